"""Option groups shared by the subcommands, and the helpers that turn options into objects.

Every option is declared once, in one group function (``add_data_options``,
``add_scorer_options``, ``add_cache_options``, ``add_llm_options``,
``add_guarantee_options``); a subcommand calls the groups it needs. No parser accepts
prefix abbreviations (:func:`subparser` sets ``allow_abbrev=False``), so ``--mode`` can
never be read as ``--model``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..data.splits import MAX_SPLITS  # the library's own bound on splits

if TYPE_CHECKING:
    from ..artifact import Artifact

logger = logging.getLogger(__name__)

__all__ = [
    "BUDGET_UNITS",
    "LIMITS",
    "OneLineParser",
    "add_cache_options",
    "add_data_options",
    "add_embedding_options",
    "add_engine_options",
    "add_guarantee_options",
    "add_json_option",
    "add_llm_options",
    "add_scorer_options",
    "add_unit_option",
    "artifact_scorer_options",
    "at_most",
    "bounded_int",
    "bounded_ints",
    "budget_unit",
    "calibrator_params",
    "check_artifact_language",
    "check_mode_list_params",
    "check_scorer_options",
    "choice_lines",
    "count",
    "dumps",
    "embedding_cache_dir",
    "embedding_options",
    "engine_inputs",
    "eprint",
    "finite_float",
    "floats",
    "fraction",
    "ints",
    "language_choice",
    "language_of",
    "languages_choice",
    "llm_options",
    "load_pairs",
    "make_engine",
    "make_scorer",
    "modes",
    "nonnegative_float",
    "nonnegative_int",
    "one_line",
    "port",
    "positive_float",
    "positive_int",
    "positive_ints",
    "pruning_unit",
    "score_field_of",
    "scorer_choice",
    "subparser",
    "warn_traffic_language",
]

# ------------------------------------------------------------------ argparse types
# Each raises ``argparse.ArgumentTypeError`` with what it expected and what it got, so a bad
# value is a usage error (exit 2) naming the option, before any work is done.
def _float(text: str, expected: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _int(text: str, expected: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def finite_float(text: str) -> float:
    """A finite number (``nan`` and ``inf`` refused); ranges are checked by the library."""
    value = _float(text, "a finite number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _float(text, "a finite number > 0")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _float(text, "a finite number >= 0")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in the open interval (0, 1) (``nan`` fails the comparison)."""
    value = _float(text, "a number in (0, 1)")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, sizes, limits)."""
    value = _int(text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


LIMITS: dict[str, int] = {
    "splits": MAX_SPLITS,
    "top_k": 10_000,            # snippets per query kept by a top-k baseline / retrieved
    "limit_queries": 10_000_000,
    "bootstrap_resamples": 100_000,
    "max_tokens": 32_768,       # length cap of a generated answer
    "n_ctx": 131_072,           # KV cache of the local model, in tokens
    "parallel": 64,             # decoding slots of the local model
    "threads": 256,             # CPU threads
    "concurrency": 256,         # LLM requests in flight
    "workers": 1_024,           # Ray actors
    "shard_bytes": 2**30,       # a shard is read into memory whole
    "batch_size": 4_096,        # snippets embedded at once
    "n_pairs": 100_000,
    "window": 10_000_000,       # recent scores kept by the adaptive mode
}
"""Upper bounds of the count options, far above any real use: a mistyped count is a usage
error (``--splits 1000000000: must be <= 10000``) instead of a run that allocates until
the kernel kills it."""


def bounded_int(high: int, *, low: int = 1) -> Any:
    """An ``argparse`` type: an integer in ``[low, high]``.

    Examples
    --------
    >>> bounded_int(10)("7")
    7
    >>> bounded_int(10)("11")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 11: must be <= 10
    """
    def parse(text: str) -> int:
        value = _int(text, f"an integer >= {low}")
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"{value}: must be <= {high}")
        return value

    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def bounded_ints(high: int) -> Any:
    """An ``argparse`` type: comma-separated integers in ``[1, high]``, at least one."""
    def parse(text: str) -> list[int]:
        values = positive_ints(text)
        over = [v for v in values if v > high]
        if over:
            raise argparse.ArgumentTypeError(f"{over[0]}: must be <= {high}")
        return values

    parse.__name__ = f"integers in [1, {high}]"
    return parse


def count(name: str) -> Any:
    """The ``argparse`` type of the count option ``name`` (a key of :data:`LIMITS`)."""
    return bounded_int(LIMITS[name])


def at_most(name: str) -> str:
    """Help text naming the bound of a count option: ``"at most 10000"``."""
    return f"at most {LIMITS[name]}"


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port number (0 lets the system choose)."""
    value = _int(text, "a port number in [0, 65535]")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {text!r}")
    return value


def floats(text: str) -> list[float]:
    """Parse ``"0.1,0.2"`` into finite floats, at least one (an ``argparse`` type)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}") from exc
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(
            f"expected finite numbers, comma-separated, got {text!r}")
    return values


def ints(text: str) -> list[int]:
    """Parse ``"1,2,3"`` into integers (an ``argparse`` type)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from exc


def positive_ints(text: str) -> list[int]:
    """Parse ``"1,2,3"`` into integers >= 1, at least one (an ``argparse`` type)."""
    values = ints(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected integers >= 1, comma-separated, got {text!r}")
    return values


def _known_modes() -> tuple[str, ...]:
    from ..calibration import MODES

    return tuple(MODES)


def modes(text: str) -> list[str]:
    """Parse comma-separated guarantee modes, each one of ``ragsieve.calibration.MODES``."""
    accepted = _known_modes()
    found = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in found if m not in accepted]
    if bad or not found:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {bad}; accepted: {', '.join(accepted)}")
    return found


# ------------------------------------------------------------------ output helpers
def _finite(obj: Any) -> Any:
    """Replace inf/nan floats by None so the output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return _finite(obj.item())
    if hasattr(obj, "tolist"):  # numpy arrays
        return _finite(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON (inf/nan become null, numpy values plain numbers)."""
    return json.dumps(_finite(obj), default=_json_default, ensure_ascii=False, **kw)


def eprint(*parts: Any) -> None:
    """Print to stderr (progress and notes; results go to stdout)."""
    print(*parts, file=sys.stderr)


def one_line(text: Any) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


# ------------------------------------------------------------------ parser helpers
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
    g = p.add_argument_group("data")
    g.add_argument("--data", required=required,
                   help="generic JSONL file, or a dataset name: xquad-en, xquad-de, xquad-es, "
                        "xquad-zh, xquad-el, xquad-ro (any XQuAD language), xquad-en2de, "
                        "xquad-en2es, xquad-en2zh, xquad-en2el, xquad-en2ro (English questions "
                        "over that language's articles; xquad-Q2L for any two), selqa-dev")
    g.add_argument("--data-dir", default=None,
                   help="dataset directory (env RAGSIEVE_DATA; default ../shared/datasets)")


def add_cache_options(p: argparse.ArgumentParser, *, embeddings: bool = True) -> None:
    """``--cache-dir`` (embedding cache, when ``embeddings``) and ``--no-cache``."""
    g = p.add_argument_group("cache")
    if embeddings:
        g.add_argument("--cache-dir", default=os.environ.get("RAGSIEVE_CACHE"),
                       help="embedding cache directory (env RAGSIEVE_CACHE; default "
                            "~/.cache/ragsieve/embeddings)")
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


def make_engine(args: argparse.Namespace) -> Any:
    """The engine of ``--engine`` (a Ray engine starts or joins Ray when first used)."""
    from ..engines import make_engine as build

    if args.engine == "local":
        if args.ray_address or args.workers:
            raise ValueError("--ray-address and --workers apply to --engine ray only.")
        return build("local")
    return build("ray", address=args.ray_address, workers=args.workers)


def engine_inputs(args: argparse.Namespace, *, limit_queries: int | None = None,
                  seed: int = 0) -> list[Path]:
    """``--data`` as files an engine can shard: a file or directory as it is; a dataset
    name (or a ``--limit-queries`` sample) written once as JSONL under the cache directory
    and reused, so that a rerun resumes on the same input."""
    import hashlib

    from .._paths import cache_dir
    from ..data import group_by_query, sample_queries, write_pairs

    path = Path(args.data)
    if limit_queries is None and (path.is_dir() or path.is_file()):
        return [path]
    key = json.dumps([str(path.resolve()) if path.exists() else str(args.data),
                      args.data_dir, limit_queries, seed])
    if path.exists():
        st = path.stat()
        key += f"{st.st_size}:{st.st_mtime_ns}"
    target = cache_dir() / "inputs" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.jsonl"
    if not target.is_file():
        pairs = load_pairs(args)
        if limit_queries:
            pairs = sample_queries(pairs, limit_queries, seed=seed)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_pairs([pairs[i] for idx in group_by_query(pairs).values() for i in idx], target)
        logger.info("wrote the input of %s to %s", args.data, target)
    return [target]


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
                        "data), llm, or field (an outside score read from --score-field) "
                        f"(default {default})")
    # every registered scorer's own flags; the shared ones (model, cache, LLM endpoint)
    # come from their groups below, once
    from ..scoring import registered_scorers

    shared = argparse.ArgumentParser(add_help=False)
    add_embedding_options(shared)
    add_cache_options(shared)
    add_llm_options(shared)
    skip = {flag for action in shared._actions for flag in action.option_strings}
    _add_declared_flags(p, {"score": g}, registered_scorers(), skip)
    add_embedding_options(p)
    add_cache_options(p)
    llm = add_llm_options(p)
    _add_declared_flags(p, {"llm": llm}, registered_scorers(), skip)


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
    accepted = ", ".join(_known_modes())
    g = p.add_argument_group("guarantee")
    if several:
        g.add_argument("--mode", type=modes, default=["marginal"], metavar="M[,M...]",
                       help=f"guarantee modes, comma-separated: {accepted} (default marginal)")
    else:
        g.add_argument("--mode", choices=_known_modes(), default="marginal", metavar="M",
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


#: The length units of the budget mode (``--budget-unit``).
BUDGET_UNITS = ("chars", "tokens")


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


def pruning_unit(args: argparse.Namespace) -> str | None:
    """``--unit`` when it names a pruning unit (``snippet``, ``sentence``), else None."""
    unit = getattr(args, "unit", None)
    return None if unit in BUDGET_UNITS else unit


def budget_unit(args: argparse.Namespace) -> str | None:
    """``--budget-unit``, or the old ``--unit chars|tokens`` (a note on stderr, once).

    Raises
    ------
    ValueError
        Both given, and they differ.
    """
    given = getattr(args, "budget_unit", None)
    old = getattr(args, "unit", None)
    if old not in BUDGET_UNITS:
        return given
    if given is not None and given != old:
        raise ValueError(f"--unit {old} and --budget-unit {given} disagree; give --budget-unit "
                         "alone (--unit names the pruning unit: snippet or sentence).")
    if not getattr(args, "_budget_unit_noted", False):
        eprint(f"note: --unit {old} is the budget's unit: spell it --budget-unit {old} "
               "(--unit is now the pruning unit, snippet or sentence)")
        args._budget_unit_noted = True
    return str(old)


# ------------------------------------------------------------------ options -> objects
def languages_choice(args: argparse.Namespace, pairs: Any = None) -> Any:
    """The languages of the data, the snippets' and the queries', and where they come from
    (a :class:`ragsieve.scoring.auto.LanguageChoice`): ``--language`` (both sides) and
    ``--query-language`` (``"given"``), an xquad dataset's (``"dataset xquad-en2de"``), the
    languages detected in ``pairs`` (:func:`ragsieve.scoring.auto.choose_languages`), or
    ``en`` (source ``"default"``: the snippets' language is not known).

    ``--query-language`` is taken as given in every case."""
    from ..data.registry import xquad_languages
    from ..embeddings.languages import normalise_language
    from ..scoring.auto import LanguageChoice, choose_languages

    given, query = getattr(args, "language", None), getattr(args, "query_language", None)
    query = None if query is None else normalise_language(str(query))
    if given:
        return choose_languages([], str(given), query_language=query)
    name = str(getattr(args, "data", "") or "")
    key = name.strip().lower()
    fixed = xquad_languages(key.removeprefix("xquad-")) if key.startswith("xquad-") else None
    if fixed is not None:
        return LanguageChoice(fixed[1], query or fixed[0], f"dataset {name}")
    if pairs:
        return choose_languages(pairs, None, query_language=query)
    return LanguageChoice("en", query or "en", "default")


def language_choice(args: argparse.Namespace, pairs: Any = None) -> tuple[str, str]:
    """The snippets' language and where it comes from (see :func:`languages_choice`)."""
    found = languages_choice(args, pairs)
    return found.code, found.source


def language_of(args: argparse.Namespace, pairs: Any = None) -> str:
    """``--language``, the language of an xquad dataset's snippets, the language detected
    in ``pairs``, or ``en`` (see :func:`languages_choice`)."""
    return language_choice(args, pairs)[0]


def embedding_cache_dir(args: argparse.Namespace) -> Path:
    """``--cache-dir``, or ``<ragsieve cache>/embeddings``."""
    from .._paths import cache_dir

    return Path(args.cache_dir) if args.cache_dir else cache_dir() / "embeddings"


def embedding_options(args: argparse.Namespace, language: str | None = None) -> dict[str, Any]:
    """Keyword arguments of an embedding-based scorer: model, language (``language``, else
    :func:`language_of`), cache."""
    return scorer_kwargs(args, "embedding", language or language_of(args))


_MISSING = object()


def _flag_value(args: argparse.Namespace, option: Any, language: str | None,
                query_language: str | None = None) -> Any:
    """The value the command line gives ``option`` (``_MISSING``: the command has no such
    flag). The shared flags resolve here: ``--language`` to the data's language,
    ``--query-language`` to the queries' (None: the data's), ``--cache-dir`` to the cache
    directory (None under ``--no-cache``), ``--no-X`` to not."""
    if option.flag == "--language":
        return language
    if option.flag == "--query-language":
        return None if query_language == language else query_language
    value = getattr(args, option.dest, _MISSING)
    if value is _MISSING:
        return value
    if option.flag == "--cache-dir":
        return None if args.no_cache else embedding_cache_dir(args)
    return not value if option.negated else value


def scorer_kwargs(args: argparse.Namespace, alias: str, language: str | None = None, *,
                  query_language: str | None = None, runtime_only: bool = False,
                  ) -> dict[str, Any]:
    """Keyword arguments of scorer ``alias`` from its declared options' flags (a value only
    where it differs from the option's default); with ``runtime_only``, only the options
    that do not change scores, and none unless the command has every one of their flags.

    Queries in another language than the snippets (``query_language``) get, for a scorer
    that takes a model and no queries' language and when ``--model`` is not given, the
    bundled model trained on both (:func:`ragsieve.embeddings.choose_model`)."""
    from ..scoring import scorer_options

    options = [o for o in scorer_options(alias) if o.flag and (o.runtime or not runtime_only)]
    values = {o.name: _flag_value(args, o, language, query_language) for o in options}
    if runtime_only and any(v is _MISSING for v in values.values()):
        return {}  # e.g. the LLM endpoint on a command that does not take it
    flags = {o.flag for o in options}
    if (query_language and language and query_language != language and values.get("model") is None
            and "--model" in flags and "--query-language" not in flags):
        from ..embeddings.languages import choose_model

        values["model"] = choose_model(language, query_language)
    return {o.name: values[o.name] for o in options
            if values[o.name] is not _MISSING and values[o.name] != o.default}


def _takes_language(alias: str) -> bool:
    from ..scoring import scorer_options

    return any(o.flag == "--language" for o in scorer_options(alias))


def llm_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``ragsieve.llm.connect`` from the LLM options."""
    return {
        "base_url": args.base_url, "model": args.llm_model, "style": args.llm_style,
        "threads": args.llm_threads, "concurrency": args.llm_concurrency,
        "api_key_env": args.api_key_env,
    }


def check_scorer_options(args: argparse.Namespace) -> None:
    """Reject scorer options that do not go together (before any data is read).

    Raises
    ------
    ValueError
        ``--score-field`` or ``--higher-is-better`` without ``--scorer field``, or
        ``--scorer field`` without ``--score-field``.
    """
    if args.scorer == "field":
        if not args.score_field:
            raise ValueError("--scorer field needs --score-field NAME, the JSONL key that "
                             "holds each pair's score.")
        return
    if args.score_field is not None:
        raise ValueError(f"--score-field {args.score_field} applies to --scorer field only "
                         f"(got --scorer {args.scorer}); add --scorer field.")
    if args.higher_is_better:
        raise ValueError(f"--higher-is-better applies to --scorer field only "
                         f"(got --scorer {args.scorer}).")


class ScorerChoice:
    """The scorer of a command, the languages and model it uses, and why (printed and in
    ``--json`` as ``"choice"``)."""

    def __init__(self, scorer: Any, language: str | None, language_source: str,
                 score: Any = None, *, query_language: str | None = None) -> None:
        self.scorer = scorer
        self.language = language  # the snippets'
        self.language_source = language_source
        self.query_language = query_language  # None: the snippets' (or not known yet)
        self.score = score  # a ScoreChoice when --scorer auto was resolved here

    def record(self, info: dict[str, Any]) -> None:
        """Write where the command line took the languages from into a calibrated filter's
        ``calibration_info`` (nothing when they were left to ``calibrate`` to detect)."""
        if self.language is None:
            return
        info["language_source"] = self.language_source
        if self.query_language and self.query_language != info.get("language"):
            info["query_language"] = self.query_language

    def to_dict(self, args: argparse.Namespace, info: dict[str, Any] | None = None,
                spec: dict[str, Any] | None = None) -> dict[str, Any]:
        """The choice as JSON values; ``info`` (a calibrated filter's ``calibration_info``)
        and ``spec`` (its scorer's) take precedence, as ``calibrate`` resolves ``auto``.
        ``language`` holds the snippets' ``code``, its ``source`` and the queries'
        ``query_code``."""
        info = info or {}
        spec = spec or self.scorer.spec()
        label = self.scorer.keep_rule(0.0).score or args.scorer
        score = info.get("score_choice") or (self.score.to_dict() if self.score else {
            "scorer": args.scorer, "label": f"{label} ({args.scorer})",
            "reason": f"given by --scorer {args.scorer}"})
        language: dict[str, Any]
        if self.language is not None:
            language = {"code": self.language, "source": self.language_source,
                        "query_code": self.query_language or self.language}
        else:
            language = {"code": info.get("language"), "source": info.get("language_source"),
                        "query_code": info.get("query_language") or info.get("language")}
        from ..artifact import spec_model

        return {"score": score, "model": spec_model(spec), "language": language}


def choice_lines(choice: dict[str, Any]) -> list[str]:
    """``score: fused (best) - whole lists ...`` and ``model: ... - language ru (...)``, or
    ``model: ... - queries en, snippets de (...)`` for queries in another language."""
    score = choice["score"]
    lines = [f"score: {score.get('label', score['scorer'])} - {score['reason']}"]
    lang = choice["language"]
    code, query = lang["code"], lang.get("query_code") or lang["code"]
    said = f"queries {query}, snippets {code}" if query != code else f"language {code}"
    where = (f"{said} ({lang['source']})" if code else
             f"language {lang['source'] or 'not detected'}")
    lines.append(f"model: {choice['model']} - {where}" if choice["model"] else where)
    return lines


def scorer_choice(args: argparse.Namespace, pairs: Any = None, *,
                  resolve_auto: bool = True) -> ScorerChoice:
    """The scorer named by ``--scorer`` for ``pairs``, with the languages it was built for.

    ``auto`` is resolved on ``pairs`` (``ragsieve.scoring.auto.choose_score``) unless
    ``resolve_auto`` is False (``calibrate``: ``ConformalFilter.calibrate`` resolves it and
    detects the languages, and falls back to ``1 - cos`` when the fused score cannot be
    fitted); the language is then None unless ``--language`` or the dataset gives it.
    """
    from ..scoring import AutoScorer

    if (args.scorer == "auto" and not resolve_auto) or not _takes_language(args.scorer):
        # calibrate detects and records the languages; field and llm choose no model by them
        found = languages_choice(args)
        language = None if found.source == "default" else found.code
        query = (found.query_code if language is not None or getattr(args, "query_language", None)
                 else None)
        if args.scorer != "auto":
            scorer = make_scorer(args, language=language or "en", query_language=query)
        else:
            scorer = AutoScorer(**scorer_kwargs(args, "auto", language, query_language=query))
        return ScorerChoice(scorer, language, found.source, query_language=query)
    found = languages_choice(args, pairs)
    language, query = found.code, found.query_code
    if args.scorer != "auto":
        return ScorerChoice(make_scorer(args, language=language, query_language=query),
                            language, found.source, query_language=query)
    auto = AutoScorer(**scorer_kwargs(args, "auto", language, query_language=query))
    if not pairs:
        return ScorerChoice(auto, language, found.source, query_language=query)
    scorer, score, _ = auto.resolve(pairs)
    return ScorerChoice(scorer, language, found.source, score, query_language=query)


def make_scorer(args: argparse.Namespace, pairs: Any = None, *,
                language: str | None = None, query_language: str | None = None) -> Any:
    """The scorer named by ``--scorer``, built by ``resolve_scorer`` from the flags of its
    declared options (:func:`scorer_kwargs`), for texts in ``language`` queried in
    ``query_language`` (both None: :func:`languages_choice`).

    ``best`` gives an unfitted fused scorer: ``evaluate`` fits it in every split and
    ``ConformalFilter.calibrate`` on a quarter of the calibration topics. ``auto`` is
    resolved on ``pairs`` (see :func:`scorer_choice`).
    """
    from ..scoring import resolve_scorer

    check_scorer_options(args)
    if args.scorer == "auto":
        return scorer_choice(args, pairs).scorer
    if language is None and _takes_language(args.scorer):
        found = languages_choice(args, pairs)
        language, query_language = found.code, query_language or found.query_code
    return resolve_scorer(args.scorer, **scorer_kwargs(args, args.scorer, language,
                                                       query_language=query_language))


def score_field_of(args: argparse.Namespace) -> str | None:
    """The JSONL key the pairs must hold a score in (``--scorer field``), else None."""
    return args.score_field if getattr(args, "scorer", None) == "field" else None


def artifact_scorer_options(args: argparse.Namespace, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Options that do not change scores, to rebuild a saved scorer from its ``spec``
    (``Artifact.scorer``): its declared ``runtime`` options (the embedding cache for
    embedding-based scorers, the endpoint and cache for the LLM)."""
    from ..scoring import registered_scorers

    kind = spec.get("scorer")
    if kind not in registered_scorers():
        return {}
    return scorer_kwargs(args, str(kind), runtime_only=True)


def check_artifact_language(args: argparse.Namespace, artifact: Artifact) -> None:
    """``--language`` and ``--query-language`` of ``filter``/``serve`` against the
    artifact's: the model and threshold were fixed by ``calibrate``, so a different language
    is an error. ``--language`` is checked against the snippets' language
    (``data.language``), ``--query-language`` against the queries' (``data.query_language``,
    else the snippets').

    Raises
    ------
    ValueError
        A language differs from the one the artifact records, or (an artifact without one)
        is not a language of its embedding model.
    """
    for flag, given, recorded in (
            ("--language", getattr(args, "language", None), artifact.language),
            ("--query-language", getattr(args, "query_language", None),
             artifact.query_language)):
        if given:
            _check_recorded_language(args, artifact, flag, str(given), recorded)


def _check_recorded_language(args: argparse.Namespace, artifact: Artifact, flag: str,
                             given: str, recorded: str | None) -> None:
    from ..embeddings.languages import MODEL_LANGUAGES, normalise_language

    code = normalise_language(given)
    model = artifact.model
    side = "queries" if flag == "--query-language" else "language"
    if recorded is not None:
        if code == normalise_language(recorded):
            return
        uses = f"model {model}" if model else f"score {artifact.scorer.get('scorer')}"
        raise ValueError(
            f"{flag} {given}: the filter {args.filter} was calibrated on {side} "
            f"{recorded} ({uses}); {flag} does not change a "
            f"saved filter: drop it, or calibrate a filter on {code} data.")
    trained = MODEL_LANGUAGES.get(model or "")
    if trained is not None and code not in trained:
        raise ValueError(
            f"{flag} {given}: the filter {args.filter} uses model {model}, not trained on "
            f"{code}; {flag} does not change a saved filter: calibrate one on {code} data.")


def warn_traffic_language(artifact: Artifact, pairs: Any) -> str | None:
    """Log (once, as a warning) and return a note when the queries of ``pairs`` are in
    another language than the artifact's queries were (``data.query_language``, else
    ``data.language``); None when they agree or nothing is known."""
    expected = artifact.query_language
    if expected is None or not pairs:
        return None
    from ..embeddings.detection import traffic_language_note

    note = traffic_language_note(expected, list(dict.fromkeys(p.query for p in pairs)),
                                 model=artifact.model)
    if note:
        logger.warning("%s", note)
    return note


#: ``--delta`` when not given (for ``calibrate``: the modes that take a delta).
DEFAULT_DELTA = 0.1


class NotGiven(float):
    """A number option's default, marked as not given on the command line: it reads as
    the number everywhere, and :func:`calibrator_params` passes only given options."""

    __slots__ = ()

#: ``calibrate``'s options that are calibrator parameters (``unit``: the budget's, given as
#: ``--budget-unit``).
CALIBRATOR_OPTIONS = ("alpha", "delta", "min_group_size", "budget", "unit", "gamma", "window")


def _calibrator_option(args: argparse.Namespace, name: str) -> Any:
    """The command line's value of a calibrator parameter (None: not given)."""
    return budget_unit(args) if name == "unit" else getattr(args, name, None)


def calibrator_params(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``make_calibrator`` from ``calibrate``'s options.

    Only options the user gave count (None: not given, the calibrator keeps its own
    default; ``--delta`` is :data:`DEFAULT_DELTA` for the modes that take one, ``--alpha``
    has its own default); a given option the mode does not take is an error.

    Raises
    ------
    ValueError
        ``--mode budget`` without ``--budget``, ``--mode group`` without ``--group-by``,
        or an option the mode does not take (``--mode marginal --delta 0.05``).
    """
    from ..calibration.modes import mode_params

    if args.mode == "budget" and args.budget is None:
        raise ValueError("--mode budget needs --budget N, the context budget per query "
                         "(in --budget-unit, default chars).")
    if args.mode == "group" and not args.group_by:
        raise ValueError("--mode group needs --group-by FIELD, the meta field (JSONL key) to "
                         "calibrate per, e.g. --group-by language.")
    values = {k: _calibrator_option(args, k) for k in CALIBRATOR_OPTIONS}
    given = {k: v for k, v in values.items() if v is not None and not isinstance(v, NotGiven)}
    taken = [k for k in CALIBRATOR_OPTIONS if k in mode_params(args.mode)]
    refused = [k for k in given if k not in taken]
    if refused:
        raise ValueError(f"--mode {args.mode} does not take {', '.join(map(_flag, refused))}; "
                         f"it takes: {', '.join(map(_flag, taken))}.")
    if "delta" in taken and "delta" not in given:
        given["delta"] = DEFAULT_DELTA
    return given


def check_mode_list_params(args: argparse.Namespace) -> None:
    """``evaluate``/``choose-alpha``'s calibrator options against the listed modes: an
    option given on the command line that none of them takes is an error (never ignored).

    Raises
    ------
    ValueError
        E.g. ``--mode marginal,topic --delta 0.05`` (no listed mode takes delta).
    """
    from ..calibration.modes import mode_params

    modes = list(args.mode) if isinstance(args.mode, (list, tuple)) else [args.mode]
    if getattr(args, "budget", None):
        modes.append("budget")  # --budget N adds the budget rows
    taken = {k for m in modes for k in mode_params(m)}
    for name in ("delta", "min_group_size", "unit", "gamma", "window"):
        value = _calibrator_option(args, name)
        if value is not None and not isinstance(value, NotGiven) and name not in taken:
            raise ValueError(f"{_flag(name)} applies to none of the modes {', '.join(modes)}: "
                             f"add a mode that takes it, or drop {_flag(name)}.")


def _flag(name: str) -> str:
    return "--budget-unit" if name == "unit" else "--" + name.replace("_", "-")


def load_pairs(args: argparse.Namespace, *, require_labels: bool = False,
               score_field: str | None = None) -> list[Any]:
    """Load ``--data`` (a JSONL file or a dataset name).

    Parameters
    ----------
    args : argparse.Namespace
        With ``data`` and ``data_dir``.
    require_labels : bool
        Every pair of a JSONL file must carry a 0/1 label.
    score_field : str, optional
        Every pair must hold a finite number under this key (``DataError`` naming
        file:line otherwise).
    """
    from ..data import load_dataset

    kw: dict[str, Any] = {}
    if str(args.data).endswith((".jsonl", ".parquet")) or Path(args.data).exists():
        if require_labels:
            kw["require_labels"] = True
    elif args.data_dir:
        kw["data_dir"] = args.data_dir
    if score_field is not None:
        kw["score_field"] = score_field
    t0 = time.perf_counter()
    pairs = load_dataset(args.data, **kw)
    logger.info("loaded %d pairs from %s in %.1fs", len(pairs), args.data,
                time.perf_counter() - t0)
    return pairs
