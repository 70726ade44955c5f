"""Where a run over a mixture is: :class:`MixturePosition`, a global step and what the mixture's order depends on.

Data in: what ``Mixture.position`` gives (``reader/mixture.py``), or the JSON ``to_json`` wrote. Data out:
the position, a few hundred bytes of JSON, the same on every host; ``Mixture.mismatch`` says why one was
not taken on a mixture. Kept apart from the plan so that the plan's module stays one subject.
"""

from __future__ import annotations

import dataclasses
import json

MIXTURE_POSITION_VERSION = 1


@dataclasses.dataclass(frozen=True)
class MixturePosition:
    """Where a run over a mixture is: its global step and what the order depends on, as a few hundred bytes of JSON.

    ``sources``: per source (name, version, weight, streams, window). ``canonical``: the mixture's
    canonical pipelines (1 in positions written before they were kept: the order they had).
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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

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
