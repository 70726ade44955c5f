"""Where a training run is: :class:`Position`, one type for a run over a dataset and over a mixture.

Data in: what ``reader.position`` (``reader/builder.py``) or ``Mixture.position`` computes, or the JSON
``to_json`` wrote. Data out: a position, a few hundred bytes of JSON, the same on every host;
``Position.from_json`` reads either kind, and ``build_dataset(..., start=position)`` takes either.

Decision: one base type, two layouts. A dataset's run is placed by its version, split, seed, batch, streams,
window and (epoch, step) (:class:`DatasetPosition`); a mixture's by the same per source plus its weights,
canonical pipelines and label ids (:class:`MixturePosition`). Folding the first into the second (a dataset as a
mixture of one source) would change a dataset's order (a mixture's sources are seeded apart and advance a record
at a time) and refuse every position saved before: the batches must stay byte for byte. So both are a
:class:`Position` with the same face (``split``, ``seed``, ``batch_size``, ``global_step``, ``to_json``), and each
pipeline says which kind it needs when given the other.
"""

from __future__ import annotations

import dataclasses
import json

POSITION_VERSION = 1
MIXTURE_POSITION_VERSION = 1


class Position:
    """Where a training run is in its data, over a dataset or a mixture: ``reader.position(data, ...)`` gives it.

    ``reader.Position(**fields)`` builds a dataset's (as earlier releases did); ``Position.from_json`` reads
    either kind. Every position has ``split``, ``seed``, ``batch_size``, ``global_step`` and ``to_json()``.
    """

    def __new__(cls, *args, **kwargs):
        if cls is Position:  # reader.Position(**saved): a dataset's, as before positions had two kinds
            return DatasetPosition(*args, **kwargs)
        return super().__new__(cls)

    @property
    def global_step(self) -> int:
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: "str | bytes") -> "Position":
        """The position ``to_json`` wrote, of either kind; ``ValueError`` naming what is wrong with anything else."""
        try:
            raw = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a reader position: {err}") from None
        kind = MixturePosition if isinstance(raw, dict) and "sources" in raw else DatasetPosition
        return kind.from_json(text)


@dataclasses.dataclass(frozen=True)
class DatasetPosition(Position):
    """Where a run over one dataset is: a few hundred bytes of JSON, the same on every host.

    ``step`` counts global batches since the start of ``epoch``. Building the
    pipeline with ``start=position`` yields, bit for bit, the batches the
    uninterrupted run yields from there, with any number of input pipelines
    that divides ``streams``. ``data_dir`` is where it was taken, for messages
    only: a copy of the same version elsewhere resumes it.
    """

    fingerprint: str
    split: str
    seed: int
    batch_size: int
    streams: int
    window: int
    epoch: int
    step: int
    steps_per_epoch: int
    version: int = POSITION_VERSION
    data_dir: str = ""

    def dataset(self) -> str:
        """The dataset it was taken on, as a message names it: its folder and version, or the version."""
        return f"{self.data_dir} (version {self.fingerprint})" if self.data_dir else f"version {self.fingerprint}"

    @property
    def global_step(self) -> int:
        return self.epoch * self.steps_per_epoch + self.step

    @classmethod
    def from_json(cls, text: "str | bytes") -> "DatasetPosition":
        """The position ``to_json`` wrote; ``ValueError`` naming what is wrong with anything else."""
        try:
            raw = json.loads(text)
            if raw.get("version") != POSITION_VERSION:
                raise ValueError(f"position version {raw.get('version')!r}; this reader reads {POSITION_VERSION}")
            return cls(**raw)
        except (TypeError, AttributeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a reader position: {err}") from None


@dataclasses.dataclass(frozen=True)
class MixturePosition(Position):
    """Where a run over a mixture is: its global step and what the order depends on, as a few hundred bytes of JSON.

    ``sources``: per source (name, version, weight, streams, window). ``canonical``: the mixture's
    canonical pipelines (1 in positions written before they were kept: the order they had).
    ``Mixture.mismatch`` says why one was not taken on a mixture.
    """

    split: str
    seed: int
    batch_size: int
    sources: tuple
    step: int
    version: int = MIXTURE_POSITION_VERSION
    labels: str = ""  # Mixture.labels_digest(); "" in positions written before it was kept
    canonical: int = 1

    @property
    def global_step(self) -> int:
        return self.step

    @classmethod
    def from_json(cls, text: "str | bytes") -> "MixturePosition":
        """The position ``to_json`` wrote; ``ValueError`` naming what is wrong with anything else."""
        try:
            raw = json.loads(text)
            missing = sorted({field.name for field in dataclasses.fields(cls)
                              if field.name not in ("labels", "canonical")} - set(raw))
            if missing:
                raise ValueError(f"not a mixture position: it has no {', '.join(missing)}")
            if raw["version"] != MIXTURE_POSITION_VERSION:
                raise ValueError(f"mixture position version {raw['version']!r}; this reader reads "
                                 f"{MIXTURE_POSITION_VERSION}")
            raw["sources"] = tuple(tuple(source) for source in raw["sources"])
            return cls(**raw)
        except (TypeError, AttributeError, KeyError, json.JSONDecodeError) as err:
            raise ValueError(f"not a mixture position: {err}") from None
