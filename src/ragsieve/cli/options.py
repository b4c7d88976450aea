"""The options of the command line, each declared once.

The option groups (``add_data_options``, ``add_scorer_options``, ``add_cache_options``,
``add_llm_options``, ``add_guarantee_options``, ...) and the single options several
subcommands share (``--seed``, ``--alpha``, ``--splits``, ...: :func:`add_seed_option`,
:func:`add_alpha_option`, :func:`add_splits_option`, ...); a subcommand calls those it
needs. Their ``argparse`` types are in :mod:`ragsieve.cli.argtypes`; turning the parsed
options into values is :mod:`ragsieve.cli.values` and :mod:`ragsieve.cli.scorers`. No
parser accepts prefix abbreviations (:func:`subparser` sets ``allow_abbrev=False``), so
``--mode`` can never be read as ``--model``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, NoReturn

from .argtypes import (
    BUDGET_UNITS,
    DEFAULT_DELTA,
    NotGiven,
    at_most,
    count,
    finite_float,
    floats,
    fraction,
    known_modes,
    modes,
    nonnegative_int,
    positive_float,
    positive_int,
    positive_ints,
)
from .output import one_line

Options = argparse.ArgumentParser | argparse._ArgumentGroup
"""Where an option is declared: a (sub)command parser or one of its groups."""

__all__ = [
    "OneLineParser",
    "add_alpha_option",
    "add_cache_options",
    "add_calibration_fraction_option",
    "add_confidence_option",
    "add_data_dir_option",
    "add_data_options",
    "add_embedding_options",
    "add_engine_options",
    "add_filter_option",
    "add_fit_options",
    "add_guarantee_options",
    "add_json_option",
    "add_limit_queries_option",
    "add_llm_options",
    "add_runtime_scorer_options",
    "add_saved_scorer_options",
    "add_scorer_options",
    "add_seed_option",
    "add_sign_key_option",
    "add_splits_option",
    "add_top_k_option",
    "add_unit_option",
    "add_verify_key_option",
    "shared_scorer_flags",
    "subparser",
]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (exit code 2), like
    the library errors: ``ragsieve calibrate: error: argument --alpha: ...``, with a pointer
    to ``--help`` instead of the whole usage block."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line and exit with code 2."""
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def subparser(sub: Any, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand parser (``summary`` is its help line) that rejects prefix
    abbreviations of its options."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=summary, allow_abbrev=False)
    return parser


def add_json_option(p: argparse.ArgumentParser) -> None:
    """``--json``: machine-readable output instead of the human text."""
    p.add_argument("--json", action="store_true", help="machine-readable JSON output")


def add_data_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--data`` and ``--data-dir``."""
    from ..data.selqa import SELQA_SPLITS

    selqa = ", ".join(f"selqa-{split}" for split in SELQA_SPLITS)
    g = p.add_argument_group("data")
    g.add_argument("--data", required=required,
                   help="generic JSONL file, or a dataset name: xquad-en, xquad-de, xquad-es, "
                        "xquad-zh, xquad-el, xquad-ro (any XQuAD language), xquad-en2de, "
                        "xquad-en2es, xquad-en2zh, xquad-en2el, xquad-en2ro (English questions "
                        f"over that language's articles; xquad-Q2L for any two), {selqa} "
                        "(SelQA's splits, read from the data directory)")
    add_data_dir_option(g, help="dataset directory (env RAGSIEVE_DATA; default "
                                "../shared/datasets)")


def add_data_dir_option(p: Options, *, help: str = "dataset directory (env RAGSIEVE_DATA)",
                        ) -> None:
    """``--data-dir``: where the named datasets are."""
    p.add_argument("--data-dir", default=None, help=help)


def add_cache_options(p: argparse.ArgumentParser, *, embeddings: bool = True) -> None:
    """``--cache-dir`` (embedding cache, when ``embeddings``) and ``--no-cache``."""
    g = p.add_argument_group("cache")
    if embeddings:
        g.add_argument("--cache-dir", default=None,
                       help="embedding cache directory (default $RAGSIEVE_CACHE/embeddings; "
                            "RAGSIEVE_CACHE, default ~/.cache/ragsieve, holds every ragsieve "
                            "cache, each in its own folder: embeddings/, onnx/, serve/, "
                            "models/, datasets/, inputs/ and the LLM and rerank reply caches)")
    g.add_argument("--no-cache", action="store_true",
                   help="persist nothing on disk (embeddings, LLM replies)")


def add_embedding_options(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    """``--model`` (when ``model``), ``--language`` and ``--query-language`` of the
    embedding scorer."""
    g = p.add_argument_group("embedding model")
    if model:
        g.add_argument("--model", default=None,
                       help="embedding model: minilm, use, e5, or any sentence-transformers "
                            "name/path (default: per language: MiniLM for en, multilingual "
                            "USE for its 15 other languages, multilingual-e5-small otherwise)")
        g.add_argument("--backend", choices=["auto", "torch", "onnx", "onnx-int8"], default="auto",
                       help="how a sentence-transformers model runs (default auto: ONNX Runtime "
                            "fp32 when installed, same vectors as torch; onnx-int8 is faster, "
                            "with slightly different vectors)")
    g.add_argument("--language", default=None,
                   help="language of the data, queries and snippets (default: an xquad "
                        "dataset's, else detected in the calibration texts with py3langid, "
                        "else en)")
    g.add_argument("--query-language", default=None,
                   help="language of the queries, when they are asked in another language "
                        "than the snippets are in (default: --language's, an xquad-Q2L "
                        "dataset's Q, else detected apart from the snippets'); the model is "
                        "one trained on both")


def add_llm_options(p: argparse.ArgumentParser, *, scorer: bool = False) -> Any:
    """The LLM endpoint (``--base-url``, ``--llm-model``, ...); with ``scorer``, also the
    LLM scorer's own flags (``--llm-mode``, ``--tie-breaking``: its declared options).
    Returns the argument group."""
    g = p.add_argument_group("LLM (scorer llm, labelling, answers)")
    g.add_argument("--base-url", default=os.environ.get("RAGSIEVE_LLM_BASE_URL"),
                   help="OpenAI-compatible base URL incl. /v1 (env RAGSIEVE_LLM_BASE_URL); "
                        "default: start the local model on 127.0.0.1 for this command")
    g.add_argument("--llm-model", default=os.environ.get("RAGSIEVE_LLM_MODEL"),
                   help="model name for --base-url, or the local model (gemma3-270m, "
                        "smollm2-135m, a .gguf path) (env RAGSIEVE_LLM_MODEL)")
    g.add_argument("--llm-style", choices=["completion", "chat"], default=None,
                   help="prompt style (default: the local model's, chat for endpoints)")
    g.add_argument("--llm-threads", type=count("threads"), default=None,
                   help="CPU threads of the local model (env RAGSIEVE_LLM_THREADS, default 1; "
                        f"{at_most('threads')})")
    g.add_argument("--llm-concurrency", type=count("concurrency"), default=None,
                   help=f"requests in flight ({at_most('concurrency')})")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY",
                   help="env var holding the API key")
    if scorer:
        _add_declared_flags(p, {"llm": g}, aliases=("llm",))
    return g


def add_engine_options(p: argparse.ArgumentParser, *, output: bool = True) -> None:
    """``--engine``, ``--ray-address``, ``--workers``, ``--shard-bytes``; with ``output``,
    also ``--format`` and ``--overwrite`` of a partitioned output."""
    from ..data.shards import DEFAULT_SHARD_BYTES

    g = p.add_argument_group("engine (large inputs)")
    g.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: stream through this process (default); ray: a pool of Ray "
                        "actors, each holding the model (extra ragsieve[ray])")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="--engine ray: the cluster to join (`ray start --head` prints it; "
                        "default: start a local Ray runtime for this command)")
    g.add_argument("--workers", type=count("workers"), default=None,
                   help=f"--engine ray: actors in the pool (default: one per CPU; "
                        f"{at_most('workers')})")
    g.add_argument("--shard-bytes", type=count("shard_bytes"), default=DEFAULT_SHARD_BYTES,
                   help=f"input bytes per shard, the unit of work and of resuming (default "
                        f"{DEFAULT_SHARD_BYTES}; {at_most('shard_bytes')})")
    if output:
        g.add_argument("--format", choices=["jsonl", "parquet"], default=None,
                       help="part format of a directory --out (default jsonl; a file --out "
                            "takes its suffix's)")
        g.add_argument("--overwrite", action="store_true",
                       help="replace an --out that holds another run (default: refuse; the "
                            "same run resumes)")


def add_scorer_options(p: argparse.ArgumentParser, *, default: str = "auto") -> None:
    """Everything that builds a scorer: ``--scorer`` and its options, the embedding
    model, the cache and the LLM endpoint.

    ``default`` is ``"auto"`` for the commands that fit a filter (the list-aware fused score on
    the deployed retriever's lists, else the portable one, else ``1 - cos``); ``score`` keeps
    ``"embedding"``, as
    its pairs need no labels and the fused score is fitted on labels.
    """
    g = p.add_argument_group("score")
    g.add_argument("--scorer", default=default,
                   help="auto (the list-aware fused score on your deployed retriever's lists: "
                        "ragsieve retrieve, --lists deployed; else the portable fused score, "
                        "else 1 - cos), embedding (1 - cos), relative (query-relative, see "
                        "--relative-kind), best (fused score, fitted on part of the calibration "
                        "data), llm, field (an outside score read from --score-field), or rerank (a "
                        "reranker endpoint of the rerank API: --rerank-url) "
                        f"(default {default})")
    # every registered scorer's own flags; the shared ones (model, cache, LLM endpoint)
    # come from their groups below, once
    from ..scoring import registered_scorers

    skip = shared_scorer_flags()
    _add_declared_flags(p, {"score": g}, registered_scorers(), skip)
    add_embedding_options(p)
    add_cache_options(p)
    llm = add_llm_options(p)
    _add_declared_flags(p, {"llm": llm}, registered_scorers(), skip)


def shared_scorer_flags() -> set[str]:
    """The flags of the shared option groups (the embedding model, the cache, the LLM
    endpoint): every scorer that reads them, and the generator, takes them; the other
    declared flags belong to the scorers that declare them."""
    shared = argparse.ArgumentParser(add_help=False)
    add_embedding_options(shared)
    add_cache_options(shared)
    add_llm_options(shared)
    return {flag for action in shared._actions for flag in action.option_strings}


def _add_declared_flags(p: argparse.ArgumentParser, groups: dict[str, Any],
                        aliases: Sequence[str], skip: set[str] | None = None) -> None:
    """The flags the scorers ``aliases`` declare (:func:`ragsieve.scoring.scorer_options`)
    in ``groups`` (by the option's group), each once; flags in ``skip`` or already in the
    parser (``--model``) are shared and left to their own group."""
    from ..scoring import scorer_options

    have = {flag for action in p._actions for flag in action.option_strings} | (skip or set())
    for alias in aliases:
        for option in scorer_options(alias):
            if option.flag is None or option.flag in have or option.group not in groups:
                continue
            groups[option.group].add_argument(option.flag, **option.argparse_kwargs())
            have.add(option.flag)


def add_guarantee_options(p: argparse.ArgumentParser, *, several: bool) -> None:
    """``--mode`` and the parameters of the guarantee modes.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The subcommand parser.
    several : bool
        ``evaluate``: ``--mode`` takes a comma-separated list and ``--budget`` a list of
        character budgets to report; ``calibrate``: one mode and the parameters of the
        ``budget`` and ``adaptive`` calibrators.
    """
    accepted = ", ".join(known_modes())
    g = p.add_argument_group("guarantee")
    if several:
        g.add_argument("--mode", type=modes, default=["marginal"], metavar="M[,M...]",
                       help=f"guarantee modes, comma-separated: {accepted} (default marginal)")
    else:
        g.add_argument("--mode", choices=known_modes(), default="marginal", metavar="M",
                       help=f"guarantee mode: {accepted} (default marginal)")
    g.add_argument("--delta", type=fraction, default=NotGiven(DEFAULT_DELTA),
                   help="pac, topic-pac and budget modes: probability that the calibration "
                        f"draw is unlucky (default {DEFAULT_DELTA})")
    g.add_argument("--group-by", default=None, metavar="FIELD",
                   help="group mode: the meta field (JSONL key) to calibrate per, e.g. language")
    g.add_argument("--min-group-size", type=positive_int, default=None,
                   help="group mode: smaller groups fall back to the pooled threshold")
    if several:
        g.add_argument("--budget", type=positive_ints, default=[],
                       help="character budgets per query to report next to the guarantee, "
                            "e.g. 1000,1500")
        return
    g.add_argument("--budget", type=positive_int, default=None, metavar="N",
                   help="budget mode: context budget per query, in --budget-unit")
    g.add_argument("--budget-unit", choices=BUDGET_UNITS, default=None,
                   help="budget mode: unit of --budget (default chars)")
    g.add_argument("--gamma", type=positive_float, default=None,
                   help="adaptive mode: step size of the online update")
    g.add_argument("--window", type=count("window"), default=None,
                   help=f"adaptive mode: number of recent scores kept ({at_most('window')})")




def add_unit_option(p: argparse.ArgumentParser, *, budget_alias: bool = False,
                    what: str = "what the filter scores and keeps (default snippet)") -> None:
    """``--unit {snippet,sentence}``: the pruning unit (:data:`ragsieve.units.UNITS`).

    ``budget_alias`` (the commands with ``--budget-unit``): ``--unit chars|tokens`` still
    sets the budget's unit, as before ``--budget-unit`` existed (a one-line note on stderr
    says so; :func:`budget_unit`).
    """
    from ..units import UNITS

    choices = [*UNITS, *(BUDGET_UNITS if budget_alias else ())]
    p.add_argument("--unit", choices=choices, default=None,
                   help=f"{what}: snippet or sentence (each snippet's sentences, the guarantee "
                        "on evidence sentences)"
                        + ("; chars|tokens: the old spelling of --budget-unit" if budget_alias
                           else ""))



def add_fit_options(p: argparse.ArgumentParser, *, several: bool, unit: str) -> None:
    """What a command that calibrates takes (``evaluate``, ``choose-alpha``, ``answers``,
    ``calibrate``): the data, the scorer, the guarantee (``several``: a list of modes,
    see :func:`add_guarantee_options`) and ``--unit`` (``unit``: its help; with one mode
    the old ``--unit chars|tokens`` spelling of the budget's unit is accepted too)."""
    add_data_options(p)
    add_scorer_options(p)
    add_guarantee_options(p, several=several)
    add_unit_option(p, budget_alias=not several, what=unit)


def add_saved_scorer_options(p: argparse.ArgumentParser) -> None:
    """What rebuilds the scorer of a saved filter (``filter``, ``report``): the languages
    (checked against the artifact's), the cache, the LLM endpoint and the other scorers'
    ``runtime`` options (:func:`add_runtime_scorer_options`: the reranker's URL)."""
    add_embedding_options(p, model=False)
    add_cache_options(p)
    add_llm_options(p)
    add_runtime_scorer_options(p)


def add_runtime_scorer_options(p: argparse.ArgumentParser) -> None:
    """The flags of the options that do not change scores (``runtime``: an endpoint's URL,
    its key's environment variable, how the calls are made) that the registered scorers
    declare in their ``score`` group, for a command that rebuilds a saved scorer from its
    spec (``filter``, ``report``, ``serve``: ``--rerank-url``). The shared groups' flags
    (cache, LLM endpoint) and flags the parser already has are left to their owners."""
    from ..scoring import registered_scorers, scorer_options

    runtime = [alias for alias in registered_scorers()
               if any(o.runtime and o.flag and o.group == "score" for o in scorer_options(alias))]
    if not runtime:
        return
    g = p.add_argument_group("saved score's endpoint")
    have = {flag for action in p._actions for flag in action.option_strings}
    have |= shared_scorer_flags()
    for alias in runtime:
        for option in scorer_options(alias):
            if option.runtime and option.flag and option.group == "score" \
                    and option.flag not in have:
                g.add_argument(option.flag, **option.argparse_kwargs())
                have.add(option.flag)


# ------------------------------------------------------------------ single shared options
def add_seed_option(p: Options) -> None:
    """``--seed``: the seed of the command's random draws (splits, samples), default 0."""
    p.add_argument("--seed", type=nonnegative_int, default=0)


def add_alpha_option(p: Options, default: float | list[float], *,
                     help: str | None = None) -> None:
    """``--alpha``: one target miscoverage (``default`` a number) or, for the commands
    that sweep, comma-separated ones (``default`` a list)."""
    if isinstance(default, list):
        p.add_argument("--alpha", type=floats, default=default, help=help)
    else:
        p.add_argument("--alpha", type=finite_float, default=default, help=help)


def add_splits_option(p: Options, default: int, *, help: str | None = None) -> None:
    """``--splits``: topic-disjoint calibration/test splits (``help``: the command's own
    words, else ``topic-disjoint calibration/test splits (default N, at most M)``)."""
    p.add_argument("--splits", type=count("splits"), default=default,
                   help=help or f"topic-disjoint calibration/test splits (default {default}, "
                                f"{at_most('splits')})")


def add_calibration_fraction_option(p: Options) -> None:
    """``--calibration-fraction``: the share of topics each split calibrates on."""
    p.add_argument("--calibration-fraction", type=fraction, default=0.5)


def add_limit_queries_option(p: Options, *, help: str) -> None:
    """``--limit-queries N``: a seeded sample of N queries (``help``: what it bounds)."""
    p.add_argument("--limit-queries", type=count("limit_queries"), default=None, help=help)


def add_confidence_option(p: Options, *, help: str) -> None:
    """``--confidence``: the level of the bootstrap intervals, default 0.95."""
    p.add_argument("--confidence", type=fraction, default=0.95, help=help)


def add_filter_option(p: Options, *,
                      help: str = "filter artifact written by `calibrate`",
                      required: bool = True, metavar: str | None = None) -> None:
    """``--filter``: a saved filter artifact."""
    if required:
        p.add_argument("--filter", required=True, help=help, metavar=metavar)
    else:
        p.add_argument("--filter", default=None, help=help, metavar=metavar)


def add_sign_key_option(p: Options) -> None:
    """``--sign-key-env NAME``: sign the written artifact with the key in env var ``NAME``."""
    p.add_argument("--sign-key-env", default=None, metavar="NAME",
                   help="sign the artifact with the secret in this environment variable "
                        "(HMAC-SHA256 over its sealed blocks; at least 16 characters), so "
                        "`serve` / `filter --verify-key-env NAME` accept it")


def add_verify_key_option(p: Options) -> None:
    """``--verify-key-env NAME``: require an artifact signed with the key in env var ``NAME``."""
    p.add_argument("--verify-key-env", default=None, metavar="NAME",
                   help="require an artifact signed with the secret in this environment "
                        "variable (`calibrate --sign-key-env`); an unsigned or wrongly signed "
                        "one is refused")


def add_top_k_option(p: Options) -> None:
    """``-k``: the snippets to retrieve from an index, default 20."""
    p.add_argument("-k", type=count("top_k"), default=20,
                   help=f"snippets to retrieve (default 20, {at_most('top_k')})")
