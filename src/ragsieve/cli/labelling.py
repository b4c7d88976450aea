"""The ``ragsieve`` subcommands around the LLM: ``label`` (label pairs with an LLM as an
engine job, streaming and resumable), ``llm serve`` (the local model as an
OpenAI-compatible server) and ``llm injection`` (how far injected instructions move the
LLM's relevance judgements).
"""

from __future__ import annotations

import argparse

from .common import _job_line, _run_job
from .output import dumps, eprint
from .values import DataSource, EngineOptions, LLMEndpoint

__all__ = ["cmd_label", "cmd_llm_injection", "cmd_llm_serve"]


def cmd_label(args: argparse.Namespace) -> int:
    """``ragsieve label``: label pairs with an LLM, streaming and resumable.

    Every finished shard is a part of the output (and every reply is in the LLM reply
    cache), so a killed run resumes where it stopped.
    """
    from ..errors import LLMError
    from ..labeling import LabelTask

    options = LLMEndpoint.from_args(args).connect_kwargs()
    if args.no_cache:
        options["cache"] = False
    task = LabelTask(method=args.method, threshold=args.threshold, **options)
    inputs = DataSource(args.data, args.data_dir).shard_inputs(
        limit_queries=args.limit_queries, seed=args.seed)
    if args.engine == "local" and not args.base_url:
        eprint("no --base-url: starting the local model for this command")
    try:
        run = _run_job(EngineOptions.from_args(args), task, inputs, out=args.out,
                       progress=not args.quiet)
    except LLMError as exc:  # the endpoint stopped answering: finished parts are kept
        from ..data.partitioned import parts_written
        from ..engines.base import output_directory

        directory = output_directory(args.out)
        done, total = parts_written(directory)
        kept = (f"Nothing was written to {args.out}." if not done else
                f"{done} of {total} shards are written in {directory}: rerun the same command "
                "to label only the rest.")
        raise LLMError(f"{exc} {kept}", status=exc.status) from exc
    report = LabelTask.report(run.stats, run.info, run.seconds, run.new_stats)
    info = report.to_dict()
    info["cost"] = report.new_tokens * args.price_per_million_tokens / 1e6
    info["run"] = run.to_dict()
    if args.json:
        print(dumps(info))
        return 0
    tokens = report.prompt_tokens + report.completion_tokens
    print(f"labelled {report.n_labelled}/{report.n_pairs} pairs ({report.n_errors} errors, "
          f"label null) -> {run.output}")
    print(f"  model {report.model}, method {report.method}, prompt {report.prompt_version}")
    print(f"  {report.n_requests} requests, {report.n_cache_hits} answers from the cache; "
          f"{tokens} tokens in all ({report.prompt_tokens} prompt + {report.completion_tokens} "
          f"completion), {report.new_tokens} new in this run: cost {info['cost']:.4f} at "
          f"{args.price_per_million_tokens:g}/M tokens")
    print(_job_line(run))
    if report.agreement:
        a = report.agreement
        print(f"  agreement with the existing labels on {a['n']} pairs: accuracy "
              f"{a['accuracy']:.3f}, Cohen's kappa {a['kappa']:.3f} (tp {a['tp']}, fp {a['fp']}, "
              f"fn {a['fn']}, tn {a['tn']})")
    return 0


def cmd_llm_serve(args: argparse.Namespace) -> int:
    """``ragsieve llm serve``: the local model as an OpenAI-compatible server."""
    from ..llm.local import serve

    serve(args.model, host=args.host, port=args.port, threads=args.threads, n_ctx=args.n_ctx,
          n_parallel=args.parallel)
    return 0


def cmd_llm_injection(args: argparse.Namespace) -> int:
    """``ragsieve llm injection``: how far injected instructions move the LLM's judgements."""
    import random

    from ..llm.connect import connect
    from ..llm.injection import measure_injection, summary_rows
    from ..llm.judge import RelevanceJudge
    from ..llm.local import DEFAULT_LOCAL_MODEL

    pairs = [p for p in DataSource(args.data, args.data_dir).load(require_labels=True)
             if p.relevant == 0]
    random.Random(args.seed).shuffle(pairs)
    items = [(p.query, p.text) for p in pairs[: args.n_pairs]]
    with connect(**LLMEndpoint.from_args(args).connect_kwargs()) as conn:
        if conn.is_local:
            eprint(f"no --base-url: started the local model {conn.model} at {conn.base_url}")
        result = measure_injection(RelevanceJudge(conn.client, style=conn.style), items,
                                   progress=not args.quiet)
    result["model"] = conn.model
    if args.json:
        print(dumps(result))
        return 0
    op, ref = result["operating_threshold"], result["reference_threshold"]
    sets = {s: sum(i["set"] == s for i in result["injections"])
            for s in ("tuned", "held-out", "control")}
    print(f"prompt injection on {result['n_pairs']} non-relevant pairs x "
          f"{sets['tuned'] + sets['held-out']} injections ({sets['tuned']} tuned, "
          f"{sets['held-out']} held-out) + {sets['control']} harmless control; "
          f"{conn.model}, {result['style']} prompts")
    print("shift = injected - clean P(yes). flips@t: clean P(yes) < t <= injected P(yes), as a "
          "share of all judgements and of those with clean P(yes) < t ('of dropped').")
    print(f"t = {op:g}: the filter's operating point at alpha 0.1 with the local Gemma; "
          f"t = {ref:g}: the labelling threshold.")
    if conn.model != DEFAULT_LOCAL_MODEL or result["style"] != "completion":
        print(f"note: t = {op:g} belongs to the local Gemma; {conn.model}'s operating point is "
              f"1 - tau of a filter calibrated with it")
    print(f"  {'prompt':<10} {'set':<8} {'mean|shift|':>11} {'mean':>6} {'max|shift|':>10} "
          f"{'max up':>6} {f'flips@{op:g}':>15} {'of dropped':>13} {f'flips@{ref:g}':>15}")

    def share(k: int, n: int) -> str:
        return f"{k / n:.1%} ({k}/{n})" if n else f"- ({k}/{n})"

    for variant, name, r in summary_rows(result):
        print(f"  {variant:<10} {name:<8} {r['mean_abs_shift']:>11.3f} {r['mean_shift']:>+6.3f} "
              f"{r['max_abs_shift']:>10.3f} {r['max_shift']:>+6.3f} "
              f"{share(r['flips_op'], r['n_judged']):>15} "
              f"{share(r['flips_op'], r['n_below_op']):>13} "
              f"{share(r['flips_ref'], r['n_judged']):>15}"
              + (f"  ({r['n_errors']} errors)" if r["n_errors"] else ""))
    print("  (--json adds the figures per injection and the raw P(yes) values)")
    return 0
