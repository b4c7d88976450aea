"""SnippetIndex on real files, the real MiniLM model and a real embedded LanceDB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lancedb")
pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")

from ragsieve import ConformalFilter, EmbeddingScorer
from ragsieve.embeddings import EmbeddingModel, load_embedding_model
from ragsieve.errors import ScorerMismatchError
from ragsieve.filtered_search import query_with_filter
from ragsieve.store import SnippetIndex, html_to_text
from ragsieve.types import Pair

DOCS = {
    "space/jupiter.txt": "Jupiter is the largest planet in the Solar System. It is a gas giant "
    "with a Great Red Spot, a storm bigger than Earth.",
    "paris.md": "# Paris\n\nThe Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "plants.html": "<html><head><title>t</title><style>p{color:red}</style></head><body>"
    "<p>Photosynthesis lets plants turn sunlight, water and carbon dioxide into "
    "glucose and oxygen.</p><script>var x = 'ignored';</script></body></html>",
    "misc.jsonl": '{"id": "bananas", "text": "Bananas are a yellow fruit rich in potassium."}\n'
    '{"text": "The Pacific is the deepest ocean on Earth."}\n',
}


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    return load_embedding_model("minilm")


class _FailAfter(EmbeddingModel):
    """Test double of the *dependency*: the real model that fails after ``n`` calls."""

    def __init__(self, real: EmbeddingModel, n: int) -> None:
        self.real, self.n = real, n
        self.model_id, self.dim = real.model_id, real.dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if self.n == 0:
            raise KeyboardInterrupt("simulated kill")
        self.n -= 1
        return self.real.embed_batch(texts)


def _write(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    return root


@pytest.fixture()
def docs(tmp_path: Path) -> Path:
    files: dict[str, str | bytes] = dict(DOCS)
    files["latin1.txt"] = "Caf\xe9 cr\xe8me".encode("latin-1")
    files["empty.txt"] = ""
    files["broken.jsonl"] = '{"text": "ok"}\nnot json\n'
    files["ignored.csv"] = "a,b\n1,2\n"
    return _write(tmp_path / "docs", files)


def test_index_search_and_skips(tmp_path: Path, docs: Path, model: EmbeddingModel) -> None:
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    report = idx.index_directory(docs)
    assert report.added == 4 and report.unchanged == 0 and report.removed == 0
    reasons = dict(report.skipped)
    assert set(reasons) == {"latin1.txt", "empty.txt", "broken.jsonl"}
    assert "UTF-8" in reasons["latin1.txt"] and "line 2" in reasons["broken.jsonl"]
    assert report.n_embedded == idx.count() == 5  # 3 single-snippet files + 2 JSONL docs

    hits = idx.search("Which planet is the biggest?", k=5)
    assert hits[0].path == "space/jupiter.txt"
    assert [h.score for h in hits] == sorted(h.score for h in hits)
    html_hit = idx.search("how do plants make sugar from light", k=1)[0]
    assert html_hit.path == "plants.html" and "ignored" not in html_hit.text
    assert "color" not in html_hit.text
    jsonl = {h.doc_id for h in idx.search("fruit", k=5) if h.path == "misc.jsonl"}
    assert jsonl == {"bananas", "misc.jsonl#2"}

    # scores are 1 - cos of a fresh embedding of the snippet text
    q = model.embed_batch(["Which planet is the biggest?"])[0]
    fresh = model.embed_batch([h.text for h in hits])
    np.testing.assert_allclose([h.score for h in hits], 1 - fresh @ q, atol=1e-5)
    assert hits[0].snippet_id == f"{hits[0].doc_id}:{hits[0].start}-{hits[0].end}"
    assert (docs / hits[0].path).read_text()[hits[0].start : hits[0].end] == hits[0].text


def test_reindex_is_incremental(tmp_path: Path, docs: Path, model: EmbeddingModel) -> None:
    SnippetIndex.open(tmp_path / "idx", model=model, create=True).index_directory(docs)
    idx = SnippetIndex.open(tmp_path / "idx")  # model taken from the index
    again = idx.index_directory(docs)
    assert (again.added, again.unchanged, again.removed, again.n_embedded) == (0, 4, 0, 0)
    assert idx.n_embedded == 0 and idx.count() == 5

    (docs / "paris.md").write_text("The Louvre in Paris is the most visited museum.", "utf-8")
    changed = idx.index_directory(docs)
    assert (changed.added, changed.unchanged, changed.n_embedded) == (1, 3, 1)
    assert idx.count() == 5
    assert "Louvre" in idx.search("art museum", k=1)[0].text
    assert not any("Eiffel" in h.text for h in idx.search("Eiffel Tower", k=10))

    (docs / "space" / "jupiter.txt").unlink()
    gone = idx.index_directory(docs)
    assert (gone.added, gone.removed, gone.n_embedded) == (0, 1, 0)
    assert idx.count() == 4 and "space/jupiter.txt" not in idx.indexed_files()
    assert all(h.path != "space/jupiter.txt" for h in idx.search("largest planet", k=10))


def test_interrupted_run_resumes(tmp_path: Path, docs: Path, model: EmbeddingModel) -> None:
    fresh = SnippetIndex.open(tmp_path / "ref", model=model, create=True)
    fresh.index_directory(docs, batch_size=1)
    killed = SnippetIndex.open(tmp_path / "idx", model=_FailAfter(model, 2), create=True)
    with pytest.raises(KeyboardInterrupt):
        killed.index_directory(docs, batch_size=1)
    assert 0 < killed.count() < fresh.count()
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    report = idx.index_directory(docs, batch_size=1)
    assert report.unchanged >= 1 and report.added >= 1
    rows = idx.tables.table("snippets").to_arrow().column("snippet_id").to_pylist()
    assert sorted(rows) == sorted(
        fresh.tables.table("snippets").to_arrow().column("snippet_id").to_pylist()
    )


def test_model_mismatch(tmp_path: Path, docs: Path, model: EmbeddingModel) -> None:
    SnippetIndex.open(tmp_path / "idx", model=model, create=True).index_directory(docs)
    with pytest.raises(ScorerMismatchError, match="all-MiniLM-L6-v2"):
        SnippetIndex.open(tmp_path / "idx", model="usem3-multilingual")


def test_query_with_filter(tmp_path: Path, docs: Path, model: EmbeddingModel) -> None:
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    idx.index_directory(docs)
    calib = [
        Pair("q1", "largest planet", "s1", "Jupiter is the biggest planet.", 1),
        Pair("q2", "when was the Eiffel Tower built", "s2", "Built in 1889 in Paris.", 1),
        Pair("q3", "what do bananas contain", "s3", "Bananas contain potassium.", 1),
        Pair("q4", "deepest ocean", "s4", "The Pacific Ocean is the deepest.", 1),
        Pair("q5", "photosynthesis output", "s5", "Plants produce oxygen and glucose.", 1),
    ]
    flt = ConformalFilter(EmbeddingScorer(model), alpha=0.2).calibrate(calib)
    hits, result = query_with_filter(idx, "Which planet is the biggest?", flt, k=5)
    assert len(hits) == result.n_input == 5
    assert result.scores == tuple(h.score for h in hits)
    expected = [h.snippet_id for h in hits if h.score <= flt.threshold]
    assert result.kept_ids == expected and "space/jupiter.txt:" in expected[0]
    assert 0 < len(expected) < len(hits) and flt.threshold < 1.0

    other = ConformalFilter(EmbeddingScorer("usem3-multilingual"), alpha=0.5)
    with pytest.raises(ScorerMismatchError, match="usem3"):
        query_with_filter(idx, "planet", other)


@pytest.mark.parametrize("kind", ["relative", "fusion"])
def test_query_with_list_relative_filter(  # type: ignore[no-untyped-def]
    tmp_path: Path, docs: Path, model: EmbeddingModel, xquad_en, kind: str
) -> None:
    """Relative / fused filters are applied from the stored vectors and agree with re-embedding."""
    from ragsieve.scoring import FusedScorer, RelativeScorer

    base = EmbeddingScorer(model)
    pairs = xquad_en[:240]
    scorer = (RelativeScorer(base, kind="gap") if kind == "relative"
              else FusedScorer.fit(pairs[:120], base))
    flt = ConformalFilter(scorer, alpha=0.2).calibrate(pairs[120:])
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    idx.index_directory(docs)
    query = "Which planet is the biggest?"
    hits, result = query_with_filter(idx, query, flt, k=5)
    assert len(hits) == result.n_input == 5
    again = scorer.score_batch(query, [h.text for h in hits])  # re-embeds the hit texts
    np.testing.assert_allclose(result.scores, again, atol=1e-5)
    assert result.scores != tuple(h.score for h in hits)  # not the raw 1 - cos
    expected = [h.snippet_id for h, a in zip(hits, result.scores) if a <= flt.threshold]
    assert result.kept_ids == expected and 0 < len(expected) < len(hits)

    other = ConformalFilter(RelativeScorer(EmbeddingScorer("usem3-multilingual")), alpha=0.5)
    with pytest.raises(ScorerMismatchError, match="relative"):
        query_with_filter(idx, query, other)


def test_memory_search_matches_lancedb_and_sees_updates(tmp_path: Path, docs: Path, model: EmbeddingModel) -> None:
    """The in-memory exact search returns LanceDB's hits and reloads when the table changes."""
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    assert idx.search_backend == "memory" and idx.search("anything") == []  # empty index
    idx.index_directory(docs)
    on_disk = SnippetIndex.open(tmp_path / "idx", model=model, search="lancedb")
    for query in ("Which planet is the biggest?", "potassium", "When was the tower built?"):
        for k in (1, 3, 50):
            mem, disk = idx.search(query, k=k), on_disk.search(query, k=k)
            assert [h.snippet_id for h in mem] == [h.snippet_id for h in disk]
            np.testing.assert_allclose([h.score for h in mem], [h.score for h in disk], atol=1e-6)
    n = idx.count()
    assert len(idx.search("planet", k=50)) == n
    reader = SnippetIndex.open(tmp_path / "idx", model=model)  # e.g. a server holding the index open
    assert len(reader.search("planet", k=50)) == n
    _write(docs, {"rome.txt": "Rome was founded, according to legend, in 753 BC by Romulus and Remus."})
    idx.index_directory(docs)  # another instance writes
    hits = reader.search("Who founded Rome?", k=50)
    assert len(hits) == n + 1 and hits[0].path == "rome.txt"
    with pytest.raises(ValueError, match="search == 'faiss'"):
        SnippetIndex.open(tmp_path / "idx", search="faiss")


def test_html_to_text() -> None:
    text = html_to_text("<p>a &amp; b</p><script>x()</script><div>c</div>")
    assert text == "a & b\nc"


def test_query_with_group_and_query_all_filters(  # type: ignore[no-untyped-def]
    tmp_path: Path, docs: Path, model: EmbeddingModel, xquad_en
) -> None:
    """Any mode applies to an index's hits; a group filter needs the query's group."""
    from ragsieve.errors import DataError

    pairs = xquad_en[:600]
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    idx.index_directory(docs)
    query = "Which planet is the biggest?"
    all_ev = ConformalFilter(EmbeddingScorer(model), "query-all", alpha=0.2).calibrate(pairs)
    hits, result = query_with_filter(idx, query, all_ev, k=5)
    assert result.kept_ids == [h.snippet_id for h in hits if h.score <= all_ev.threshold]
    by_lang = ConformalFilter(EmbeddingScorer(model), "group", alpha=0.2).calibrate(
        pairs, group_by="language")
    with pytest.raises(DataError, match="no group"):
        query_with_filter(idx, query, by_lang, k=5)
    hits, result = query_with_filter(idx, query, by_lang, k=5, group="en")
    tau = by_lang.calibrator_.threshold_for("en")
    assert result.kept_ids == [h.snippet_id for h in hits if h.score <= tau]


# ------------------------------------------------------------ writers, duplicates, odd files
RAGSIEVE = str(Path(sys.executable).parent / "ragsieve")


def _rows(idx: SnippetIndex) -> list[tuple[str, str]]:
    """``(path, snippet_id)`` of every stored snippet row, duplicates included."""
    table = idx.tables.table("snippets").to_arrow()
    return list(zip(table.column("path").to_pylist(), table.column("snippet_id").to_pylist()))


def _many_docs(root: Path, n: int = 20) -> Path:
    """``n`` small documents of a few sentences each (one or two snippets per file)."""
    words = ["planet", "river", "mountain", "city", "forest", "ocean", "desert", "island"]
    return _write(root, {
        f"doc{i:03d}.txt": " ".join(
            f"Document {i} sentence {j} is about the {words[(i + j) % len(words)]} number {j}."
            for j in range(12))
        for i in range(n)
    })


class _SecondWriter(EmbeddingModel):
    """Test double of the *dependency*: the real model that, on its first call (the first
    writer is then in the middle of its run), starts a second real ``ragsieve index`` process
    on the same index and records how it ended."""

    def __init__(self, real: EmbeddingModel, argv: list[str]) -> None:
        self.real, self.argv = real, argv
        self.model_id, self.dim = real.model_id, real.dim
        self.second: subprocess.CompletedProcess[str] | None = None

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if self.second is None:
            self.second = subprocess.run(self.argv, capture_output=True, text=True, timeout=300,
                                         check=False)
        return self.real.embed_batch(texts)


def test_second_index_writer_fails_fast_with_the_holder_pid(tmp_path: Path, docs: Path,
                                                            model: EmbeddingModel) -> None:
    """A ``ragsieve index`` started while another writer is mid-run exits 2 with one line
    naming the writer's pid, and writes nothing."""
    idx_dir = tmp_path / "idx"
    first = _SecondWriter(model, [RAGSIEVE, "-q", "index", str(docs), "--index", str(idx_dir)])
    idx = SnippetIndex.open(idx_dir, model=first, create=True)
    report = idx.index_directory(docs, batch_size=1)
    second = first.second
    assert second is not None
    assert second.returncode == 2, second.stdout + second.stderr
    err = second.stderr.strip()
    assert err == (f"ragsieve index: error: index {str(idx_dir)!r} is being written by pid "
                   f"{os.getpid()}; wait for it to finish (or stop it) and run again.")
    rows = _rows(idx)
    assert len(rows) == len(set(rows)) == report.n_embedded == 5
    # the lock went with the writer: a third run finds nothing to do and no duplicate
    third = subprocess.run([RAGSIEVE, "-q", "index", str(docs), "--index", str(idx_dir)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert third.returncode == 0 and "0 snippet(s) embedded; 5 in the index" in third.stdout


def test_two_concurrent_index_processes_leave_no_duplicates(tmp_path: Path) -> None:
    """The issue's reproduction: two ``ragsieve index`` processes on one index at once."""
    docs = _many_docs(tmp_path / "docs")
    argv = [RAGSIEVE, "-q", "index", str(docs), "--index", str(tmp_path / "idx"),
            "--batch-size", "8"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    for code, out, err in results:
        assert code == 0 or (code == 2 and "is being written by pid" in err), (code, out, err)
    assert any(code == 0 for code, _, _ in results)
    idx = SnippetIndex.open(tmp_path / "idx")
    rows = _rows(idx)
    assert len(rows) == len(set(rows)) and {p for p, _ in rows} == {
        p.name for p in docs.iterdir()}
    assert len(idx.indexed_files()) == len(idx.tables.rows("files", ["path"])) == 20


def test_rerun_repairs_planted_duplicates(tmp_path: Path, docs: Path,
                                          model: EmbeddingModel) -> None:
    """An index holding duplicate rows (what two unlocked writers left) is repaired by a
    rerun: extra copies deleted, nothing re-embedded, search returns each snippet once."""
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    idx.index_directory(docs)
    clean = sorted(_rows(idx))
    snippets, files = idx.tables.table("snippets"), idx.tables.table("files")
    paris = snippets.to_arrow().filter(pc.equal(snippets.to_arrow()["path"], "paris.md"))
    snippets.add(snippets.to_arrow())  # every row twice ...
    snippets.add(paris)  # ... paris.md three times
    files.add(files.to_arrow())  # and every file row twice, as two writers leave them
    assert len(_rows(idx)) == 2 * len(clean) + 1
    assert len(idx.search("Eiffel Tower", k=3)) == 3
    assert len({h.snippet_id for h in idx.search("Eiffel Tower", k=3)}) == 1

    report = SnippetIndex.open(tmp_path / "idx").index_directory(docs)
    assert sorted(_rows(idx)) == clean
    assert report.n_duplicates == len(clean) + 1 and report.n_embedded == 0
    assert (report.added, report.unchanged) == (0, 4)
    assert len(idx.tables.rows("files", ["path"])) == len(idx.indexed_files()) == 4
    hits = idx.search("Eiffel Tower", k=3)
    assert len({h.snippet_id for h in hits}) == 3 and hits[0].path == "paris.md"
    again = idx.index_directory(docs)
    assert again.n_duplicates == 0 and again.n_embedded == 0


def test_rerun_redoes_a_file_with_rows_of_two_versions(tmp_path: Path, docs: Path,
                                                       model: EmbeddingModel) -> None:
    """Rows of two versions of one file (two writers around an edit) cannot be deduplicated:
    the file is embedded again."""
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    idx.index_directory(docs)
    clean = sorted(_rows(idx))
    files = idx.tables.table("files")
    old = files.to_arrow().filter(pc.equal(files.to_arrow()["path"], "paris.md"))
    files.add(old.set_column(1, "sha256", pa.array(["0" * 64])))
    report = idx.index_directory(docs)
    assert (report.added, report.unchanged, report.n_embedded) == (1, 3, 1)
    assert sorted(_rows(idx)) == clean and len(idx.tables.rows("files", ["path"])) == 4


def test_stale_lock_of_a_killed_writer_is_taken_over(tmp_path: Path, docs: Path,
                                                     model: EmbeddingModel) -> None:
    """A writer killed with SIGKILL leaves its lock file; the next writer takes it over."""
    idx_dir = tmp_path / "idx"
    SnippetIndex.open(idx_dir, model=model, create=True)
    code = ("import sys, time; from pathlib import Path; from ragsieve.store._locking import WriteLock; "
            "WriteLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); "
            "time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(idx_dir)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        lock_file = idx_dir / ".ragsieve-write.lock"
        assert lock_file.read_text().strip() == str(holder.pid)
        with pytest.raises(BlockingIOError, match=f"being written by pid {holder.pid}"):
            SnippetIndex.open(idx_dir, model=model).index_directory(docs)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_file.read_text().strip() == str(holder.pid)  # stale: its holder is dead
    idx = SnippetIndex.open(idx_dir, model=model)
    report = idx.index_directory(docs)
    assert report.added == 4 and len(_rows(idx)) == 5


def test_open_for_reading_refuses_a_missing_index(tmp_path: Path, docs: Path,
                                                  model: EmbeddingModel) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(FileNotFoundError, match="no-such-dir.*does not exist.*ragsieve index"):
        SnippetIndex.open(missing)
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="not a ragsieve index"):
        SnippetIndex.open(empty, model=model)
    assert list(empty.iterdir()) == []
    idx = SnippetIndex.open(missing, model=model, create=True)  # writers create it
    idx.index_directory(docs)
    assert SnippetIndex.open(missing).count() == 5


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs symlinks and FIFOs (POSIX)")
def test_odd_files_are_listed_as_skipped(tmp_path: Path, docs: Path,
                                         model: EmbeddingModel) -> None:
    """Symlink loops, dangling links and FIFOs are listed among the skipped files with the
    reason (never read: a FIFO would block), and a linked regular file is indexed."""
    (docs / "loop-a.txt").symlink_to("loop-b.txt")
    (docs / "loop-b.txt").symlink_to("loop-a.txt")
    (docs / "self.md").symlink_to("self.md")
    (docs / "dangling.md").symlink_to("gone.md")
    os.mkfifo(docs / "pipe.txt")
    (docs / "linked.txt").symlink_to(docs / "paris.md")
    (docs / "subdir-link").symlink_to(docs / "space", target_is_directory=True)
    idx = SnippetIndex.open(tmp_path / "idx", model=model, create=True)
    report = idx.index_directory(docs)
    reasons = dict(report.skipped)
    assert reasons["loop-a.txt"] == reasons["loop-b.txt"] == reasons["self.md"] == "symlink loop"
    assert reasons["dangling.md"] == "dangling symlink (its target 'gone.md' does not exist)"
    assert reasons["pipe.txt"] == "not a regular file (FIFO)"
    assert reasons["subdir-link"] == "symlink to a directory (not followed)"
    assert {"latin1.txt", "empty.txt", "broken.jsonl"} < set(reasons)
    assert report.added == 5 and "linked.txt" in idx.indexed_files()
