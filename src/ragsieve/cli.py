"""``ragsieve`` command line: parse, call the library, print.

Library errors become one-line messages with exit code 2 (no traceback); ``--json``
gives machine-readable output next to the human tables.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._version import __version__
from .errors import RagsieveError

logger = logging.getLogger(__name__)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def _json_default(obj: Any) -> Any:
    if isinstance(obj, float) and math.isinf(obj):
        return None
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _dumps(obj: Any, **kw: Any) -> str:
    return json.dumps(_finite(obj), default=_json_default, ensure_ascii=False, **kw)


def _finite(obj: Any) -> Any:
    """Replace inf/nan floats by None so the output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# ---------------------------------------------------------------- helpers
def _add_scorer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scorer", default="embedding", help="scorer alias (default: embedding)")
    p.add_argument("--model", default=None,
                   help="embedding model: minilm, use, or any sentence-transformers name/path "
                        "(default: per language, MiniLM for en, multilingual USE otherwise)")
    p.add_argument("--language", default=None, help="language of the data (default: en, or the dataset's)")
    p.add_argument("--cache-dir", default=os.environ.get("RAGSIEVE_CACHE"),
                   help="embedding cache directory (env RAGSIEVE_CACHE; default ~/.cache/ragsieve)")
    p.add_argument("--no-cache", action="store_true", help="do not persist embeddings on disk")


def _add_data_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--data", required=required,
                   help="generic JSONL file, or a dataset name: xquad-en, xquad-de, xquad-es, "
                        "xquad-zh, selqa-dev")
    p.add_argument("--data-dir", default=None, help="dataset directory (env RAGSIEVE_DATA)")


def _language_of(args: argparse.Namespace) -> str:
    if args.language:
        return str(args.language)
    name = str(getattr(args, "data", "") or "")
    if name.startswith("xquad-"):
        return name.split("-", 1)[1]
    return "en"


def _make_scorer(args: argparse.Namespace) -> Any:
    from .scoring import resolve_scorer

    kwargs: dict[str, Any] = {}
    if args.scorer == "embedding":
        kwargs = {"model": args.model, "language": _language_of(args)}
        if not args.no_cache:
            kwargs["cache_dir"] = _embedding_cache_dir(args)
    return resolve_scorer(args.scorer, **kwargs)


def _embedding_cache_dir(args: argparse.Namespace) -> Path:
    from .data.paths import cache_dir

    return Path(args.cache_dir) if args.cache_dir else cache_dir() / "embeddings"


def _load_pairs(args: argparse.Namespace, *, require_labels: bool = False) -> list[Any]:
    from .data import load_dataset

    kw: dict[str, Any] = {}
    if args.data_dir:
        kw["data_dir"] = args.data_dir
    if str(args.data).endswith(".jsonl") or Path(args.data).is_file():
        kw = {"require_labels": require_labels} if require_labels else {}
    t0 = time.perf_counter()
    pairs = load_dataset(args.data, **kw)
    logger.info("loaded %d pairs from %s in %.1fs", len(pairs), args.data, time.perf_counter() - t0)
    return pairs


def _eprint(*a: Any) -> None:
    print(*a, file=sys.stderr)


# ---------------------------------------------------------------- commands
def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluation import evaluate, format_table

    pairs = _load_pairs(args, require_labels=True)
    scorer = _make_scorer(args)
    report = evaluate(
        pairs,
        scorer,
        progress=not args.quiet,
        alphas=args.alpha,
        top_k=args.top_k,
        thetas=args.theta,
        n_splits=args.splits,
        calibration_fraction=args.calibration_fraction,
        seed=args.seed,
    )
    report.info["dataset"] = str(args.data)
    # print the computed results before plotting, so a plotting failure loses nothing
    if args.json:
        print(_dumps(report.to_dict()), flush=True)
    else:
        print(format_table(report), flush=True)
    if args.plot:
        from .evaluation.plots import plot_report

        plot_report(report, args.plot, title=f"ragsieve evaluate: {args.data}")
        _eprint(f"plot written to {args.plot}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .filter import ConformalFilter

    pairs = _load_pairs(args, require_labels=True)
    flt = ConformalFilter(_make_scorer(args), alpha=args.alpha, min_keep=args.min_keep)
    flt.calibrate(pairs, progress=not args.quiet)
    flt.save(args.out)
    info = flt.to_dict()
    if args.json:
        print(_dumps(info))
    else:
        cal = info["calibration"]
        tau = "inf (keeps everything)" if cal["threshold_is_infinite"] else f"{cal['threshold']:.4f}"
        print(
            f"calibrated on {info['data']['n_relevant']} relevant snippets "
            f"({info['data']['n_queries']} queries, {info['data']['n_groups']} groups): "
            f"alpha={cal['alpha']:g}, tau={tau}, coverage band "
            f"[{cal['coverage_band'][0]:.3f}, {cal['coverage_band'][1]:.3f}] -> {args.out}"
        )
    return 0


def cmd_filter(args: argparse.Namespace) -> int:
    from .filter import ConformalFilter, read_artifact

    payload = read_artifact(args.filter)
    options: dict[str, Any] = {}
    if payload.get("scorer", {}).get("scorer") == "embedding" and not args.no_cache:
        options["cache_dir"] = _embedding_cache_dir(args)
    flt = ConformalFilter.from_dict(payload, scorer_options=options)
    pairs = _load_pairs(args)
    results = flt.filter_pairs(pairs, progress=not args.quiet)
    total_in = sum(r.n_input for r in results.values())
    total_kept = sum(len(r.kept) for r in results.values())
    for qid, r in results.items():
        if args.json:
            print(_dumps({
                "query_id": qid, "query": r.query, "kept": r.kept_ids,
                "scores": [s.score for s in r.kept], "n_input": r.n_input,
                "removal": r.removal, "threshold": r.threshold, "note": r.note,
            }))
        else:
            print(f"{qid}: kept {len(r.kept)}/{r.n_input}  {r.query[:70]}")
            for s in r.kept:
                print(f"    {s.score:.4f}  {s.snippet_id}")
            if r.note:
                print(f"    note: {r.note}")
    if not args.json:
        rm = 1 - total_kept / total_in if total_in else 0.0
        print(f"{len(results)} queries, kept {total_kept}/{total_in} snippets (removed {rm:.1%}), "
              f"tau={flt.threshold:.4f}, alpha={flt.alpha:g}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .data import write_pairs

    pairs = _load_pairs(args)
    n = write_pairs(pairs, args.out)
    _eprint(f"wrote {n} pairs to {args.out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ._io import atomic_write_text
    from .data import load_dataset
    from .data.splits import group_splits
    from .evaluation import evaluate, format_table
    from .evaluation.plots import plot_report
    from .filter import ConformalFilter

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.data = f"xquad-{args.language or 'en'}"
    _eprint(f"[1/4] loading {args.data} (topic = Wikipedia article)")
    kw = {"data_dir": args.data_dir} if args.data_dir else {}
    pairs = load_dataset(args.data, **kw)
    scorer = _make_scorer(args)
    _eprint(f"[2/4] scoring {len(pairs)} (query, snippet) pairs with {scorer.spec()} "
            "(embeddings are cached per text)")
    t0 = time.perf_counter()
    report = evaluate(pairs, scorer, progress=True, alphas=args.alpha, n_splits=args.splits, seed=args.seed)
    report.info["dataset"] = args.data
    report.info["seconds"] = round(time.perf_counter() - t0, 1)
    _eprint(f"[3/4] {report.n_splits} topic-disjoint splits evaluated")
    print(format_table(report))
    atomic_write_text(out / "report.json", _dumps(report.to_dict(), indent=2) + "\n")
    plot_report(report, out / "coverage.png", title=f"ragsieve demo: {args.data}, {scorer.spec().get('model')}")

    # a filter calibrated on half of the topics, applied to one query of the other half
    cal_idx, test_idx = group_splits([p.group for p in pairs], n_splits=1, seed=args.seed)[0]
    flt = ConformalFilter(scorer, alpha=0.1).calibrate([pairs[i] for i in cal_idx])
    flt.save(out / "filter.json")
    first = pairs[int(test_idx[0])]
    example = [pairs[i] for i in test_idx if pairs[i].query_id == first.query_id]
    res = flt.filter(first.query, example)
    _eprint(f"[4/4] wrote {out / 'report.json'}, {out / 'coverage.png'}, {out / 'filter.json'}")
    print(f"\nExample (alpha=0.1, tau={flt.threshold:.4f}, calibrated on other articles):")
    print(f"  Q: {first.query}")
    print(f"  kept {len(res.kept)} of {res.n_input} snippets ({res.removal:.0%} removed):")
    for s in res.kept:
        rel = "relevant" if example[s.index].relevant else "not relevant"
        print(f"    [{s.score:.3f}, {rel}] {s.text[:100]!r}...")
    return 0


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragsieve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ragsieve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO messages")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("evaluate", help="topic-disjoint coverage/removal sweep with baselines")
    _add_data_args(p)
    _add_scorer_args(p)
    p.add_argument("--alpha", type=_floats, default=[0.05, 0.1, 0.2, 0.3, 0.4])
    p.add_argument("--top-k", type=_ints, default=[1, 2, 3, 5])
    p.add_argument("--theta", type=_floats, default=[0.2, 0.3, 0.4, 0.5],
                   help="fixed similarity cut-offs (keep when 1 - score >= theta)")
    p.add_argument("--splits", type=int, default=20)
    p.add_argument("--calibration-fraction", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", default=None, help="write the figure to this PNG")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("calibrate", help="calibrate a filter on labelled pairs and save it")
    _add_data_args(p)
    _add_scorer_args(p)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--min-keep", type=int, default=0, help="empty-result policy (default 0)")
    p.add_argument("--out", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("filter", help="apply a saved filter to pairs (one line per query)")
    p.add_argument("--filter", required=True, help="filter artifact written by `calibrate`")
    _add_data_args(p)
    p.add_argument("--language", default=None)
    p.add_argument("--cache-dir", default=os.environ.get("RAGSIEVE_CACHE"))
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_filter)

    p = sub.add_parser("export", help="write a dataset in the generic JSONL format")
    _add_data_args(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("demo", help="XQuAD end to end: sweep, baselines, table, plot, report")
    p.add_argument("--out", default="ragsieve-demo")
    p.add_argument("--splits", type=int, default=20)
    p.add_argument("--alpha", type=_floats, default=[0.05, 0.1, 0.2, 0.3, 0.4])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--scorer", default="embedding")
    p.add_argument("--model", default=None)
    p.add_argument("--language", default="en")
    p.add_argument("--cache-dir", default=os.environ.get("RAGSIEVE_CACHE"))
    p.add_argument("--no-cache", action="store_true")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragsieve`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except (RagsieveError, ValueError, TypeError, OSError, ImportError) as exc:
        print(f"ragsieve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
