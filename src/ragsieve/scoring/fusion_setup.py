"""What a fused score is made of, read from a preset or from a saved spec.

:class:`FusionSetup` is the record :class:`~ragsieve.scoring.fusion.FusedScorer` takes: its
base, its signals, its preset's row (:mod:`ragsieve.scoring.presets`, with the learner and
list features it fits) and its fitted learner. :func:`read_fused_setup` builds one from the
keywords of a spec (those a saved artifact records, or a preset's name and the options of
the ``"best"`` alias), in the order a reader of the spec checks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .._validation import check_str
from .base import Scorer
from .corpus_bm25 import inline_statistics, one_statistics
from .embedding import EmbeddingScorer
from .learners import FittedFusion, check_learner, read_fitted
from .presets import READER_PRESETS, Preset, get_preset
from .registry import resolve_scorer, scorer_options
from .sentence_cosine import SentenceCosineScorer
from .signals import preset_signals, signal_label

__all__ = ["FEATURES", "OWN_FEATURES", "FusionSetup", "feature_names_of", "read_fused_setup"]

#: The features of one signal (its score and its four list-relative transforms); the
#: feature names of a fused score of its base alone.
FEATURES = ("score", "gap", "z", "log_rank", "ratio")
#: The feature of one signal without list features (``list_features=False``): its score.
OWN_FEATURES = ("score",)


@dataclass(frozen=True)
class FusionSetup:
    """What a fused score is made of: the record :class:`FusedScorer` takes.

    Attributes
    ----------
    base : Scorer
        The base score (fitted): the first signal.
    signals : tuple of Scorer
        The signals besides the base (a text-fitted one may be unfitted).
    preset : Preset
        Its preset's row (:mod:`ragsieve.scoring.presets`; ``base``: the base alone or
        signals given without a preset), with the learner and list features this score
        fits (``dataclasses.replace`` of the row when they differ from the row's).
    fitted : FusionWeights, BoostedTrees or None
        The fitted learner (None: not fitted yet).
    """

    base: Scorer
    signals: tuple[Scorer, ...]
    preset: Preset = field(default_factory=lambda: get_preset("base"))
    fitted: FittedFusion | None = None


def _base_options(base: Any, signals: Sequence[Any] | None,
                  options: Mapping[str, Any]) -> dict[str, Any]:
    """The options the base takes: all but those that the base does not declare and a
    signal built from a spec declares as ``runtime`` (a reranker's ``url``), which go to
    the signals alone (:func:`_signal`)."""
    if isinstance(base, Scorer):
        declared = {o.name for o in base.declared_options}
    else:
        alias = base.get("scorer") if isinstance(base, Mapping) else base
        declared = ({o.name for o in scorer_options(alias)} if isinstance(alias, str) else set())
    specs = [s for s in (signals or ()) if isinstance(s, Mapping) and isinstance(s.get("scorer"), str)]
    theirs = {o.name for s in specs for o in scorer_options(s["scorer"]) if o.runtime}
    return {k: v for k, v in options.items() if k in declared or k not in theirs}


def _signal(signal: Any, base_options: Mapping[str, Any], base: Scorer) -> Scorer:
    """A signal from a scorer or a spec; a spec gets the ``runtime`` options it declares. The
    best-sentence cosine of the base's own model shares the base's loaded model and cache
    (as the presets build it), so a saved filter loads that model once."""
    if isinstance(signal, Scorer):
        return signal
    if not isinstance(signal, Mapping) or not isinstance(signal.get("scorer"), str):
        raise TypeError(f"a signal is {signal!r}; expected a Scorer or a spec mapping with a "
                        "'scorer' key.")
    if signal["scorer"] == SentenceCosineScorer.name and isinstance(base, EmbeddingScorer):
        shared = SentenceCosineScorer.sharing(base)
        if shared.spec() == dict(signal):
            return shared
    runtime = {o.name for o in scorer_options(signal["scorer"]) if o.runtime}
    return resolve_scorer(signal, **{k: v for k, v in base_options.items() if k in runtime})


def read_fused_setup(base: Any, spec: Mapping[str, Any]) -> FusionSetup:
    """The parts of the fused score that ``base`` and the keywords of a spec give (see
    :class:`~ragsieve.scoring.fusion.FusedScorer`'s parameters), in the order a reader of the spec checks them.

    Raises
    ------
    TypeError
        ``query_language`` not a string, ``signals`` not a list, ``list_features`` not a
        bool, a signal neither a scorer nor a spec.
    ValueError
        An unknown preset or learner, ``reader_base`` without a reader preset or with
        ``signals``, ``rerank`` with ``signals``, ``features`` other than those computed,
        fitted parameters of the wrong shape or of the other learner.
    """
    options = dict(spec)
    fitted: dict[str, Any] = {k: options.pop(k) for k in _FITTED_KEYS if k in options}
    ask = _SetupKeywords(**{f.name: options.pop(f.name) for f in fields(_SetupKeywords)
                            if f.name in options})
    if ask.corpus_statistics is not None and not isinstance(ask.signals, (list, tuple)):
        raise ValueError("corpus_statistics are the statistics of signals given in "
                         "signals; got no list of signals.")
    if isinstance(ask.signals, (list, tuple)):  # saved once for the signals sharing them
        ask = replace(ask, signals=inline_statistics(ask.signals, ask.corpus_statistics),
                      corpus_statistics=None)
    scorer = _setup_base(base, ask, options)
    row = _setup_preset(ask)
    signals = _setup_signals(scorer, row, ask, options)
    names = feature_names_of([scorer, *signals], not row.list_free)
    if fitted.get("features") is not None and tuple(fitted["features"]) != names:
        raise ValueError(f"features == {list(fitted['features'])!r}; this ragsieve computes "
                         f"{list(names)} for these signals.")
    return FusionSetup(scorer, signals, row, read_fitted(row.learner, len(names), fitted))


#: The keywords of a spec that hold the fitted learner (:func:`~ragsieve.scoring.learners.read_fitted`)
#: and the feature names it was fitted on.
_FITTED_KEYS = ("weights", "bias", "mean", "scale", "trees", "features")


@dataclass(frozen=True)
class _SetupKeywords:
    """The keywords of a fused score's spec that say what it is made of (the rest are the
    fitted learner's and the base's)."""

    signals: Sequence[Any] | None = None
    preset: str | Preset | None = None
    learner: str | None = None
    list_features: bool | None = None
    query_language: str | None = None
    reader_base: str | None = None
    rerank: Any = None
    corpus_statistics: Any = None


def _setup_base(base: Any, ask: _SetupKeywords, options: Mapping[str, Any]) -> Scorer:
    """The base score: ``base`` as it is, or built from an alias or spec with the options it
    takes (across languages an alias without a model gets one trained on both)."""
    query_language = check_str(ask.query_language, "query_language", non_blank=True,
                               allow_none=True)
    if query_language is not None and base == "embedding" and options.get("model") is None:
        from ..embeddings.languages import choose_model

        options = {**options, "model": choose_model(str(options.get("language") or "en"),
                                                   query_language)}
    own = _base_options(base, [*(ask.signals or ()), *([] if ask.rerank is None else [ask.rerank])],
                        options)
    return resolve_scorer(base, **own) if own or not isinstance(base, Scorer) else base


def _setup_preset(ask: _SetupKeywords) -> Preset:
    """The preset's row with the learner and list features asked for (``"base"`` without a
    preset)."""
    row = get_preset("base" if ask.preset is None else ask.preset)
    if ask.reader_base is not None and (ask.signals is not None or not row.reader):
        shown = None if row.name == "base" else row.name
        raise ValueError(f"reader_base == {ask.reader_base!r} names the base of a reader preset's "
                         f"reader; got preset {shown!r}"
                         f"{' and signals' if ask.signals is not None else ''} (expected one of "
                         f"{', '.join(sorted(READER_PRESETS))}, without signals).")
    if ask.rerank is not None and ask.signals is not None:
        raise ValueError("rerank adds the reranker to a preset's signals; with signals "
                         "given, give it among them (a saved spec records it there).")
    if ask.list_features is not None and not isinstance(ask.list_features, bool):
        raise TypeError(f"list_features is {type(ask.list_features).__name__}, expected a bool.")
    learner = row.learner if ask.learner is None else check_learner(ask.learner)
    list_free = row.list_free if ask.list_features is None else not ask.list_features
    return replace(row, learner=learner, list_free=list_free)


def _setup_signals(base: Scorer, row: Preset, ask: _SetupKeywords,
                   options: Mapping[str, Any]) -> tuple[Scorer, ...]:
    """The signals besides the base: those given (scorers or specs), else the preset's."""
    signals = ask.signals
    if signals is None:
        rerank = None if ask.rerank is None else _signal(ask.rerank, options, base)
        signals = preset_signals(base, row, ask.query_language, reader_base=ask.reader_base,
                                 rerank=rerank)
    elif isinstance(signals, (str, bytes, Mapping, Scorer)):
        raise TypeError(f"signals is a {type(signals).__name__}, expected a list of scorers "
                        "or scorer specs.")
    return one_statistics(tuple(_signal(s, options, base) for s in signals))


def feature_names_of(signals: Sequence[Scorer], list_features: bool) -> tuple[str, ...]:
    """One name per feature of these signals (the base first): :data:`FEATURES` for the base
    alone with list features, else ``"<signal>.<feature>"`` for every signal
    (``"bm25-list.gap"``; without list features only ``"<signal>.score"``).

    Raises
    ------
    ValueError
        A signal given twice.
    """
    if len(signals) == 1 and list_features:
        return FEATURES
    labels = [signal_label(s.spec()) for s in signals]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"the fused score has the signal(s) {twice} twice; give each once.")
    per = FEATURES if list_features else OWN_FEATURES
    return tuple(f"{label}.{f}" for label in labels for f in per)
