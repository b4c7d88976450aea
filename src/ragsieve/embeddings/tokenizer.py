"""The tokenizer of an ONNX-run model, without importing ``transformers`` on every load.

Loading a Hugging Face tokenizer through ``transformers.AutoTokenizer`` costs about 2.4 s
per process on a 2-core machine (importing ``transformers``), more than the ONNX session
itself. A fast tokenizer is a ``tokenizers`` object inside: :func:`load_tokenizer` saves
that object once, as ``transformers`` configured it (normaliser, special tokens, pad
token), to the ONNX cache, and later processes run it with ``tokenizers`` alone.

The saved file is named after a digest of the model's tokenizer files, so a changed
tokenizer is saved again and never read stale. A model with no fast tokenizer keeps
``transformers`` (:class:`_TransformersTokenizer`). Both give the same ``input_ids``,
``attention_mask`` and ``token_type_ids``: right padding to the longest text of the batch
and ``longest_first`` truncation at ``max_length``, as ``tokenizer(texts, padding=True,
truncation=True, max_length=...)`` does (``tests/test_embeddings_onnx.py`` compares them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_text
from .._optional import require
from .._paths import cache_dir

__all__ = ["Tokenize", "load_tokenizer", "saved_tokenizer_path"]

logger = logging.getLogger(__name__)

#: ``texts -> {"input_ids", "attention_mask", "token_type_ids"}`` as int64 arrays.
Tokenize = Callable[[list[str]], dict[str, np.ndarray]]

#: The files of a Hugging Face model directory that decide its tokenizer.
_SOURCES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "vocab.txt", "added_tokens.json")
#: Bumped when the saved layout changes.
_FORMAT = 1


def saved_tokenizer_path(model_id: str, model_path: str | os.PathLike[str]) -> Path:
    """Where the fast tokenizer of ``model_path`` is saved (``cache_dir()/onnx/…``).

    Parameters
    ----------
    model_id : str
        Identifier of the model (names the file).
    model_path : str or os.PathLike
        The model directory; a digest of its tokenizer files is part of the name.

    Returns
    -------
    pathlib.Path
        ``cache_dir() / "onnx" / f"{model_id}-{digest}.tokenizer.json"``.
    """
    digest = hashlib.sha256(f"format {_FORMAT}".encode())
    for name in _SOURCES:
        try:
            data = (Path(model_path) / name).read_bytes()
        except OSError:
            continue
        digest.update(f"\0{name}\0{len(data)}\0".encode())
        digest.update(data)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_id).strip(".") or "model"
    return cache_dir() / "onnx" / f"{safe}-{digest.hexdigest()[:16]}.tokenizer.json"


def load_tokenizer(model_path: str, model_id: str, *, max_length: int) -> Tokenize:
    """The tokenizer of ``model_path``: the saved fast one when there is one, else saved now.

    Parameters
    ----------
    model_path : str
        Local directory of the model's Hugging Face tokenizer.
    model_id : str
        Identifier of the model (names the saved file).
    max_length : int
        Tokens per text; longer texts are truncated.

    Returns
    -------
    Tokenize
        ``texts -> {"input_ids", "attention_mask", "token_type_ids"}`` (int64 arrays,
        padded to the longest text).
    """
    saved = saved_tokenizer_path(model_id, model_path)
    loaded = _read_saved(saved, max_length)
    if loaded is not None:
        return loaded
    transformers = require("transformers", "embed")
    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    if not getattr(tok, "is_fast", False):
        logger.info("%s has no fast tokenizer: tokenizing with transformers", model_path)
        return _TransformersTokenizer(tok, max_length)
    try:
        atomic_write_text(saved, json.dumps({
            "format": _FORMAT, "tokenizer": tok.backend_tokenizer.to_str(),
            "pad_id": tok.pad_token_id, "pad_token": tok.pad_token,
            "pad_type_id": tok.pad_token_type_id, "padding_side": tok.padding_side,
            "truncation_side": tok.truncation_side}))
    except OSError as exc:  # a read-only cache: tokenize with transformers this time
        logger.warning("could not save the tokenizer to %s (%s): tokenizing with "
                       "transformers", saved, exc)
        return _TransformersTokenizer(tok, max_length)
    loaded = _read_saved(saved, max_length)
    return loaded if loaded is not None else _TransformersTokenizer(tok, max_length)


def _read_saved(path: Path, max_length: int) -> Tokenize | None:
    """The saved fast tokenizer at ``path``, or None when it is missing or unusable."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable saved tokenizer %s (%s)", path, exc)
        return None
    tokenizers = require("tokenizers", "embed")
    try:
        if payload.get("format") != _FORMAT or payload.get("pad_id") is None:
            raise ValueError(f"format {payload.get('format')!r}, pad id {payload.get('pad_id')!r}")
        tok = tokenizers.Tokenizer.from_str(payload["tokenizer"])
        tok.no_padding()
        tok.no_truncation()
        tok.enable_truncation(max_length, strategy="longest_first",
                              direction=payload["truncation_side"])
        tok.enable_padding(direction=payload["padding_side"], pad_id=int(payload["pad_id"]),
                           pad_type_id=int(payload["pad_type_id"]),
                           pad_token=str(payload["pad_token"]))
    except Exception as exc:  # noqa: BLE001 - anything unusable: save it again
        logger.warning("ignoring unusable saved tokenizer %s (%s)", path, exc)
        return None
    return _FastTokenizer(tok)


class _FastTokenizer:
    """A configured ``tokenizers.Tokenizer`` (padding and truncation set)."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        encodings = self._tok.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }


class _TransformersTokenizer:
    """A ``transformers`` tokenizer called as the fast one is."""

    def __init__(self, tok: Any, max_length: int) -> None:
        self._tok = tok
        self._max_length = max_length

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        enc = self._tok(texts, padding=True, truncation=True, max_length=self._max_length,
                        return_tensors="np")
        return {name: np.asarray(enc[name], dtype=np.int64)
                for name in ("input_ids", "attention_mask", "token_type_ids") if name in enc}
