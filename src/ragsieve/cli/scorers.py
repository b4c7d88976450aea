"""From the scorer options of a command to a scorer: :class:`ScorerRequest` and what is
built from it.

A command reads its scorer flags once into a :class:`ScorerRequest` (``--scorer``, the
flags every registered scorer declares, ``--data`` for an xquad dataset's languages); the
functions here take that value, never the parsed namespace: the scorer and the languages
it is built for (:func:`scorer_choice`, :func:`make_scorer`), the options that rebuild a
saved scorer (:func:`artifact_scorer_options`) and the checks of ``--language`` against a
saved filter (:func:`check_artifact_language`).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..artifact import Artifact
    from ..fitting import CalibrationInfo

logger = logging.getLogger(__name__)

__all__ = [
    "ScorerChoice",
    "ScorerRequest",
    "artifact_scorer_options",
    "check_artifact_language",
    "check_scorer_options",
    "embedding_cache_dir",
    "embedding_options",
    "language_choice",
    "language_of",
    "languages_choice",
    "make_scorer",
    "score_field_of",
    "scorer_choice",
    "scorer_kwargs",
    "warn_traffic_language",
]


@dataclass(frozen=True)
class ScorerRequest:
    """The scorer a command asks for, as given on its command line.

    Parameters
    ----------
    scorer : str, optional
        ``--scorer`` (None: the command has no such option, e.g. ``filter``).
    flags : mapping
        The values of the flags the registered scorers declare
        (:func:`ragsieve.scoring.scorer_options`) that the command has, by their
        ``dest`` (``--relative-kind`` -> ``relative_kind``); a flag the command lacks is
        absent.
    data : str, optional
        ``--data``: an xquad dataset fixes the languages.
    """

    scorer: str | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)
    data: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScorerRequest:
        """The request of a parsed command line (every scorer flag it has)."""
        from ..scoring import registered_scorers, scorer_options

        dests = {o.dest for alias in registered_scorers() for o in scorer_options(alias)
                 if o.dest is not None}
        return cls(scorer=getattr(args, "scorer", None),
                   flags={d: getattr(args, d) for d in sorted(dests) if hasattr(args, d)},
                   data=getattr(args, "data", None))

    @property
    def language(self) -> str | None:
        """``--language``."""
        return self.flags.get("language")

    @property
    def query_language(self) -> str | None:
        """``--query-language``."""
        return self.flags.get("query_language")

    @property
    def cache_dir(self) -> str | None:
        """``--cache-dir``."""
        return self.flags.get("cache_dir")

    @property
    def no_cache(self) -> bool:
        """``--no-cache``."""
        return bool(self.flags.get("no_cache", False))


# ------------------------------------------------------------------ languages
def languages_choice(request: ScorerRequest, pairs: Any = None) -> Any:
    """The languages of the data, the snippets' and the queries', and where they come from
    (a :class:`ragsieve.scoring.auto.LanguageChoice`): ``--language`` and
    ``--query-language`` (``"given"``); ``--language`` alone (both sides, unless the queries
    of ``pairs`` are confidently detected in another language: then queries in it over
    snippets in ``--language``, with a warning; :func:`ragsieve.scoring.auto.choose_languages`,
    the rule ``ConformalFilter.calibrate`` follows too); an xquad dataset's (``"dataset
    xquad-en2de"``), the languages detected in ``pairs``, or ``en`` (source ``"default"``:
    the snippets' language is not known).

    ``--query-language`` is taken as given in every case (equal to ``--language``, it keeps
    the queries in that language whatever is detected)."""
    from ..data.registry import xquad_languages
    from ..embeddings.languages import normalise_language
    from ..scoring.auto import LanguageChoice, choose_languages

    given, query = request.language, request.query_language
    query = None if query is None else normalise_language(str(query))
    if given:
        return choose_languages(list(pairs or []), str(given), query_language=query)
    name = str(request.data or "")
    key = name.strip().lower()
    fixed = xquad_languages(key.removeprefix("xquad-")) if key.startswith("xquad-") else None
    if fixed is not None:
        return LanguageChoice(fixed[1], query or fixed[0], f"dataset {name}")
    if pairs:
        return choose_languages(pairs, None, query_language=query)
    return LanguageChoice("en", query or "en", "default")


def language_choice(request: ScorerRequest, pairs: Any = None) -> tuple[str, str]:
    """The snippets' language and where it comes from (see :func:`languages_choice`)."""
    found = languages_choice(request, pairs)
    return found.code, found.source


def language_of(request: ScorerRequest, pairs: Any = None) -> str:
    """``--language``, the language of an xquad dataset's snippets, the language detected
    in ``pairs``, or ``en`` (see :func:`languages_choice`)."""
    return language_choice(request, pairs)[0]


# ------------------------------------------------------------------ scorer keyword arguments
def embedding_cache_dir(cache_dir: str | None) -> Path:
    """``--cache-dir``, or ``$RAGSIEVE_CACHE/embeddings`` (:func:`ragsieve._paths.embeddings_dir`:
    an embedding cache left directly in ``$RAGSIEVE_CACHE`` by an earlier version is read
    where it is)."""
    from .._paths import embeddings_dir

    return Path(cache_dir) if cache_dir else embeddings_dir()


def embedding_options(request: ScorerRequest, language: str | None = None) -> dict[str, Any]:
    """Keyword arguments of an embedding-based scorer: model, language (``language``, else
    :func:`language_of`), cache."""
    return scorer_kwargs(request, "embedding", language or language_of(request))


_MISSING = object()


def _flag_value(request: ScorerRequest, option: Any, language: str | None,
                query_language: str | None = None) -> Any:
    """The value the command line gives ``option`` (``_MISSING``: the command has no such
    flag). The shared flags resolve here: ``--language`` to the data's language,
    ``--query-language`` to the queries' (None: the data's), ``--cache-dir`` to the cache
    directory (None under ``--no-cache``), ``--no-X`` to not."""
    if option.flag == "--language":
        return language
    if option.flag == "--query-language":
        return None if query_language == language else query_language
    value = request.flags.get(option.dest, _MISSING)
    if value is _MISSING:
        return value
    if option.flag == "--cache-dir":
        return None if request.no_cache else embedding_cache_dir(request.cache_dir)
    return not value if option.negated else value


def scorer_kwargs(request: ScorerRequest, alias: str, language: str | None = None, *,
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
    values = {o.name: _flag_value(request, o, language, query_language) for o in options}
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


def check_scorer_options(request: ScorerRequest) -> None:
    """Reject scorer options that do not go together (before any data is read).

    Raises
    ------
    ValueError
        ``--score-field`` or ``--higher-is-better`` without ``--scorer field``, or
        ``--scorer field`` without ``--score-field``.
    """
    score_field = request.flags.get("score_field")
    if request.scorer == "field":
        if not score_field:
            raise ValueError("--scorer field needs --score-field NAME, the JSONL key that "
                             "holds each pair's score.")
        return
    if score_field is not None:
        raise ValueError(f"--score-field {score_field} applies to --scorer field only "
                         f"(got --scorer {request.scorer}); add --scorer field.")
    if request.flags.get("higher_is_better"):
        raise ValueError(f"--higher-is-better applies to --scorer field only "
                         f"(got --scorer {request.scorer}).")
    _check_own_flags(request)


def _check_own_flags(request: ScorerRequest) -> None:
    """Refuse a scorer's own flag given to a scorer that does not take it (it would be
    ignored: ``--preset reader`` with ``--scorer auto`` would not fit the reader preset).

    A flag counts as given when its value differs from its parser default; the shared
    flags (:func:`~ragsieve.cli.options.shared_scorer_flags`: model, cache, LLM endpoint)
    are every command's."""
    from ..scoring import registered_scorers, scorer_options
    from .options import shared_scorer_flags

    alias = str(request.scorer)
    if request.scorer is None or alias not in registered_scorers():
        return
    own = {o.flag for o in scorer_options(alias)}
    shared = shared_scorer_flags()
    takers: dict[str, list[str]] = {}
    parsed: dict[str, Any] = {}  # the first declaration's, as the parser adds each flag once
    for name in registered_scorers():
        for o in scorer_options(name):
            if o.flag is None or o.dest is None or o.flag in shared:
                continue
            takers.setdefault(o.flag, []).append(name)
            parsed.setdefault(o.flag, (o.dest, False if o.type is bool
                                       else None if o.required else o.default))
    for flag, (dest, default) in parsed.items():
        if flag in own or dest not in request.flags or request.flags[dest] == default:
            continue
        raise ValueError(
            f"{flag} {request.flags[dest]} applies to --scorer {' or '.join(takers[flag])} "
            f"(got --scorer {alias}, which would ignore it); drop {flag} or choose a scorer "
            "that takes it.")


# ------------------------------------------------------------------ the scorer
class ScorerChoice:
    """The scorer of a command, the languages and model it uses, and why (printed and in
    ``--json`` as ``"choice"``); ``alias`` is the ``--scorer`` it was built for."""

    def __init__(self, scorer: Any, language: str | None, language_source: str,
                 score: Any = None, *, query_language: str | None = None,
                 alias: str | None = None) -> None:
        self.scorer = scorer
        self.language = language  # the snippets'
        self.language_source = language_source
        self.query_language = query_language  # None: the snippets' (or not known yet)
        self.score = score  # a ScoreChoice when --scorer auto was resolved here
        self.alias = alias

    def record(self, info: CalibrationInfo) -> CalibrationInfo:
        """A calibrated filter's ``calibration_info`` with where the command line took the
        languages from (as it was when they were left to ``calibrate`` to detect)."""
        if self.language is None:
            return info
        query = self.query_language or self.language  # decided here: it wins over calibrate's
        return info.but(language_source=self.language_source,
                        query_language=None if query == info.language else query)

    def to_dict(self, info: Mapping[str, Any] | None = None,
                spec: dict[str, Any] | None = None) -> dict[str, Any]:
        """The choice as JSON values; ``info`` (a calibrated filter's ``calibration_info``)
        and ``spec`` (its scorer's) take precedence, as ``calibrate`` resolves ``auto``.
        ``language`` holds the snippets' ``code``, its ``source`` and the queries'
        ``query_code``."""
        info = info or {}
        spec = spec or self.scorer.spec()
        label = self.scorer.keep_rule(0.0).score or self.alias
        score = info.get("score_choice") or (self.score.to_dict() if self.score else {
            "scorer": self.alias, "label": f"{label} ({self.alias})",
            "reason": f"given by --scorer {self.alias}"})
        language: dict[str, Any]
        if self.language is not None:
            language = {"code": self.language, "source": self.language_source,
                        "query_code": self.query_language or self.language}
        else:
            language = {"code": info.get("language"), "source": info.get("language_source"),
                        "query_code": info.get("query_language") or info.get("language")}
        from ..artifact import spec_model

        if spec.get("scorer") == "sentence_context" and not str(
                score.get("label", "")).startswith("sentence in context"):
            # the sentence unit: the chosen score reads each sentence within its snippet
            score = {**score, "label": "sentence in context, each stage "
                     f"{score.get('label', score.get('scorer'))}"}
        return {"score": score, "model": spec_model(spec), "language": language}


def _auto_scorer(request: ScorerRequest, language: str | None, query: str | None) -> Any:
    """The ``auto`` score of the flags. When the command line settled both languages it is
    told both, the queries' even when it is the snippets' (``--query-language`` equal to
    ``--language``, or nothing detected against ``--language``), so calibrating it does not
    detect the queries' language again."""
    from ..scoring import AutoScorer

    kwargs = scorer_kwargs(request, "auto", language, query_language=query)
    if language is not None and query is not None:
        kwargs["query_language"] = query
    return AutoScorer(**kwargs)


def scorer_choice(request: ScorerRequest, pairs: Any = None, *,
                  resolve_auto: bool = True) -> ScorerChoice:
    """The scorer named by ``--scorer`` for ``pairs``, with the languages it was built for.

    ``auto`` is resolved on ``pairs`` (``ragsieve.scoring.auto.choose_score``) unless
    ``resolve_auto`` is False (``calibrate``: ``ConformalFilter.calibrate`` resolves it and
    detects the languages, and falls back to ``1 - cos`` when the fused score cannot be
    fitted); the language is then None unless ``--language`` or the dataset gives it.
    """
    check_scorer_options(request)
    alias = str(request.scorer)
    if (alias == "auto" and not resolve_auto) or not _takes_language(alias):
        # calibrate detects and records the languages; field and llm choose no model by them.
        # --language alone: the queries are checked here, so the line and record say so
        found = languages_choice(request, pairs if request.language else None)
        language = None if found.source == "default" else found.code
        query = found.query_code if language is not None or request.query_language else None
        if alias != "auto":
            scorer = make_scorer(request, language=language or "en", query_language=query)
        else:
            scorer = _auto_scorer(request, language, query)
        return ScorerChoice(scorer, language, found.source, query_language=query, alias=alias)
    found = languages_choice(request, pairs)
    language, query = found.code, found.query_code
    if alias != "auto":
        return ScorerChoice(make_scorer(request, language=language, query_language=query),
                            language, found.source, query_language=query, alias=alias)
    auto = _auto_scorer(request, language, query)
    if not pairs:
        return ScorerChoice(auto, language, found.source, query_language=query, alias=alias)
    scorer, score, _ = auto.resolve(pairs)
    return ScorerChoice(scorer, language, found.source, score, query_language=query,
                        alias=alias)


def make_scorer(request: ScorerRequest, pairs: Any = None, *,
                language: str | None = None, query_language: str | None = None) -> Any:
    """The scorer named by ``--scorer``, built by ``resolve_scorer`` from the flags of its
    declared options (:func:`scorer_kwargs`), for texts in ``language`` queried in
    ``query_language`` (both None: :func:`languages_choice`).

    ``best`` gives an unfitted fused scorer: ``evaluate`` fits it in every split and
    ``ConformalFilter.calibrate`` on a quarter of the calibration topics. ``auto`` is
    resolved on ``pairs`` (see :func:`scorer_choice`).
    """
    from ..scoring import resolve_scorer

    check_scorer_options(request)
    alias = str(request.scorer)
    if alias == "auto":
        return scorer_choice(request, pairs).scorer
    if language is None and _takes_language(alias):
        found = languages_choice(request, pairs)
        language, query_language = found.code, query_language or found.query_code
    return resolve_scorer(alias, **scorer_kwargs(request, alias, language,
                                                 query_language=query_language))


def score_field_of(request: ScorerRequest) -> str | None:
    """The JSONL key the pairs must hold a score in (``--scorer field``), else None."""
    return request.flags.get("score_field") if request.scorer == "field" else None


# ------------------------------------------------------------------ a saved scorer
def artifact_scorer_options(request: ScorerRequest, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Options that do not change scores, to rebuild a saved scorer from its ``spec``
    (``Artifact.scorer``): its declared ``runtime`` options (the embedding cache for
    embedding-based scorers, the endpoint and cache for the LLM), and those of the scorers
    nested in it (a fused score's signals: a reranker signal's ``--rerank-url``), which the
    fused score passes on to them. A nested scorer's option of a name the outer scorer
    declares too (the reranker's ``batch_size``) is left out: it would reach the outer one."""
    from ..scoring import registered_scorers, scorer_options
    from ..scoring.registry import nested_specs

    kind = spec.get("scorer")
    if kind not in registered_scorers():
        return {}
    options = scorer_kwargs(request, str(kind), runtime_only=True)
    declared = {o.name for o in scorer_options(str(kind))}
    for nested in nested_specs(spec):
        if nested["scorer"] not in registered_scorers():
            continue
        for name, value in scorer_kwargs(request, nested["scorer"], runtime_only=True).items():
            if name not in declared:
                options.setdefault(name, value)
    return options


def check_artifact_language(artifact: Artifact, path: str, *, language: str | None,
                            query_language: str | None) -> None:
    """``--language`` and ``--query-language`` of ``filter``/``serve`` against the
    artifact's (read from ``path``): the model and threshold were fixed by ``calibrate``,
    so a different language is an error. ``--language`` is checked against the snippets'
    language (``data.language``), ``--query-language`` against the queries'
    (``data.query_language``, else the snippets').

    Raises
    ------
    ValueError
        A language differs from the one the artifact records, or (an artifact without one)
        is not a language of its embedding model.
    """
    for flag, given, recorded in (
            ("--language", language, artifact.language),
            ("--query-language", query_language, artifact.query_language)):
        if given:
            _check_recorded_language(path, artifact, flag, str(given), recorded)


def _check_recorded_language(path: str, artifact: Artifact, flag: str,
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
            f"{flag} {given}: the filter {path} was calibrated on {side} "
            f"{recorded} ({uses}); {flag} does not change a "
            f"saved filter: drop it, or calibrate a filter on {code} data.")
    trained = MODEL_LANGUAGES.get(model or "")
    if trained is not None and code not in trained:
        raise ValueError(
            f"{flag} {given}: the filter {path} uses model {model}, not trained on "
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
