"""``ExactResume``: a Keras ``fit`` that is killed and restarted trains on exactly the batches of an uninterrupted one.

Data in: the optimizer's step (restored by ``keras.callbacks.BackupAndRestore``)
and the dataset's manifest. Data out: ``position.json`` beside the backup, and
``model.stop_training`` at the uninterrupted run's last step.

The reader's order is a pure function of (dataset, seed, epoch) and the
pipeline starts at ``start=model.optimizer.iterations``, read when ``fit``
starts iterating, after ``BackupAndRestore`` has restored it. What is left for
this callback:

- refuse a restart on another version of the dataset (a reconversion between
  the kill and the restart), naming both versions, as ``start=Position`` does;
- end training at ``epochs * steps_per_epoch`` steps. Keras restarts an
  interrupted epoch at its first step while the optimizer and the data go on
  from where they stopped, so without it a resumed run would train the
  steps of the interrupted epoch that it had already trained once more, on
  data of the epoch after the last.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Optional, Union

import keras
import tensorflow as tf

from reader.info import dataset_info
from reader.builder import position
from reader.mixtures.plan import Mixture
from reader.options import ReadOptions
from reader.positions import DatasetPosition, MixturePosition, Position

logger = logging.getLogger(__name__)


class ExactResume(keras.callbacks.Callback):
    """Keeps ``fit`` on the reader's order across restarts; list it after ``BackupAndRestore``.

    Args:
      path: where the run's position is kept (a JSON file beside the backup).
      data_dir, split, batch_size, seed, options: what ``build_dataset`` was given; for a mixture,
        ``data_dir`` is the :class:`reader.Mixture` ``build_mixture`` read (``split``, ``batch_size``: its own).
      epochs: the ``epochs`` given to ``fit``.
      steps_per_epoch: the ``steps_per_epoch`` given to ``fit``: a mixture's
        (``mixture.steps_for(1, name)``, or any); a dataset's is its own.
    """

    def __init__(self, path: str, data_dir: Union[str, Mixture], split: str, batch_size: int, seed: int, epochs: int,
                 options: ReadOptions = ReadOptions(), steps_per_epoch: Optional[int] = None) -> None:
        super().__init__()
        if isinstance(data_dir, Mixture) and not steps_per_epoch:
            raise ValueError("ExactResume over a mixture needs steps_per_epoch=, the one given to fit (a mixture "
                             "has no epoch of its own: mixture.steps_for(passes, source) sizes one)")
        self.path = path
        self._args = (data_dir, split, batch_size, seed)
        self._options = options
        self._epochs = epochs
        self._steps_per_epoch = steps_per_epoch
        self._total = 0

    def _position(self) -> Union[Position, MixturePosition]:
        step = int(tf.convert_to_tensor(self.model.optimizer.iterations))
        if isinstance(self._args[0], Mixture):
            return self._args[0].position(self._args[3], step)
        return position(*self._args, step, options=self._options)

    def on_train_begin(self, logs=None) -> None:
        now = self._position()
        if isinstance(now, MixturePosition):
            self._total = self._epochs * self._steps_per_epoch
            self._check_mixture(now)
            self._save(now)
            return
        self._total = self._epochs * (self._steps_per_epoch or now.steps_per_epoch)
        if tf.io.gfile.exists(self.path):
            with tf.io.gfile.GFile(self.path, "r") as handle:
                saved = DatasetPosition.from_json(handle.read())
            if saved.fingerprint != now.fingerprint and not dataset_info(self._args[0]).is_version(saved.fingerprint):
                raise ValueError(
                    f"{self.path}: this run was trained on {saved.dataset()}, and {self._args[0]} is version "
                    f"{now.fingerprint} (another dataset, or reconverted or changed since); its position cannot "
                    "resume there. Point data_dir at the version it was trained on, or start a new run in a new "
                    "backup folder")
            ignored = ("epoch", "step", "fingerprint", "data_dir")  # a copy of the same version elsewhere resumes
            layout = {k: v for k, v in json.loads(saved.to_json()).items() if k not in ignored}
            current = {k: v for k, v in json.loads(now.to_json()).items() if k not in ignored}
            if layout != current:
                changed = sorted(k for k in layout if layout[k] != current[k])
                raise ValueError(f"{self.path}: this run was trained with {', '.join(f'{k}={layout[k]!r}' for k in changed)}"
                                 f" and is restarted with {', '.join(f'{k}={current[k]!r}' for k in changed)}")
            if now.global_step:
                logger.info("resuming at epoch %d, step %d (global step %d)", now.epoch, now.step, now.global_step)
        self._save(now)

    def _check_mixture(self, now: MixturePosition) -> None:
        """A restart of a mixture run on another mixture (sources, versions, weights, seed) is refused, named."""
        if not tf.io.gfile.exists(self.path):
            return
        with tf.io.gfile.GFile(self.path, "r") as handle:
            text = handle.read()
        try:
            saved = MixturePosition.from_json(text)
        except ValueError:
            raise ValueError(f"{self.path}: this run was trained on one dataset, not a mixture ({text[:200]})") from None
        mismatch = self._args[0].mismatch(saved, now.seed)
        if mismatch:
            raise ValueError(f"{self.path}: this run cannot resume on this mixture: {mismatch}. Point it at the "
                             "mixture it was trained on, or start a new run in a new backup folder")
        if now.step:
            logger.info("resuming the mixture at global step %d", now.step)

    def on_epoch_end(self, epoch, logs=None) -> None:
        self._save(self._position())

    def on_train_batch_end(self, batch, logs=None) -> None:
        if int(tf.convert_to_tensor(self.model.optimizer.iterations)) >= self._total:
            self.model.stop_training = True

    def _save(self, now: Union[Position, MixturePosition]) -> None:
        folder = os.path.dirname(self.path)
        if folder:
            tf.io.gfile.makedirs(folder)
        # Whole or not at all: a kill during the write must not leave half a position for the restart.
        temp = f"{self.path}.partial"
        with tf.io.gfile.GFile(temp, "w") as handle:
            handle.write(now.to_json())
        tf.io.gfile.rename(temp, self.path, overwrite=True)
