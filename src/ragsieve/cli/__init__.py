"""``ragsieve`` command line: parse, call the library, print.

Library errors become one-line messages with exit code 2 (no traceback); a
``TypeError`` is a bug and keeps its traceback. ``--json`` gives machine-readable output
next to the human tables. Options are declared once, in :mod:`~ragsieve.cli.options`
(their types in :mod:`~ragsieve.cli.argtypes`); the commands are in one module per
surface (:mod:`~ragsieve.cli.evaluating`, :mod:`~ragsieve.cli.filtering`,
:mod:`~ragsieve.cli.labelling`, :mod:`~ragsieve.cli.serving`,
:mod:`~ragsieve.cli.indexing`; their shared helpers in :mod:`~ragsieve.cli.common`), each
turning its parsed options into values once (:mod:`~ragsieve.cli.values`,
:mod:`~ragsieve.cli.scorers`), the demos in :mod:`~ragsieve.cli.demos`. No parser accepts
abbreviated options; every count option has an upper bound
(:data:`~ragsieve.cli.argtypes.LIMITS`). Before a command that writes runs,
:func:`check_paths` refuses an output that would overwrite, or write into, one of its
inputs (:data:`PATH_ROLES`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import RagsieveError
from ..types import DEFAULT_ALPHA
from . import demos, evaluating, filtering, indexing, labelling, serving
from .argtypes import (
    LIMITS,
    at_most,
    bounded_ints,
    count,
    floats,
    fraction,
    nonnegative_float,
    nonnegative_int,
    port,
    positive_float,
    positive_int,
)
from .options import (
    OneLineParser,
    add_alpha_option,
    add_cache_options,
    add_calibration_fraction_option,
    add_confidence_option,
    add_data_dir_option,
    add_data_options,
    add_embedding_options,
    add_engine_options,
    add_filter_option,
    add_fit_options,
    add_json_option,
    add_limit_queries_option,
    add_llm_options,
    add_runtime_scorer_options,
    add_saved_scorer_options,
    add_scorer_options,
    add_seed_option,
    add_sign_key_option,
    add_splits_option,
    add_top_k_option,
    add_unit_option,
    add_verify_key_option,
    subparser,
)
from .output import one_line

__all__ = ["build_parser", "main"]

CLEAN_ERRORS: tuple[type[BaseException], ...] = (RagsieveError, ValueError, OSError, ImportError)
"""Exceptions ``main`` reports as one line with exit code 2 (a ``TypeError`` is a bug and
is not among them)."""

PATH_ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "evaluate": (("data",), ("plot", "html")),
    "answers": (("data",), ("per_query", "plot", "html")),
    "report": (("data", "filter"), ("out",)),
    "calibrate": (("data",), ("out",)),
    "score": (("data", "filter"), ("out",)),
    "filter": (("data", "filter"), ("out",)),
    "label": (("data",), ("out",)),
    "recalibrate": (("feedback", "filter"), ("out",)),
    "export": (("data",), ("out", "docs", "queries")),
    "index": (("docs_dir",), ("index",)),
    "retrieve": (("index", "queries"), ("out",)),
    "demo": (("data_dir",), ("out",)),
    "rag-demo": (("data_dir",), ("out",)),
    "shift-demo": (("data_dir",), ("out",)),
}
"""Per command that writes: the options it reads and the options it writes (namespace
attributes). ``main`` refuses, before the command runs, an output that is one of the
inputs (same path, symlink or hard link), lies inside an input directory, or holds an
input (:func:`ragsieve._paths.check_outputs_apart`)."""

_ENGINE_COMMANDS = frozenset({"score", "filter", "label"})


def _option_name(attr: str) -> str:
    return attr if attr == "docs_dir" else "--" + attr.replace("_", "-")


def _written_paths(args: argparse.Namespace, attr: str) -> dict[str, str]:
    """The paths an output option makes a command write: the path, and the file a plot
    really goes to or the ``<out>.parts`` directory of an engine's file output."""
    from .._paths import figure_path

    value = getattr(args, attr, None)
    if value is None:
        return {}
    paths = {_option_name(attr): str(value)}
    if attr == "plot":
        paths[_option_name(attr)] = str(figure_path(value))
    elif attr == "out" and args.command in _ENGINE_COMMANDS:
        from ..engines.base import output_directory

        paths[f"{_option_name(attr)} (its parts)"] = str(output_directory(value))
    return paths


def check_paths(args: argparse.Namespace) -> None:
    """Refuse a command whose outputs would overwrite or write into its inputs.

    Raises
    ------
    ValueError
        Naming both options (see :data:`PATH_ROLES`).
    """
    from .._paths import check_outputs_apart

    inputs, outputs = PATH_ROLES.get(args.command, ((), ()))
    written: dict[str, str] = {}
    for attr in outputs:
        written.update(_written_paths(args, attr))
    read = {_option_name(a): getattr(args, a) for a in inputs if getattr(args, a, None)}
    check_outputs_apart(written, read)


def _add_evaluate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "evaluate", "topic-disjoint coverage/removal sweep with baselines")
    add_fit_options(p, several=True, unit="what is scored and measured (default snippet)")
    g = p.add_argument_group("sweep")
    add_alpha_option(g, [0.05, 0.1, 0.2, 0.3, 0.4])
    g.add_argument("--top-k", type=bounded_ints(LIMITS["top_k"]), default=[1, 2, 3, 5],
                   help=f"top-k baselines, comma-separated ({at_most('top_k')} each)")
    g.add_argument("--thresholds", type=floats, default=None,
                   help="fixed cut-off baselines in the score's own units and direction, "
                        "comma-separated (keep 1 - cos <= V; keep bm25 >= V with "
                        "--higher-is-better); default: cut at --threshold-quantiles")
    g.add_argument("--threshold-quantiles", type=floats, default=[0.1, 0.2, 0.3, 0.5, 0.7, 0.9],
                   help="quantiles of the score, on each split's calibration topics, that the "
                        "fixed cut-off baselines cut at (default 0.1,0.2,0.3,0.5,0.7,0.9)")
    add_splits_option(g, 20)
    add_calibration_fraction_option(g)
    add_seed_option(g)
    add_limit_queries_option(g, help="evaluate on N queries drawn at random across topics "
                                     "(bounds LLM cost)")
    g.add_argument("--on-error", choices=["raise", "drop"], default="raise",
                   help="pairs the scorer cannot score: fail (default) or drop them and report "
                        "how many")
    add_engine_options(p, output=False)
    add_json_option(p)
    p.add_argument("--plot", default=None, help="write the figure to this PNG")
    p.add_argument("--html", default=None, metavar="PATH",
                   help="also write the results as one self-contained HTML page (table, "
                        "figure, the guarantee)")
    p.set_defaults(func=evaluating.cmd_evaluate)


def _add_choose_alpha(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "choose-alpha", "the alpha that reaches a removal (or coverage) target, "
                                       "measured on held-out topics")
    add_fit_options(p, several=False, unit="what is scored and measured (default snippet)")
    g = p.add_argument_group("target (give one)")
    t = g.add_mutually_exclusive_group(required=True)
    t.add_argument("--removal", type=fraction, default=None,
                   help="share of snippets to remove, e.g. 0.5: the smallest alpha that removes "
                        "at least this much on held-out topics")
    t.add_argument("--coverage", type=fraction, default=None,
                   help="share of relevant snippets to keep, e.g. 0.9: the largest alpha whose "
                        "guarantee promises it")
    g.add_argument("--alphas", type=floats, default=None,
                   help="alphas to try (default 0.01,0.02,0.05,0.1,0.15,0.2,0.25,0.3,0.4,0.5)")
    add_splits_option(g, 10)
    add_seed_option(g)
    add_json_option(p)
    p.set_defaults(func=evaluating.cmd_choose_alpha)


def _add_answers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "answers", "downstream answer quality of each method's kept context "
                                  "(answer in context, EM/F1, nugget F1, paired bootstrap CIs)")
    add_fit_options(p, several=True,
                    unit="what the conformal filter scores and keeps (default snippet)")
    g = p.add_argument_group("answers")
    add_alpha_option(g, [0.05, 0.1, 0.2])
    add_splits_option(g, 1, help="topic-disjoint splits (default 1; each repeats the generation "
                                 f"for its test queries; {at_most('splits')})")
    add_calibration_fraction_option(g)
    add_seed_option(g)
    add_limit_queries_option(g, help="evaluate at most N test queries (a seeded sample; "
                                     "calibration keeps every calibration topic): bounds the "
                                     "LLM cost")
    g.add_argument("--no-generate", action="store_true",
                   help="model-free metrics only (answer in context, context size): no LLM")
    judge = g.add_mutually_exclusive_group()
    judge.add_argument("--judge", dest="judge", action="store_true", default=None,
                       help="judge the answers (nugget metrics) even with the local model")
    judge.add_argument("--no-judge", dest="judge", action="store_false",
                       help="skip the nugget judge (default: judge with --base-url only)")
    g.add_argument("--max-tokens", type=count("max_tokens"), default=32,
                   help=f"length cap of a generated answer (default 32, {at_most('max_tokens')})")
    add_confidence_option(g, help="level of the paired bootstrap intervals (default 0.95)")
    g.add_argument("--bootstrap-resamples", type=count("bootstrap_resamples"), default=2000,
                   help=f"paired bootstrap resamples (default 2000, "
                        f"{at_most('bootstrap_resamples')})")
    add_json_option(p)
    p.add_argument("--plot", default=None, help="write the quality-vs-context-size figure to this PNG")
    p.add_argument("--per-query", default=None, metavar="FILE",
                   help="also write every query's values per method as JSONL")
    p.add_argument("--html", default=None, metavar="PATH",
                   help="also write the results as one self-contained HTML page (answer "
                        "metrics with intervals, figure)")
    p.set_defaults(func=evaluating.cmd_answers)


def _add_calibrate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "calibrate", "calibrate a filter of one guarantee mode and save it")
    add_fit_options(p, several=False, unit="what the filter scores and keeps, saved in the "
                                            "artifact (default snippet)")
    add_alpha_option(p, DEFAULT_ALPHA, help="target miscoverage (default 0.1)")
    p.add_argument("--min-keep", type=nonnegative_int, default=0,
                   help="empty-result policy (default 0)")
    p.add_argument("--out", required=True, help="artifact to write (JSON)")
    p.add_argument("--lists", choices=("auto", "deployed", "data"), default="auto",
                   help="where the calibration lists come from (recorded in the artifact and "
                        "checked wherever it is applied): auto reads it from the data (lists "
                        "written by `ragsieve retrieve` carry their retriever); deployed: they "
                        "are the lists your deployed retriever returns (the default score may "
                        "then read the whole list); data: a data set's own lists (the default "
                        "score is then list-free). See docs/deploy.md")
    p.add_argument("--no-expected", action="store_true",
                   help="skip the expected coverage and removal on new topics (a 5-fold "
                        "cross-validation over the calibration topics; it scores every pair)")
    add_sign_key_option(p)
    add_json_option(p)
    p.set_defaults(func=filtering.cmd_calibrate)


def _add_filter(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "filter", "apply a saved filter to pairs (one line per query); printed "
                                 "results also run the service's exchangeability alarm over the "
                                 "queries and say when it fires")
    add_filter_option(p)
    add_data_options(p)
    add_unit_option(p, what="must be the artifact's unit, or omitted")
    p.add_argument("--out", default=None,
                   help="write one JSON object per query here (a directory of parts, or a "
                        ".jsonl / .parquet file), streaming and resumable; default: print")
    add_saved_scorer_options(p)
    add_engine_options(p)
    add_json_option(p)
    p.add_argument("--show-removed", action="store_true",
                   help="also print each removed snippet with its score and the threshold it "
                        "missed, marked '[relevant: missed]' when the data labels it relevant "
                        "(--json always carries them under 'removed')")
    add_verify_key_option(p)
    p.set_defaults(func=filtering.cmd_filter)


def _add_report(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "report", "one self-contained HTML page of what a saved filter does to "
                                 "data: guarantee, coverage and removal, trade-off, per query")
    add_filter_option(p)
    add_data_options(p)
    p.add_argument("--out", required=True, metavar="PATH", help="the HTML page to write")
    p.add_argument("--max-queries", type=count("limit_queries"), default=50,
                   help="queries listed one by one (default 50; the measures use all)")
    add_splits_option(p, 10, help="topic-disjoint splits of the trade-off figure (default 10, "
                                  f"{at_most('splits')})")
    add_confidence_option(p, help="level of the bootstrap intervals (default 0.95)")
    add_seed_option(p)
    add_saved_scorer_options(p)
    add_json_option(p)
    p.set_defaults(func=evaluating.cmd_report)


def _add_score(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "score", "write every pair's nonconformity score (JSONL or Parquet), "
                                "streaming and resumable, locally or on Ray")
    add_data_options(p)
    p.add_argument("--out", required=True,
                   help="a directory of parts with a manifest, or a .jsonl / .parquet file")
    add_filter_option(p, required=False, metavar="ARTIFACT",
                      help="score with this artifact's scorer (e.g. its fitted fused score); "
                           "default: --scorer")
    p.add_argument("--score-name", default="score",
                   help="the key each pair's score is written under (default score)")
    # the pairs need no labels here, and the fused score is fitted on labels: 1 - cos
    add_scorer_options(p, default="embedding")
    add_engine_options(p)
    add_json_option(p)
    p.set_defaults(func=filtering.cmd_score)


def _add_label(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "label", "label pairs with an LLM (relevant + raw answer), resumable")
    add_data_options(p)
    p.add_argument("--out", required=True,
                   help="labelled pairs: a .jsonl / .parquet file, or a directory of parts")
    p.add_argument("--method", choices=["auto", "logprob", "yes-no"], default="auto")
    p.add_argument("--threshold", type=fraction, default=0.5,
                   help="P(yes) threshold of --method logprob")
    add_limit_queries_option(p, help=f"label N queries drawn at random "
                                     f"({at_most('limit_queries')})")
    add_seed_option(p)
    p.add_argument("--price-per-million-tokens", type=nonnegative_float, default=0.0,
                   help="for the cost estimate (0 for a local model)")
    add_cache_options(p, embeddings=False)
    add_llm_options(p)
    add_engine_options(p)
    add_json_option(p)
    p.set_defaults(func=labelling.cmd_label)


def _add_llm(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "llm", "the local LLM")
    llm_sub = p.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    q = subparser(llm_sub, "serve", "serve the local model (OpenAI-compatible) until Ctrl-C")
    q.add_argument("--model", default="gemma3-270m",
                   help="gemma3-270m, smollm2-135m or a .gguf path")
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--port", type=port, default=8080)
    q.add_argument("--threads", type=count("threads"), default=None,
                   help=f"CPU threads (env RAGSIEVE_LLM_THREADS, default 1; {at_most('threads')})")
    q.add_argument("--n-ctx", type=count("n_ctx"), default=4096,
                   help=f"context (KV cache) in tokens (default 4096, {at_most('n_ctx')})")
    q.add_argument("--parallel", type=count("parallel"), default=1,
                   help=f"parallel slots (default 1, {at_most('parallel')})")
    q.set_defaults(func=labelling.cmd_llm_serve)
    q = subparser(llm_sub, "injection", "measure how far injected instructions move judgements")
    add_data_options(q)
    q.add_argument("--n-pairs", type=count("n_pairs"), default=40,
                   help=f"non-relevant pairs to test (default 40, {at_most('n_pairs')})")
    add_seed_option(q)
    add_llm_options(q)
    add_json_option(q)
    q.set_defaults(func=labelling.cmd_llm_injection)


def _add_shift_demo(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "shift-demo", "a stream that switches dataset/language: static vs adaptive")
    p.add_argument("--out", default="ragsieve-shift", help="output folder (default ragsieve-shift)")
    p.add_argument("--phase1", default="xquad-en")
    p.add_argument("--phase2", default="xquad-de")
    add_alpha_option(p, DEFAULT_ALPHA)
    p.add_argument("--gamma", type=positive_float, default=0.005, help="ACI step size")
    p.add_argument("--window", type=count("window"), default=None,
                   help="recent scores the adaptive filter keeps (default: the library's; "
                        f"{at_most('window')})")
    add_seed_option(p)
    add_data_dir_option(p)
    add_json_option(p)
    p.set_defaults(func=demos.cmd_shift_demo)


def _add_index_and_query(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "index", "chunk, embed and store a folder of documents (LanceDB)")
    p.add_argument("docs_dir")
    p.add_argument("--index", required=True,
                   help="index directory (created if missing; one writer at a time)")
    p.add_argument("--model", default=None,
                   help="embedding model (default: the index's, or MiniLM)")
    p.add_argument("--batch-size", type=count("batch_size"), default=32,
                   help=f"snippets embedded at once (default 32, {at_most('batch_size')})")
    p.set_defaults(func=indexing.cmd_index)

    p = subparser(sub, "query", "retrieve from an index, filtered by a calibrated filter")
    p.add_argument("query")
    p.add_argument("--index", required=True,
                   help="index directory built by `ragsieve index` (never created here)")
    add_filter_option(p, required=False,
                      help="filter artifact: embedding, relative or best scorer on the index's "
                           "model")
    add_top_k_option(p)
    p.add_argument("--group", default=None,
                   help="the query's group, for a filter of the group mode (e.g. its language)")
    p.add_argument("--generate", action="store_true",
                   help="ask the LLM for an answer grounded in the kept snippets, with citations")
    add_llm_options(p)
    add_json_option(p)
    p.set_defaults(func=indexing.cmd_query)


def _add_retrieve(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "retrieve", "run an index on labelled queries and write what it "
                                   "retrieves as labelled pairs: the lists to calibrate on")
    p.add_argument("--index", required=True,
                   help="index directory built by `ragsieve index`: the one you deploy "
                        "(never created here)")
    p.add_argument("--queries", required=True, metavar="FILE",
                   help="labelled queries, JSONL: query_id, query, and relevant_doc_ids "
                        "and/or answers (docs/data-format.md); '-' for stdin")
    p.add_argument("-k", "--k", type=count("top_k"), default=20,
                   help="snippets retrieved per query: the k you deploy (default 20, as "
                        f"`ragsieve query`; {at_most('top_k')})")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the pairs to write, generic JSONL, one line per hit (atomically)")
    p.add_argument("--language", default=None,
                   help="language of the answers' SQuAD normalisation: its articles are "
                        "dropped before matching (default en)")
    # the top-level -q too: SUPPRESS keeps `ragsieve -q retrieve` quiet
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress bar (as `ragsieve -q`)")
    add_json_option(p)
    add_cache_options(p)  # the queries' vectors, kept for `calibrate` on the same cache
    p.set_defaults(func=indexing.cmd_retrieve)


def _add_rag_demo(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "rag-demo",
                  "index the XQuAD English articles and ask a question, filter in the loop")
    p.add_argument("--out", default="ragsieve-rag",
                   help="folder for the documents, the index and the filter (default ragsieve-rag)")
    p.add_argument("--question", default=None,
                   help="default: a question from the held-out articles")
    add_alpha_option(p, DEFAULT_ALPHA)
    add_top_k_option(p)
    add_seed_option(p)
    add_data_dir_option(p)
    add_cache_options(p)
    p.set_defaults(func=demos.cmd_rag_demo)


def _add_serve(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "serve",
                  "HTTP service: POST /filter (and /query with --index) with a calibrated filter")
    add_filter_option(p)
    p.add_argument("--index", default=None,
                   help="index directory served by POST /query (see `ragsieve index`)")
    # serve's defaults are ServeOptions' (server/options.py): None here means "not given"
    p.add_argument("--max-k", type=positive_int, default=None,
                   help="largest k a /query request may ask for (default 100)")
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=None, help="port to listen on (default 8000)")
    p.add_argument("--api-key-env", default=None,
                   help="env var holding the API key (required to bind a non-loopback host)")
    add_verify_key_option(p)
    p.add_argument("--allowed-hosts", default=None, metavar="HOSTS",
                   help="comma-separated Host names the service answers to besides the "
                        "address it listens on (and localhost for a loopback one), e.g. "
                        "ragsieve.example,10.0.0.5:8000; any other Host gets 400 (DNS "
                        "rebinding). '*' answers to any Host: unsafe")
    p.add_argument("--max-body-bytes", type=positive_int, default=None,
                   help="larger request bodies get 413 (default 1000000)")
    p.add_argument("--max-receiving-bytes", type=positive_int, default=None, metavar="N",
                   help="most bytes of request bodies being received at once over all "
                        "connections (of one process); a request that would pass it gets 503 "
                        "with Retry-After before its body is read (default 4 x "
                        "--max-body-bytes)")
    p.add_argument("--max-receiving-per-client", type=positive_int, default=None, metavar="N",
                   help="most bytes of request bodies one client address may be sending at "
                        "once; beyond it 429 with Retry-After (default 2 x --max-body-bytes, at "
                        "most --max-receiving-bytes; behind a proxy every client has its "
                        "address: raise it)")
    p.add_argument("--body-idle-timeout", type=positive_float, default=None, metavar="S",
                   help="seconds a request body may go without a byte arriving before 408 and "
                        "the connection closed (default 10)")
    p.add_argument("--max-snippets", type=positive_int, default=None,
                   help="requests with more snippets or labels get 413 (default 1000)")
    p.add_argument("--rerank-return", choices=("kept", "all"), default=None,
                   help="what POST /v1/rerank, /v2/rerank and /rerank answer when the URL does "
                        "not say (?return=all or the /all path prefix): the documents the "
                        "filter keeps (default) or every document ranked, with its p-value")
    add_cache_options(p)
    add_runtime_scorer_options(p)  # a saved score's endpoint: --rerank-url
    _add_serve_operations(p)
    p.set_defaults(func=serving.cmd_serve)


def _add_serve_operations(p: argparse.ArgumentParser) -> None:
    """``serve``'s operation options: workers, state, feedback, adaptive, monitor, reload."""
    g = p.add_argument_group("operation")
    g.add_argument("--workers", type=positive_int, default=None,
                   help="worker processes (each loads the model; they share the feedback, "
                        "the adaptive threshold, the monitor and /metrics; default 1)")
    g.add_argument("--state-dir", default=None, metavar="DIR",
                   help="feedback, reload and monitor files (default: one per artifact path "
                        "under the ragsieve cache, printed at start)")
    g.add_argument("--feedback", default=None, metavar="DB",
                   help="SQLite file of served scores and POST /feedback labels "
                        "(default DIR/feedback.sqlite)")
    g.add_argument("--adaptive", action="store_true",
                   help="the threshold follows the feedback (adaptive conformal inference); "
                        "needs an artifact of mode adaptive")
    g.add_argument("--monitor-delta", type=fraction, default=None,
                   help="false-alarm bound of the exchangeability alarm (default 0.01)")
    g.add_argument("--watch", action="store_true",
                   help="reload the artifact when its file changes (SIGHUP and POST "
                        "/admin/reload always work)")
    g.add_argument("--max-artifact-bytes", type=positive_int, default=None, metavar="N",
                   help="refuse artifact files larger than this at start and on a reload "
                        "(default 64 MiB)")
    g = p.add_argument_group("fairness and feedback limits")
    g.add_argument("--max-pieces", type=positive_int, default=None, metavar="N",
                   help="most pieces of model work one request may cause, a piece being about "
                        "500 characters of text to embed: snippets, sentences and the query "
                        "alike (413 beyond; default 128, about 2 s of model time on 2 cores)")
    g.add_argument("--max-queue", type=positive_int, default=None, metavar="N",
                   help="most requests waiting for the model at once (429 with Retry-After "
                        "beyond; default 64)")
    g.add_argument("--feedback-retention", type=positive_float, default=None, metavar="SECONDS",
                   help="how long a served score can be labelled; older served rows and their "
                        "labels are pruned (default 7 days)")
    g.add_argument("--max-labels-per-query", type=positive_int, default=None, metavar="N",
                   help="most labels counted for one query_id (default 1000)")
    g.add_argument("--max-labels-per-minute", type=positive_int, default=None, metavar="N",
                   help="most labels one client may send per minute (429 beyond; default "
                        "6000)")


def _add_recalibrate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "recalibrate",
                  "rebuild a filter artifact from the labels collected by `serve` (POST /feedback)")
    p.add_argument("--feedback", required=True, metavar="DB",
                   help="the service's feedback database (printed by `serve` at start)")
    add_filter_option(p, help="the artifact the labels were collected with")
    p.add_argument("--out", required=True, help="the new artifact (JSON)")
    p.add_argument("--min-labels", type=positive_int, default=50,
                   help="fewest relevant labels of served snippets to recalibrate on (default 50)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--merge", dest="merge", action="store_true", default=True,
                     help="fit on the artifact's calibration scores plus the labels (default; "
                          "modes marginal and adaptive, which keep their scores)")
    how.add_argument("--replace", dest="merge", action="store_false",
                     help="fit on the labels alone (any mode labels can feed)")
    add_sign_key_option(p)
    add_json_option(p)
    p.set_defaults(func=serving.cmd_recalibrate)


def _add_export(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "export", "write a dataset in the generic JSONL format, or as documents "
                                 "and labelled queries to index and retrieve")
    add_data_options(p)
    p.add_argument("--out", default=None, help="the pairs, as JSONL")
    p.add_argument("--docs", default=None, metavar="DIR",
                   help="the documents, rebuilt from the snippets, as DIR/documents.jsonl "
                        "(one {id, text} per line: what `ragsieve index DIR` indexes)")
    p.add_argument("--queries", default=None, metavar="FILE",
                   help="the labelled queries (relevant_doc_ids, answers) for `ragsieve "
                        "retrieve --queries`")
    p.set_defaults(func=indexing.cmd_export)


def _add_demo(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparser(sub, "demo", "XQuAD end to end: 1 - cos vs the fused score, table, plot, "
                               "an example query")
    p.add_argument("--out", default="ragsieve-demo")
    add_splits_option(p, 20, help=f"topic-disjoint splits (default 20, {at_most('splits')})")
    add_alpha_option(p, [0.05, 0.1, 0.2, 0.3, 0.4])
    add_seed_option(p)
    add_data_dir_option(p)
    p.add_argument("--scorer", choices=["best", "relative", "embedding"], default="best",
                   help="the score compared with 1 - cos (default best, the fused score; "
                        "embedding shows 1 - cos alone)")
    add_embedding_options(p)
    p.set_defaults(language="en")
    add_cache_options(p)
    p.set_defaults(func=demos.cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    """The ``ragsieve`` argument parser (no prefix abbreviations on any level).

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = OneLineParser(  # its subcommand parsers are OneLineParsers too
        prog="ragsieve", allow_abbrev=False,
        description="ragsieve: calibrated filters for retrieved context (evaluate, calibrate, "
                    "filter, serve). Errors: one line on stderr, exit code 2.")
    parser.add_argument("--version", action="version", version=f"ragsieve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO messages")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_evaluate, _add_choose_alpha, _add_answers, _add_calibrate, _add_score, _add_filter,
                _add_report,
                _add_label, _add_llm, _add_shift_demo, _add_index_and_query, _add_retrieve,
                _add_rag_demo,
                _add_serve, _add_recalibrate, _add_export, _add_demo):
        add(sub)
    return parser


def _quiet_progress() -> None:
    """``-q``: no progress bar from the libraries either (Hugging Face Hub downloads,
    transformers' weight loading), whether they are imported yet or not."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read when they are first imported
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragsieve`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success; 2 for a usage error, an output that would overwrite or write into
        an input (:func:`check_paths`, checked before any work) or a library error
        (``RagsieveError``, ``ValueError``, ``OSError``, ``ImportError``), printed as one
        line on stderr; 130 when interrupted. Other exceptions, ``TypeError`` among them, propagate
        with their traceback: they are bugs.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "quiet", False):
        _quiet_progress()
    try:
        check_paths(args)
        return int(args.func(args) or 0)
    except CLEAN_ERRORS as exc:
        print(f"ragsieve {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
