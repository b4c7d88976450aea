"""The ``ragsieve`` subcommands of the HTTP service: ``serve`` (a saved filter, and an
index, behind the service), :func:`serve_options` (``serve``'s parsed options as the
service's :class:`~ragsieve.server.options.ServeOptions`) and ``recalibrate`` (a new
artifact from the feedback labels stored by ``serve``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import _tau
from .output import dumps, eprint
from .scorers import ScorerRequest, artifact_scorer_options

__all__ = ["cmd_recalibrate", "cmd_serve", "serve_options"]


def cmd_serve(args: argparse.Namespace) -> int:
    """``ragsieve serve``: the HTTP service around a saved filter (and an index)."""
    from ..artifact import Artifact
    from ..server import run_server

    options = serve_options(args)  # every option checked before the artifact is read
    artifact = Artifact.read(args.filter, max_bytes=options.max_artifact_bytes,
                             verify_key=options.verify_key())
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
    from ..artifact import Artifact, key_from_env
    from ..server.recalibrate import recalibrate

    sign_key = key_from_env(args.sign_key_env) if args.sign_key_env else None
    artifact = Artifact.read(args.filter)
    result = recalibrate(artifact, args.feedback, min_labels=args.min_labels,
                         merge=args.merge)  # scores nothing
    result.filter.save(args.out, sign_key=sign_key)
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
    rule = result.filter.scorer_.keep_rule  # thresholds in the score's own direction
    print(f"tau={_tau(rule(result.new_threshold).threshold)} (was "
          f"{_tau(rule(result.old_threshold).threshold)}){extra} -> {args.out}")
    return 0
