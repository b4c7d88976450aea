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


def _modes(text: str) -> list[str]:
    from .calibration import MODES

    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {bad}; accepted: {', '.join(MODES)}")
    return modes


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
    p.add_argument("--scorer", default="embedding",
                   help="embedding (1 - cos), relative (query-relative, see --relative-kind), "
                        "best (fused score fitted on part of the calibration data), or llm")
    p.add_argument("--relative-kind", choices=["gap", "z", "rank", "ratio"], default="gap",
                   help="scorer relative: how a snippet's cosine is compared with its list")
    p.add_argument("--model", default=None,
                   help="embedding model: minilm, use, or any sentence-transformers name/path "
                        "(default: per language, MiniLM for en, multilingual USE otherwise)")
    p.add_argument("--language", default=None, help="language of the data (default: en, or the dataset's)")
    p.add_argument("--cache-dir", default=os.environ.get("RAGSIEVE_CACHE"),
                   help="embedding cache directory (env RAGSIEVE_CACHE; default ~/.cache/ragsieve)")
    p.add_argument("--no-cache", action="store_true", help="do not persist embeddings on disk")


def _add_llm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM (scorer llm, labelling)")
    g.add_argument("--base-url", default=os.environ.get("RAGSIEVE_LLM_BASE_URL"),
                   help="OpenAI-compatible base URL incl. /v1 (env RAGSIEVE_LLM_BASE_URL); "
                        "default: start the local model on 127.0.0.1 for this command")
    g.add_argument("--llm-model", default=os.environ.get("RAGSIEVE_LLM_MODEL"),
                   help="model name for --base-url, or the local model (gemma3-270m, smollm2-135m, "
                        "a .gguf path) (env RAGSIEVE_LLM_MODEL)")
    g.add_argument("--llm-style", choices=["completion", "chat"], default=None,
                   help="prompt style (default: the local model's, chat for endpoints)")
    g.add_argument("--llm-threads", type=int, default=None,
                   help="CPU threads of the local model (env RAGSIEVE_LLM_THREADS, default 1)")
    g.add_argument("--llm-concurrency", type=int, default=None, help="requests in flight")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY", help="env var holding the API key")


def _add_llm_scorer_args(p: argparse.ArgumentParser) -> None:
    _add_llm_args(p)
    p.add_argument("--llm-mode", choices=["logprob", "rating"], default="logprob",
                   help="scorer llm: P(yes) from logprobs (default) or a verbal rating in [0, 1]")
    p.add_argument("--tie-breaking", choices=["none", "random"], default="none",
                   help="scorer llm: random jitter so tied (discrete) scores cover exactly")


def _llm_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "base_url": args.base_url, "model": args.llm_model, "style": args.llm_style,
        "threads": args.llm_threads, "concurrency": args.llm_concurrency,
        "api_key_env": args.api_key_env,
    }


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
    if args.scorer in ("embedding", "best", "relative"):
        kwargs = {"model": args.model, "language": _language_of(args)}
        if not args.no_cache:
            kwargs["cache_dir"] = _embedding_cache_dir(args)
        if args.scorer == "best":
            return "best"  # evaluate / calibrate fit the fusion on part of the calibration data
        if args.scorer == "relative":
            return resolve_scorer("relative", kind=args.relative_kind, base=resolve_scorer("embedding", **kwargs))
    elif args.scorer == "llm":
        kwargs = {"mode": args.llm_mode, "tie_breaking": args.tie_breaking, **_llm_options(args)}
        if args.no_cache:
            kwargs["cache"] = False
    return resolve_scorer(args.scorer, **kwargs)


def _artifact_scorer_options(args: argparse.Namespace, payload: dict[str, Any]) -> dict[str, Any]:
    """Options that do not change scores, for rebuilding an artifact's scorer from its spec:
    the embedding cache for embedding-based scorers, the endpoint and cache for the LLM."""
    spec = payload.get("scorer")
    kind = spec.get("scorer") if isinstance(spec, dict) else None
    if kind in ("embedding", "relative", "fusion"):
        return {} if args.no_cache else {"cache_dir": _embedding_cache_dir(args)}
    if kind == "llm" and hasattr(args, "base_url"):
        options = {k: v for k, v in _llm_options(args).items() if v is not None and k != "model"}
        return {**options, "cache": False} if args.no_cache else options
    return {}


def _embedding_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {"model": args.model, "language": _language_of(args)}
    if not args.no_cache:
        opts["cache_dir"] = _embedding_cache_dir(args)
    return opts


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
    if args.limit_queries:
        from .data import sample_queries

        pairs = sample_queries(pairs, args.limit_queries, seed=args.seed)
    scorer = _make_scorer(args)
    t0 = time.perf_counter()
    report = evaluate(
        pairs,
        scorer,
        scorer_options=_embedding_options(args) if scorer == "best" else None,
        progress=not args.quiet,
        on_error=args.on_error,
        modes=args.mode,
        delta=args.delta,
        group_by=args.group_by,
        budgets=args.budget,
        alphas=args.alpha,
        top_k=args.top_k,
        thetas=args.theta,
        n_splits=args.splits,
        calibration_fraction=args.calibration_fraction,
        seed=args.seed,
    )
    report.info["dataset"] = str(args.data)
    report.info["scoring_seconds"] = round(time.perf_counter() - t0, 2)
    report.info["pairs_per_second"] = round(len(pairs) / max(report.info["scoring_seconds"], 1e-9), 3)
    if args.limit_queries:
        report.info["limit_queries"] = args.limit_queries
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
    scorer = _make_scorer(args)
    if scorer == "best":  # fit the fusion on half of the topics, calibrate on the other half
        from .data import group_splits
        from .scoring import FusedScorer

        fit_idx, cal_idx = group_splits([p.group for p in pairs], n_splits=1, seed=0)[0]
        scorer = FusedScorer.fit([pairs[i] for i in fit_idx], "embedding", **_embedding_options(args))
        pairs = [pairs[i] for i in cal_idx]
        _eprint(f"fusion fitted on {len(fit_idx)} pairs of half the topics; calibrating on the other "
                f"{len(pairs)} pairs")
    flt = ConformalFilter(scorer, alpha=args.alpha, min_keep=args.min_keep)
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
    flt = ConformalFilter.from_dict(payload, scorer_options=_artifact_scorer_options(args, payload))
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


def cmd_label(args: argparse.Namespace) -> int:
    from .data import sample_queries, write_pairs
    from .labeling import LLMLabeler

    pairs = _load_pairs(args)
    if args.limit_queries:
        pairs = sample_queries(pairs, args.limit_queries, seed=args.seed)
    options = _llm_options(args)
    if args.no_cache:
        options["cache"] = False
    labeler = LLMLabeler(method=args.method, threshold=args.threshold, **options)
    try:
        if labeler.connection.is_local:
            _eprint(f"no --base-url: started the local model {labeler.connection.model} at "
                    f"{labeler.connection.base_url} for this command")
        labelled, report = labeler.label_pairs(pairs, progress=not args.quiet)
    finally:
        labeler.close()
    write_pairs(labelled, args.out)
    info = report.to_dict()
    tokens = report.prompt_tokens + report.completion_tokens
    info["cost"] = report.new_tokens * args.price_per_million_tokens / 1e6
    if args.json:
        print(_dumps(info))
        return 0
    print(f"labelled {report.n_labelled}/{report.n_pairs} pairs ({report.n_errors} errors, label null) "
          f"-> {args.out}")
    print(f"  model {report.model}, method {report.method}, prompt {report.prompt_version}")
    print(f"  {report.n_requests} requests, {report.n_cache_hits} answers from the cache; "
          f"{tokens} tokens in all ({report.prompt_tokens} prompt + {report.completion_tokens} "
          f"completion), {report.new_tokens} new in this run: cost {info['cost']:.4f} at "
          f"{args.price_per_million_tokens:g}/M tokens")
    print(f"  {report.seconds:.1f} s, {report.pairs_per_second:.2f} pairs/s")
    if report.agreement:
        a = report.agreement
        print(f"  agreement with the existing labels on {a['n']} pairs: accuracy {a['accuracy']:.3f}, "
              f"Cohen's kappa {a['kappa']:.3f} (tp {a['tp']}, fp {a['fp']}, fn {a['fn']}, tn {a['tn']})")
    return 0


def cmd_llm_serve(args: argparse.Namespace) -> int:
    from .llm.local import serve

    serve(args.model, host=args.host, port=args.port, threads=args.threads, n_ctx=args.n_ctx,
          n_parallel=args.parallel)
    return 0


def cmd_llm_injection(args: argparse.Namespace) -> int:
    import random

    from .llm.connect import connect
    from .llm.injection import measure_injection
    from .llm.judge import RelevanceJudge

    pairs = [p for p in _load_pairs(args, require_labels=True) if p.relevant == 0]
    random.Random(args.seed).shuffle(pairs)
    items = [(p.query, p.text) for p in pairs[: args.n_pairs]]
    options = _llm_options(args)
    with connect(**options) as conn:
        if conn.is_local:
            _eprint(f"no --base-url: started the local model {conn.model} at {conn.base_url}")
        result = measure_injection(RelevanceJudge(conn.client, style=conn.style), items,
                                   progress=not args.quiet)
    result["model"] = conn.model
    if args.json:
        print(_dumps(result))
        return 0
    print(f"prompt injection on {result['n_pairs']} non-relevant pairs x {len(result['injections'])} "
          f"injections ({conn.model}):")
    for variant in ("defended", "undefended"):
        if variant in result:
            r = result[variant]
            print(f"  {variant:<11} mean P(yes) shift {r['mean_shift']:+.3f}, max {r['max_shift']:+.3f}, "
                  f"label flips {r['flip_rate']:.1%} ({r['n_judged']} judged, {r['n_errors']} errors)")
    return 0


def cmd_shift_demo(args: argparse.Namespace) -> int:
    from .evaluation.shift import run_shift_demo

    kw: dict[str, Any] = {}
    if args.data_dir:
        kw["data_dir"] = args.data_dir
    _eprint(f"stream: {args.phase1} then {args.phase2}, scored with MiniLM; static vs adaptive (ACI) "
            f"filter at alpha={args.alpha:g}")
    res = run_shift_demo(args.out, seed=args.seed, phase1=args.phase1, phase2=args.phase2,
                         alpha=args.alpha, gamma=args.gamma, **kw)
    if args.json:
        print(_dumps(res))
        return 0
    print(f"static threshold {res['static_threshold']:.4f} (calibrated on held-out {args.phase1} topics)")
    for phase in ("phase1", "phase2"):
        r = res[phase]
        print(f"{phase} ({res[phase + '_dataset']}): static coverage {r['static']['coverage']:.3f} "
              f"removal {r['static']['removal']:.3f} | adaptive coverage {r['adaptive']['coverage']:.3f} "
              f"removal {r['adaptive']['removal']:.3f} | drift p={r['drift']['p_value']:.3g}"
              f"{' DRIFT' if r['drift']['drifted'] else ''}")
    print(f"wrote {res['png']} and {res['json']}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .filter import read_artifact
    from .server import api_key_from_env, run_server

    key = api_key_from_env(args.api_key_env) if args.api_key_env else None
    options = _artifact_scorer_options(args, read_artifact(args.filter))
    run_server(args.filter, host=args.host, port=args.port, api_key=key,
               max_body_bytes=args.max_body_bytes, max_snippets=args.max_snippets,
               scorer_options=options or None, index_path=args.index, max_k=args.max_k)
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from .store import SnippetIndex

    index = SnippetIndex.open(args.index, model=args.model)
    report = index.index_directory(args.docs_dir, batch_size=args.batch_size, progress=not args.quiet)
    print(f"{args.index}: {report.added} file(s) added or changed, {report.unchanged} unchanged, "
          f"{report.removed} removed; {report.n_embedded} snippet(s) embedded; {index.count()} in the index")
    for path, reason in report.skipped:
        print(f"  skipped {path}: {reason}")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from .filter import ConformalFilter
    from .store import SnippetIndex

    if args.generate and args.json:
        raise ValueError("--generate prints a text answer; use it without --json.")
    index = SnippetIndex.open(args.index)
    if args.filter:
        hits, res = index.query_with_filter(args.query, ConformalFilter.load(args.filter), k=args.k)
        kept = {s.index for s in res.kept}
    else:
        hits, res, kept = index.search(args.query, k=args.k), None, None
    if args.json:
        print(_dumps({"query": args.query, "hits": [
            {"snippet_id": h.snippet_id, "path": str(h.path), "score": h.score, "text": h.text,
             "filter_score": None if res is None else res.scores[i],
             "kept": None if kept is None else i in kept} for i, h in enumerate(hits)],
            "threshold": None if res is None else res.threshold,
            "removal": None if res is None else res.removal, "note": None if res is None else res.note}))
        return 0
    for i, h in enumerate(hits):
        if kept is None or i in kept:
            score = h.score if res is None else res.scores[i]
            print(f"[{score:.3f}] {h.snippet_id}  {h.text[:110]!r}")
    if res is not None:
        print(f"kept {len(res.kept)} of {res.n_input} retrieved snippets ({res.removal:.0%} removed), "
              f"tau={res.threshold:.4f}" + (f"; {res.note}" if res.note else ""))
    if args.generate:
        from .generation import answer_with_citations
        from .llm.connect import connect

        context = [s.text for s in res.kept] if res is not None else [h.text for h in hits]
        with connect(**_llm_options(args)) as conn:
            if conn.is_local:
                _eprint(f"no --base-url: started the local model {conn.model} at {conn.base_url}")
            answer = answer_with_citations(conn, args.query, context)
        print(f"\nAnswer ({conn.model}): {answer.text}")
        if answer.citations:
            print("cited: " + ", ".join(f"[{n}] {context[n - 1][:80]!r}" for n in answer.citations))
        if answer.unknown_citations:
            print(f"cites snippets that do not exist: {list(answer.unknown_citations)}")
    return 0


def cmd_rag_demo(args: argparse.Namespace) -> int:
    """XQuAD English articles -> index -> calibrated filter -> a question answered with context."""
    from ._io import atomic_write_text
    from .data import group_splits, load_xquad
    from .data.xquad import xquad_file
    from .filter import ConformalFilter
    from .scoring import EmbeddingScorer
    from .store import SnippetIndex

    out = Path(args.out)
    docs = out / "docs"
    raw = json.loads(xquad_file("en", data_dir=args.data_dir).read_text(encoding="utf-8"))
    for article in raw["data"]:
        text = "\n\n".join(p["context"] for p in article["paragraphs"])
        atomic_write_text(docs / f"{article['title']}.txt", text + "\n")
    _eprint(f"[1/3] wrote {len(raw['data'])} XQuAD articles to {docs}; indexing")
    index = SnippetIndex.open(out / "index")
    report = index.index_directory(docs, progress=not args.quiet)
    _eprint(f"      {report.n_embedded} snippet(s) embedded, {index.count()} in the index")
    pairs = load_xquad("en", data_dir=args.data_dir)
    cal_idx, test_idx = group_splits([p.group for p in pairs], n_splits=1, seed=args.seed)[0]
    cache: dict[str, Any] = {} if args.no_cache else {"cache_dir": _embedding_cache_dir(args)}
    flt = ConformalFilter(EmbeddingScorer(**cache), alpha=args.alpha).calibrate([pairs[i] for i in cal_idx])
    flt.save(out / "filter.json")
    _eprint(f"[2/3] filter calibrated on half of the articles: alpha={args.alpha:g}, tau={flt.threshold:.4f}")
    question = args.question or pairs[int(test_idx[0])].query
    hits, res = index.query_with_filter(question, flt, k=args.k)
    print(f"[3/3] Q: {question}")
    print(f"kept {len(res.kept)} of {res.n_input} retrieved snippets ({res.removal:.0%} removed), "
          f"tau={res.threshold:.4f}" + (f"; {res.note}" if res.note else ""))
    for s in res.kept:
        print(f"  [{s.score:.3f}] {hits[s.index].snippet_id}: {s.text[:110]!r}")
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
    p.add_argument("--limit-queries", type=int, default=None,
                   help="evaluate on N queries drawn at random across topics (bounds LLM cost)")
    p.add_argument("--on-error", choices=["raise", "drop"], default="raise",
                   help="pairs the scorer cannot score: fail (default) or drop them and report how many")
    p.add_argument("--mode", type=_modes, default=["marginal"],
                   help="guarantee modes, comma-separated: marginal, query-recall, query-all, pac, "
                        "group, topic (default marginal)")
    p.add_argument("--delta", type=float, default=0.1, help="pac mode: P(calibration draw is unlucky)")
    p.add_argument("--group-by", default=None,
                   help="group mode: the meta field to calibrate per (e.g. language, topic)")
    p.add_argument("--budget", type=_ints, default=[],
                   help="character budgets per query to report next to the guarantee, e.g. 1000,1500")
    _add_llm_scorer_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("calibrate", help="calibrate a filter on labelled pairs and save it")
    _add_data_args(p)
    _add_scorer_args(p)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--min-keep", type=int, default=0, help="empty-result policy (default 0)")
    _add_llm_scorer_args(p)
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
    _add_llm_args(p)
    p.set_defaults(func=cmd_filter)

    p = sub.add_parser("label", help="label pairs with an LLM (relevant + raw answer), resumable")
    _add_data_args(p)
    p.add_argument("--out", required=True, help="labelled generic JSONL")
    p.add_argument("--method", choices=["auto", "logprob", "yes-no"], default="auto")
    p.add_argument("--threshold", type=float, default=0.5, help="P(yes) threshold of --method logprob")
    p.add_argument("--limit-queries", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--price-per-million-tokens", type=float, default=0.0,
                   help="for the cost estimate (0 for a local model)")
    p.add_argument("--no-cache", action="store_true", help="do not use the persistent LLM cache")
    p.add_argument("--json", action="store_true")
    _add_llm_args(p)
    p.set_defaults(func=cmd_label)

    p = sub.add_parser("llm", help="the local LLM")
    llm_sub = p.add_subparsers(dest="llm_command", required=True)
    q = llm_sub.add_parser("serve", help="serve the local model (OpenAI-compatible) until Ctrl-C")
    q.add_argument("--model", default="gemma3-270m", help="gemma3-270m, smollm2-135m or a .gguf path")
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--port", type=int, default=8080)
    q.add_argument("--threads", type=int, default=None, help="CPU threads (env RAGSIEVE_LLM_THREADS, default 1)")
    q.add_argument("--n-ctx", type=int, default=4096)
    q.add_argument("--parallel", type=int, default=1, help="parallel slots")
    q.set_defaults(func=cmd_llm_serve)
    q = llm_sub.add_parser("injection", help="measure how far injected instructions move judgements")
    _add_data_args(q)
    q.add_argument("--n-pairs", type=int, default=40, help="non-relevant pairs to test")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--json", action="store_true")
    _add_llm_args(q)
    q.set_defaults(func=cmd_llm_injection)

    p = sub.add_parser("shift-demo", help="a stream that switches dataset/language: static vs adaptive")
    p.add_argument("--out", default="ragsieve-shift")
    p.add_argument("--phase1", default="xquad-en")
    p.add_argument("--phase2", default="xquad-de")
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--gamma", type=float, default=0.005, help="ACI step size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_shift_demo)

    p = sub.add_parser("index", help="chunk, embed and store a folder of documents (LanceDB)")
    p.add_argument("docs_dir")
    p.add_argument("--index", required=True, help="index directory (created if missing)")
    p.add_argument("--model", default=None, help="embedding model (default: the index's, or MiniLM)")
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("query", help="retrieve from an index, filtered by a calibrated filter")
    p.add_argument("query")
    p.add_argument("--index", required=True)
    p.add_argument("--filter", default=None,
                   help="filter artifact: embedding, relative or best scorer on the index's model")
    p.add_argument("-k", type=int, default=20, help="snippets to retrieve")
    p.add_argument("--json", action="store_true")
    p.add_argument("--generate", action="store_true",
                   help="ask the LLM for an answer grounded in the kept snippets, with citations")
    _add_llm_args(p)
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("rag-demo", help="index the XQuAD English articles and ask a question, filter in the loop")
    p.add_argument("--out", default="ragsieve-rag")
    p.add_argument("--question", default=None, help="default: a question from the held-out articles")
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("-k", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--cache-dir", default=os.environ.get("RAGSIEVE_CACHE"))
    p.add_argument("--no-cache", action="store_true")
    p.set_defaults(func=cmd_rag_demo)

    p = sub.add_parser("serve", help="HTTP service: POST /filter (and /query with --index) with a calibrated filter")
    p.add_argument("--filter", required=True, help="filter artifact written by `calibrate`")
    p.add_argument("--index", default=None, help="index directory served by POST /query (see `ragsieve index`)")
    p.add_argument("--max-k", type=int, default=100, help="largest k a /query request may ask for")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key-env", default=None,
                   help="env var holding the API key (required to bind a non-loopback host)")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000)
    p.add_argument("--max-snippets", type=int, default=1000)
    p.add_argument("--cache-dir", default=os.environ.get("RAGSIEVE_CACHE"))
    p.add_argument("--no-cache", action="store_true")
    p.set_defaults(func=cmd_serve)

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
