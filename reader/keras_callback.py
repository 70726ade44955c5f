"""``ExactResume``: a Keras ``fit`` that is killed and restarted trains on exactly the batches of an uninterrupted one.

Data in: the optimizer's step (restored by ``keras.callbacks.BackupAndRestore``)
and the data ``build_dataset`` was given: a folder or its ``DatasetInfo`` (the manifest), or a ``Mixture``
plan, whose split and batch size are its own and not said again. Data out: ``position.json`` beside the backup, and
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
import warnings
from typing import Optional, Union

import keras
import tensorflow as tf

from reader.info import DatasetInfo, dataset_info
from reader.builder import Data, position
from reader.mixtures.plan import Mixture
from reader.options import ReadOptions
from reader.positions import DatasetPosition, MixturePosition, Position

logger = logging.getLogger(__name__)


class ExactResume(keras.callbacks.Callback):
    """Keeps ``fit`` on the reader's order across restarts; list it after ``BackupAndRestore``.

    Args:
      path: where the run's position is kept (a JSON file beside the backup).
      data: what ``build_dataset`` was given: a folder, its :class:`reader.DatasetInfo`, or a
        :class:`reader.Mixture` (``reader.mixture(sources, split, batch_size)``).
      split, batch_size: a dataset's, as ``build_dataset`` was given them (default "train", 64); a mixture's
        are its plan's, not said again (saying them agreeing is deprecated; disagreeing is refused).
      seed, options: what ``build_dataset`` was given.
      epochs: the ``epochs`` given to ``fit``.
      steps_per_epoch: the ``steps_per_epoch`` given to ``fit``: a mixture's
        (``mixture.steps_for(1, name)``, or any); a dataset's is its own.

    Raises:
      ValueError: no seed or epochs, a mixture without ``steps_per_epoch``, or a mixture with a split or batch
        size other than its plan's (naming both).
    """

    def __init__(self, path: str, data: Data = None, split: Optional[str] = None, batch_size: Optional[int] = None,
                 seed: Optional[int] = None, epochs: Optional[int] = None, options: ReadOptions = ReadOptions(),
                 steps_per_epoch: Optional[int] = None, **deprecated) -> None:
        super().__init__()
        data = _renamed_data(data, deprecated)
        if seed is None or epochs is None:
            raise ValueError(f"ExactResume needs the run's seed= and the epochs= given to fit, got seed={seed!r}, "
                             f"epochs={epochs!r}")
        if isinstance(data, Mixture):
            _plan_said_again(data, split, batch_size)
            split = batch_size = None  # the plan's own
            if not steps_per_epoch:
                raise ValueError("ExactResume over a mixture needs steps_per_epoch=, the one given to fit (a mixture "
                                 "has no epoch of its own: mixture.steps_for(passes, source) sizes one)")
        self.path = path
        self._args = (data, split, batch_size, seed)
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
        self._check_dataset(now)
        self._save(now)

    def _check_dataset(self, now: DatasetPosition) -> None:
        """A restart on another version of the dataset, or with another layout (split, seed, batch, streams,
        window), is refused, named; a copy of the same version elsewhere resumes."""
        if not tf.io.gfile.exists(self.path):
            return
        with tf.io.gfile.GFile(self.path, "r") as handle:
            saved = DatasetPosition.from_json(handle.read())
        data = self._args[0]
        info = data if isinstance(data, DatasetInfo) else None
        if saved.fingerprint != now.fingerprint and not (info or dataset_info(data)).is_version(saved.fingerprint):
            raise ValueError(
                f"{self.path}: this run was trained on {saved.dataset()}, and {info.data_dir if info else data} is "
                f"version {now.fingerprint} (another dataset, or reconverted or changed since); its position cannot "
                "resume there. Point data at the version it was trained on, or start a new run in a new "
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


def _renamed_data(data, given: dict) -> Data:
    """``data_dir=``, the keyword of the release before, folded in with a warning naming ``data=``; any other
    keyword refused."""
    if "data_dir" in given:
        if data is not None:
            raise TypeError("ExactResume got both data= and data_dir=: pass data= alone")
        warnings.warn("ExactResume(path, data_dir=...) is deprecated and goes in the next release: pass "
                      "ExactResume(path, data=...), the folder, DatasetInfo or Mixture build_dataset was given",
                      DeprecationWarning, stacklevel=3)
        data = given.pop("data_dir")
    if given:
        raise TypeError(f"ExactResume() got an unexpected keyword argument {sorted(given)[0]!r}")
    if data is None:
        raise TypeError("ExactResume() needs data=, the folder, DatasetInfo or Mixture build_dataset was given")
    return data


def _plan_said_again(plan: Mixture, split: Optional[str], batch_size: Optional[int]) -> None:
    """A mixture's split and batch size are its plan's: said again and other, refused naming both; said again
    and the same, accepted for one more release with a warning naming the call without them."""
    if split is None and batch_size is None:
        return
    if (split is not None and plan.sources[0].info.split(split).name != plan.split) or \
            (batch_size is not None and batch_size != plan.batch_size):
        raise ValueError(f"the mixture was planned for split {plan.split!r} and batch_size={plan.batch_size}, and "
                         f"ExactResume got split={split!r}, batch_size={batch_size!r}: leave them out "
                         "(ExactResume(path, plan, seed=..., epochs=..., steps_per_epoch=...) reads the plan's)")
    warnings.warn("ExactResume(path, plan, split, batch_size, seed, epochs) over a mixture is deprecated and goes "
                  "in the next release: call ExactResume(path, plan, seed=seed, epochs=epochs, "
                  "steps_per_epoch=...); the plan's split and batch_size are its own", DeprecationWarning,
                  stacklevel=3)
