"""TensorFlow loaded without its native start-up lines, for the CLI's ``verify``/``inspect`` and the examples.

Call it first, before anything imports TensorFlow (``import reader`` does):
afterwards the lines have been printed. A library never does this on its own:
pointing file descriptor 2 elsewhere for a moment would hide other threads'
output too; a script's first line is where it belongs.
"""

from __future__ import annotations

import os
import sys


def quiet_tensorflow(logical_devices: bool = True) -> None:
    """Load TensorFlow and find its devices without its C++ start-up lines on the user's terminal.

    TensorFlow's native code logs through absl before absl is initialised
    ("Could not find cuda drivers", "failed call to cuInit" on a machine
    without a GPU), which ``TF_CPP_MIN_LOG_LEVEL`` does not silence; so the
    import and the device discovery run with file descriptor 2 pointed at
    /dev/null. Python errors still surface: they are raised, not printed, there.

    ``logical_devices=False`` stops at the physical devices, so the caller may
    still split them (``tf.config.set_logical_device_configuration``).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow as tf

        tf.config.list_physical_devices()  # where CUDA is probed
        if logical_devices:
            tf.config.list_logical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
