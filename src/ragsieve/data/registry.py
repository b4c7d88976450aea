"""Load a dataset by name: ``"xquad-en"``, ``"xquad-en2de"``, ``"selqa-dev"``, or a
``.jsonl`` path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ragsieve.data.jsonl import read_pairs
from ragsieve.data.selqa import SELQA_SPLITS, load_selqa
from ragsieve.data.xquad import XQUAD_LANGUAGES, load_xquad
from ragsieve.errors import DataError
from ragsieve.types import Pair

__all__ = ["available_datasets", "load_dataset", "xquad_languages"]


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_dataset` (besides a path to a ``.jsonl`` file).

    The cross-language names listed are English questions over another language's
    articles (``xquad-en2de``); ``xquad-{q}2{c}`` works for any two XQuAD languages.
    """
    return (
        ["xquad"]
        + [f"xquad-{lang}" for lang in XQUAD_LANGUAGES]
        + [f"xquad-en2{lang}" for lang in XQUAD_LANGUAGES if lang != "en"]
        + ["selqa"]
        + [f"selqa-{split}" for split in SELQA_SPLITS]
    )


def xquad_languages(variant: str) -> tuple[str, str] | None:
    """``(query_language, language)`` of an XQuAD dataset name's variant (``"de"`` ->
    ``("de", "de")``, ``"en2de"`` -> ``("en", "de")``), None when it names none.

    Examples
    --------
    >>> xquad_languages("en2de"), xquad_languages("zh"), xquad_languages("en2fr")
    (('en', 'de'), ('zh', 'zh'), None)
    """
    query, cross, language = variant.partition("2")
    if not cross:
        language = query
    if query in XQUAD_LANGUAGES and language in XQUAD_LANGUAGES:
        return query, language
    return None


def load_dataset(name: str | os.PathLike[str], **kwargs: Any) -> list[Pair]:
    """Load labelled pairs by dataset name or from a JSONL file.

    Parameters
    ----------
    name : str or os.PathLike
        ``"xquad"`` (English), ``"xquad-{language}"``, ``"xquad-{q}2{language}"`` (the
        questions of language ``q`` over the articles of ``language``, e.g.
        ``"xquad-en2de"``; see :func:`~ragsieve.data.xquad.load_xquad`), ``"selqa"`` (dev),
        ``"selqa-{split}"`` (case-insensitive), or the path of a file in the generic
        JSONL format (any existing file, or a name ending in ``.jsonl``).
    **kwargs
        Passed on to :func:`~ragsieve.data.xquad.load_xquad` (``data_dir``,
        ``context``, ``chunker``, ``download``), :func:`~ragsieve.data.selqa.load_selqa`
        (``data_dir``, ``chunker``, ``download``), a Parquet file or a directory of
        JSONL / Parquet files (a ragsieve output directory: its finished parts) or
        :func:`~ragsieve.data.jsonl.read_pairs` (``require_labels``), and
        ``score_field``: a numeric field every pair must carry (an outside score).

    Returns
    -------
    list of Pair

    Raises
    ------
    ValueError
        For an unknown name; the message lists the accepted names.
    DataError
        When the data cannot be found or read.

    Notes
    -----
    To export a dataset to the generic format:
    ``write_pairs(load_dataset("xquad-en"), "xquad-en.jsonl")``.
    """
    text = os.fspath(name)
    score_field = kwargs.pop("score_field", None)
    if not isinstance(name, os.PathLike):
        key = text.strip().lower()
        key = {"xquad": "xquad-en", "selqa": "selqa-dev"}.get(key, key)
        family, _, variant = key.partition("-")
        languages = xquad_languages(variant) if family == "xquad" else None
        if languages is not None:
            fixed = [k for k in ("language", "query_language") if k in kwargs]
            if fixed:
                raise TypeError(f"dataset {text!r} fixes the languages; do not pass "
                                f"{'= or '.join(fixed)}=.")
            query_language, language = languages
            return _with_field(load_xquad(language, query_language=query_language, **kwargs),
                               text, score_field)
        if family == "selqa" and variant in SELQA_SPLITS:
            if "split" in kwargs:
                raise TypeError(f"dataset {text!r} fixes the split; do not pass split=.")
            return _with_field(load_selqa(variant, **kwargs), text, score_field)
    path = Path(text)
    if path.is_dir() or path.suffix.lower() == ".parquet":
        from .jsonl import _Consistency
        from .shards import iter_input_pairs

        pairs = list(iter_input_pairs([path], score_field=score_field, **kwargs))
        consistency = _Consistency()  # across shards and files, as for one JSONL file
        for i, pair in enumerate(pairs, start=1):
            consistency.check(pair, f"{text}: pair #{i}")
        if not pairs:
            raise DataError(f"{text}: holds no pairs.")
        return pairs
    if (
        isinstance(name, os.PathLike)
        or text == "-"
        or text.endswith(".jsonl")
        or Path(text).is_file()
    ):
        return read_pairs(text, score_field=score_field, **kwargs)
    raise ValueError(
        f"dataset == {text!r}, must be one of {', '.join(available_datasets())}, "
        "or a path to a JSONL file."
    )


def _with_field(pairs: list[Pair], name: str, score_field: str | None) -> list[Pair]:
    """Built-in datasets carry no outside score: refuse a score field they lack."""
    if score_field is not None and any(score_field not in p.meta for p in pairs):
        raise DataError(
            f"dataset {name!r} has no {score_field!r} field; an outside score needs a JSONL "
            "file that carries it on every line."
        )
    return pairs
