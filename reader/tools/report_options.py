"""What the report shows of the samples it draws: :class:`ReportOptions` (beside the report, not the reader's options).

In:  the caller's choices (``python -m converter report``'s flags, or ``write_report``'s ``options``).
Out: a frozen, checked :class:`ReportOptions`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """What the page shows of the samples it draws (the figures always count every record).

    Attributes:
      per_class: tiles of a class's contact sheet.
      max_sheet_classes: classes given a contact sheet (the first, by id; a page of 1,000 sheets helps nobody).
      tile: pixels of a tile's image side.
      rejections_shown: rejections shown with their thumbnail.
      duplicate_groups_shown: groups shown per kind (exact, near) and scope (within a split, across splits).
      thumb: pixels of a thumbnail's longer side.
      masks_read: a segmentation dataset's masks decoded to find records of each class for the contact sheets
        (the first ones, until every sheet is full; the figures never decode a mask).
    """

    per_class: int = 6
    max_sheet_classes: int = 48
    tile: int = 160
    rejections_shown: int = 6
    duplicate_groups_shown: int = 6
    thumb: int = 128
    masks_read: int = 500

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ValueError(f"ReportOptions.{field.name} must be at least 1, not {getattr(self, field.name)}")
