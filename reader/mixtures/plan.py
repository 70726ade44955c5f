"""A mixture of converted datasets: its sources, their weights, its label space and its exact per-batch quotas.

Data in: ``(data_dir or DatasetInfo, weight[, name])`` per source, a split, the
global batch size G and a :class:`reader.LabelSpace`. Data out: a
:class:`Mixture`, the plan ``build_dataset`` reads by (``reader/mixtures/pipeline.py``),
and :class:`MixturePosition` (``reader/positions.py``), a run's place in it. Nothing is read but
manifests.

The order of a mixture, a pure function of (seed, step) as a single dataset's is::

    global batch t: counts(t)[k] records of source k               [quotas.py: exact, O(1) per step]
      = C canonical slices of G / C, slice c holding split(t)[c, k]  [quotas.split_quotas: each the floor or
        of source k (source 0's, then source 1's, ...)                ceiling of counts(t)[k] / C, O(1)]
    source k's records: its own "streams" order (order.py) over its split,
      seeded by (seed, k), its C_k = C * m_k streams dealt m_k to each
      canonical pipeline (MosaicML Streaming's canonical nodes); canonical
      pipeline c reads its streams round-robin as one sequence that runs
      through its own epochs: a small source wraps around in a new order
      while a large one goes on; with repeat factors, each epoch's E copies
      (repeat_factor.py) cut into C runs of E / C, canonical pipeline c's
      run of each epoch its sequence
    where canonical pipeline c is in source k at step T: split.consumed(T)[c, k], O(1)

C (``canonical_pipelines``) and each source's streams are the mixture's layout (``reader/mixtures/layout.py``):
any input pipeline count dividing C gives the same global batches. See docs/reader.md, "Mixtures".
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from fractions import Fraction
from typing import Optional, Sequence, Union

import numpy as np

import record_schema
from reader.info import DatasetInfo, SplitInfo, dataset_info
from reader.mixtures.label_space import LabelMap, LabelSpace, unite
from reader.positions import MixturePosition
from reader.order import StreamLayout
from reader.options import as_int, as_options
from reader.mixtures.quotas import Quotas, Split, as_fractions, plan_quotas, split_quotas
from reader.mixtures import leaks as mixture_leaks
from reader.mixtures.layout import canonical_pipelines as planned_canonical, repeated_layout, source_layout
from reader.mixtures.repeat_factor import Factors, RepeatFactor, image_classes, repeat_factors


@dataclasses.dataclass(frozen=True)
class MixtureSource:
    """One source of a mixture: its name (for messages, reports and positions), dataset, split and order layout.

    ``layout``: its own streams order, cut with a "batch" of one record per
    stream, so its sequence advances a record at a time at whatever rate its
    quota asks.
    """

    name: str
    info: DatasetInfo
    split: SplitInfo
    weight: Fraction
    layout: StreamLayout
    factors: Optional[Factors] = None  # repeat-factor sampling: each record's factor, E an epoch, the report

    @property
    def epoch_records(self) -> int:
        """Records of one pass (epoch) of this source: its split less fewer than ``layout.streams`` left over
        (with repeat factors: E, its records counted with their repeats)."""
        return self.layout.steps_per_epoch * self.layout.batch_size


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Several datasets read as one, each source its share of every global batch.

    Made by :func:`mixture`. Attributes: ``sources``, ``split``, ``batch_size``,
    ``task`` (every source's), ``quotas`` (the exact schedule), ``labels``
    (the united label space), ``contiguous_ids`` (objects numbered 0..K-1).
    """

    sources: tuple[MixtureSource, ...]
    split: str
    batch_size: int
    task: str
    quotas: Quotas
    labels: LabelMap
    contiguous_ids: bool = False
    space: LabelSpace = LabelSpace()
    _window_given: bool = False
    repeat_factor: Optional[RepeatFactor] = None
    canonical_pipelines: int = 1
    split_counts: Optional[Split] = None  # quotas.split_quotas(quotas, canonical_pipelines)

    @property
    def canonical_split(self) -> Split:
        """How each global batch's counts are dealt over the canonical pipelines (:func:`quotas.split_quotas`)."""
        return self.split_counts if self.split_counts is not None else split_quotas(self.quotas,
                                                                                    self.canonical_pipelines)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(source.name for source in self.sources)

    @property
    def classes(self) -> tuple[str, ...]:
        """As ``DatasetInfo.classes``: id i is ``classes[i]`` ("" for the background of objects)."""
        return self.labels.classes

    @property
    def object_classes(self) -> tuple[str, ...]:
        """The named classes in id order: a KerasHub detector's class names (with ``contiguous_ids``)."""
        return self.labels.names

    @property
    def num_classes(self) -> int:
        """Logits a model needs for the ids the batches hold (KerasHub's ``num_classes`` with ``contiguous_ids``)."""
        return len(self.labels.classes)

    def replanned(self, split: str, batch_size: int) -> "Mixture":
        """The same sources, weights and label space over ``split`` at ``batch_size`` (itself when they are its own)."""
        if split == self.split and batch_size == self.batch_size:
            return self
        specs = [(s.info, s.weight, s.name) for s in self.sources]
        window = self.sources[0].layout.window if self._window_given else None
        same = split == self.split
        return mixture(specs, split, batch_size, self.space, self.contiguous_ids, window,
                       self.repeat_factor if same else None, self.canonical_pipelines if same else None)

    def source(self, name: str) -> int:
        """The index of the source called ``name``; ``ValueError`` listing the names otherwise."""
        if name not in self.names:
            raise ValueError(f"the mixture has no source {name!r}; its sources are {list(self.names)}")
        return self.names.index(name)

    def counts(self, step: int) -> np.ndarray:
        """Examples of each source in global batch ``step``."""
        return self.quotas.counts(step)

    def consumed(self, step: int) -> np.ndarray:
        """Examples of each source in the global batches before ``step``."""
        return self.quotas.consumed(step)

    def passes(self, step: int) -> dict:
        """Source name -> passes over it (epochs, fractional) in the batches before ``step``."""
        used = self.consumed(step)
        return {source.name: float(used[k]) / source.epoch_records for k, source in enumerate(self.sources)}

    def steps_for(self, passes: float, source: str) -> int:
        """The fewest steps after which source ``source`` has been read ``passes`` times (a run sized by a source)."""
        k = self.source(source)
        if not passes > 0:
            raise ValueError(f"passes must be > 0, got {passes!r}")
        if self.quotas.shares[k] == 0:
            raise ValueError(f"source {source!r} has weight 0: no number of steps reads it")
        wanted = int(np.ceil(passes * self.sources[k].epoch_records))
        low, high = 0, int(np.ceil(wanted / float(self.quotas.shares[k]))) + 2
        while low < high:  # consumed() only grows with the step
            middle = (low + high) // 2
            if self.consumed(middle)[k] >= wanted:
                high = middle
            else:
                low = middle + 1
        return low

    def label_map(self) -> str:
        """The mixture's classes as the TF Object Detection API's ``label_map.pbtxt`` (ids from 1)."""
        return self.labels.label_map()

    def write_label_map(self, folder: str) -> str:
        """Write ``folder/label_map.pbtxt`` and ``folder/labels.txt`` (one class a line); the pbtxt's path."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, record_schema.LABEL_MAP_FILE)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(self.label_map())
        with open(os.path.join(folder, record_schema.LABELS_FILE), "w", encoding="utf-8") as handle:
            handle.write("".join(f"{name}\n" for name in self.labels.names))
        return path

    def describe(self) -> dict:
        """What the mixture is, for a log or a report: per source its weight asked and realised, records,
        steps a pass takes, classes; the class map and which sources hold which class."""
        total = sum(source.weight for source in self.sources)
        return {
            "split": self.split, "batch_size": self.batch_size, "task": self.task,
            "quota_period_steps": self.quotas.period, "canonical_pipelines": self.canonical_pipelines,
            "sources": [{"name": s.name, "data_dir": s.info.data_dir, "fingerprint": s.info.fingerprint,
                         "weight": float(s.weight / total), "weight_realised": self.quotas.weights[k],
                         "per_batch": [int(np.floor(self.quotas.shares[k])), int(np.ceil(self.quotas.shares[k]))],
                         "records": s.split.num_examples, "records_per_pass": s.epoch_records,
                         "steps_per_pass": self.steps_for(1, s.name) if self.quotas.shares[k] else None,
                         "classes": [c for c in s.info.classes if c],
                         **({"repeat_factors": {"epoch_records": s.factors.epoch_records,
                                                "classes": s.factors.report}} if s.factors else {})}
                        for k, s in enumerate(self.sources)],
            "classes": list(self.classes),
            "class_sources": {name: list(held) for name, held in self.labels.holders.items()},
            # source -> its class -> the mixture's id (None: dropped)
            "class_map": {s.name: {name: (int(self.labels.tables[k][i]) if self.labels.tables[k][i] >= 0 else None)
                                   for i, name in enumerate(s.info.classes) if name}
                          for k, s in enumerate(self.sources)},
        }

    def position(self, seed: int, step: int) -> MixturePosition:
        """The :class:`MixturePosition` of training at global ``step``: computed, nothing read."""
        step = as_int(step)
        if step is None or step < 0:
            raise ValueError(f"step must be a global step >= 0, got {step!r}")
        if as_int(seed) is None:
            raise ValueError("a position needs the run's seed (a run without one has an order nobody can repeat)")
        return MixturePosition(self.split, int(seed), self.batch_size, self._identity(), step,
                               labels=self.labels_digest(), canonical=self.canonical_pipelines)

    def labels_digest(self) -> str:
        """12 hex digits naming the label ids: the classes in id order and each source's record id -> id table.
        A run resumed under other ids would learn on relabelled data without a word."""
        digest = hashlib.sha256("\n".join(self.classes).encode("utf-8"))
        for table in self.labels.tables:
            digest.update(np.asarray(table, np.int64).tobytes())
        return digest.hexdigest()[:12]

    def _identity(self) -> tuple:
        """Per source what the order depends on: name, version, weight, streams, window, repeat threshold."""
        threshold = self.repeat_factor.threshold if self.repeat_factor else 0
        return tuple((s.name, s.info.fingerprint, str(s.weight / sum(x.weight for x in self.sources)),
                      s.layout.streams, s.layout.window, threshold) for s in self.sources)

    def mismatch(self, position: MixturePosition, seed: Optional[int]) -> str:
        """Why ``position`` was not taken on this mixture (and seed, if given), or ""."""
        saved, now = position.sources, self._identity()
        if [s[0] for s in saved] != [s[0] for s in now]:
            return f"it was taken on sources {[s[0] for s in saved]} and this mixture has {[s[0] for s in now]}"
        if position.canonical != self.canonical_pipelines:  # before the streams, which follow from it
            return (f"it was taken with canonical_pipelines={position.canonical} and this mixture has "
                    f"{self.canonical_pipelines}: plan it with reader.mixture(..., "
                    f"canonical_pipelines={position.canonical})")
        fields = ("name", "version", "weight", "streams", "window", "repeat factor threshold")
        for old, new in zip(saved, now):
            source = self.sources[now.index(new)]
            for index, field in enumerate(fields):
                if tuple(old)[index] != new[index] and not (field == "version" and source.info.is_version(old[1])):
                    shown = [value or "none" if field == "repeat factor threshold" else value
                             for value in (old[index], new[index])]
                    what = (f"version {old[1]} and {source.info.data_dir or 'its data'} is version {new[1]} "
                            "(another dataset, or reconverted or changed since)" if field == "version"
                            else f"{field} {shown[0]} and this mixture gives it {shown[1]}")
                    return f"source {old[0]!r} had {what}"
        for name, old, new in (("split", position.split, self.split), ("batch_size", position.batch_size,
                                                                         self.batch_size),
                               ("seed", position.seed, position.seed if seed is None else seed)):
            if old != new:
                return f"it was taken with {name}={old!r} and this pipeline has {name}={new!r}"
        if position.labels and position.labels != self.labels_digest():
            return (f"it was taken with other label ids (classes and renames; digest {position.labels}, this "
                    f"mixture's {self.labels_digest()}: its classes are {list(self.classes)})")
        return ""


SourceSpec = Union[tuple, list]


def mixture(sources: Sequence[SourceSpec], split: str = "train", batch_size: int = 64,
            labels: LabelSpace = LabelSpace(), contiguous_ids: bool = False, window: Optional[int] = None,
            repeat_factor: Optional[RepeatFactor] = None, canonical_pipelines: Optional[int] = None,
            leaks: str = "warn") -> Mixture:
    """The plan of a mixture of ``sources``: each ``(data_dir or DatasetInfo, weight)`` or ``(..., weight, name)``.

    Args:
      sources: converted datasets with their weights (any positive scale:
        ``0.5, 0.3, 0.2`` or ``5, 3, 2``); a name defaults to the folder's.
      split: read from every source.
      batch_size: the global batch G; each source gets the floor or the
        ceiling of ``G * weight`` a batch, and never drifts a whole example from it.
      labels: how the sources' classes unite (:class:`reader.LabelSpace`).
      contiguous_ids: objects numbered 0..K-1 (KerasHub) instead of 1..K.
      window: records per shuffled window of each source (default: one
        dataset's, 10,000 / (6 * its streams)).
      repeat_factor: repeat-factor sampling of each source's images
        (:class:`reader.RepeatFactor`): reads every record's class ids once, here (each split's records
        table: N small integers; a dataset converted before them, its shards' labels).
      leaks: an image of one source's ``split`` that another source holds in its validation or test split
        (byte-identical, or perceptual hashes within 3 bits; found from the records tables, nothing
        decoded, :mod:`reader.mixtures.leaks`): ``"warn"`` logs the pairs, ``"refuse"`` raises
        :class:`reader.mixtures.leaks.LeakError` naming them, ``"ignore"`` does not look.
      canonical_pipelines: C, the canonical pipelines each source's streams
        are dealt over: any input pipeline count H dividing C reads 1/H of
        the bytes and gives the same global batches. C must divide G and be
        at most the smallest source's records. Default: gcd(G, 64), halved
        (not below 8) while the smallest source would give each fewer than
        512 records, and while it holds fewer records than C. With repeat
        factors, each epoch's E copies (in reading order) are cut into C
        runs of E / C, one a canonical pipeline (E a multiple of C).

    Raises:
      ValueError: naming the source at fault: not a dataset, no such split,
        another task than the first source's, a bad weight; or two sources
        with one name.
    """
    batch_size = as_int(batch_size)
    if batch_size is None or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    labels = as_options(labels, LabelSpace, "labels")
    infos, weights, names = _read_sources(sources)
    fractions = as_fractions(weights, [repr(name) for name in names])
    task = _one_task(infos, names)
    splits = [info.split(split) for info in infos]
    mixture_leaks.check(infos, names, splits[0].name, leaks)
    canonical = planned_canonical(canonical_pipelines, batch_size, [s.num_examples for s in splits], names)
    layouts = [source_layout(s.num_examples, window, name, canonical) for s, name in zip(splits, names)]
    factors = [None] * len(infos)
    if repeat_factor is not None:
        repeat_factor = as_options(repeat_factor, RepeatFactor, "repeat_factor")
        factors = [repeat_factors(image_classes(info, split_info), info.classes, repeat_factor.threshold, canonical)
                   for info, split_info in zip(infos, splits)]
        layouts = [repeated_layout(f.epoch_records, window, canonical) for f in factors]
    members = tuple(MixtureSource(name, info, split_info, weight, layout, f)
                    for name, info, split_info, weight, layout, f in zip(names, infos, splits, fractions, layouts,
                                                                         factors))
    label_map = unite(task, [info.classes for info in infos], names, labels, contiguous_ids)
    quotas = plan_quotas(fractions, batch_size)
    return Mixture(members, splits[0].name, batch_size, task, quotas, label_map, bool(contiguous_ids), labels,
                   window is not None, repeat_factor, canonical, split_quotas(quotas, canonical))


def _read_sources(sources: Sequence[SourceSpec]) -> tuple[list[DatasetInfo], list, list[str]]:
    """Each source's manifest, weight and name (its folder's by default); ``ValueError`` naming a source that is
    not ``(data_dir, weight[, name])``, not written by the converter, or named twice."""
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or len(sources) < 1:
        raise ValueError("sources must be a list of (data_dir, weight) or (data_dir, weight, name), got "
                         f"{sources!r}")
    infos, weights, names = [], [], []
    for index, spec in enumerate(sources):
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
            raise ValueError(f"source {index} must be (data_dir, weight) or (data_dir, weight, name), got {spec!r}")
        if isinstance(spec[1], str) or (len(spec) == 3 and not isinstance(spec[2], str)):
            raise ValueError(f"source {index} must be (data_dir, weight) or (data_dir, weight, name), a number for "
                             f"the weight and text for the name, got {spec!r}")
        where = spec[0]
        info = where if isinstance(where, DatasetInfo) else dataset_info(where)
        if not info.converted:
            raise ValueError(f"source {index} ({info.data_dir or 'shards without a manifest'}) was not written by "
                             "the converter: a mixture unites classes by name and needs each source's manifest")
        infos.append(info)
        weights.append(spec[1])
        names.append(str(spec[2]) if len(spec) == 3 else os.path.basename(info.data_dir.rstrip("/")) or f"source{index}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"sources {twice} appear more than once by name: give each a name, "
                         "(data_dir, weight, name)")
    return infos, weights, names


def _one_task(infos: Sequence[DatasetInfo], names: Sequence[str]) -> str:
    """The task every source holds; ``ValueError`` naming the first odd source and its task."""
    for info, name in zip(infos[1:], names[1:]):
        if info.task != infos[0].task:
            raise ValueError(f"source {name!r} ({info.data_dir}) holds task {info.task!r} and source {names[0]!r} "
                             f"holds {infos[0].task!r}: every source of a mixture must be the same task")
    return infos[0].task
