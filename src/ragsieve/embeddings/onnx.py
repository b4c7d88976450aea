"""ONNX Runtime backend for mean-pooled sentence-transformers models (extra ``onnx``).

:func:`load_onnx_model` exports a sentence-transformers model once with
``torch.onnx.export`` (TorchScript exporter, opset 17), with the mean pooling and the
L2 normalisation inside the graph, and runs it with ONNX Runtime on CPU. The file is
written atomically to ``cache_dir() / "onnx" / f"{model_id}-fp32.onnx"`` and reused on
later loads; ``int8=True`` adds a dynamically quantised copy
(``quantize_dynamic``, per-channel QInt8 weights, ``…-int8.onnx``).

fp32 ONNX gives the torch vectors (docs/results.md has the comparison); int8
moves vectors, so it is opt-in and has its own ``model_id``.
The export itself needs torch and sentence-transformers (extra ``embed``); running a
file that was already exported needs only onnxruntime and ``tokenizers``: the model's
fast tokenizer is saved beside the graph once (:mod:`ragsieve.embeddings.tokenizer`), so
a load imports neither ``onnx`` nor ``transformers``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._optional import require
from .._paths import cache_dir
from .._validation import check_int, check_path, check_str
from .base import EmbeddingModel, _normalise_rows
from .tokenizer import load_tokenizer

__all__ = ["OnnxEmbeddingModel", "load_onnx_model", "onnx_path"]

logger = logging.getLogger(__name__)

_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_OUTPUT = "sentence_embedding"
#: Bumped when the exported graph changes, so older files are re-exported.
_FORMAT = "1"
_EXPORT_LOCK = threading.Lock()


def onnx_path(model_id: str, *, int8: bool = False) -> Path:
    """Where the exported graph of ``model_id`` lives (``cache_dir()/onnx/…``).

    Parameters
    ----------
    model_id : str
        Identifier of the source model, e.g. ``"all-MiniLM-L6-v2"``.
    int8 : bool
        The quantised file instead of the fp32 one.

    Returns
    -------
    pathlib.Path
        ``cache_dir() / "onnx" / f"{model_id}-{fp32|int8}.onnx"`` (characters outside
        ``[A-Za-z0-9._-]`` in ``model_id`` become ``_``).
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_id).strip(".") or "model"
    return cache_dir() / "onnx" / f"{safe}-{'int8' if int8 else 'fp32'}.onnx"


def _max_seq_length(model_path: str) -> int | None:
    try:
        with open(os.path.join(model_path, "sentence_bert_config.json"), encoding="utf-8") as f:
            value = json.load(f).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


def _session_options(threads: int | None) -> Any:
    """ONNX Runtime session options: ``threads`` intra-op threads (None: ``OMP_NUM_THREADS``
    when set, else one per core), one inter-op thread, no spinning."""
    ort = require("onnxruntime", "onnx")
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.inter_op_num_threads = 1
    if threads is None:  # the standard variable process managers (Ray, k8s jobs) set
        threads = _omp_threads()
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


def _open_checked(path: Path, expected: dict[str, str], threads: int | None) -> Any | None:
    """The ONNX Runtime session of the file at ``path`` when it holds the ``expected``
    ragsieve metadata; None when it is missing, unloadable or stale (export it again).

    The session is the one the model then runs (the file is loaded once), and reading its
    metadata needs no ``onnx`` import."""
    if not path.is_file():
        return None
    ort = require("onnxruntime", "onnx")
    try:
        session = ort.InferenceSession(str(path), sess_options=_session_options(threads),
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any load failure: export again
        logger.warning("ignoring unusable ONNX file %s (%s)", path, exc)
        return None
    meta = dict(session.get_modelmeta().custom_metadata_map)
    stale = {k: (meta.get(k), v) for k, v in expected.items() if meta.get(k) != v}
    if stale:
        logger.info("re-exporting %s: metadata differs %s", path, stale)
        return None
    return session


def _write_atomically(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` then move the file to ``path`` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp.onnx", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _set_metadata(tmp: str, meta: dict[str, str]) -> None:
    onnx = require("onnx", "onnx")
    model = onnx.load(tmp)
    del model.metadata_props[:]
    for key, value in meta.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, tmp)


def _export_fp32(model_path: str, dst: Path, meta: dict[str, str]) -> None:
    torch = require("torch", "embed")
    st = require("sentence_transformers", "embed")
    model = st.SentenceTransformer(model_path, device="cpu")
    modules = list(model)
    pooling = modules[1] if len(modules) > 1 else None
    mode = getattr(pooling, "pooling_mode", None)  # sentence-transformers >= 6
    if isinstance(mode, str):
        mean = mode == "mean"
    else:  # older releases: one boolean per mode
        flags = {
            name: bool(getattr(pooling, name, False))
            for name in ("pooling_mode_mean_tokens", "pooling_mode_cls_token",
                         "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                         "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
        }
        mean = flags.pop("pooling_mode_mean_tokens") and not any(flags.values())
    tail = [type(m).__name__ for m in modules[2:]]
    if not mean or any(name != "Normalize" for name in tail):
        raise ValueError(
            f"the ONNX backend supports Transformer + mean Pooling (+ Normalize) "
            f"sentence-transformers models; {model_path!r} has modules "
            f"{[type(m).__name__ for m in modules]}. Use backend='torch' for it."
        )
    hf = modules[0].auto_model.eval()

    class Pooled(torch.nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.m = hf

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            h = self.m(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(h.dtype)
            emb = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(emb, p=2, dim=1)

    enc = model.tokenizer(
        ["hello world", "a slightly longer example sentence"], padding=True, return_tensors="pt"
    )
    if "token_type_ids" not in enc:
        raise ValueError(
            f"the tokenizer of {model_path!r} gives no token_type_ids; the ONNX backend "
            "supports BERT-style models only. Use backend='torch' for it."
        )
    args = tuple(enc[name] for name in _INPUTS)
    axes = {name: {0: "batch", 1: "seq"} for name in _INPUTS} | {_OUTPUT: {0: "batch"}}

    def write(tmp: str) -> None:
        import warnings

        with torch.no_grad(), warnings.catch_warnings():
            # The TorchScript exporter warns (deprecation, tracer); the output is exact.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Pooled().eval(), args, tmp, dynamo=False, input_names=list(_INPUTS),
                output_names=[_OUTPUT], dynamic_axes=axes, opset_version=17,
                do_constant_folding=True,
            )
        _set_metadata(tmp, meta)

    logger.info("exporting %s to ONNX at %s", model_path, dst)
    _write_atomically(dst, write)


def _quantize(src: Path, dst: Path, meta: dict[str, str]) -> None:
    quant = require("onnxruntime.quantization", "onnx")

    def write(tmp: str) -> None:
        # per_channel=True is required: per-tensor weights drop cosine to torch to ~0.9.
        quant.quantize_dynamic(
            str(src), tmp, weight_type=quant.QuantType.QInt8, per_channel=True
        )
        _set_metadata(tmp, meta)

    logger.info("quantising %s to int8 at %s", src, dst)
    _write_atomically(dst, write)


class OnnxEmbeddingModel(EmbeddingModel):
    """A sentence embedding graph run by ONNX Runtime (built by :func:`load_onnx_model`).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.onnx`` file (inputs ``input_ids``, ``attention_mask``, ``token_type_ids``;
        output ``sentence_embedding``, already pooled and normalised).
    tokenizer_path : str
        Directory holding the model's Hugging Face tokenizer (run with ``tokenizers``
        once saved: :func:`~ragsieve.embeddings.tokenizer.load_tokenizer`).
    model_id : str
        Identity of the model (recorded in artifacts and indexes).
    cache_id : str, optional
        Key of its vectors in the embedding cache (default ``model_id``); names the
        backend (``…@onnx``), so two backends never mix vectors.
    session : onnxruntime.InferenceSession, optional
        The session of ``path``, opened already (:func:`load_onnx_model` opens it to read
        its metadata); None opens one.
    max_length : int
        Tokens per text; longer texts are truncated, as sentence-transformers does.
    threads : int or None
        ONNX Runtime intra-op threads; None takes ``OMP_NUM_THREADS`` when it is set (as
        Ray sets it for an actor's CPUs, so actors sharing a machine do not oversubscribe
        it), else lets ONNX Runtime pick (one per core).

    Notes
    -----
    Thread spinning is switched off (``session.intra_op.allow_spinning = 0``): with
    spinning on, a run sharing a busy CPU with torch or the LLM child stalled for minutes.
    """

    #: Texts per forward pass inside :meth:`embed_batch` (after sorting by length).
    max_batch_size: int = 32

    def __init__(
        self,
        path: str | os.PathLike[str],
        tokenizer_path: str,
        *,
        model_id: str,
        max_length: int,
        threads: int | None = None,
        cache_id: str | None = None,
        session: Any = None,
    ) -> None:
        threads = check_int(threads, "threads", min_value=1, allow_none=True)
        self.path = Path(path)
        if session is None:
            ort = require("onnxruntime", "onnx")
            session = ort.InferenceSession(str(self.path), sess_options=_session_options(threads),
                                           providers=["CPUExecutionProvider"])
        self._session = session
        self.max_length = int(max_length)
        self._tokenize = load_tokenizer(tokenizer_path, model_id.split("@")[0],
                                        max_length=self.max_length)
        self.model_id = model_id
        self.cache_id = cache_id or model_id
        self.dim = int(self._run([""]).shape[1])

    def _run(self, texts: list[str]) -> np.ndarray:
        enc = self._tokenize(texts)
        feed = {name: enc[name] for name in _INPUTS}
        (out,) = self._session.run([_OUTPUT], feed)
        return np.asarray(out, dtype=np.float32)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; see :meth:`EmbeddingModel.embed_batch`.

        Texts are sorted by length and run ``max_batch_size`` at a time, so that short
        texts are not padded to the longest one; rows come back in input order.
        """
        texts = list(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), self.max_batch_size):
            idx = order[start : start + self.max_batch_size]
            out[idx] = self._run([texts[i] for i in idx])
        return _normalise_rows(out)


def load_onnx_model(
    model_path: str,
    model_id: str,
    *,
    int8: bool = False,
    threads: int | None = None,
) -> EmbeddingModel:
    """A sentence-transformers model run by ONNX Runtime, exported once and cached.

    Parameters
    ----------
    model_path : str
        Local directory of a sentence-transformers model with a BERT-style transformer,
        mean pooling and (optionally) L2 normalisation, e.g. the bundled MiniLM.
    model_id : str
        Identifier of the source model. fp32: the returned model keeps it as ``model_id``
        (its vectors are the torch ones) and caches under ``f"{model_id}@onnx"``; int8:
        both are ``f"{model_id}@onnx-int8"``. Either way embedding caches never
        mix vectors of different backends.
    int8 : bool
        Run the dynamically quantised graph (per-channel QInt8 weights): faster than
        fp32 ONNX, vectors close to but not the torch ones.
    threads : int or None
        ONNX Runtime intra-op threads; None lets ONNX Runtime choose.

    Returns
    -------
    EmbeddingModel
        An :class:`OnnxEmbeddingModel`.

    Raises
    ------
    ImportError
        When onnxruntime is missing (extra ``onnx``); when the graph has to be exported
        and onnx (extra ``onnx``) or torch / sentence-transformers (extra ``embed``) are
        missing.
    ValueError
        When the model is not a mean-pooled BERT-style sentence-transformers model.
    """
    check_path(model_path, "model_path")
    check_str(model_id, "model_id", non_blank=True)
    threads = check_int(threads, "threads", min_value=1, allow_none=True)
    require("onnxruntime", "onnx")
    model_path = str(model_path)
    max_length = _max_seq_length(model_path)
    fp32 = onnx_path(model_id)
    meta = {"ragsieve.format": _FORMAT, "ragsieve.source_model_id": model_id}
    fp32_meta = meta | {"ragsieve.precision": "fp32"}
    path, wanted = (onnx_path(model_id, int8=True), meta | {"ragsieve.precision": "int8"}) \
        if int8 else (fp32, fp32_meta)
    with _EXPORT_LOCK:
        session = _open_checked(path, wanted, threads)  # the file it runs, loaded once
        if session is None:
            if not int8 or _open_checked(fp32, fp32_meta, 1) is None:
                _export_fp32(model_path, fp32, fp32_meta)
            if int8:
                _quantize(fp32, path, wanted)
    if max_length is None:
        max_length = 512
        logger.warning("no max_seq_length in %s; truncating at %d tokens", model_path, max_length)
    return OnnxEmbeddingModel(
        path,
        model_path,
        # fp32 gives the torch vectors (cosine 1 - 1e-7), so it keeps the model's identity
        # (artifacts and indexes stay valid) and only the cache key names the backend;
        # int8 moves the vectors and is a model of its own
        model_id=f"{model_id}@onnx-int8" if int8 else model_id,
        cache_id=f"{model_id}@onnx-int8" if int8 else f"{model_id}@onnx",
        max_length=max_length,
        threads=threads,
        session=session,
    )


def _omp_threads() -> int | None:
    """``OMP_NUM_THREADS`` as a positive int, or None when unset or not one."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) >= 1:
        return int(value)
    return None

