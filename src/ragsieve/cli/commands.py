"""The ``ragsieve`` subcommands: each parses nothing, calls the library once, prints.

Options are declared in :mod:`ragsieve.cli.options`; the demos live in
:mod:`ragsieve.cli.demos`. Every ``cmd_*`` takes the parsed namespace, turns it into
values there and nowhere else (:mod:`ragsieve.cli.values`,
:class:`~ragsieve.cli.scorers.ScorerRequest`, :func:`serve_options`), and returns the
exit code; the helpers below it take those values.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .output import choice_lines, dumps, eprint
from .scorers import (
    ScorerChoice,
    ScorerRequest,
    artifact_scorer_options,
    check_artifact_language,
    check_scorer_options,
    make_scorer,
    score_field_of,
    scorer_choice,
    warn_traffic_language,
)
from .values import (
    DataSource,
    EngineOptions,
    GuaranteeOptions,
    LLMEndpoint,
    calibrator_params,
    check_mode_list_params,
    pruning_unit,
)

if TYPE_CHECKING:
    from ..artifact import Artifact

__all__ = [
    "cmd_answers",
    "cmd_calibrate",
    "cmd_choose_alpha",
    "cmd_evaluate",
    "cmd_export",
    "cmd_filter",
    "cmd_index",
    "cmd_label",
    "cmd_llm_injection",
    "cmd_llm_serve",
    "cmd_query",
    "cmd_recalibrate",
    "cmd_report",
    "cmd_retrieve",
    "cmd_score",
    "cmd_serve",
    "serve_options",
]


def _tau(value: float) -> str:
    return f"{value:.4f}"


def _unit_pairs(pairs: list[Any], unit: str | None, language: str | None) -> list[Any]:
    """The labelled pairs at ``unit``: as loaded, or (``sentence``) one pair per sentence,
    labelled on evidence sentences (:func:`ragsieve.units.sentence_pairs`)."""
    if unit != "sentence":
        return pairs
    from ..units import sentence_pairs

    out = sentence_pairs(pairs, language=language)
    eprint(f"unit sentence: {len(pairs)} snippet pairs -> {len(out)} sentence pairs "
           f"({sum(p.relevant == 1 for p in out)} evidence sentences)")
    return out


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``ragsieve evaluate``: topic-disjoint sweep of the guarantee modes and baselines.

    With ``--engine ray`` the scores are computed on Ray; the sweep runs here.
    """
    from ..evaluation import evaluate

    request = ScorerRequest.from_args(args)
    check_scorer_options(request)
    guarantee = GuaranteeOptions.from_args(args)
    check_mode_list_params(guarantee)
    engine_options = EngineOptions.from_args(args)
    engine = engine_options.make()
    pairs = DataSource(args.data, args.data_dir).load(require_labels=True,
                                                      score_field=score_field_of(request))
    if args.limit_queries:
        from ..data import sample_queries

        pairs = sample_queries(pairs, args.limit_queries, seed=args.seed)
    unit = pruning_unit(args.unit)
    pairs = _unit_pairs(pairs, unit, args.language)
    chosen = _choice(request, pairs)
    scorer = _on_engine(chosen.scorer, engine, engine_options, request)
    t0 = time.perf_counter()
    try:
        report = evaluate(
            pairs, scorer, progress=not args.quiet, on_error=args.on_error,
            group_by=guarantee.group_by, modes=guarantee.mode, delta=guarantee.delta,
            min_group_size=guarantee.min_group_size, budgets=guarantee.budget,
            alphas=args.alpha, top_k=args.top_k, thetas=args.thresholds,
            threshold_quantiles=args.threshold_quantiles, n_splits=args.splits,
            calibration_fraction=args.calibration_fraction, seed=args.seed,
        )
    finally:
        _close(engine)
    seconds = time.perf_counter() - t0
    report.info["dataset"] = str(args.data)
    report.info["unit"] = unit or "snippet"
    report.info["choice"] = chosen.to_dict()
    report.info["engine"] = engine.describe()
    report.info["scoring_seconds"] = round(seconds, 2)
    report.info["pairs_per_second"] = round(len(pairs) / max(seconds, 1e-9), 3)
    if args.limit_queries:
        report.info["limit_queries"] = args.limit_queries
    _print_evaluation(report, chosen, data=str(args.data), as_json=args.json, plot=args.plot,
                      html=args.html)
    return 0


def _on_engine(scorer: Any, engine: Any, options: EngineOptions,
               request: ScorerRequest) -> Any:
    """``scorer`` as it runs on ``engine``: itself locally, a Ray pool's proxy on Ray."""
    if engine.name != "ray":
        return scorer
    from ..engines.scorer import on_engine

    base = scorer.base_scorer() or scorer
    return on_engine(scorer, engine, shard_bytes=options.shard_bytes,
                     scorer_options=artifact_scorer_options(request, base.spec()))


def _print_evaluation(report: Any, chosen: ScorerChoice, *, data: str, as_json: bool,
                      plot: str | None, html: str | None) -> None:
    """Print ``evaluate``'s report (table or JSON), then write the figure and the page."""
    from ..evaluation import format_table

    # print the computed results before plotting, so a plotting failure loses nothing
    if as_json:
        print(dumps(report.to_dict()), flush=True)
    else:
        print(format_table(report), flush=True)
    if plot:
        from ..evaluation.plots import plot_report

        written = plot_report({_score_name(chosen): report}, plot,
                              title=f"ragsieve evaluate: {data}")
        eprint(f"plot written to {written}")
    if html:
        from ..evaluation.report import evaluation_page, write_report

        page = evaluation_page(report, title=f"ragsieve evaluate: {data}",
                               label=_score_name(chosen), text_table=format_table(report))
        eprint(f"report written to {write_report(page, html)}")


def cmd_choose_alpha(args: argparse.Namespace) -> int:
    """``ragsieve choose-alpha``: the alpha that reaches a removal or coverage target."""
    from ..evaluation import DEFAULT_ALPHA_GRID, choose_alpha

    request = ScorerRequest.from_args(args)
    check_scorer_options(request)
    if args.mode in ("budget", "adaptive"):
        raise ValueError(f"choose-alpha picks alpha for a fixed guarantee; mode {args.mode!r} "
                         "is not one (budget: choose the budget; adaptive: its alpha is a "
                         "long-run target). Use --mode marginal, query-recall, pac, ...")
    guarantee = GuaranteeOptions.from_args(args)
    check_mode_list_params(guarantee)
    pairs = DataSource(args.data, args.data_dir).load(require_labels=True,
                                                      score_field=score_field_of(request))
    pairs = _unit_pairs(pairs, pruning_unit(args.unit), args.language)
    choice = choose_alpha(
        pairs, _choice(request, pairs).scorer, removal=args.removal, coverage=args.coverage,
        mode=guarantee.mode, alphas=args.alphas or DEFAULT_ALPHA_GRID, n_splits=args.splits,
        seed=args.seed, progress=not args.quiet, group_by=guarantee.group_by,
        delta=guarantee.delta, min_group_size=guarantee.min_group_size)
    if args.json:
        print(dumps(choice.to_dict()))
    else:
        print(choice.statement)
        for row in choice.grid:
            mark = " <-" if row["alpha"] == choice.alpha else ""
            print(f"  alpha {row['alpha']:<5g} coverage {row['coverage']:.3f}  "
                  f"removal {row['removal']:.3f}{mark}")
    return 0 if choice.reached else 1


def _close(engine: Any) -> None:
    closer = getattr(engine, "close", None)
    if callable(closer):
        closer()


def cmd_answers(args: argparse.Namespace) -> int:
    """``ragsieve answers``: what the generator gets from each method's kept context."""
    from ..evaluation.answers import LOCAL_N_CTX, AnswerConfig, evaluate_answers
    from ..evaluation.table import format_answer_table

    request = ScorerRequest.from_args(args)
    check_scorer_options(request)
    config = AnswerConfig(
        alphas=tuple(args.alpha), modes=tuple(args.mode), n_splits=args.splits,
        calibration_fraction=args.calibration_fraction, seed=args.seed, delta=args.delta,
        min_group_size=args.min_group_size, budgets=tuple(args.budget),
        limit_queries=args.limit_queries, generate=not args.no_generate,
        judge=args.judge, max_tokens=args.max_tokens, confidence=args.confidence,
        n_resamples=args.bootstrap_resamples, language=args.language,
        unit=pruning_unit(args.unit) or "snippet",  # sentence: its rows beside the snippet rows
    )
    pairs = DataSource(args.data, args.data_dir).load(require_labels=True,
                                                      score_field=score_field_of(request))
    scorer = _choice(request, pairs).scorer
    connection = None
    if config.generate:
        connection = _answers_connection(LLMEndpoint.from_args(args), no_cache=args.no_cache,
                                         n_ctx=LOCAL_N_CTX)
    try:
        report = evaluate_answers(pairs, scorer, config, connection=connection,
                                  group_by=args.group_by, progress=not args.quiet)
    finally:
        if connection is not None:
            connection.close()
    report.info["dataset"] = str(args.data)
    # print the computed results before writing files, so a failure there loses nothing
    print(dumps(report.to_dict()) if args.json else format_answer_table(report), flush=True)
    _write_answers(report, data=str(args.data), per_query=args.per_query, plot=args.plot,
                   html=args.html)
    return 0


def _answers_connection(endpoint: LLMEndpoint, *, no_cache: bool, n_ctx: int) -> Any:
    """The connection to the generator and judge of ``answers`` (the local model started
    for this command without ``--base-url``: said on stderr)."""
    from ..llm import connect

    options = endpoint.connect_kwargs()
    if no_cache:
        options["cache"] = False
    connection = connect(**options, n_ctx=n_ctx)
    if connection.is_local:
        eprint(f"no --base-url: started the local model {connection.model} at "
               f"{connection.base_url} for this command (generator and judge)")
    return connection


def _write_answers(report: Any, *, data: str, per_query: str | None, plot: str | None,
                   html: str | None) -> None:
    """Write what ``answers`` was asked to write beside its table: the per-query lines,
    the figure, the page."""
    from ..evaluation.table import format_answer_table

    if per_query:
        from ..evaluation.answers import write_per_query

        n = write_per_query(report, per_query)
        eprint(f"{n} per-query lines written to {per_query}")
    if plot:
        from ..evaluation.plots import plot_answers

        written = plot_answers(report, plot, title=f"ragsieve answers: {data}")
        eprint(f"plot written to {written}")
    if html:
        from ..evaluation.report import answers_page, write_report

        page = answers_page(report, title=f"ragsieve answers: {data}",
                            text_table=format_answer_table(report))
        eprint(f"report written to {write_report(page, html)}")


def _choice(request: ScorerRequest, pairs: Any) -> ScorerChoice:
    """The scorer of ``--scorer`` for ``pairs`` (a ``ScorerChoice``); the choice of ``auto``
    goes to stderr."""
    chosen = scorer_choice(request, pairs)
    if request.scorer == "auto":
        for line in choice_lines(chosen.to_dict()):
            eprint(line)
    return chosen


def _score_name(chosen: ScorerChoice) -> str:
    """``--scorer``, or what ``auto`` resolved to (``best``, ``embedding``)."""
    return str(chosen.score.alias if chosen.score is not None else chosen.alias)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``ragsieve calibrate``: fit a filter of one guarantee mode and save the artifact."""
    from ..calibration import make_calibrator
    from ..filter import ConformalFilter

    request = ScorerRequest.from_args(args)
    check_scorer_options(request)
    guarantee = GuaranteeOptions.from_args(args)
    params = calibrator_params(guarantee)
    calibrator = make_calibrator(guarantee.mode, **params)
    pairs = DataSource(args.data, args.data_dir).load(require_labels=True,
                                                      score_field=score_field_of(request))
    chosen = scorer_choice(request, pairs, resolve_auto=False)
    unit = pruning_unit(args.unit)
    flt = ConformalFilter(chosen.scorer, calibrator, min_keep=args.min_keep,
                          unit=unit or "snippet")
    flt.calibrate(pairs, group_by=guarantee.group_by, progress=not args.quiet,
                  language=chosen.language, lists=args.lists)
    chosen.record(flt.calibration_info)  # where the CLI took the languages from
    flt.save(args.out)

    def expected() -> Any:  # cross-validation over the calibration topics
        return _expected(pairs, flt.scorer, guarantee, params, unit=unit,
                         progress=not args.quiet)

    info = flt.to_dict()
    rule = flt.scorer.keep_rule(flt.threshold)
    choice = chosen.to_dict(flt.calibration_info, info["scorer"])
    if args.json:  # the artifact, the keep rule in the score's own units, the choice made
        found = None if args.no_expected else expected().to_dict()
        print(dumps({**info, **rule.to_dict(), "choice": choice, "expected": found}))
        return 0
    _print_calibration(flt, info, rule, choice, out=args.out,
                       expected=None if args.no_expected else expected)
    return 0


def _print_calibration(flt: Any, info: dict[str, Any], rule: Any, choice: dict[str, Any], *,
                       out: str, expected: Callable[[], Any] | None) -> None:
    """``calibrate``'s text: the choice, the lists, the guarantee and threshold, what is
    expected on new topics (``expected()``, unless None), the keep rule, a note."""
    for choice_line in choice_lines(choice):
        print(choice_line)
    print(_lists_line(flt))
    guarantee = flt.guarantee()
    tau = _tau(flt.threshold)
    if guarantee.get("infinite"):
        tau += " (too few calibration points: keeps everything)"
    data = info.get("data") or {}
    print(f"mode {flt.mode}: {guarantee['statement']}")
    line = f"tau={tau}, n={guarantee.get('n_calibration')}"
    band = guarantee.get("coverage_band")
    if band:
        line += f", coverage band [{band[0]:.3f}, {band[1]:.3f}]"
    if data:
        what = "evidence sentences" if flt.unit == "sentence" else "relevant snippets"
        line += (f"; calibrated on {data.get('n_relevant')} {what} "
                 f"({data.get('n_queries')} queries, {data.get('n_groups')} groups)")
    print(f"{line} -> {out}")
    if expected is not None:
        print(expected())
    if not guarantee.get("infinite"):
        print(f"{rule} (each snippet's {rule.score} against the calibrated threshold)")
    note = (guarantee.get("details") or {}).get("note")
    if note:
        print(f"note: {note}")


def _lists_line(flt: Any) -> str:
    """``lists: the lists of index 3f2a9c0d (...): 200 lists of 10 snippets each; ...``: where
    the calibration lists came from, and what the score's guarantee assumes of them."""
    lists = flt.lists
    line = f"lists: {lists.describe()}"
    if not lists.list_dependent:
        return line + "; the score reads one snippet at a time, so the lists' shape does not enter it"
    return (line + "; the score reads the whole list: its guarantee holds for lists like these "
            "(checked wherever the filter is applied; see docs/deploy.md)")


def _expected(pairs: list[Any], scorer: Any, guarantee: GuaranteeOptions,
              params: dict[str, Any], *, unit: str | None, progress: bool) -> Any:
    """What ``calibrate``'s mode and alpha (``params``: the calibrator's) are expected to do
    on new topics (topic folds)."""
    from ..evaluation.expect import Expectation, expected_on_new_topics

    if unit == "sentence":  # its two fitted stages are not refitted per fold
        return Expectation(guarantee.mode, float(guarantee.alpha), len({p.group for p in pairs}),
                           reason=(
            "not estimated for --unit sentence (the sentence-in-context score is fitted in two "
            "stages on the calibration topics; `ragsieve evaluate --unit sentence` measures the "
            "sentence score on held-out topics)"))
    return expected_on_new_topics(pairs, scorer, mode=guarantee.mode, group_by=guarantee.group_by,
                                  progress=progress, **params)


def _spans(scored: Any) -> tuple[tuple[int, int], ...]:
    """The kept character spans of a snippet: its kept sentences (unit sentence), or the
    kept pieces of one that was cut (empty: kept whole)."""
    return tuple(getattr(scored, "spans", ()) or ())


def check_artifact_unit(given: str | None, artifact: Artifact) -> None:
    """``--unit`` of ``filter`` (``given``) must be the artifact's (or omitted): the unit
    is calibrated.

    Raises
    ------
    ValueError
        They differ.
    """
    if given is not None and given != artifact.unit:
        raise ValueError(f"--unit {given} disagrees with the artifact, calibrated on unit "
                         f"{artifact.unit!r}; omit --unit or recalibrate with --unit {given}.")


def cmd_filter(args: argparse.Namespace) -> int:
    """``ragsieve filter``: apply a saved filter to pairs, one line (or object) per query.

    With ``--out`` the results are written by an engine (streaming, resumable, local or
    Ray) as one JSON object per query; without it they are printed.
    """
    from ..artifact import Artifact
    from ..filter import ConformalFilter

    artifact = Artifact.read(args.filter)
    check_artifact_unit(pruning_unit(args.unit), artifact)
    check_artifact_language(artifact, args.filter, language=args.language,
                            query_language=args.query_language)
    options = artifact_scorer_options(ScorerRequest.from_args(args), artifact.scorer)
    data = DataSource(args.data, args.data_dir)
    if args.out is not None:
        return _run_filter_job(artifact, options, data, EngineOptions.from_args(args),
                               out=args.out, progress=not args.quiet, as_json=args.json)
    if args.engine != "local":
        raise ValueError(f"--engine {args.engine} writes its results to files: add --out "
                         "PATH (a directory, or a .jsonl / .parquet file).")
    flt = ConformalFilter.from_artifact(artifact, scorer_options=options)
    pairs = data.load(score_field=artifact.score_field)
    warn_traffic_language(artifact, pairs)
    results = flt.filter_pairs(pairs, progress=not args.quiet)
    _print_filtered(results, flt, as_json=args.json, show_removed=args.show_removed)
    return 0


def _print_filtered(results: dict[str, Any], flt: Any, *, as_json: bool,
                    show_removed: bool) -> None:
    """``filter``'s results on stdout: a JSON object per query, or the kept (and with
    ``show_removed`` the removed) snippets of each and a summary."""
    from ..engines import filter_record

    total_in = sum(r.n_input for r in results.values())
    total_kept = sum(len(r.kept) for r in results.values())
    shown: list[Any] = []  # results printed so far: the lists note is printed once
    for qid, r in results.items():
        if as_json:
            print(dumps(filter_record(qid, r)))
            continue
        print(f"{qid}: kept {len(r.kept)}/{r.n_input}  {r.query[:70]}")
        for s in r.kept:
            spans = ", ".join(f"{a}-{b}" for a, b in _spans(s))
            what = "kept sentences" if r.unit == "sentence" else "cut; kept characters"
            print(f"    {s.score:.4f}  {s.snippet_id}" + (f"  ({what} {spans})" if spans else ""))
        if show_removed:
            for s in r.removed:
                print(f"    removed {s.score:.4f} > {r.threshold:.4f}  {s.snippet_id}")
        if r.note:
            print(f"    note: {r.note}")
        if r.lists_note and r.lists_unlike and not any(x.lists_unlike for x in shown):
            print(f"    lists: {r.lists_note}")
        shown.append(r)
    if not as_json:
        unlike = sum(r.lists_unlike for r in results.values())
        if unlike:
            print(f"lists: {unlike} of {len(results)} lists unlike the filter's calibration "
                  "lists (see the warning above and docs/deploy.md)")
        print(_filter_summary(len(results), total_kept, total_in, flt))
        print(f"mode {flt.mode}: {flt.guarantee()['statement']}")


def cmd_report(args: argparse.Namespace) -> int:
    """``ragsieve report``: one self-contained HTML page of what a saved filter does to data."""
    from ..artifact import Artifact
    from ..evaluation.report import build_report, write_report
    from ..filter import ConformalFilter

    artifact = Artifact.read(args.filter)
    flt = ConformalFilter.from_artifact(
        artifact, scorer_options=artifact_scorer_options(ScorerRequest.from_args(args),
                                                         artifact.scorer))
    pairs = DataSource(args.data, args.data_dir).load(score_field=artifact.score_field)
    page = build_report(flt, pairs, data_name=str(args.data), filter_name=str(args.filter),
                        max_queries=args.max_queries, n_splits=args.splits,
                        confidence=args.confidence, seed=args.seed, progress=not args.quiet)
    written = write_report(page, args.out)
    if args.json:
        # the page's size (a FIFO or a device given as --out has none of its own)
        print(dumps({"out": str(written), "bytes": len(page.encode("utf-8"))}))
    else:
        print(f"report written to {written}")
    return 0


def _filter_summary(n_queries: int, kept: float, total: float, flt: Any) -> str:
    rm = 1 - kept / total if total else 0.0
    return (f"{n_queries} queries, kept {int(kept)}/{int(total)} snippets (removed {rm:.1%}), "
            f"tau={_tau(flt.threshold)}, alpha={flt.alpha:g}")


def _run_filter_job(artifact: Artifact, options: dict[str, Any], data: DataSource,
                    engine: EngineOptions, *, out: str, progress: bool, as_json: bool) -> int:
    from ..engines import FilterTask

    task = FilterTask(artifact, scorer_options=options, score_field=artifact.score_field)
    report = _run_job(engine, task, data.shard_inputs(), out=out, progress=progress)
    stats = report.stats
    if as_json:
        print(dumps(report.to_dict()))
        return 0
    flt = task.filter
    print(_filter_summary(int(stats.get("queries", 0)), stats.get("kept", 0),
                          stats.get("snippets", 0), flt) + f" -> {report.output}")
    print(f"mode {flt.mode}: {flt.guarantee()['statement']}")
    print(_job_line(report))
    return 0


def _run_job(options: EngineOptions, task: Any, inputs: list[Any], *, out: str,
             progress: bool) -> Any:
    """Run an engine job with the engine ``options``, writing ``out``; the engine is
    closed afterwards."""
    from ..engines import run_job

    engine = options.make()
    try:
        return run_job(task, inputs, out, engine, fmt=options.format,
                       shard_bytes=options.shard_bytes, overwrite=options.overwrite,
                       progress=progress)
    finally:
        _close(engine)


def _job_line(report: Any) -> str:
    e = report.engine
    where = "this process" if e.get("engine") == "local" else (
        f"Ray ({e.get('address')}, {e.get('workers') or 'one per CPU'} workers)")
    resumed = f", {report.n_resumed} already written by an earlier run" if report.n_resumed else ""
    shards = "shard" if report.n_shards == 1 else "shards"
    return (f"  {report.pairs} pairs in {report.n_shards} {shards}{resumed}; "
            f"{report.seconds:.1f} s on {where}, {report.pairs_per_second:.1f} pairs/s")


def cmd_score(args: argparse.Namespace) -> int:
    """``ragsieve score``: write every pair's nonconformity score (JSONL or Parquet)."""
    from ..engines import ScoreTask

    request = ScorerRequest.from_args(args)
    if args.filter:
        from ..artifact import Artifact

        if args.scorer != "embedding" or args.score_field or args.model:
            raise ValueError("--filter scores with the artifact's scorer; drop --scorer, "
                             "--score-field and --model.")
        artifact = Artifact.read(args.filter)  # the one reader: every field, the seal
        spec, options = artifact.scorer, artifact_scorer_options(request, artifact.scorer)
        score_field = artifact.score_field
    else:
        if args.scorer in ("best", "auto"):
            chosen = "chosen and " if args.scorer == "auto" else ""
            raise ValueError(f"--scorer {args.scorer} is {chosen}fitted when a filter is "
                             "calibrated: give the filter with --filter ARTIFACT to score with "
                             "its score, or name one (--scorer embedding, the default here).")
        scorer = make_scorer(request)
        spec = scorer.spec()
        options = artifact_scorer_options(request, spec)
        score_field = score_field_of(request)
    task = ScoreTask(spec, scorer_options=options, score_name=args.score_name,
                     score_field=score_field)
    report = _run_job(EngineOptions.from_args(args), task,
                      DataSource(args.data, args.data_dir).shard_inputs(), out=args.out,
                      progress=not args.quiet)
    if args.json:
        print(dumps(report.to_dict()))
        return 0
    print(f"scored {report.pairs} pairs with {spec.get('scorer')} -> {report.output} "
          f"(key {args.score_name!r})")
    print(_job_line(report))
    return 0


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


def cmd_serve(args: argparse.Namespace) -> int:
    """``ragsieve serve``: the HTTP service around a saved filter (and an index)."""
    from ..artifact import Artifact
    from ..server import run_server

    options = serve_options(args)  # every option checked before the artifact is read
    artifact = Artifact.read(args.filter, max_bytes=options.max_artifact_bytes)
    options = options.replace(scorer_options=artifact_scorer_options(
        ScorerRequest.from_args(args), artifact.scorer))
    line = (f"ragsieve serve: state dir {options.state_dir}; feedback database "
            f"{options.feedback_db}"
            + (f"; {options.workers} workers" if options.workers > 1 else ""))
    # says where the state lives once the artifact is loaded (an error before that stays
    # the only line)
    run_server(args.filter, options, on_start=lambda: eprint(line))
    return 0


def serve_options(args: argparse.Namespace) -> Any:
    """The :class:`~ragsieve.server.options.ServeOptions` of ``serve``'s parsed options.

    An option left unset (None) takes the ``ServeOptions`` default (one definition of each
    default); the state directory defaults to one per artifact path
    (:func:`~ragsieve.server.state.default_state_dir`), the feedback database to
    ``<state dir>/feedback.sqlite``, the API key is read from ``--api-key-env``.
    """
    from ..server import api_key_from_env
    from ..server.options import ServeOptions
    from ..server.state import default_state_dir

    given = {name: getattr(args, name) for name in ServeOptions.names()
             if getattr(args, name, None) is not None}
    state = Path(args.state_dir) if args.state_dir else default_state_dir(args.filter)
    return ServeOptions(**{
        **given, "state_dir": state, "index_path": args.index,
        "feedback_db": Path(args.feedback) if args.feedback else state / "feedback.sqlite",
        "api_key": api_key_from_env(args.api_key_env) if args.api_key_env else None,
    })


def cmd_recalibrate(args: argparse.Namespace) -> int:
    """``ragsieve recalibrate``: a new artifact from the labels stored by ``serve``."""
    from ..artifact import Artifact
    from ..server.recalibrate import recalibrate

    artifact = Artifact.read(args.filter)
    result = recalibrate(artifact, args.feedback, min_labels=args.min_labels,
                         merge=args.merge)  # scores nothing
    result.filter.save(args.out)
    report = {
        "out": args.out, "mode": result.mode, "labels": result.n_labels,
        "labels_used": result.n_used, "relevant_used": result.n_relevant,
        "queries": result.n_queries, "merged_calibration_scores": result.n_merged,
        "old_threshold": result.old_threshold, "new_threshold": result.new_threshold,
        "notes": result.notes,
    }
    if args.json:
        print(dumps(report))
        return 0
    merged = (f" + {result.n_merged} calibration scores of the artifact" if result.n_merged
              else "; calibration scores replaced")
    print(f"mode {result.mode}: recalibrated on {result.n_used} labels ({result.n_relevant} "
          f"relevant, {result.n_queries} queries){merged}")
    extra = "".join(f"; {note}" for note in result.notes)
    print(f"tau={_tau(result.new_threshold)} (was {_tau(result.old_threshold)}){extra} -> {args.out}")
    return 0


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
    from ..store import SnippetIndex

    if args.generate and args.json:
        raise ValueError("--generate prints a text answer; use it without --json.")
    index = SnippetIndex.open(args.index, create=False)  # a mistyped path is an error
    if args.filter:
        flt = ConformalFilter.load(args.filter)
        _warn_other_retriever(flt, index, args.k)
        if flt.unit == "sentence":  # it reads each hit's sentences: scored from the texts
            hits = index.search(args.query, k=args.k)
            res = flt.filter(args.query, [h.text for h in hits], group=args.group)
        else:
            hits, res = index.query_with_filter(args.query, flt, k=args.k, group=args.group)
        kept: set[int] | None = {s.index for s in res.kept}
    else:
        hits, res, kept = index.search(args.query, k=args.k), None, None
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
        if res.lists_unlike:
            print(f"lists: {res.lists_note}")
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

    from ..data import describe_lists, read_queries, write_pairs
    from ..lists import describe_retriever, retriever_of
    from ..store import SnippetIndex

    queries = read_queries(args.queries)  # a bad line fails before any model work
    index = SnippetIndex.open(args.index, create=False)  # a mistyped path is an error
    pairs = index.retrieve_pairs(queries, args.k, language=args.language,
                                 progress=not args.quiet)
    write_pairs(pairs, args.out)
    summary = describe_lists(queries, pairs, args.k)
    retriever = retriever_of(pairs) or index.retriever_identity(args.k)
    if summary.no_relevant:
        shown = ", ".join(summary.no_relevant[:5]) + (", ..." if len(summary.no_relevant) > 5
                                                      else "")
        eprint(f"warning: {len(summary.no_relevant)} of {summary.n_labelled} labelled queries "
               f"have no relevant hit among their {args.k} ({shown}): they hold no evidence to "
               "calibrate on (retrieve more with a larger -k, or check their labels)")
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
