"""The ``ragsieve`` subcommands that measure a filter: ``evaluate`` (the topic-disjoint
sweep of the guarantee modes and baselines), ``choose-alpha``, ``answers`` (what the
generator gets from each method's kept context) and ``report`` (the HTML page of a saved
filter on data), with the helpers only they use (the sentence unit's pairs, the ``auto``
choice on stderr, the scorer on an engine, what each prints and writes).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .argtypes import number
from .common import _close, _index_vectors
from .output import choice_lines, dumps, eprint
from .scorers import (
    ScorerChoice,
    ScorerRequest,
    artifact_scorer_options,
    check_scorer_options,
    score_field_of,
    scorer_choice,
)
from .values import (
    DataSource,
    EngineOptions,
    GuaranteeOptions,
    LLMEndpoint,
    check_mode_list_params,
    pruning_unit,
)

__all__ = ["cmd_answers", "cmd_choose_alpha", "cmd_evaluate", "cmd_report"]


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
    # sentence pairs are not the index's snippets: nothing of theirs is stored
    reused = [] if unit == "sentence" else _index_vectors(pairs, chosen.scorer, quiet=args.quiet)
    scorer = _on_engine(chosen.scorer, engine, engine_options, request)
    cost = _reader_cost(chosen.scorer, pairs, splits=args.splits,
                        calibration_fraction=args.calibration_fraction)
    if cost and not args.quiet:
        eprint(cost)
    t0 = time.perf_counter()
    try:
        report = evaluate(
            pairs, scorer, progress=not args.quiet, on_error=args.on_error,
            group_by=guarantee.group_by, modes=guarantee.mode, delta=number(guarantee.delta),
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
    report.info["index_vectors"] = reused
    report.info["scoring_seconds"] = round(seconds, 2)
    report.info["pairs_per_second"] = round(len(pairs) / max(seconds, 1e-9), 3)
    if args.limit_queries:
        report.info["limit_queries"] = args.limit_queries
    _print_evaluation(report, chosen, data=str(args.data), as_json=args.json, plot=args.plot,
                      html=args.html)
    return 0


def _reader_cost(scorer: Any, pairs: list[Any], *, splits: int,
                 calibration_fraction: float) -> str | None:
    """What a fused score with the reader costs ``evaluate``, said before it starts, and how
    to make it shorter; None: the score has no reader.

    Each split fits the fused score on its fit share (``FUSION_FIT_FRACTION`` of the
    calibration topics), which cross-fits the reader: one fine-tune on each half of the
    share, one on the whole. A fine-tune reads every relevant pair of its share and
    ``negatives`` irrelevant ones each (and, where the pairs mark evidence, the relevant
    snippets' sentences), at most ``max_fit_pairs``.
    """
    from ..scoring.reader import reader_signal
    from ..scoring.shares import FUSION_FIT_FRACTION

    reader = reader_signal(scorer)
    if reader is None:
        return None
    share = calibration_fraction * FUSION_FIT_FRACTION
    relevant = sum(p.relevant == 1 for p in pairs) * share
    each = min(reader.max_fit_pairs, round(relevant * (1 + reader.negatives)))
    return (f"cost: the reader is fine-tuned 3 times per split (on each half of the fit share, "
            f"then on the whole): {3 * splits} fine-tunes for {splits} split(s), reading at least "
            f"{2 * each} pairs per split (the whole share's {each}: the relevant pairs of "
            f"{share:.0%} of the topics and {reader.negatives} irrelevant ones each, more with "
            f"evidence sentences, at most {reader.max_fit_pairs}; and its halves'); the "
            "measured time per 1,000 pairs is in "
            "docs/scores.md (the reader). Shorter: fewer --splits, --limit-queries N, or "
            "--preset portable (no reader).")


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
    from ..evaluation import DEFAULT_ALPHA_GRID, AlphaTarget, choose_alpha

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
        pairs, _choice(request, pairs).scorer,
        AlphaTarget(removal=args.removal, coverage=args.coverage, mode=guarantee.mode),
        alphas=args.alphas or DEFAULT_ALPHA_GRID, n_splits=args.splits,
        seed=args.seed, progress=not args.quiet, group_by=guarantee.group_by,
        delta=number(guarantee.delta), min_group_size=guarantee.min_group_size)
    if args.json:
        print(dumps(choice.to_dict()))
    else:
        print(choice.statement)
        for row in choice.grid:
            mark = " <-" if row["alpha"] == choice.alpha else ""
            print(f"  alpha {row['alpha']:<5g} coverage {row['coverage']:.3f}  "
                  f"removal {row['removal']:.3f}{mark}")
    return 0 if choice.reached else 1


def cmd_answers(args: argparse.Namespace) -> int:
    """``ragsieve answers``: what the generator gets from each method's kept context."""
    from ..evaluation.answers import LOCAL_N_CTX, AnswerConfig, evaluate_answers
    from ..evaluation.table import format_answer_table

    request = ScorerRequest.from_args(args)
    check_scorer_options(request)
    config = AnswerConfig(
        alphas=tuple(args.alpha), modes=tuple(args.mode), n_splits=args.splits,
        calibration_fraction=args.calibration_fraction, seed=args.seed, delta=number(args.delta),
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


def cmd_report(args: argparse.Namespace) -> int:
    """``ragsieve report``: one self-contained HTML page of what a saved filter does to data."""
    from ..artifact import Artifact
    from ..evaluation.report import ReportSettings, build_report, write_report
    from ..filter import ConformalFilter

    artifact = Artifact.read(args.filter)
    flt = ConformalFilter.from_artifact(
        artifact, scorer_options=artifact_scorer_options(ScorerRequest.from_args(args),
                                                         artifact.scorer))
    pairs = DataSource(args.data, args.data_dir).load(score_field=artifact.score_field)
    settings = ReportSettings(data_name=str(args.data), filter_name=str(args.filter),
                              max_queries=args.max_queries, n_splits=args.splits,
                              confidence=args.confidence, seed=args.seed)
    page = build_report(flt, pairs, settings, progress=not args.quiet)
    written = write_report(page, args.out)
    if args.json:
        # the page's size (a FIFO or a device given as --out has none of its own)
        print(dumps({"out": str(written), "bytes": len(page.encode("utf-8"))}))
    else:
        print(f"report written to {written}")
    return 0
