"""``build_dataset``: the one way to read a dataset or a mixture, and ``distributed_dataset`` and ``position`` for both.

Data in: where the data is (a converted folder, a :class:`DatasetInfo`, or a :class:`Mixture` from
``reader.mixture``) and what the trainer wants (split, batch, image, start, options). Data out: a
``tf.data.Dataset`` of batches from ``reader/pipeline.py`` (one dataset) or ``reader/mixtures/pipeline.py``
(a mixture), checked alike by ``reader/pipeline_checks.py``.

Decision (docs/reader.md, "One entry point"): as ``tfds.load(name, split=, batch_size=, read_config=)`` takes
whatever names the data and ``tf.data.Dataset.sample_from_datasets`` returns a dataset like any other, the
data goes first and may be a folder, its ``DatasetInfo`` or a ``Mixture``; a mixture is planned once
(``reader.mixture``, Grain's ``MapDataset.mix``) and its split and batch size are read from the plan, not
said again. The tuning stays in :class:`ReadOptions` and what only other tools' shards need in
:class:`ForeignShards` (TFDS's ``ReadConfig`` and ``decoders`` likewise sit beside the call, not in it).
A dataset is not read as a one-source mixture: that would change its order (see ``reader/positions.py``).
``build_mixture`` and the keywords ``keys=``, ``label_offset=``, ``info=`` work for one more release,
with a ``DeprecationWarning`` naming the new call.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional, Sequence, Union

import tensorflow as tf

from reader.info import DatasetInfo, dataset_info
from reader.mixtures.label_space import LabelSpace
from reader.mixtures.plan import Mixture, mixture
from reader.mixtures.pipeline import check_mixture_options, mixture_batches
from reader.options import (
    Augmentation,
    BoxAugmentation,
    ForeignShards,
    ObjectTargets,
    ReadOptions,
    as_int,
    as_options,
    check_flag,
)
from reader.order import stream_layout
from reader.pipeline import dataset_batches
from reader.pipeline_checks import Request, check_positive, check_seed
from reader.positions import DatasetPosition, Position
from reader.mixtures.repeat_factor import RepeatFactor

Data = Union[str, DatasetInfo, Mixture]


def build_dataset(
    data: Data,
    split: Optional[str] = None,
    batch_size: Optional[int] = None,
    image_size: Union[int, Sequence[int]] = 224,
    training: bool = True,
    seed: Optional[int] = None,
    deterministic: Optional[bool] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
    *,
    start: Union[None, int, str, Position, tf.Variable, tf.Tensor] = None,
    num_epochs: Optional[int] = None,
    num_steps: Optional[int] = None,
    dtype: tf.DType = tf.float32,
    normalization: Optional[str] = None,
    augment: Union[None, Augmentation, BoxAugmentation] = None,
    crop_fraction: float = 0.875,
    targets: ObjectTargets = ObjectTargets(),
    foreign: ForeignShards = ForeignShards(),
    with_source: bool = False,
    skip_corrupt: bool = False,
    options: ReadOptions = ReadOptions(),
    **deprecated,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, targets)`` batches over a converted split, or over a mixture.

    Args:
      data: a folder written by the converter (its manifest lists the shards), its
        :class:`DatasetInfo` (read once, or ``reader.foreign_dataset_info`` for other tools' shards), or a
        :class:`Mixture` (``reader.mixture([(dir, weight), ...], split, batch_size)``): each source its exact
        share of every batch, classes united by name.
      split: "train", "validation" (or "val") or "test"; default "train", a mixture's own.
      batch_size: global batch size, default 64, a mixture's own (training reads the plan's split and
        batch; another is refused naming both; evaluation reads any). With ``input_context``, each pipeline
        yields ``input_context.get_per_replica_batch_size(batch_size)``.
      image_size: output size, an int or ``(height, width)``.
      training: True for the training preset (random resized crop decoded cropped, flip, the seeded order,
        repeats, static batch shape); False for one deterministic pass with a centre crop, keeping the final
        partial batch (a mixture: each source once, source after source).
      seed: makes the order and the augmentation reproducible (and resumable).
      deterministic: element order reproducible; default True with a seed, False (faster) without.
        Evaluation, and a mixture (its quotas hold only in order), are always deterministic.
      input_context: from ``tf.distribute`` (``distributed_dataset`` passes it); each pipeline reads its
        share, and the H pipelines' batches together are the one-pipeline global batch.
      start: where training starts, the same kinds for a dataset and a mixture: a global step (int), a
        :class:`Position` of this data (``reader.position(data, ...)``; its JSON too; checked against the
        data, seed and layout, its seed used when ``seed`` is None), or a variable read when iteration starts
        (Keras' ``model.optimizer.iterations``). Resuming re-reads at most one window per stream.
      num_epochs: one dataset's training epochs (counted from epoch 0); None repeats indefinitely.
      num_steps: a mixture's training steps (counted from step 0; ``mixture.steps_for(passes, name)``).
      dtype: float32, bfloat16, float16, or uint8 (normalise on the accelerator).
      normalization: None (0..255), "mobilenet" ([-1, 1]) or "imagenet" (mean/std).
      augment: the training crop's ranges and the flip (:class:`Augmentation`, :class:`BoxAugmentation`).
      crop_fraction: eval centre crop as a fraction of the shorter side.
      targets: what a detection batch holds (:class:`ObjectTargets`).
      foreign: what shards written by other tools need (:class:`ForeignShards`: feature keys, label offset).
      with_source: also yield each example's source index (int32 ``[B]``, into ``mixture.names``; 0 for
        one dataset): batches are ``(images, targets, sources)``.
      skip_corrupt: skip the rest of a corrupt shard with a warning instead of failing (one dataset).
      options: the tuning knobs (:class:`ReadOptions`), or a dict of its fields; a mixture takes
        ``window``, ``private_threads`` and ``prefetch_to_device``.

    Raises:
      DatasetNotFoundError: no manifest in the folder.
      ValueError: an unknown split (the message lists the splits), a bad argument (named), a ``start``
        position of other data, or an argument that does not apply to a mixture.
      CacheTooLargeError: ``cache="memory"`` and the split does not fit.
    """
    data, foreign = _deprecated_keywords(data, foreign, deprecated)
    if not isinstance(data, Mixture) and not isinstance(data, DatasetInfo):
        data = dataset_info(data)
    given = dict(image_size=image_size, training=training, seed=seed, deterministic=deterministic,
                 input_context=input_context, start=start, num_epochs=num_epochs, num_steps=num_steps, dtype=dtype,
                 normalization=normalization, augment=augment, crop_fraction=crop_fraction, targets=targets,
                 foreign=foreign, with_source=with_source, skip_corrupt=skip_corrupt, options=options)
    if isinstance(data, Mixture):
        request = Request(split=data.split if split is None else split,
                          batch_size=data.batch_size if batch_size is None else batch_size, **given)
        return mixture_batches(data, request)
    request = Request(split="train" if split is None else split, batch_size=64 if batch_size is None else batch_size,
                      **given)
    return dataset_batches(data, request)


def _deprecated_keywords(data, foreign: ForeignShards, given: dict) -> tuple:
    """``keys=``, ``label_offset=`` and ``info=`` of the release before, folded in with a warning naming the new
    call; a keyword that is now a :class:`ReadOptions` field named with where it went; any other refused."""
    foreign = as_options(foreign, ForeignShards, "foreign")
    old = {name: given.pop(name) for name in ("keys", "label_offset") if name in given}
    if old:
        said = ", ".join(f"{name}=..." for name in old)
        warnings.warn(f"build_dataset({said}) is deprecated and goes in the next release: pass "
                      f"foreign=reader.ForeignShards({said})", DeprecationWarning, stacklevel=3)
        foreign = dataclasses.replace(foreign, **old)
    if "info" in given:
        info = given.pop("info")
        if info is not None:
            warnings.warn("build_dataset(data_dir, info=info) is deprecated and goes in the next release: pass the "
                          "DatasetInfo where the folder goes, build_dataset(info, ...)", DeprecationWarning,
                          stacklevel=3)
            data = info
    if given:
        name = sorted(given)[0]
        if name in [f.name for f in dataclasses.fields(ReadOptions)]:
            raise TypeError(f"build_dataset({name}=...) moved into the tuning options: pass "
                            f"options=reader.ReadOptions({name}={given[name]!r})")
        raise TypeError(f"build_dataset() got an unexpected keyword argument {name!r}")
    return data, foreign


def distributed_dataset(strategy: tf.distribute.Strategy, data: Data, split: Optional[str] = None,
                        batch_size: Optional[int] = None, **kwargs) -> tf.distribute.DistributedDataset:
    """``build_dataset`` per input pipeline through ``strategy.distribute_datasets_from_function``, for a
    dataset or a mixture.

    ``batch_size`` is the global batch (a mixture's own when not given); each replica gets its share, and
    each input pipeline reads its share of the shards (of every source).
    """
    info = kwargs.pop("info", None)
    if info is not None:
        warnings.warn("distributed_dataset(strategy, data_dir, info=info) is deprecated and goes in the next "
                      "release: pass the DatasetInfo where the folder goes, distributed_dataset(strategy, info, ...)",
                      DeprecationWarning, stacklevel=2)
        data = info
    if not isinstance(data, (Mixture, DatasetInfo)):
        data = dataset_info(data)  # read once, not once per pipeline

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return build_dataset(data, split, batch_size, input_context=context, **kwargs)

    return strategy.distribute_datasets_from_function(dataset_fn)


def position(data: Data, split: Optional[str] = None, batch_size: Optional[int] = None, seed: Optional[int] = None,
             step: Optional[int] = None, options: ReadOptions = ReadOptions()) -> Position:
    """The :class:`Position` of training at global ``step`` (batches since step 0) over ``data``.

    Computed, not read from a pipeline: any host can say where the run is, and
    ``build_dataset(data, ..., start=position)`` continues from there. ``data``, ``split``, ``batch_size`` and
    ``options`` as ``build_dataset`` was given them (a mixture's split and batch are its own).
    """
    if seed is None:
        raise ValueError("a position needs the run's seed (a run without one has an order nobody can repeat)")
    if isinstance(data, Mixture):
        if (split is not None and data.sources[0].info.split(split).name != data.split) or \
                (batch_size is not None and batch_size != data.batch_size):
            raise ValueError(f"the mixture was planned for split {data.split!r} and batch_size={data.batch_size}, "
                             f"and position() got split={split!r}, batch_size={batch_size!r}: leave them unset")
        return data.position(seed, step)
    info = data if isinstance(data, DatasetInfo) else dataset_info(data)
    split_info = info.split("train" if split is None else split)
    batch_size = check_positive(batch_size=64 if batch_size is None else batch_size)
    options = as_options(options, ReadOptions, "options")
    layout = stream_layout(split_info.num_examples, batch_size, options.streams, options.window, split_info.name)
    seed = check_seed(seed)
    step = as_int(step)
    if step is None or step < 0:
        raise ValueError(f"step must be a global step >= 0, got {step!r}")
    epoch, within = divmod(step, layout.steps_per_epoch)
    return DatasetPosition(info.fingerprint, split_info.name, seed, batch_size, layout.streams, layout.window, epoch,
                           within, layout.steps_per_epoch, data_dir=info.data_dir or "")


def build_mixture(
    sources: Union[Mixture, Sequence[tuple]],
    split: str = "train",
    batch_size: int = 64,
    image_size: Union[int, Sequence[int]] = 224,
    training: bool = True,
    seed: Optional[int] = None,
    deterministic: Optional[bool] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
    *,
    start: Union[None, int, Position, tf.Variable, tf.Tensor] = None,
    num_steps: Optional[int] = None,
    dtype: tf.DType = tf.float32,
    normalization: Optional[str] = None,
    augment: Union[None, Augmentation, BoxAugmentation] = None,
    crop_fraction: float = 0.875,
    targets: ObjectTargets = ObjectTargets(),
    labels: LabelSpace = LabelSpace(),
    with_source: bool = False,
    repeat_factor: Optional[RepeatFactor] = None,
    options: ReadOptions = ReadOptions(),
) -> tf.data.Dataset:
    """Deprecated (goes in the next release): ``reader.build_dataset(reader.mixture(sources, split, batch_size,
    labels, repeat_factor=...), image_size, ...)`` reads the same batches, the plan's split and batch said once."""
    warnings.warn("reader.build_mixture is deprecated and goes in the next release: call "
                  "reader.build_dataset(plan, image_size=..., ...) with plan = reader.mixture(sources, split, "
                  "batch_size, labels=..., repeat_factor=...); the plan's split and batch_size are its own",
                  DeprecationWarning, stacklevel=2)
    training = check_flag(training, "training")
    check_flag(with_source, "with_source")
    options = check_mixture_options(options)
    targets = as_options(targets, ObjectTargets, "targets")
    repeat_factor = repeat_factor if training else None
    plan = sources if isinstance(sources, Mixture) else mixture(
        sources, split, batch_size, labels, targets.contiguous_ids, options.window, repeat_factor)
    # A Mixture carries its own label space and repeat factors: other ones given beside it would be ignored.
    if labels != LabelSpace() and labels != plan.space:
        raise ValueError(f"build_mixture got labels={labels!r} and a mixture planned with labels={plan.space!r}: "
                         "plan it with reader.mixture(..., labels=...) instead")
    if repeat_factor is not None and repeat_factor != plan.repeat_factor:
        raise ValueError(f"build_mixture got repeat_factor={repeat_factor!r} and a mixture planned with "
                         f"repeat_factor={plan.repeat_factor!r}: plan it with reader.mixture(..., repeat_factor=...)")
    request = Request(split=split, batch_size=batch_size, image_size=image_size, training=training, seed=seed,
                      deterministic=deterministic, input_context=input_context, start=start, num_steps=num_steps,
                      dtype=dtype, normalization=normalization, augment=augment, crop_fraction=crop_fraction,
                      targets=targets, with_source=with_source, options=options)
    return mixture_batches(plan, request)

