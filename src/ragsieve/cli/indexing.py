"""The ``ragsieve`` subcommands of the snippet index and the data on disk: ``index``
(chunk, embed and store a folder of documents), ``query`` (retrieve, filter, optionally
answer with the LLM), ``retrieve`` (the index's lists for labelled queries, as the pairs
to calibrate on) and ``export`` (a dataset as generic JSONL, or as documents and
labelled queries).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .output import dumps, eprint
from .values import DataSource, LLMEndpoint

__all__ = ["cmd_export", "cmd_index", "cmd_query", "cmd_retrieve"]


def cmd_index(args: argparse.Namespace) -> int:
    """``ragsieve index``: chunk, embed and store a folder of documents."""
    from ..store import SnippetIndex

    index = SnippetIndex.open(args.index, model=args.model, create=True)
    report = index.index_directory(args.docs_dir, batch_size=args.batch_size,
                                   progress=not args.quiet)
    print(f"{args.index}: {report.added} file(s) added or changed, {report.unchanged} unchanged, "
          f"{report.removed} removed; {report.n_embedded} snippet(s) embedded; "
          f"{index.count()} in the index")
    if report.n_duplicates:
        print(f"  repaired: deleted {report.n_duplicates} duplicate snippet row(s)")
    for path, reason in report.skipped:
        print(f"  skipped {path}: {reason}")
    return 0


def _query_json(query: str, hits: list[Any], res: Any,
                kept: set[int] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "query": query,
        "hits": [{"snippet_id": h.snippet_id, "path": str(h.path), "score": h.score,
                  "text": h.text, "filter_score": None if res is None else res.scores[i],
                  "kept": None if kept is None else i in kept} for i, h in enumerate(hits)],
        "threshold": None if res is None else res.threshold,
        "removal": None if res is None else res.removal,
        "note": None if res is None else res.note,
        "lists_unlike": None if res is None else res.lists_unlike,
        "lists_note": None if res is None else res.lists_note,
    }
    if res is not None and res.unit == "sentence":  # each kept hit's kept sentences
        for s in res.kept:
            out["hits"][s.index].update(spans=[list(span) for span in s.spans],
                                        pruned_text=s.pruned_text)
    return out


def cmd_query(args: argparse.Namespace) -> int:
    """``ragsieve query``: retrieve from an index, filtered, optionally answered by the LLM."""
    from ..filter import ConformalFilter
    from ..filtered_search import query_with_filter
    from ..store import SnippetIndex

    if args.generate and args.json:
        raise ValueError("--generate prints a text answer; use it without --json.")
    index = SnippetIndex.open(args.index, create=False)  # a mistyped path is an error
    if args.filter:
        flt = ConformalFilter.load(args.filter)
        flt.watch_lists(log=False)  # a list unlike the calibration lists is said once, below
        said = _warn_other_retriever(flt, index, args.k)
        if flt.unit == "sentence":  # it reads each hit's sentences: scored from the texts
            hits = index.search(args.query, k=args.k)
            res = flt.filter(args.query, [h.text for h in hits], group=args.group)
        else:
            hits, res = query_with_filter(index, args.query, flt, k=args.k, group=args.group)
        kept: set[int] | None = {s.index for s in res.kept}
    else:
        hits, res, kept, said = index.search(args.query, k=args.k), None, None, None
    if res is not None and res.lists_unlike and not said:
        eprint(f"warning: {res.lists_note}")  # the one report of it (the warning above, else)
    if args.json:
        print(dumps(_query_json(args.query, hits, res, kept)))
        return 0
    for i, h in enumerate(hits):
        if kept is None or i in kept:
            score = h.score if res is None else res.scores[i]
            print(f"[{score:.3f}] {h.snippet_id}  {h.text[:110]!r}")
    if res is not None:
        print(f"kept {len(res.kept)} of {res.n_input} retrieved snippets ({res.removal:.0%} "
              f"removed), tau={res.threshold:.4f}" + (f"; {res.note}" if res.note else ""))
    if args.generate:
        from ..generation import answer_with_citations
        from ..llm.connect import connect

        context = ([s.pruned_text if res.unit == "sentence" else s.text for s in res.kept]
                   if res is not None else [h.text for h in hits])
        with connect(**LLMEndpoint.from_args(args).connect_kwargs()) as conn:
            if conn.is_local:
                eprint(f"no --base-url: started the local model {conn.model} at {conn.base_url}")
            answer = answer_with_citations(conn, args.query, context)
        print(f"\nAnswer ({conn.model}): {answer.text}")
        if answer.citations:
            print("cited: " + ", ".join(f"[{n}] {context[n - 1][:80]!r}"
                                        for n in answer.citations))
        if answer.unknown_citations:
            print(f"cites snippets that do not exist: {list(answer.unknown_citations)}")
    return 0


def cmd_retrieve(args: argparse.Namespace) -> int:
    """``ragsieve retrieve``: search the index for every labelled query and write what it
    returns as labelled pairs carrying the index's identity (the lists to calibrate on)."""
    import sys
    from contextlib import nullcontext

    from ..data import describe_lists, read_queries, write_pairs
    from ..embeddings import EmbeddingCache
    from ..lists import describe_retriever, retriever_of
    from ..retrieval import retrieve_pairs
    from ..store import SnippetIndex
    from .scorers import embedding_cache_dir

    # a bad line fails before any model work
    queries = read_queries(args.queries, language=args.language)
    index = SnippetIndex.open(args.index, create=False)  # a mistyped path is an error
    # the queries' vectors kept where `calibrate` looks: it embeds them no more
    with (nullcontext() if args.no_cache else
          EmbeddingCache(index.model, cache_dir=embedding_cache_dir(args.cache_dir))) as cache:
        pairs = retrieve_pairs(index, queries, args.k, language=args.language,
                               progress=not args.quiet, query_cache=cache)
    write_pairs(pairs, args.out)
    summary = describe_lists(queries, pairs, args.k, known_doc_ids=index.document_ids())
    retriever = retriever_of(pairs) or index.retriever_identity(args.k)
    _warn_lists(summary, args.k)
    if args.json:
        print(dumps({**summary.to_dict(), "out": args.out, "retriever": retriever}))
        return 0
    out = sys.stderr if args.out == "-" else sys.stdout  # the pairs own stdout then
    print(f"retrieved {summary.n_queries} queries from {args.index}: "
          f"{describe_retriever(retriever)}, {retriever['n_snippets']} snippets", file=out)
    print(f"{summary.n_hits} hits, {summary.n_relevant} relevant; {summary.n_labelled} "
          f"labelled queries, {len(summary.no_relevant)} of them without a relevant hit",
          file=out)
    if summary.short:
        print(f"{len(summary.short)} queries got fewer than {args.k} hits: the index holds "
              f"{retriever['n_snippets']} snippets", file=out)
    if summary.unlabelled:
        print(f"unlabelled queries: {len(summary.unlabelled)} (relevant: null); label their "
              f"pairs with `ragsieve label --data {args.out} --out labelled.jsonl` before "
              "calibrating", file=out)
    print(f"wrote {summary.n_hits} pairs to {args.out}", file=out)
    return 0


def _shown(ids: Any, n: int = 5) -> str:
    """The first ``n`` of ``ids``, then ``...``."""
    ids = list(ids)
    return ", ".join(ids[:n]) + (", ..." if len(ids) > n else "")


def _warn_lists(summary: Any, k: int) -> None:
    """Say (stderr) which labels name no indexed document and which queries the retriever
    missed: one line each."""
    if summary.unknown_doc_ids:
        named: dict[str, str] = {}  # doc id -> the first query naming it
        for q, d in summary.unknown_doc_ids:
            named.setdefault(d, q)
        shown = _shown(f"{d!r} in {q}" for d, q in named.items())
        alone = (f"{len(summary.unfindable)} of them ({_shown(summary.unfindable)}) name no "
                 "other" if summary.unfindable else "each query names another too")
        eprint(f"warning: {len(summary.unknown_doc_ids)} relevant_doc_ids of "
               f"{len({q for q, _ in summary.unknown_doc_ids})} labelled queries name no "
               f"document of the index ({shown}): no retriever can return them; {alone}; use "
               "the ids `ragsieve index` records (a file's path relative to the indexed "
               "folder, or a JSONL document's \"id\")")
    if summary.misses:
        eprint(f"warning: {len(summary.misses)} of {summary.n_labelled} labelled queries have "
               f"no relevant snippet in their top {k} ({_shown(summary.misses)}): recall "
               "misses of the retriever, which no filter recovers; calibrating on these "
               "lists needs relevant snippets only from the other queries (a larger -k finds "
               "more; or check their labels)")


def _warn_other_retriever(flt: Any, index: Any, k: int) -> str | None:
    """Say (stderr) when ``flt`` was calibrated on lists of another retriever than ``index``'s
    top ``k`` and its score reads the whole list; the reason, or None."""
    from ..lists import DOCS, compare_retriever

    reason = compare_retriever(flt.lists, index.retriever_identity(k))
    if reason:
        eprint(f"warning: {reason}; its score reads the whole list, so its guarantee holds for "
               "lists like its calibration lists: calibrate through this index (`ragsieve "
               f"retrieve --index {index.path} -k {k}`, then `ragsieve calibrate`); see {DOCS}")
    return reason


def cmd_export(args: argparse.Namespace) -> int:
    """``ragsieve export``: write a dataset in the generic JSONL format (``--out``), or as the
    documents and labelled queries of the retrieve-then-calibrate path (``--docs``,
    ``--queries``)."""
    import json

    from .._io import atomic_write_text
    from ..data import write_pairs
    from ..data.queries import documents_and_queries

    if args.out is None and args.docs is None and args.queries is None:
        raise ValueError("export writes nothing: give --out (the pairs), --docs DIR (the "
                         "documents) and/or --queries FILE (the labelled queries).")
    pairs = DataSource(args.data, args.data_dir).load()
    if args.out is not None:
        n = write_pairs(pairs, args.out)
        eprint(f"wrote {n} pairs to {args.out}")
    if args.docs is None and args.queries is None:
        return 0
    documents, queries = documents_and_queries(pairs)
    if args.docs is not None:
        path = Path(args.docs) / "documents.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, "".join(json.dumps({"id": d, "text": t}, ensure_ascii=False)
                                        + "\n" for d, t in documents.items()))
        eprint(f"wrote {len(documents)} documents to {path} (ragsieve index {args.docs} ...)")
    if args.queries is not None:
        atomic_write_text(args.queries, "".join(json.dumps(q.to_record(), ensure_ascii=False)
                                                + "\n" for q in queries))
        eprint(f"wrote {len(queries)} labelled queries to {args.queries} (ragsieve retrieve "
               f"--queries {args.queries} ...)")
    return 0
