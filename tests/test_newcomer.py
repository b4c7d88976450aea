"""What a newcomer met in the first hour (issue 50, "Hardening IV", items 13-18): the batch
``filter`` says when its queries stop looking exchangeable with the calibration data, the
demo's own example is not suspect, one wording per list-check event, ``--show-removed``
marks the relevant snippets it removed, and ``RAGSIEVE_CACHE`` keeps each cache in its own
folder. (The docs site's search from ``file://`` is tested in tests/test_docs.py.)

Real components throughout: the bundled MiniLM, the shared datasets, the real CLI.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve.cli import main
from ragsieve.lists import ListRecord, ListWatch


def _tiny_pairs(path: Path) -> Path:
    rows = [{"query_id": f"q{q}", "query": f"who wrote book {q}?", "snippet_id": f"s{s}",
             "text": f"Book {s} was written by author {s}.", "relevant": int(q == s)}
            for q in range(2) for s in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------ item 18: RAGSIEVE_CACHE
def test_the_embedding_cache_has_its_own_folder_under_ragsieve_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny_pairs(tmp_path / "pairs.jsonl")
    root = tmp_path / "cache"
    monkeypatch.setenv("RAGSIEVE_CACHE", str(root))
    assert main(["-q", "score", "--data", str(data), "--out", str(tmp_path / "s1.jsonl")]) == 0
    assert (root / "embeddings" / "embeddings.sqlite").is_file()
    assert not (root / "embeddings.sqlite").exists()  # was: the cache's root itself
    # an earlier version's cache, left directly in RAGSIEVE_CACHE: read where it is, said once
    old = tmp_path / "old"
    old.mkdir()
    (root / "embeddings" / "embeddings.sqlite").rename(old / "embeddings.sqlite")
    monkeypatch.setenv("RAGSIEVE_CACHE", str(old))
    with caplog.at_level(logging.WARNING, logger="ragsieve._paths"):
        assert main(["-q", "score", "--data", str(data), "--out", str(tmp_path / "s2.jsonl")]) == 0
    assert not (old / "embeddings").exists() and (old / "embeddings.sqlite").is_file()
    said = [r.getMessage() for r in caplog.records if r.name == "ragsieve._paths"]
    assert len(said) == 1 and all("old place" in m and "mv " in m for m in said)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default $RAGSIEVE_CACHE/embeddings" in text and "onnx/, serve/" in text


# ------------------------------------------------------------------ item 15: one wording per event
def test_the_list_alarm_has_one_wording_in_the_log_and_every_note(
        caplog: pytest.LogCaptureFixture) -> None:
    """The sequential test's alarm fires once; the log said "over the last 10" while the
    notes of the lists after it (``--json``, stdout) said "over the last 50"."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 16, 600)  # calibration: lists of 1-15, about 8 snippets
    qids = [f"q{i}" for i, n in enumerate(lengths) for _ in range(n)]
    watch = ListWatch(ListRecord.from_lists(qids, source={"kind": "data"}, list_dependent=True))
    with caplog.at_level(logging.WARNING, logger="ragsieve.lists"):
        checks = [watch.see(14) for _ in range(80)]  # in range, but always long
    assert watch.alarm and watch.fired_at < 50
    logged = [r.getMessage() for r in caplog.records if r.name == "ragsieve.lists"]
    assert len(logged) == 1
    event = checks[watch.fired_at - 1].note.removesuffix(" (see docs/deploy.md)")
    assert logged[0].startswith(event + "; ")
    assert {c.note for c in checks[watch.fired_at - 1:]} == {watch.alarm_check().note}
    assert f"over the last {watch.fired_at}," in event


# ------------------------------------------------------------------ items 13 and 17: batch filter
@pytest.fixture(scope="module")
def en_filter(tmp_path_factory: pytest.TempPathFactory, xquad_en: list[Any],
              shared_data_dir: Path, embedding_cache_dir: Path) -> dict[str, Path]:
    """A MiniLM filter (alpha 0.1) calibrated on half of the queries of 8 XQuAD-en articles;
    60 held-out English queries of those articles (exchangeable with it) and the same 60 in
    Greek (XQuAD-el: another collection, which the English model tells apart less well), as
    JSONL."""
    from ragsieve import ConformalFilter
    from ragsieve.data import load_xquad, write_pairs
    from ragsieve.scoring import EmbeddingScorer

    root = tmp_path_factory.mktemp("newcomer")
    articles = set(sorted({p.group for p in xquad_en})[:8])
    ids = sorted({p.query_id for p in xquad_en if p.group in articles})
    calibration = set(ids[::2])
    flt = ConformalFilter(EmbeddingScorer(cache_dir=embedding_cache_dir), alpha=0.1)
    flt.calibrate([p for p in xquad_en if p.query_id in calibration])
    out = {"filter": flt.save(root / "filter.json")}
    rng = np.random.default_rng(0)
    held = [str(q) for q in rng.permutation(sorted(set(ids) - calibration))[:60]]
    for name, pairs in (("en", xquad_en), ("el", load_xquad("el", data_dir=shared_data_dir))):
        wanted = {q.replace("xquad-en-", f"xquad-{name}-"): i for i, q in enumerate(held)}
        chosen = sorted((p for p in pairs if p.query_id in wanted),
                        key=lambda p: wanted[p.query_id])  # the same queries, in one order
        write_pairs(chosen, root / f"{name}.jsonl")
        out[name] = root / f"{name}.jsonl"
    return out


def _filter(en_filter: dict[str, Path], data: str, cache: Path, *extra: str) -> list[str]:
    return ["-q", "filter", "--filter", str(en_filter["filter"]), "--data", str(en_filter[data]),
            "--cache-dir", str(cache), *extra]


def test_a_batch_of_another_collection_raises_the_services_alarm_once(
        en_filter: dict[str, Path], embedding_cache_dir: Path,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """Item 13: ``filter --data`` runs the monitor ``serve`` runs, over its queries in their
    order, and says once (stderr) where it fired, the martingale against 1/delta and what to
    do; ``--json`` carries it on the query that fired it."""
    with caplog.at_level(logging.WARNING):
        assert main(_filter(en_filter, "el", embedding_cache_dir)) == 0
    text = capsys.readouterr()
    assert text.err.count("exchangeability alarm") == 1, text.err
    assert not [r for r in caplog.records if "exchangeability alarm" in r.getMessage()]
    line = next(x for x in text.err.splitlines() if "exchangeability alarm" in x)
    assert line.startswith("warning: ") and ">= 1/delta = 100 at query " in line
    assert "of 60 (" in line and "recalibrate on data like these queries" in line
    assert main(_filter(en_filter, "el", embedding_cache_dir, "--json")) == 0
    records = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    fired = [r["exchangeability_alarm"] for r in records if "exchangeability_alarm" in r]
    assert len(fired) == 1
    alarm = fired[0]
    assert records[alarm["fired_at"] - 1]["query_id"] == alarm["query_id"]
    assert alarm["martingale"] >= alarm["threshold"] == 100 and alarm["delta"] == 0.01
    assert alarm["n_queries"] == 60 and f"at query {alarm['fired_at']} of 60" in alarm["message"]


def test_a_batch_like_the_calibration_data_raises_no_alarm(
        en_filter: dict[str, Path], embedding_cache_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_filter(en_filter, "en", embedding_cache_dir, "--json")) == 0
    said = capsys.readouterr()
    assert "exchangeability" not in said.err
    assert not any("exchangeability_alarm" in json.loads(x) for x in said.out.splitlines())


def test_show_removed_marks_the_relevant_snippets_it_removed(
        en_filter: dict[str, Path], embedding_cache_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Item 17: on labelled data, each removed snippet labelled relevant (a miss) is marked."""
    from ragsieve.cli.filtering import MISSED
    from ragsieve.data import read_pairs

    relevant = {(p.query_id, p.snippet_id) for p in read_pairs(en_filter["en"]) if p.relevant}
    assert main(_filter(en_filter, "en", embedding_cache_dir, "--json")) == 0
    records = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    misses = {(r["query_id"], s["snippet_id"]) for r in records for s in r["removed"]
              if (r["query_id"], s["snippet_id"]) in relevant}
    assert misses, "expected a relevant snippet removed at alpha 0.1 over 60 queries"
    assert main(_filter(en_filter, "en", embedding_cache_dir, "--show-removed")) == 0
    lines = capsys.readouterr().out.splitlines()
    marked = [x for x in lines if x.endswith(MISSED)]
    assert len(marked) == len(misses)
    assert all(x.strip().startswith("removed ") for x in marked)
    assert {x.removesuffix(MISSED).split()[-1] for x in marked} == {s for _, s in misses}


# ------------------------------------------------------------------ item 14: the demo's example
def test_the_demos_held_out_lists_are_like_its_calibration_lists(xquad_en: list[Any]) -> None:
    """``make demo`` calibrated on half of XQuAD-en's articles (lists of 8 to 16 snippets) and
    filtered the other half, lists of 6 to 27: its own example warned "a list of 17 snippets,
    outside the calibration lists' 8 to 16". The demo's split now calibrates on every length
    it filters; the list check (lengths: what the warning read) says nothing of the held-out
    lists, seen in the demo's random order."""
    from ragsieve.cli.demos import demo_split
    from ragsieve.keeping import see_lists
    from ragsieve.lists import ListRecord, ListWatch
    from ragsieve.pieces import Pieces, as_items

    cal, test = demo_split(xquad_en, seed=0)  # the demo's default --seed
    assert {p.group for p in cal}.isdisjoint({p.group for p in test})
    assert len({p.group for p in cal}) == len({p.group for p in test}) == 24
    record = ListRecord.from_lists([p.query_id for p in cal], source={"kind": "data"},
                                   list_dependent=True,
                                   topics=[p.group for p in cal])
    lists: dict[str, list[str]] = {}
    for p in test:
        lists.setdefault(p.query_id, []).append(p.text)
    watch = ListWatch(record)
    cuts = {q: Pieces.whole(as_items(texts)) for q, texts in lists.items()}
    checks = see_lists(watch, cuts, dict.fromkeys(cuts, 0), None, seed=0)  # filter_pairs' order
    assert not any(c.unlike for c in checks.values()), next(
        c.note for c in checks.values() if c.unlike)
