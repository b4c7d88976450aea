"""The text an index reads from a documents folder: which files, their documents, snippets.

``.txt`` and ``.md`` files are read as they are, ``.html`` / ``.htm`` as their visible text
(:func:`html_to_text`, the stdlib parser), and a ``.jsonl`` line is one document with
``"text"`` and an optional ``"id"``. Symlinks to files are read; symlinks to directories,
loops, dangling links, FIFOs and other non-regular files are listed as skipped, never
opened.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from html.parser import HTMLParser
from pathlib import Path

from ..chunking import chunk_text
from ..errors import DataError
from ..types import Snippet

__all__ = ["SUPPORTED_SUFFIXES", "file_snippets", "html_to_text", "scan_directory"]

SUPPORTED_SUFFIXES = (".txt", ".md", ".html", ".htm", ".jsonl")


class _TextExtractor(HTMLParser):
    """Visible text of an HTML document (script/style dropped, blocks on new lines)."""

    _SKIP = frozenset({"script", "style", "head", "title", "noscript", "template"})
    _BLOCK = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section",
              "article", "pre", "blockquote", "table", "ul", "ol", "hr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skip_depth += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of ``html`` with the stdlib parser (no external dependency)."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def _read_docs(path: Path, rel: str, raw: bytes) -> list[tuple[str, str]]:
    """``(doc_id, text)`` of a file; raises ``DataError`` when it cannot be used."""
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        return [(rel, html_to_text(content))]
    if suffix != ".jsonl":
        return [(rel, content)]
    docs = []
    for lineno, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"line {lineno} is not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise DataError(f'line {lineno} has no string "text" field')
        doc_id = obj.get("id")
        docs.append((str(doc_id) if doc_id is not None else f"{rel}#{lineno}", obj["text"]))
    return docs


_LINKED_DIR = "symlink to a directory (not followed)"
_FILE_KINDS = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
               (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


def scan_directory(root: Path, index_root: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """The files below ``root`` to index (supported, readable, outside the index itself) and
    the entries skipped with their reasons (relative path, reason)."""
    skipped: list[tuple[str, str]] = []
    paths = []
    for p in sorted(root.rglob("*")):
        supported = p.suffix.lower() in SUPPORTED_SUFFIXES
        if not supported and not p.is_symlink():
            continue
        reason = _not_indexable(p)
        if reason is None:
            if supported and index_root not in p.resolve().parents:
                paths.append(p)
        elif reason and (supported or reason == _LINKED_DIR):
            skipped.append((p.relative_to(root).as_posix(), reason))
    return paths, skipped


def file_snippets(path: Path, rel: str, known_sha: str | None, size: int,
                   overlap: int) -> tuple[str, list[Snippet] | None]:
    """A file's SHA-256 and its snippets (None when the index holds it with that hash).

    Raises
    ------
    DataError
        The file cannot be read, or holds no text to index (the reason it is skipped).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"unreadable: {exc.strerror or exc}") from exc
    sha = hashlib.sha256(raw).hexdigest()
    if known_sha == sha:
        return sha, None
    snippets: list[Snippet] = []
    for doc_id, text in _read_docs(path, rel, raw):
        if text.strip():
            snippets.extend(chunk_text(text, doc_id, size=size, overlap=overlap))
    if not snippets:
        raise DataError("empty: no text to index")
    return sha, snippets


def _not_indexable(path: Path) -> str | None:
    """Why the directory entry ``path`` cannot be read as a document, without opening it.

    Returns None for a regular file (or a symlink to one), ``""`` for a directory (its
    files are listed by the walk itself), else the reason shown among the skipped files.
    """
    try:
        info = path.stat()  # follows symlinks
    except OSError as exc:
        if not path.is_symlink():
            return f"unreadable: {exc.strerror or exc}"
        if exc.errno == errno.ELOOP:
            return "symlink loop"
        if exc.errno == errno.ENOENT:
            return f"dangling symlink (its target {os.readlink(path)!r} does not exist)"
        return f"unreadable symlink: {exc.strerror or exc}"
    if stat.S_ISREG(info.st_mode):
        return None
    if stat.S_ISDIR(info.st_mode):
        return _LINKED_DIR if path.is_symlink() else ""
    kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "unknown kind")
    return f"not a regular file ({kind})"
