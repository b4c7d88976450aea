"""The ``ragsieve`` subcommands that fit and apply a filter: ``calibrate`` (fit one
guarantee mode, save the artifact, say what to expect on new topics), ``filter`` (apply a
saved artifact to pairs: printed, or written by an engine job with ``--out``) and
``score`` (every pair's nonconformity score, written by an engine job), with the checks
of ``--unit`` against the artifact and what each prints.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .common import _index_vectors, _job_line, _run_job, _tau
from .output import choice_lines, dumps, eprint
from .scorers import (
    ScorerRequest,
    artifact_scorer_options,
    check_artifact_language,
    check_scorer_options,
    embedding_cache_dir,
    make_scorer,
    score_field_of,
    scorer_choice,
    warn_traffic_language,
)
from .values import (
    DataSource,
    EngineOptions,
    GuaranteeOptions,
    calibrator_params,
    pruning_unit,
)

if TYPE_CHECKING:
    from ..artifact import Artifact

__all__ = ["MISSED", "check_artifact_unit", "cmd_calibrate", "cmd_filter", "cmd_score"]

MISSED = "  [relevant: missed]"
"""How ``filter --show-removed`` marks a removed snippet the data labels relevant."""


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``ragsieve calibrate``: fit a filter of one guarantee mode and save the artifact."""
    from ..artifact import key_from_env
    from ..calibration import make_calibrator
    from ..filter import ConformalFilter

    sign_key = key_from_env(args.sign_key_env) if args.sign_key_env else None  # before work
    request = ScorerRequest.from_args(args)
    check_scorer_options(request)
    guarantee = GuaranteeOptions.from_args(args)
    params = calibrator_params(guarantee)
    calibrator = make_calibrator(guarantee.mode, **params)
    pairs = DataSource(args.data, args.data_dir).load(require_labels=True,
                                                      score_field=score_field_of(request))
    chosen = scorer_choice(request, pairs, resolve_auto=False)
    _check_topics(calibrator, pairs, chosen.scorer, quiet=args.quiet)
    reused = _index_vectors(pairs, chosen.scorer, quiet=args.quiet, cache_dir=None
                            if request.no_cache else embedding_cache_dir(request.cache_dir))
    unit = pruning_unit(args.unit)
    flt = ConformalFilter(chosen.scorer, calibrator, min_keep=args.min_keep,
                          unit=unit or "snippet")
    flt.calibrate(pairs, group_by=guarantee.group_by, progress=not args.quiet,
                  language=chosen.language, lists=args.lists)
    flt.calibration_info = chosen.record(flt.calibration_info)  # where the CLI took the languages
    flt.save(args.out, sign_key=sign_key)

    def expected() -> Any:  # cross-validation over the calibration topics
        return _expected(pairs, flt.scorer_, guarantee, params, unit=unit,
                         progress=not args.quiet)

    info = flt.to_dict()
    rule = flt.scorer_.keep_rule(flt.threshold)
    choice = chosen.to_dict(flt.calibration_info, info["scorer"])
    if args.json:  # the artifact, the promise, the keep rule in the score's own units, the choice
        found = None if args.no_expected else expected().to_dict()
        print(dumps({**info, "guarantee": flt.guarantee(), **rule.to_dict(), "choice": choice,
                     "expected": found, "index_vectors": reused}))
        return 0
    _print_calibration(flt, info, rule, choice, out=args.out,
                       expected=None if args.no_expected else expected)
    return 0


def _check_topics(calibrator: Any, pairs: Any, scorer: Any, *, quiet: bool) -> None:
    """A topic mode's need said before calibrating: ``ValueError`` (exit 2) when the data
    holds too few topics with evidence; a ``topics:`` line when a learning score leaves too
    few to calibrate on."""
    from ..fitting import topics_shortfall

    short = topics_shortfall(calibrator, pairs, learns=not scorer.is_fitted)
    if short is None:
        return
    message, refused = short
    if refused:
        raise ValueError(message + ".")
    if not quiet:
        print(f"topics: {message}")


def _print_calibration(flt: Any, info: dict[str, Any], rule: Any, choice: dict[str, Any], *,
                       out: str, expected: Callable[[], Any] | None) -> None:
    """``calibrate``'s text: the choice, the lists, the guarantee and threshold, what is
    expected on new topics (``expected()``, unless None), the keep rule, a note."""
    for choice_line in choice_lines(choice):
        print(choice_line)
    print(_lists_line(flt))
    guarantee = flt.guarantee()
    tau = _tau(rule.threshold)  # in the score's own direction (bm25, not -bm25)
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
        each = "each sentence's" if flt.unit == "sentence" else "each snippet's"
        print(f"{rule} ({each} {rule.score} against the calibrated threshold)")
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
    from ..artifact import Artifact, key_from_env
    from ..filter import ConformalFilter

    artifact = Artifact.read(args.filter, verify_key=key_from_env(args.verify_key_env)
                             if args.verify_key_env else None)
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
    _index_vectors(pairs, flt.scorer_, quiet=args.quiet)
    results = flt.filter_pairs(pairs, progress=not args.quiet)
    alarm = _watch_exchangeability(artifact, results)
    _print_filtered(results, flt, as_json=args.json, show_removed=args.show_removed,
                    pairs=pairs, alarm=alarm)
    return 0


def _watch_exchangeability(artifact: Artifact, results: dict[str, Any]) -> Any:
    """The service's exchangeability monitor run over the batch's queries in their order
    (each query one request, as ``serve`` observes it); when it fires, one ``warning:``
    line on stderr with its numbers and what to do. The alarm (``BatchAlarm``), or None."""
    from ..monitoring import ExchangeabilityMonitor, watch_batch

    monitor = ExchangeabilityMonitor.from_artifact(artifact, log_alarm=False)
    if monitor is None:  # an artifact without a monitor reference: nothing to compare with
        return None
    with monitor:
        alarm = watch_batch(monitor, ((qid, r.unit_scores) for qid, r in results.items()))
    if alarm is not None:
        eprint(f"warning: {alarm.message}")
    return alarm


def _print_filtered(results: dict[str, Any], flt: Any, *, as_json: bool,
                    show_removed: bool, pairs: Any = None, alarm: Any = None) -> None:
    """``filter``'s results on stdout: a JSON object per query, or the kept (and with
    ``show_removed`` the removed, those labelled relevant marked as misses) snippets of
    each, with their scores in the score's own units and their p-values, and a summary
    (with coverage when ``pairs`` are labelled). The exchangeability ``alarm`` (said on
    stderr) is in the JSON object of the query that made it fire, under
    ``exchangeability_alarm``."""
    from ..engines import filter_record
    from ..keeping import p_value_rule

    total_in = sum(r.n_input for r in results.values())
    total_kept = sum(len(r.kept) for r in results.values())
    shown: list[Any] = []  # results printed so far: the lists note is printed once
    relevant = {(p.query_id, p.snippet_id) for p in pairs or () if p.relevant == 1}

    def own(score: float) -> str:  # the score in its own units and direction
        return f"{flt.scorer_.keep_rule(score).threshold:.4f}"

    for qid, r in results.items():
        if as_json:
            record = filter_record(qid, r, flt.scorer_)
            if alarm is not None and alarm.query_id == qid:
                record["exchangeability_alarm"] = alarm.to_dict()
            print(dumps(record))
            continue
        print(f"{qid}: kept {len(r.kept)}/{r.n_input}  {r.query[:70]}")
        for s in r.kept:
            spans = ", ".join(f"{a}-{b}" for a, b in _spans(s))
            what = "kept sentences" if r.unit == "sentence" else "cut; kept characters"
            print(f"    {own(s.score)}{_p_text(s)}  {s.snippet_id}"
                  + (f"  ({what} {spans})" if spans else ""))
        if show_removed:
            rule = flt.scorer_.keep_rule(r.threshold)
            for s in r.removed:
                miss = MISSED if (qid, s.snippet_id) in relevant else ""
                print(f"    removed {own(s.score)}{_p_text(s)} (rule {rule.keep_if} "
                      f"{rule.threshold:.4f})  {s.snippet_id}{miss}")
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
        measured = _labelled_line(results, pairs, flt.unit)
        if measured:
            print(measured)
        if flt.evidence is not None:
            print(p_value_rule(flt.calibrator_))
        print(f"mode {flt.mode}: {flt.guarantee()['statement']}")


def _p_text(scored: Any) -> str:
    """``  p=0.412`` (nothing when the artifact stores no calibration evidence)."""
    return "" if scored.p_value is None else f"  p={scored.p_value:.3f}"


def _labelled_line(results: dict[str, Any], pairs: Any, unit: str) -> str | None:
    """On labelled data: the share of relevant snippets kept and of snippets removed, with
    the counts behind them; None when any pair is unlabelled or none is relevant."""
    if not pairs or any(p.relevant is None for p in pairs):
        return None
    relevant = {(p.query_id, p.snippet_id) for p in pairs if p.relevant == 1}
    if not relevant:
        return None
    kept = {(qid, sid) for qid, r in results.items() for sid in r.kept_ids}
    hits = len(relevant & kept)
    n_in = sum(r.n_input for r in results.values())
    n_kept = sum(len(r.kept) for r in results.values())
    what = "relevant snippets (a snippet counts when any of its sentences is kept)" \
        if unit == "sentence" else "relevant snippets"
    return (f"on the labels in the data: coverage {hits / len(relevant):.3f} (kept {hits} of "
            f"{len(relevant)} {what}), removal {1 - n_kept / n_in:.3f} "
            f"({n_in - n_kept} of {n_in} snippets removed)")


def _filter_summary(n_queries: int, kept: float, total: float, flt: Any) -> str:
    rm = 1 - kept / total if total else 0.0
    return (f"{n_queries} queries, kept {int(kept)}/{int(total)} snippets (removed {rm:.1%}), "
            f"{flt.scorer_.keep_rule(flt.threshold)}"
            + ("" if flt.alpha is None else f", alpha={flt.alpha:g}"))


def _index_vectors_of_inputs(inputs: list[Any], task: Any, *, quiet: bool) -> list[str]:
    """``filter --out``: the stored vectors of the index the inputs' ``retrieve`` pairs
    name, put into the embedding cache the job's workers read (its SQLite file, so Ray
    workers on this machine find them too), in one streaming pass over the inputs."""
    from ..data.shards import iter_input_pairs

    return _index_vectors(iter_input_pairs(inputs, score_field=task.score_field),
                          task.filter.scorer_, quiet=quiet,
                          cache_dir=task.scorer_options.get("cache_dir"))


def _run_filter_job(artifact: Artifact, options: dict[str, Any], data: DataSource,
                    engine: EngineOptions, *, out: str, progress: bool, as_json: bool) -> int:
    from ..engines import FilterTask

    task = FilterTask(artifact, scorer_options=options, score_field=artifact.score_field)
    inputs = data.shard_inputs()
    _index_vectors_of_inputs(inputs, task, quiet=not progress)
    report = _run_job(engine, task, inputs, out=out, progress=progress)
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
