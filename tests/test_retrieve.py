"""``ragsieve retrieve``: the deployed index run on labelled queries, on real XQuAD-en
paragraphs, the real MiniLM model and a real LanceDB index.

The index holds the first paragraphs of six XQuAD-en articles: three articles as one JSONL
file of documents (``id`` = the paragraph id XQuAD pairs carry as ``meta["doc_id"]``), three
as one ``.txt`` file per paragraph (the document id is then the file's path). The queries
are each paragraph's first question, labelled by ``relevant_doc_ids``, by ``answers``, or
by both, in turn; the labels of the written pairs are checked against a SQuAD
normalisation written out here, independently of ragsieve's.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import string
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lancedb")

from ragsieve.cli import build_parser, main
from ragsieve.data import LabelledQuery, describe_lists, read_pairs, read_queries
from ragsieve.errors import DataError
from ragsieve.lists import retriever_of
from ragsieve.retrieval import retrieve_pairs
from ragsieve.store import SnippetIndex
from ragsieve.types import Pair

K = 5
N_ARTICLES = 6
PER_ARTICLE = 5


@dataclass(frozen=True)
class Corpus:
    """The documents, the index built from them, and the queries over them."""

    root: Path
    docs: Path
    index: Path
    queries: list[dict[str, Any]]  # every one labelled
    texts: dict[str, str]  # document id -> text (a .txt file's id is its path)


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> Corpus:
    from ragsieve.data.xquad import xquad_file

    raw = json.loads(xquad_file("en", data_dir=shared_data_dir).read_text(encoding="utf-8"))
    root = tmp_path_factory.mktemp("retrieve")
    docs = root / "docs"
    docs.mkdir()
    records, queries, texts = [], [], {}
    for a, article in enumerate(raw["data"][:N_ARTICLES]):
        title = article["title"]
        for p, paragraph in enumerate(article["paragraphs"][:PER_ARTICLE]):
            if a % 2 == 0:  # a JSONL document: its id is XQuAD's paragraph id
                doc_id = f"{title}/{p}"
                records.append({"id": doc_id, "text": paragraph["context"]})
            else:  # a file of its own: its id is its path in the folder
                doc_id = f"{title}/{p}.txt"
                (docs / title).mkdir(exist_ok=True)
                (docs / doc_id).write_text(paragraph["context"], encoding="utf-8")
            texts[doc_id] = paragraph["context"]
            qa = paragraph["qas"][0]
            query: dict[str, Any] = {"query_id": qa["id"], "query": qa["question"],
                                     "group": title}
            kind = len(queries) % 3
            if kind in (0, 2):
                query["relevant_doc_ids"] = [doc_id]
            if kind in (1, 2):
                query["answers"] = sorted({ans["text"] for ans in qa["answers"]})
            queries.append(query)
    _write_jsonl(docs / "paragraphs.jsonl", records)
    SnippetIndex.open(root / "idx", create=True).index_directory(docs)
    return Corpus(root, docs, root / "idx", queries, texts)


def run(argv: list[str]) -> tuple[int, str, str]:
    """``ragsieve ARGV`` in this process: (exit code, stdout, stderr); a usage error's
    ``SystemExit`` gives its code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@dataclass(frozen=True)
class Retrieved:
    queries: Path
    out: Path
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def labelled(corpus: Corpus) -> Retrieved:
    """``retrieve --json`` of the queries, every one labelled."""
    queries = _write_jsonl(corpus.root / "labelled-queries.jsonl", corpus.queries)
    out = corpus.root / "labelled-pairs.jsonl"
    code, stdout, stderr = run(["-q", "retrieve", "--index", str(corpus.index), "--queries",
                                str(queries), "-k", str(K), "--out", str(out), "--json"])
    return Retrieved(queries, out, code, stdout, stderr)


# ------------------------------------------------------------ an independent SQuAD label
def _squad_tokens(text: str) -> list[str]:
    """The SQuAD normalisation (lower case, no punctuation, no English articles), as in the
    official evaluation script, with Unicode punctuation as in MLQA's."""
    text = "".join(ch for ch in text.lower()
                   if ch not in string.punctuation and not unicodedata.category(ch).startswith("P"))
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def _expected_label(query: dict[str, Any], pair: Pair) -> int | None:
    ids, answers = query.get("relevant_doc_ids"), query.get("answers")
    if ids is None and answers is None:
        return None
    of_listed = ids is None or pair.meta["doc_id"] in ids or pair.meta["path"] in ids
    text = " " + " ".join(_squad_tokens(pair.text)) + " "
    answered = answers is None or any(f" {' '.join(_squad_tokens(a))} " in text
                                      for a in answers)
    return int(of_listed and answered)


def _by_query(pairs: list[Pair]) -> dict[str, list[Pair]]:
    out: dict[str, list[Pair]] = {}
    for pair in pairs:
        out.setdefault(pair.query_id, []).append(pair)
    return out


# ------------------------------------------------------------------ identity
def test_fingerprint_names_the_documents_and_the_indexing(corpus: Corpus,
                                                          tmp_path: Path) -> None:
    """The same documents indexed the same way in two directories have one fingerprint;
    a changed, added or removed file, or another chunking, gives another."""
    small = tmp_path / "docs-a"
    shutil.copytree(corpus.docs / "Warsaw", small)
    twin = tmp_path / "docs-b"
    shutil.copytree(small, twin)
    a = SnippetIndex.open(tmp_path / "idx-a", create=True)
    a.index_directory(small)
    b = SnippetIndex.open(tmp_path / "idx-b", model=a.model, create=True)
    b.index_directory(twin)
    assert re.fullmatch(r"[0-9a-f]{64}", a.fingerprint)
    assert a.fingerprint == b.fingerprint
    ida, idb = a.retriever_identity(K), b.retriever_identity(K)
    assert ida["path"] != idb["path"]
    assert {**ida, "path": None} == {**idb, "path": None}
    assert ida == {"kind": "ragsieve-index", "index": a.fingerprint, "model": a.model_id,
                   "k": K, "n_snippets": a.count(), "path": str((tmp_path / "idx-a").resolve())}
    assert json.loads(json.dumps(ida)) == ida
    assert a.retriever_identity(K + 1)["k"] == K + 1

    seen = {a.fingerprint}
    changed = twin / "0.txt"
    original = changed.read_text(encoding="utf-8")
    changed.write_text(original + " Warsaw is on the Vistula.", encoding="utf-8")
    b.index_directory(twin)
    seen.add(b.fingerprint)
    (twin / "extra.txt").write_text("The Vistula flows into the Baltic Sea.", encoding="utf-8")
    b.index_directory(twin)
    seen.add(b.fingerprint)
    (twin / "1.txt").unlink()
    b.index_directory(twin)
    seen.add(b.fingerprint)
    assert len(seen) == 4  # every change gave a fingerprint of its own
    (twin / "extra.txt").unlink()
    changed.write_text(original, encoding="utf-8")
    shutil.copy(small / "1.txt", twin / "1.txt")
    b.index_directory(twin)
    assert b.fingerprint == a.fingerprint  # the same documents again: the same index

    other = SnippetIndex.open(tmp_path / "idx-c", model=a.model, size=300, overlap=50,
                              create=True)
    other.index_directory(small)
    assert other.fingerprint != a.fingerprint


# ------------------------------------------------------------------ the lists
def test_retrieve_writes_the_index_lists_labelled(corpus: Corpus, labelled: Retrieved) -> None:
    assert labelled.code == 0, labelled.stderr
    pairs = read_pairs(labelled.out, require_labels=True)  # every query labelled
    index = SnippetIndex.open(corpus.index)
    identity = index.retriever_identity(K)
    assert identity["kind"] == "ragsieve-index" and identity["k"] == K
    assert retriever_of(pairs) == identity
    assert all(p.meta["retriever"] == identity for p in pairs)

    by_query = _by_query(pairs)
    assert list(by_query) == [q["query_id"] for q in corpus.queries]  # input order
    for query in corpus.queries:
        got = by_query[query["query_id"]]
        hits = index.search(query["query"], k=K)  # the one search, query by query
        assert [p.snippet_id for p in got] == [h.snippet_id for h in hits]
        assert [p.meta["retrieval_score"] for p in got] == pytest.approx(
            [h.score for h in hits], abs=1e-5)
        assert [p.meta["rank"] for p in got] == list(range(K))
        for pair in got:
            assert pair.query == query["query"] and pair.group == query["group"]
            assert corpus.texts[pair.meta["doc_id"]][pair.meta["start"]:pair.meta["end"]] \
                == pair.text
            assert pair.relevant == _expected_label(query, pair), (query, pair.snippet_id)
            assert pair.meta.get("answers") == query.get("answers")

    # the labels mean something: each kind of label finds evidence, and not everywhere
    relevant = [p for p in pairs if p.relevant == 1]
    assert 0 < len(relevant) < len(pairs)
    kinds = {(("relevant_doc_ids" in q), ("answers" in q)) for q in corpus.queries
             if any(p.relevant for p in by_query[q["query_id"]])}
    assert kinds == {(True, False), (False, True), (True, True)}
    jsonl = {p.meta["path"] for p in relevant}
    assert "paragraphs.jsonl" in jsonl and any(path.endswith(".txt") for path in jsonl)

    summary = json.loads(labelled.stdout)
    no_relevant = [q for q, got in by_query.items() if not any(p.relevant for p in got)]
    assert summary == {"k": K, "n_queries": len(corpus.queries),
                       "n_labelled": len(corpus.queries), "n_hits": len(pairs),
                       "n_relevant": len(relevant), "unlabelled": [],
                       "no_relevant": no_relevant, "short": [], "unknown_doc_ids": [],
                       "unfindable": [], "out": str(labelled.out), "retriever": identity}
    if no_relevant:
        assert f"warning: {len(no_relevant)} of {len(corpus.queries)} labelled" in labelled.stderr


def test_python_api_gives_the_same_pairs(corpus: Corpus, labelled: Retrieved) -> None:
    index = SnippetIndex.open(corpus.index)
    pairs = retrieve_pairs(index, labelled.queries, K, batch_size=4)
    written = read_pairs(labelled.out)
    assert [(p.query_id, p.snippet_id, p.relevant) for p in pairs] == \
        [(p.query_id, p.snippet_id, p.relevant) for p in written]
    summary = describe_lists(read_queries(labelled.queries), pairs, K)
    assert summary.n_hits == len(corpus.queries) * K and summary.short == ()
    with pytest.raises(ValueError, match="k == 0"):
        retrieve_pairs(index, labelled.queries, 0)
    with pytest.raises(TypeError, match=r"single str; pass a list"):
        index.search_many("Where is Warsaw?", K)


def test_retrieved_lists_calibrate(corpus: Corpus, labelled: Retrieved,
                                   embedding_cache_dir: Path) -> None:
    """The round trip: what `retrieve` writes is what `calibrate` takes."""
    artifact = corpus.root / "filter.json"
    code, _, err = run(["-q", "calibrate", "--data", str(labelled.out), "--out", str(artifact),
                        "--cache-dir", str(embedding_cache_dir)])
    assert code == 0, err
    saved = json.loads(artifact.read_text(encoding="utf-8"))
    relevant = sum(p.relevant == 1 for p in read_pairs(labelled.out))
    # all of them, or (a fused score) those of the topics it was not fitted on
    assert 0 < saved["data"]["n_relevant"] <= relevant


def test_unlabelled_and_evidence_free_queries(corpus: Corpus, tmp_path: Path) -> None:
    """A query without labels gets `relevant: null` (for `ragsieve label`); a labelled query
    whose k hits hold no evidence is named in a warning."""
    queries = [*corpus.queries[:3],
               {"query_id": "unlabelled", "query": "Who won Super Bowl 50?", "group": "x"},
               {"query_id": 7, "query": "Where is Warsaw?", "relevant_doc_ids": ["no-such-doc"]},
               # a JSONL file's path names every document in it
               {"query_id": "by-file", "query": "Who won Super Bowl 50?",
                "relevant_doc_ids": ["paragraphs.jsonl"]}]
    qfile = _write_jsonl(tmp_path / "queries.jsonl", queries)
    out = tmp_path / "pairs.jsonl"
    code, stdout, stderr = run(["-q", "retrieve", "--index", str(corpus.index), "--queries",
                                str(qfile), "--k", "3", "--out", str(out)])
    assert code == 0, stderr
    by_query = _by_query(read_pairs(out))
    assert [p.relevant for p in by_query["unlabelled"]] == [None] * 3
    assert [p.relevant for p in by_query["7"]] == [0] * 3
    assert "answers" not in by_query["unlabelled"][0].meta
    by_file = by_query["by-file"]
    assert [p.relevant for p in by_file] == [int(p.meta["path"] == "paragraphs.jsonl")
                                             for p in by_file]
    assert any(p.relevant for p in by_file)
    assert all(p.meta["doc_id"] != "paragraphs.jsonl" for p in by_file)
    without = [q for q, got in by_query.items() if q != "unlabelled"
               and not any(p.relevant for p in got)]
    assert "7" in without
    # "no-such-doc" is no document of the index: named apart, never called a recall miss
    assert ("warning: 1 relevant_doc_ids of 1 labelled queries name no document of the index "
            "('no-such-doc' in 7): no retriever can return them; 1 of them (7) name no other"
            ) in stderr
    misses = [q for q in without if q != "7"]
    if misses:
        assert (f"warning: {len(misses)} of 5 labelled queries have no relevant snippet in "
                f"their top 3 ({', '.join(misses)}): recall misses") in stderr
    assert "calibrate on" not in stderr.split("recall misses")[0]
    assert "unlabelled queries: 1 (relevant: null)" in stdout
    assert f"ragsieve label --data {out}" in stdout
    assert f"wrote 18 pairs to {out}" in stdout
    code, _, err = run(["-q", "calibrate", "--data", str(out), "--out", str(tmp_path / "f.json")])
    assert code == 2 and "'relevant' is missing or null" in err  # label them first


def test_k_larger_than_the_index(corpus: Corpus, tmp_path: Path) -> None:
    index = SnippetIndex.open(corpus.index)
    qfile = _write_jsonl(tmp_path / "q.jsonl", corpus.queries[:2])
    out = tmp_path / "pairs.jsonl"
    code, stdout, stderr = run(["-q", "retrieve", "--index", str(corpus.index), "--queries",
                                str(qfile), "-k", "10000", "--out", str(out), "--json"])
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["n_hits"] == 2 * index.count() and len(summary["short"]) == 2
    assert summary["retriever"]["k"] == 10000


# ------------------------------------------------------------------ bad input
def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_bad_input_is_one_line_exit_2(corpus: Corpus, labelled: Retrieved,
                                      tmp_path: Path) -> None:
    out = tmp_path / "pairs.jsonl"
    base = ["retrieve", "--index", str(corpus.index), "--out", str(out)]

    missing = tmp_path / "no-index"
    code, _, err = run(["retrieve", "--index", str(missing), "--queries",
                        str(labelled.queries), "--out", str(out)])
    _one_line_error(code, err, "does not exist", "ragsieve index")
    assert not missing.exists()
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    code, _, err = run(["retrieve", "--index", str(empty_dir), "--queries",
                        str(labelled.queries), "--out", str(out)])
    _one_line_error(code, err, "is not a ragsieve index")
    assert list(empty_dir.iterdir()) == []

    good = json.dumps(corpus.queries[0])
    cases = {
        "no-query.jsonl": (f'{good}\n{{"query_id": "x"}}\n', ":2: query == None"),
        "bad-json.jsonl": (f"{good}\n\n{{not json\n", ":3: malformed JSON"),
        "bad-ids.jsonl": ('{"query_id": "x", "query": "q", "relevant_doc_ids": "doc-1"}\n',
                          ":1: relevant_doc_ids"),
        "twice.jsonl": (f"{good}\n{good}\n", "is given twice (first at"),
        "empty.jsonl": ("\n  \n", "contains no queries"),
    }
    for name, (content, needle) in cases.items():
        qfile = tmp_path / name
        qfile.write_text(content, encoding="utf-8")
        code, _, err = run([*base, "--queries", str(qfile)])
        _one_line_error(code, err, str(qfile), needle)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"query_id": "q", "query": "Caf\xe9?"}\n')
    code, _, err = run([*base, "--queries", str(latin1)])
    _one_line_error(code, err, f"{latin1}:1: bytes are not valid UTF-8")
    code, _, err = run([*base, "--queries", str(tmp_path / "absent.jsonl")])
    _one_line_error(code, err, "no such file", "labelled queries")
    assert not out.exists()

    for flag, k, needle in (("-k", "0", "expected an integer >= 1, got '0'"),
                            ("--k", "10001", "10001: must be <= 10000"),
                            ("-k", "nan", "expected an integer >= 1, got 'nan'")):
        code, _, err = run([*base, "--queries", str(labelled.queries), flag, k])
        _one_line_error(code, err, f"argument -k/--k: {needle}")
    code, _, err = run(["retrieve", "--ind", str(corpus.index), "--queries",
                        str(labelled.queries), "--out", str(out)])  # never abbreviated
    _one_line_error(code, err, "--ind")
    assert not out.exists()


def test_outputs_never_overwrite_inputs(corpus: Corpus, labelled: Retrieved,
                                        tmp_path: Path) -> None:
    queries = tmp_path / "queries.jsonl"
    shutil.copy(labelled.queries, queries)
    before = queries.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(queries)
    files_before = sorted(p.name for p in corpus.index.iterdir())
    for out, needle in ((queries, "is the same file as --queries"),
                        (link, "is the same file as --queries"),
                        (corpus.index / "pairs.jsonl", "is inside --index"),
                        (corpus.index, "is the same directory as --index")):
        code, _, err = run(["retrieve", "--index", str(corpus.index), "--queries", str(queries),
                            "--out", str(out)])
        _one_line_error(code, err, needle, "choose another --out")
    assert queries.read_bytes() == before
    assert sorted(p.name for p in corpus.index.iterdir()) == files_before


def test_an_index_that_is_not_whole_or_empty_is_refused(corpus: Corpus, labelled: Retrieved,
                                                        tmp_path: Path) -> None:
    """An index left half-committed (files row gone, snippet rows still there, as a writer
    killed between the two leaves it) is refused until `ragsieve index` repairs it."""
    import lancedb

    copy = tmp_path / "idx"
    shutil.copytree(corpus.index, copy)
    lancedb.connect(str(copy)).open_table("files").delete("path = 'Warsaw/0.txt'")
    out = tmp_path / "pairs.jsonl"
    argv = ["-q", "retrieve", "--index", str(copy), "--queries", str(labelled.queries),
            "--out", str(out)]
    code, _, err = run(argv)
    _one_line_error(code, err, "not in a whole state", "ragsieve index")
    assert not out.exists()
    assert run(["-q", "index", str(corpus.docs), "--index", str(copy)])[0] == 0
    assert SnippetIndex.open(copy).fingerprint == SnippetIndex.open(corpus.index).fingerprint
    code, _, err = run(argv)
    assert code == 0, err

    empty = SnippetIndex.open(tmp_path / "empty", model=SnippetIndex.open(copy).model,
                              create=True)
    with pytest.raises(DataError, match="holds no snippets"):
        retrieve_pairs(empty, labelled.queries, K)


def test_an_index_written_during_the_run_is_refused(corpus: Corpus, labelled: Retrieved,
                                                    tmp_path: Path) -> None:
    """Lists of two versions of an index are refused (a writer commits mid-run; the double
    of the *dependency*, the model, runs that writer when the first queries are embedded)."""
    from ragsieve.embeddings import EmbeddingModel

    copy, docs = tmp_path / "idx", tmp_path / "docs"
    shutil.copytree(corpus.index, copy)
    shutil.copytree(corpus.docs, docs)
    real = SnippetIndex.open(corpus.index).model

    class WriterDuringSearch(EmbeddingModel):
        def __init__(self) -> None:
            self.model_id, self.dim, self.calls = real.model_id, real.dim, 0

        def embed_batch(self, texts: Any) -> Any:
            return real.embed_batch(texts)

        def embed_queries(self, texts: Any) -> Any:
            self.calls += 1
            if self.calls == 1:  # another process adds a file to the index
                (docs / "late.txt").write_text("Warsaw's old town was rebuilt after 1945.",
                                               encoding="utf-8")
                SnippetIndex.open(copy, model=real).index_directory(docs)
            return real.embed_queries(texts)

    index = SnippetIndex.open(copy, model=WriterDuringSearch())
    with pytest.raises(DataError, match="changed while the queries ran"):
        retrieve_pairs(index, labelled.queries, K, batch_size=4)
    assert retrieve_pairs(index, labelled.queries, K)[0].meta["retriever"]["n_snippets"] \
        == SnippetIndex.open(corpus.index).count() + 1


def test_jsonl_documents_sharing_an_id_are_named(corpus: Corpus, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    _write_jsonl(docs / "a.jsonl", [{"id": "same", "text": "Warsaw lies on the Vistula."}])
    _write_jsonl(docs / "b.jsonl", [{"id": "same", "text": "Warsaw lies on the Vistula."}])
    index = SnippetIndex.open(tmp_path / "idx", model=SnippetIndex.open(corpus.index).model,
                              create=True)
    index.index_directory(docs)
    with pytest.raises(DataError, match=r"returned snippet 'same:0-27' twice .*'a.jsonl'.*"
                                        r"'b.jsonl'.*own \"id\""):
        retrieve_pairs(index, [{"query_id": "q", "query": "Where is Warsaw?"}], 2)


# ------------------------------------------------------------------ parser and queries
def test_parser_declares_paths_and_quiet() -> None:
    from ragsieve.cli import PATH_ROLES

    assert PATH_ROLES["retrieve"] == (("index", "queries"), ("out",))
    parser = build_parser()
    common = ["--index", "i", "--queries", "q.jsonl", "--out", "o.jsonl"]
    assert parser.parse_args(["retrieve", *common]).quiet is False
    assert parser.parse_args(["retrieve", *common]).k == 20
    assert parser.parse_args(["-q", "retrieve", *common]).quiet is True
    assert parser.parse_args(["retrieve", *common, "-q", "--k", "7"]).quiet is True
    assert parser.parse_args(["retrieve", *common, "--k", "7"]).k == 7


def test_read_queries_forms() -> None:
    queries = read_queries([{"query_id": 3, "query": "Who?", "answers": ["Ada"], "lang": "en"},
                            LabelledQuery("q2", "Where?")])
    assert [q.query_id for q in queries] == ["3", "q2"]
    assert queries[0].meta == {"lang": "en"} and not queries[1].labelled
    with pytest.raises(DataError, match=r"queries\[1\]: query_id '3' is given twice"):
        read_queries([{"query_id": 3, "query": "a"}, {"query_id": "3", "query": "b"}])
    with pytest.raises(TypeError, match="one mapping"):
        read_queries({"query_id": 1, "query": "a"})  # type: ignore[arg-type]


def _iter_lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)


def test_written_lines_carry_the_documented_keys(labelled: Retrieved) -> None:
    first = next(_iter_lines(labelled.out))
    assert set(first) >= {"query_id", "query", "snippet_id", "text", "relevant", "group",
                          "doc_id", "path", "start", "end", "retrieval_score", "rank",
                          "retriever"}
    assert set(first["retriever"]) == {"kind", "index", "model", "k", "n_snippets", "path"}


# ------------------------------------------------ Hardening IV item 10: input trust
def test_a_huge_query_line_is_refused_unread(corpus: Corpus, tmp_path: Path) -> None:
    """A 20 MB query line took 30 s and 3.9 GB (the model tokenised it whole): now refused
    from its byte length before it is decoded, never held whole (tracemalloc's peak stays
    far below the line), naming file:line, the size and the limit; nothing written."""
    import tracemalloc

    from ragsieve.data.queries import MAX_QUERY_LINE_BYTES

    qfile = tmp_path / "huge.jsonl"
    big = json.dumps({"query_id": "big", "query": "who won " * 2_500_000, "answers": ["x"]})
    qfile.write_text(json.dumps(corpus.queries[0]) + "\n" + big + "\n", encoding="utf-8")
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as caught:
            read_queries(qfile)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{qfile}:2: the line holds {len(big):,} bytes" in str(caught.value)
    assert f"at most {MAX_QUERY_LINE_BYTES:,}" in str(caught.value)
    assert peak < len(big) // 2  # a few MiB of buffers, never the 20 MB line
    out = tmp_path / "pairs.jsonl"
    code, _, err = run(["retrieve", "--index", str(corpus.index), "--queries", str(qfile),
                        "--out", str(out)])
    _one_line_error(code, err, f"{qfile}:2: the line holds {len(big):,} bytes")
    assert not out.exists()


def test_a_query_over_the_character_cap_is_refused() -> None:
    from ragsieve.data.queries import MAX_QUERY_CHARS

    assert read_queries([{"query_id": 1, "query": "q" * MAX_QUERY_CHARS}])[0].query
    with pytest.raises(DataError, match=r"queries\[0\]: query holds 10,001 characters; a "
                                        r"query may hold at most 10,000"):
        read_queries([{"query_id": 1, "query": "q" * (MAX_QUERY_CHARS + 1)}])


def test_answers_that_normalise_to_nothing_are_refused(corpus: Corpus, tmp_path: Path) -> None:
    """``""`` was refused but ``"the"`` and ``"..."`` were accepted and labelled nothing;
    now every answer must keep a word under the SQuAD normalisation of its language."""
    good = json.dumps(corpus.queries[0])
    out = tmp_path / "pairs.jsonl"
    for answer in ("the", "...", " A ", "an."):
        qfile = tmp_path / "q.jsonl"
        qfile.write_text(f'{good}\n{{"query_id": "x", "query": "Who?", "answers": '
                         f'["Ada", {json.dumps(answer)}]}}\n', encoding="utf-8")
        code, _, err = run(["retrieve", "--index", str(corpus.index), "--queries", str(qfile),
                            "--out", str(out)])
        _one_line_error(code, err, f"{qfile}:2: answers[1] == {answer!r} holds no word once "
                                   "normalised")
        assert not out.exists()
    # the articles are the answers' language's: "die" is a German article, an English word
    german = [{"query_id": 1, "query": "Wer?", "answers": ["die"]}]
    assert read_queries(german)[0].answers == ("die",)
    with pytest.raises(DataError, match=r"answers\[0\] == 'die' .* articles of 'de'"):
        read_queries(german, language="de")


def test_unknown_doc_ids_are_counted_apart(corpus: Corpus) -> None:
    """``relevant_doc_ids`` naming no indexed document ("../../etc/passwd") are counted in
    the summary, not mistaken for recall misses."""
    index = SnippetIndex.open(corpus.index)
    known = index.document_ids()
    assert "paragraphs.jsonl" in known and set(corpus.texts) <= known
    queries = read_queries([
        {"query_id": "a", "query": "Who won?", "relevant_doc_ids": ["../../etc/passwd"]},
        {"query_id": "b", "query": "Who won?",
         "relevant_doc_ids": ["../../etc/passwd", next(iter(corpus.texts))]}])
    summary = describe_lists(queries, [], K, known_doc_ids=known)
    assert summary.unknown_doc_ids == (("a", "../../etc/passwd"), ("b", "../../etc/passwd"))
    assert summary.unfindable == ("a",) and summary.misses == ("b",)
    assert summary.to_dict()["unknown_doc_ids"][0] == {"query_id": "a",
                                                       "doc_id": "../../etc/passwd"}
