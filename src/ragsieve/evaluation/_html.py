"""The one skeleton of ragsieve's HTML pages: inline CSS, escaped text, no network, no script.

Every page ragsieve writes (``report``, ``evaluate --html``, ``answers --html``) is built
from these pieces. A page is one file: figures are inline base64 PNGs, the style sheet is
inline, and a Content-Security-Policy forbids every fetch and every script, so an
untrusted snippet can never run code or reach the network even if it were not escaped
(it always is: :func:`esc`). A figure of several panels is shown one image per panel, each
at its own size (:func:`panel_figures`), so its text is never shrunk to fit the page.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import atomic_write_text

if TYPE_CHECKING:
    from .plots import Panel

__all__ = ["esc", "fmt", "page", "panel_figures", "table", "write_page"]

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
"""The page's Content-Security-Policy: inline style and ``data:`` images only."""

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:1.2em 1.5em;color:#1b1f24;background:#fff}
h1{font-size:1.5em;margin:.2em 0 .4em}h2{font-size:1.2em;margin:1.6em 0 .5em;
border-bottom:1px solid #d0d7de;padding-bottom:.2em}h3{font-size:1em;margin:.2em 0}
.guarantee{background:#f0f7ff;border-left:4px solid #0969da;padding:.6em 1em;margin:.6em 0}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em;margin:.6em 0}
dl.facts dt{font-weight:600;color:#57606a}dl.facts dd{margin:0;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #d0d7de;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
img.figure{max-width:100%;height:auto;border:1px solid #d0d7de}
div.figures{display:flex;flex-wrap:wrap;gap:.8em 1em;align-items:flex-start;margin:.6em 0}
div.figures figure{margin:0;max-width:100%}
section.query{border:1px solid #d0d7de;border-radius:6px;padding:.4em .9em;margin:.5em 0}
section.query.miss{border-color:#cf222e;border-left-width:4px}
section.query summary{cursor:pointer;padding:.15em 0}
section.query summary h3{display:inline;margin-right:.5em}
section.query summary .muted{font-size:.9em}
.missed{font-size:.8em;font-weight:600;padding:0 .4em;border-radius:3px;background:#cf222e;
color:#fff;margin-right:.5em}
ul.kept,ul.removed{list-style:none;padding:0;margin:.3em 0}
ul.kept li,ul.removed li{padding:.3em .5em;margin:.2em 0;border-radius:4px;overflow-wrap:anywhere}
ul.kept li{background:#dafbe1}ul.removed li{background:#ffebe9;color:#3b3b3b}
ul.removed li[data-label=relevant]{box-shadow:inset 4px 0 #cf222e}
ul.kept li.sentences,ul.removed li.sentences{background:#f6f8fa;color:inherit}
.sentence{display:block;padding:.15em .5em;margin:.2em 0;border-radius:3px;border-left:4px solid}
.sentence.kept{background:#dafbe1;border-color:#1a7f37}
.sentence.removed{background:#ffebe9;border-color:#cf222e;color:#3b3b3b}
.score{font-variant-numeric:tabular-nums;font-weight:600;margin-right:.5em}
.p-value{font-variant-numeric:tabular-nums;color:#555;margin-right:.5em}
.label{font-size:.8em;padding:0 .35em;border-radius:3px;background:#eaeef2;margin-right:.4em}
.muted{color:#57606a}.note{color:#9a6700}pre{background:#f6f8fa;padding:.6em;overflow:auto;
font-size:.85em}
"""


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|inf|nan)")


def esc(value: Any) -> str:
    """``value`` as HTML text (``<``, ``>``, ``&`` and both quotes escaped)."""
    return html.escape(str(value), quote=True)


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell: ``-`` for None, ``inf``/``nan`` spelled out."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}f}"
    return str(value)


def page(title: str, body: str) -> str:
    """A whole HTML document around ``body`` (already HTML) with the shared style sheet."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{esc(CSP)}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n{body}\n</body>\n</html>\n"
    )


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, cls: str = "") -> str:
    """An HTML table; every cell is escaped, numbers right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            text = fmt(cell) if not isinstance(cell, str) else cell
            num = (isinstance(cell, (int, float)) and not isinstance(cell, bool)) or bool(
                _NUMBER.fullmatch(text))
            cells.append(f"<td class=\"num\">{esc(text)}</td>" if num else f"<td>{esc(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    klass = f" class=\"{esc(cls)}\"" if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def panel_figures(panels: Sequence[Panel], caption: str = "") -> str:
    """The panels of a figure side by side as they fit, one ``<figure class="panel"
    data-panel=...>`` each, shown at its own size (:attr:`Panel.css_size`, never wider
    than the page), and the caption under all of them."""
    items = []
    for panel in panels:
        width, height = panel.css_size
        data = base64.b64encode(panel.png).decode("ascii")
        items.append(f"<figure class=\"panel\" data-panel=\"{esc(panel.name)}\"><img "
                     f"class=\"figure\" alt=\"{esc(panel.alt)}\" width=\"{width}\" "
                     f"height=\"{height}\" src=\"data:image/png;base64,{data}\"></figure>")
    cap = f"<p class=\"muted figure-caption\">{esc(caption)}</p>" if caption else ""
    return f"<div class=\"figures\">{''.join(items)}</div>{cap}"


def write_page(text: str, path: str | os.PathLike[str]) -> Path:
    """Write a page with the one writer of finished files
    (:func:`ragsieve._io.atomic_write_text`: a regular file is replaced atomically, a
    character device or a FIFO written in place, a block device or a socket refused).

    Returns
    -------
    pathlib.Path
        The written file.
    """
    return atomic_write_text(path, text)
