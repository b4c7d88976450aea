"""The demos: ``ragsieve demo`` (``make demo``), ``rag-demo`` and ``shift-demo``.

They are longer than a command and print a story, so they live apart from the command
modules (:mod:`ragsieve.cli.evaluating`, :mod:`ragsieve.cli.filtering`,
:mod:`ragsieve.cli.labelling`, :mod:`ragsieve.cli.serving`, :mod:`ragsieve.cli.indexing`);
like the commands they only call the library.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .output import dumps, eprint
from .scorers import ScorerRequest, embedding_cache_dir, embedding_options

__all__ = ["cmd_demo", "cmd_rag_demo", "cmd_shift_demo", "demo_split"]

EXAMPLE_ALPHA = 0.1
"""Miscoverage of the filters shown on the demo's example query."""

_LABELS = {"embedding": "1 - cos", "best": "fused (best)", "relative": "relative"}


def _demo_scorer(alias: str, request: ScorerRequest) -> Any:
    from ..scoring import resolve_scorer

    options = embedding_options(request)
    if alias == "relative":
        return resolve_scorer("relative", base=resolve_scorer("embedding", **options))
    return resolve_scorer(alias, **options)


def _summary(results: dict[str, Any], relevant: dict[str, set[str]]) -> dict[str, float]:
    """Removal, and coverage of the relevant snippets, over many filter results."""
    n_in = sum(r.n_input for r in results.values())
    n_kept = sum(len(r.kept) for r in results.values())
    n_rel = sum(len(ids) for ids in relevant.values())
    n_rel_kept = sum(len(relevant.get(q, set()) & set(r.kept_ids)) for q, r in results.items())
    return {
        "removal": 1 - n_kept / n_in if n_in else 0.0,
        "coverage": n_rel_kept / n_rel if n_rel else float("nan"),
    }


def _keeps_evidence(results: dict[str, Any], relevant: dict[str, set[str]]) -> list[str]:
    """The queries with relevant snippets that kept all of them."""
    return [q for q, r in results.items()
            if relevant.get(q) and relevant[q] <= set(r.kept_ids)]


def _pick_example(results: dict[str, Any], relevant: dict[str, set[str]],
                  baseline: dict[str, Any]) -> str:
    """The query with the largest removal among those that kept all their relevant
    snippets; ties go to the query the ``baseline`` results removed least from, then to
    the first. The first query when none kept its relevant snippets."""
    candidates = _keeps_evidence(results, relevant)
    if not candidates:
        return next(iter(results))
    return max(candidates, key=lambda q: (results[q].removal, -baseline[q].removal))


def _print_result(label: str, res: Any, tau: float, relevant: set[str], *, texts: bool) -> None:
    n_rel = len(relevant & set(res.kept_ids))
    print(f"  {label} (tau={tau:.4f}): kept {len(res.kept)} of {res.n_input} snippets "
          f"({res.removal:.0%} removed), {n_rel} of {len(relevant)} relevant"
          + (f"; {res.note}" if res.note else ""))
    if not texts:
        return
    for s in res.kept:
        rel = "relevant" if s.snippet_id in relevant else "not relevant"
        print(f"    [{s.score:.3f}, {rel}] {s.text[:100]!r}...")


@dataclass(frozen=True)
class _Demo:
    """What ``ragsieve demo`` compares, on which data, with which options."""

    data: str
    aliases: tuple[str, ...]
    request: ScorerRequest
    alphas: list[float]
    n_splits: int
    seed: int
    progress: bool

    @property
    def labels(self) -> dict[str, str]:
        return {a: _LABELS.get(a, a) for a in self.aliases}


def cmd_demo(args: argparse.Namespace) -> int:
    """``ragsieve demo`` (``make demo``): XQuAD end to end, ``1 - cos`` against the fused
    score on the same topic-disjoint splits, a plot, and one held-out query filtered."""
    from .._io import atomic_write_text
    from ..data import load_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = f"xquad-{args.language or 'en'}"
    demo = _Demo(data, ("embedding",) if args.scorer == "embedding" else ("embedding", args.scorer),
                 replace(ScorerRequest.from_args(args), data=data), args.alpha, args.splits,
                 args.seed, not args.quiet)
    labels, aliases = demo.labels, demo.aliases
    eprint(f"[1/5] loading {data} (topic = Wikipedia article)")
    pairs = load_dataset(data, **({"data_dir": args.data_dir} if args.data_dir else {}))
    reports, plot = _demo_sweep(demo, pairs, out)
    filters, results, relevant = _demo_filters(demo, pairs)
    shown = aliases[-1]
    filters[shown].save(out / "filter.json")
    report_path = atomic_write_text(out / "report.json", dumps({
        "dataset": data,
        "reports": {a: r.to_dict() for a, r in reports.items()},
        "held_out": {a: _summary(results[a], relevant) for a in aliases},
    }, indent=2) + "\n")
    eprint(f"[4/5] wrote {report_path}, {plot}, {out / 'filter.json'} ({labels[shown]})")
    _print_example(demo, filters, results, relevant)
    return 0


def _demo_sweep(demo: _Demo, pairs: list[Any], out: Path) -> tuple[dict[str, Any], Any]:
    """Steps 2 and 3 of the demo: every score evaluated on the same topic-disjoint splits,
    the tables printed and the figure written (its path returned with the reports)."""
    from ..evaluation import evaluate, format_table
    from ..evaluation.plots import plot_report

    labels = demo.labels
    reports = {}
    for alias in demo.aliases:
        scorer = _demo_scorer(alias, demo.request)
        eprint(f"[2/5] {labels[alias]}: scoring {len(pairs)} (query, snippet) pairs with "
               f"{scorer.spec()} (embeddings are cached per text)")
        t0 = time.perf_counter()
        report = evaluate(pairs, scorer, progress=demo.progress, alphas=demo.alphas,
                          n_splits=demo.n_splits, seed=demo.seed)
        report.info["dataset"] = demo.data
        report.info["seconds"] = round(time.perf_counter() - t0, 1)
        reports[alias] = report
    eprint(f"[3/5] {reports['embedding'].n_splits} topic-disjoint splits evaluated, the same "
           f"splits for {' and '.join(labels.values())}")
    for alias, report in reports.items():
        print(f"\n== score: {labels[alias]} ==")
        print(format_table(report))
    plot = plot_report({labels[a]: r for a, r in reports.items()}, out / "coverage.png",
                       title=f"ragsieve demo: {demo.data}, " + " vs ".join(labels.values()))
    return reports, plot


def demo_split(pairs: list[Any], seed: int) -> tuple[list[Any], list[Any]]:
    """The demo's calibration and held-out halves: the topics split in two
    (:func:`~ragsieve.data.splits.group_splits`), with the topics of the shortest and of the
    longest lists moved into the calibration half (each swapped for a calibration topic of
    a length in between).

    A list-aware score's guarantee holds for lists like its calibration lists, and the
    filter flags any other; calibrating on data that spans the lengths it is applied to, as
    a deployment should, keeps the demo from showing its own held-out lists as suspect.
    """
    from ..data.splits import group_splits

    cal_idx, test_idx = group_splits([p.group for p in pairs], n_splits=1, seed=seed)[0]
    sizes: dict[Any, int] = {}
    for p in pairs:
        sizes[p.query_id] = sizes.get(p.query_id, 0) + 1
    length: dict[Any, int] = {}  # a topic's longest list
    for p in pairs:
        length[p.group] = max(length.get(p.group, 0), sizes[p.query_id])
    cal = {pairs[i].group for i in cal_idx}
    test = {pairs[i].group for i in test_idx}
    extremes = [min(length, key=lambda g: (length[g], str(g))),
                max(length, key=lambda g: (length[g], str(g)))]
    lo, hi = length[extremes[0]], length[extremes[1]]
    for topic in extremes:
        between = sorted((g for g in cal if lo < length[g] < hi), key=str)
        if topic in test and between:
            cal.add(topic)
            test.discard(topic)
            cal.discard(between[0])
            test.add(between[0])
    return [p for p in pairs if p.group in cal], [p for p in pairs if p.group in test]


def _demo_filters(demo: _Demo, pairs: list[Any],
                  ) -> tuple[dict[str, Any], dict[str, Any], dict[str, set[str]]]:
    """Filters calibrated on half of the topics, applied to the queries of the other half
    (:func:`demo_split`): the filters, their results and the relevant snippets of each
    held-out query."""
    from ..filter import ConformalFilter

    cal, test = demo_split(pairs, demo.seed)
    relevant: dict[str, set[str]] = {}
    for p in test:
        if p.relevant:
            relevant.setdefault(p.query_id, set()).add(p.snippet_id)
    filters, results = {}, {}
    for alias in demo.aliases:
        filters[alias] = ConformalFilter(_demo_scorer(alias, demo.request), alpha=EXAMPLE_ALPHA)
        filters[alias].calibrate(cal)
        results[alias] = filters[alias].filter_pairs(test)
    return filters, results, relevant


def _print_example(demo: _Demo, filters: dict[str, Any], results: dict[str, Any],
                   relevant: dict[str, set[str]]) -> None:
    """Step 5 of the demo: removal and coverage of each filter on the held-out queries, and
    one query filtered by each."""
    labels, aliases = demo.labels, demo.aliases
    shown = aliases[-1]
    qid = _pick_example(results[shown], relevant, results["embedding"])
    n_test = len(results[shown])
    n_all = len(_keeps_evidence(results[shown], relevant))
    print(f"\n[5/5] Filters at alpha={EXAMPLE_ALPHA:g}, calibrated on half of the articles, "
          f"applied to the {n_test} queries of the other half:")
    for alias in aliases:
        s = _summary(results[alias], relevant)
        print(f"  {labels[alias]:<13} removes {s['removal']:.1%} of the snippets, keeps "
              f"{s['coverage']:.1%} of the relevant ones")
    ties = f" (ties: where {labels['embedding']} removed the least)" if len(aliases) > 1 else ""
    print(f"Example: of the {n_all} held-out queries whose relevant snippets the "
          f"{labels[shown]} filter kept, the one where it removed the most{ties}:")
    print(f"  Q: {results[shown][qid].query}")
    for alias in reversed(aliases):
        _print_result(labels[alias], results[alias][qid], filters[alias].threshold,
                      relevant.get(qid, set()), texts=alias == shown)


def cmd_rag_demo(args: argparse.Namespace) -> int:
    """``ragsieve rag-demo``: XQuAD English articles -> index -> calibrated filter -> a
    question answered from the kept snippets. Everything is written under ``--out``."""
    from .._io import atomic_write_text
    from ..data import group_splits, load_xquad
    from ..data.xquad import xquad_file
    from ..filter import ConformalFilter
    from ..filtered_search import query_with_filter
    from ..scoring import resolve_scorer
    from ..store import SnippetIndex

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    docs = out / "docs"
    raw = json.loads(xquad_file("en", data_dir=args.data_dir).read_text(encoding="utf-8"))
    for article in raw["data"]:
        text = "\n\n".join(p["context"] for p in article["paragraphs"])
        atomic_write_text(docs / f"{article['title']}.txt", text + "\n")
    eprint(f"[1/3] wrote {len(raw['data'])} XQuAD articles to {docs}; indexing")
    index = SnippetIndex.open(out / "index", create=True)
    report = index.index_directory(docs, progress=not args.quiet)
    eprint(f"      {report.n_embedded} snippet(s) embedded, {index.count()} in the index")
    pairs = load_xquad("en", data_dir=args.data_dir)
    cal_idx, test_idx = group_splits([p.group for p in pairs], n_splits=1, seed=args.seed)[0]
    cache: dict[str, Any] = ({} if args.no_cache else
                             {"cache_dir": embedding_cache_dir(args.cache_dir)})
    flt = ConformalFilter(resolve_scorer("embedding", **cache), alpha=args.alpha)
    flt.calibrate([pairs[i] for i in cal_idx])
    flt.save(out / "filter.json")
    eprint(f"[2/3] filter calibrated on half of the articles: alpha={args.alpha:g}, "
           f"tau={flt.threshold:.4f} -> {out / 'filter.json'}")
    question = args.question or pairs[int(test_idx[0])].query
    hits, res = query_with_filter(index, question, flt, k=args.k)
    print(f"[3/3] Q: {question}")
    print(f"kept {len(res.kept)} of {res.n_input} retrieved snippets ({res.removal:.0%} removed), "
          f"tau={res.threshold:.4f}" + (f"; {res.note}" if res.note else ""))
    for s in res.kept:
        print(f"  [{s.score:.3f}] {hits[s.index].snippet_id}: {s.text[:110]!r}")
    return 0


def cmd_shift_demo(args: argparse.Namespace) -> int:
    """``ragsieve shift-demo``: a stream that switches dataset/language, static vs adaptive."""
    from ..evaluation.shift import run_shift_demo

    kw: dict[str, Any] = {}
    if args.data_dir:
        kw["data_dir"] = args.data_dir
    if args.window is not None:
        kw["window"] = args.window
    eprint(f"stream: {args.phase1} then {args.phase2}, scored with MiniLM; static vs adaptive "
           f"(ACI) filter at alpha={args.alpha:g}")
    res = run_shift_demo(args.out, seed=args.seed, phase1=args.phase1, phase2=args.phase2,
                         alpha=args.alpha, gamma=args.gamma, **kw)
    if args.json:
        print(dumps(res))
        return 0
    print(f"static threshold {res['static_threshold']:.4f} (calibrated on held-out "
          f"{args.phase1} topics)")
    for phase in ("phase1", "phase2"):
        r = res[phase]
        print(f"{phase} ({res[phase + '_dataset']}): static coverage "
              f"{r['static']['coverage']:.3f} removal {r['static']['removal']:.3f} | adaptive "
              f"coverage {r['adaptive']['coverage']:.3f} removal {r['adaptive']['removal']:.3f} "
              f"| drift p={r['drift']['p_value']:.3g}"
              f"{' DRIFT' if r['drift']['drifted'] else ''}")
    print(f"wrote {res['png']} and {res['json']}")
    return 0
