"""What the commands print: strict JSON, notes on stderr, one-line messages."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["choice_lines", "dumps", "eprint", "one_line"]


def _finite(obj: Any) -> Any:
    """Replace inf/nan floats by None so the output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return _finite(obj.item())
    if hasattr(obj, "tolist"):  # numpy arrays
        return _finite(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON (inf/nan become null, numpy values plain numbers)."""
    return json.dumps(_finite(obj), default=_json_default, ensure_ascii=False, **kw)


def eprint(*parts: Any) -> None:
    """Print to stderr (progress and notes; results go to stdout)."""
    print(*parts, file=sys.stderr)


def one_line(text: Any) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def choice_lines(choice: dict[str, Any]) -> list[str]:
    """``score: fused (best) - whole lists ...``, ``reader: not tried: ...`` (when ``auto``
    asked whether to fuse the reader), ``reranker: fused: ...`` (when it asked about the
    user's reranker) and ``model: ... - language ru (...)``, or
    ``model: ... - queries en, snippets de (...)`` for queries in another language."""
    score = choice["score"]
    lines = [f"score: {score.get('label', score['scorer'])} - {score['reason']}"]
    if score.get("reader"):
        lines.append(f"reader: {score['reader']}")
    if score.get("rerank"):
        lines.append(f"reranker: {score['rerank']['reason']}")
    lang = choice["language"]
    code, query = lang["code"], lang.get("query_code") or lang["code"]
    said = f"queries {query}, snippets {code}" if query != code else f"language {code}"
    where = (f"{said} ({lang['source']})" if code else
             f"language {lang['source'] or 'not detected'}")
    lines.append(f"model: {choice['model']} - {where}" if choice["model"] else where)
    return lines
