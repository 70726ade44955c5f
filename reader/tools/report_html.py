"""The report as one self-contained HTML page: every image inline as a ``data:`` URI, no script, no network.

In: :class:`Section` values (an id, a title, HTML built with the helpers here: :func:`table`,
:func:`image`, :func:`paragraph`). Out: the page's text. Every piece of text that comes from a dataset
(class names, paths, reasons) is escaped here, so a class named ``<script>`` is shown as written.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
from typing import Iterable, Optional, Sequence

from PIL import Image

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1100px;
       padding: 1em 2em; color: #222; }
nav a { margin-right: 1em; }
section { border-top: 1px solid #ccc; padding-top: .5em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0; font-size: 90%; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; vertical-align: top; margin: 2px; }
figure { display: inline-block; margin: 4px; vertical-align: top; }
figcaption { font-size: 80%; max-width: 260px; overflow-wrap: anywhere; }
.note { color: #666; font-size: 90%; }
.pair { display: inline-block; border: 1px solid #ddd; margin: 4px; padding: 4px; vertical-align: top; }
.pair b { font-size: 85%; }
.pair div { display: flex; align-items: flex-start; }
.pair figcaption { max-width: 150px; }
"""


@dataclasses.dataclass(frozen=True)
class Section:
    """One part of the page: ``<section id=...>`` with a heading; ``body`` is HTML made by this module."""

    id: str
    title: str
    body: str


def escape(text) -> str:
    return html.escape(str(text), quote=True)


def paragraph(text: str, note: bool = False) -> str:
    """Plain ``text`` (escaped) as a paragraph; ``note``: greyed, for what is not there and why."""
    return f'<p{" class=note" if note else ""}>{escape(text)}</p>'


def heading(text: str) -> str:
    return f"<h3>{escape(text)}</h3>"


def table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A table of escaped cells; ints are right-aligned with thousands separators."""
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(_cell(cell) for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{escape(value)}</td>"


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image(png: bytes, alt: str, mime: str = "image/png") -> str:
    """An ``<img>`` holding its bytes."""
    return f'<img src="{data_uri(png, mime)}" alt="{escape(alt)}">'


def picture(thumb: Image.Image, alt: str, caption: Optional[str] = None, quality: int = 85) -> str:
    """A Pillow image inline as a JPEG (photos and tiles: a tenth of a PNG's bytes), with a caption."""
    buffer = io.BytesIO()
    thumb.convert("RGB").save(buffer, format="JPEG", quality=quality)
    tag = image(buffer.getvalue(), alt, "image/jpeg")
    return f"<figure>{tag}<figcaption>{escape(caption)}</figcaption></figure>" if caption is not None else tag


def link(href: str, text: str) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>'


def page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole page: a title, links to each section, then the sections in order."""
    nav = " ".join(f'<a href="#{escape(s.id)}">{escape(s.title)}</a>' for s in sections)
    parts = [f'<section id="{escape(s.id)}"><h2>{escape(s.title)}</h2>{s.body}</section>' for s in sections]
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1><p class=note>{escape(subtitle)}</p>"
            f"<nav>{nav}</nav>{''.join(parts)}</body></html>\n")
