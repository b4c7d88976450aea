"""``ConformalFilter``: a scorer plus a calibrator of any guarantee mode, and its artifact.

A filter is calibrated once on labelled pairs from *other* topics and then applied
to each query's retrieved snippets: it keeps what its calibrator keeps (for most modes
the snippets whose nonconformity score is at most the calibrated threshold tau), in
their original order.

Snippets
--------
A snippet is a ``str``, a :class:`~ragsieve.types.Snippet`, a :class:`~ragsieve.types.Pair`
or a mapping with any of ``"text"``, ``"score"`` (an outside score, for filters calibrated
on one with :class:`~ragsieve.scoring.FieldScorer`; the field's own name works too),
``"snippet_id"`` / ``"id"``, and the group value of the ``group`` mode under the filter's
``group_by`` key or ``"group"``. :meth:`ConformalFilter.filter_vectors` scores from the
caller's own embeddings instead of texts.

Units
-----
``unit="snippet"`` (the default) scores and keeps whole snippets. ``unit="sentence"``
scores and keeps each snippet's sentences (:func:`ragsieve.units.sentence_pieces`: a
sentence longer than ``max_chars`` is cut into pieces of at most 500 characters, each
scored and kept like a sentence) and calibrates on evidence sentences, cut the same way
(:func:`ragsieve.units.sentence_pairs`); a kept snippet's ``Scored.spans`` are its kept
sentences (and pieces) and ``Scored.pruned_text`` their text, and
``FilterResult.sentences`` records every sentence's (and piece's) score and decision. The
unit is part of the artifact's policy.

Empty-result policy
-------------------
When nothing is kept, the default (``min_keep=0``) returns an empty ``kept`` tuple and
says so in ``FilterResult.note`` (and an INFO log line): an empty context is a legitimate
outcome ("nothing retrieved looks like evidence"). With ``min_keep=k`` the ``k``
best-scoring snippets are kept instead; the note says that these snippets were kept by
the policy, not by the calibrated rule.

Artifact
--------
:meth:`ConformalFilter.to_artifact` gives the filter as a sealed
:class:`~ragsieve.artifact.Artifact` (format version 2: the scorer spec, the calibration
block, the policy, the calibration data's provenance and, by default, see
``calibrate(monitor=...)``, the ``"monitor"`` block the exchangeability monitor ranks
served requests against) and :meth:`ConformalFilter.from_artifact` builds the filter back;
``save`` / ``load`` / ``to_dict`` / ``from_dict`` wrap them. :mod:`ragsieve.artifact` is
the one reader, writer, seal and identity. Version 1 artifacts (marginal only) and version
2 artifacts without a monitor block still load (``monitor_reference`` is then None).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from ._monitor_reference import reference_block
from ._validation import check_alpha, check_instance, check_int, check_scores, check_str
from .artifact import (
    ARTIFACT_FORMAT,
    ARTIFACT_VERSION,
    CHECKSUM_COVERS,
    MAX_ARTIFACT_BYTES,
    Artifact,
    check_fields,
    read_text,
    seal_value,
)
from .calibration import (
    BaseCalibrator,
    SplitConformalCalibrator,  # noqa: F401 (the class docstring's example uses it)
    make_calibrator,
)
from .calibration.inputs import CalibrationInputs
from .chunking import DEFAULT_SIZE, chunk_text
from .errors import (
    ArtifactError,
    CalibrationError,
    DataError,
    NotFittedError,
    ScorerMismatchError,
)
from .lists import (
    DEFAULT_DELTA,
    DEFAULT_MIN_LISTS,
    ListCheck,
    ListRecord,
    ListWatch,
    lists_source,
    retriever_of,
)
from .scoring import Scorer, resolve_scorer
from .scoring.auto import ScoreChoice, choose_languages
from .scoring.fusion import FusedScorer, fit_fused_scorer
from .scoring.sentence_context import (
    PARENT_POSITION,
    PARENT_TEXT,
    SentenceContextScorer,
    fit_sentence_context,
    with_parent_text,
)
from .types import FilterResult, Pair, Scored, Snippet, fingerprint_pairs
from .units import check_unit, sentence_pairs, sentence_pieces

__all__ = [
    "ARTIFACT_FORMAT", "ARTIFACT_VERSION", "CHECKSUM_COVERS", "MAX_ARTIFACT_BYTES", "MAX_CHARS",
    "ConformalFilter", "SnippetLike", "check_artifact_fields", "parse_artifact", "read_artifact",
    "read_artifact_text",
]

logger = logging.getLogger(__name__)

#: Inputs longer than this many characters are cut into calibration-sized pieces.
MAX_CHARS = int(1.2 * DEFAULT_SIZE)

SnippetLike = str | Snippet | Pair | Mapping[str, Any]
_ACCEPTED = (
    "str, ragsieve.Snippet, ragsieve.Pair, or a mapping with 'text' (or an outside 'score')"
)


#: Single values that iterate into pieces of themselves (characters, keys, fields): refused
#: where a sequence of snippets is expected.
_NOT_A_SEQUENCE = (str, bytes, bytearray, Mapping, Snippet, Pair)


def _snippet_list(snippets: Any, name: str = "snippets") -> list[Any]:
    """``snippets`` as a list; ``TypeError`` for one snippet given where a sequence is expected.

    A bare ``str`` would otherwise be read as one snippet per character (and a mapping as
    one per key).

    Examples
    --------
    >>> _snippet_list("a string")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: snippets is a str ('a string'); expected a sequence of snippets, e.g. ['a string'] ...
    """
    if isinstance(snippets, _NOT_A_SEQUENCE):
        shown = f"{snippets!r:.60}"
        raise TypeError(
            f"{name} is a {type(snippets).__name__} ({shown}); expected a sequence of snippets, "
            f"e.g. [{shown}] (each a {_ACCEPTED})."
        )
    return list(snippets)


def _as_item(item: Any, index: int) -> dict[str, Any]:
    """One accepted snippet form as a dict with ``snippet_id`` and, where known, ``text``.

    A mapping names its id ``snippet_id`` or ``id``, not both (``DataError``), the same rule
    as the service's snippet objects.
    """
    if isinstance(item, str):
        return {"text": item, "snippet_id": str(index)}
    if isinstance(item, Snippet):
        return {"text": item.text, "snippet_id": item.snippet_id}
    if isinstance(item, Pair):
        return {**item.meta, "text": item.text, "snippet_id": item.snippet_id}
    if isinstance(item, Mapping):
        out = dict(item)
        text = out.get("text")
        check_str(text, f"snippet {index}: 'text'", allow_none=True)
        if "snippet_id" in out and "id" in out:
            raise DataError(f"snippet {index} has both 'snippet_id' ({out['snippet_id']!r}) and "
                            f"'id' ({out['id']!r}); 'id' is another name of 'snippet_id': give one.")
        out["snippet_id"] = str(out.get("snippet_id", out.get("id", index)))
        return out
    raise TypeError(f"snippet {index} has type {type(item).__name__}; expected {_ACCEPTED}.")


def _check_labels(pairs: Sequence[Pair]) -> None:
    """``DataError`` for an unlabelled calibration pair, ``CalibrationError`` for no relevant one."""
    unlabelled = [p for p in pairs if p.relevant is None]
    if unlabelled:
        raise DataError(
            f"{len(unlabelled)} calibration pair(s) have no relevance label (first: "
            f"query_id={unlabelled[0].query_id!r}, snippet_id={unlabelled[0].snippet_id!r}); "
            "calibration needs relevant = 0 or 1 on every pair."
        )
    if not any(p.relevant == 1 for p in pairs):
        raise CalibrationError(
            f"no relevant calibration snippet among {len(pairs)} pairs; "
            "need at least one pair with relevant == 1."
        )


def _of_sentences(statement: str) -> str:
    """A calibrator's statement about snippets, said of the sentences a filter of unit
    ``"sentence"`` calibrated on.

    Examples
    --------
    >>> _of_sentences("mean share of a new query's relevant snippets kept >= 0.9")
    "mean share of a new query's evidence sentences kept >= 0.9"
    """
    for old, new in (("relevant live snippets", "live evidence sentences"),
                     ("relevant snippets", "evidence sentences"),
                     ("a relevant snippet", "an evidence sentence"),
                     ("relevant snippet", "evidence sentence"), ("snippets", "sentences")):
        statement = statement.replace(old, new)
    return statement


@dataclass(frozen=True)
class _Pieces:
    """Input snippets and what is scored: the snippets, or pieces of the long ones."""

    items: list[dict[str, Any]]
    pieces: list[dict[str, Any]]
    owner: np.ndarray  # item of each piece
    spans: list[tuple[int, int] | None]  # span of each piece in its item (None: whole)
    merge: bool = True  # merge overlapping kept spans (windows); False: one per piece (sentences)
    cut: tuple[bool, ...] = ()  # per piece: cut from a text longer than the window ((): none)

    @classmethod
    def whole(cls, items: list[dict[str, Any]]) -> _Pieces:
        return cls(items, items, np.arange(len(items)), [None] * len(items))

    def cut_summary(self) -> tuple[int, int]:
        """How many items hold a cut text (a snippet, or a sentence, longer than the
        window), and how many pieces were cut from them."""
        owners = {int(o) for o, c in zip(self.owner, self.cut, strict=False) if c}
        return len(owners), sum(self.cut)

    def kept_spans(self, keep_piece: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
        """Per item, the spans of its kept pieces, merged where they overlap unless
        ``merge`` is False (empty when it was scored whole).

        One pass over the pieces; the pieces of an item come in text order.
        """
        out: list[list[tuple[int, int]]] = [[] for _ in self.items]
        for sp, o, k in zip(self.spans, self.owner, keep_piece, strict=True):
            if not k or sp is None:
                continue
            merged = out[int(o)]
            if self.merge and merged and sp[0] <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(sp[1], merged[-1][1]))
            else:
                merged.append(sp)
        return [tuple(m) for m in out]


class ConformalFilter:
    """Keep the snippets a calibrated guarantee mode keeps.

    Parameters
    ----------
    scorer : Scorer or str, default="auto"
        The nonconformity score (an alias such as ``"embedding"`` or ``"best"`` is
        resolved; ``"best"`` is fitted by :meth:`calibrate`). ``"auto"`` is chosen by
        :meth:`calibrate`: the list-aware fused score where the pairs are the deployed
        retriever's lists (see ``calibrate(lists=...)``), else the portable fused score, else
        ``1 - cos`` (:func:`~ragsieve.scoring.auto.choose_score`), over the embedding model
        of the detected language.
    calibrator : BaseCalibrator or str, optional
        A calibrator of any mode, fitted already or fitted by :meth:`calibrate`, or a
        mode name (``"marginal"``, ``"query-all"``, ...) built with ``alpha``.
        Defaults to the marginal mode.
    alpha : float, default=0.1
        Used only when ``calibrator`` is None or a mode name; checked at once (``ValueError``
        outside (0, 1), ``TypeError`` for a non-number), like ``min_keep``, ``group_by``
        and ``max_chars``.
    min_keep : int, default=0
        Empty-result policy: keep at least this many best-scoring snippets.
    group_by : str, optional
        ``group`` mode: the field holding each snippet's group (``Pair.meta`` key at
        calibration, snippet key at filtering).
    max_chars : int, optional
        Snippets whose text is longer are cut into sentence-aware pieces of the size the
        filter was calibrated on (500 characters, 100 of overlap) and scored piece by piece;
        the snippet is kept when any piece is kept, and ``Scored.spans`` says which parts.
        Defaults to ``MAX_CHARS`` (600). An embedding model would otherwise read only its
        first few hundred tokens and silently drop evidence placed further in.
    unit : {"snippet", "sentence"}, default="snippet"
        What is scored and kept. ``"sentence"``: every snippet is split into sentences
        (:func:`ragsieve.units.split_sentences`), :meth:`calibrate` takes the usual labelled
        snippet pairs and calibrates on their sentences (evidence sentences from
        ``meta["evidence"]`` spans or the query's ``answers``:
        :func:`ragsieve.units.sentence_pairs`), so the guarantee is on evidence sentences;
        :meth:`filter` keeps the sentences the rule keeps and returns the snippets with at
        least one of them, each with the kept sentences' ``spans`` and ``pruned_text``. An
        unfitted score (``"auto"``, ``"best"``) becomes the sentence-in-context score
        (:class:`~ragsieve.scoring.sentence_context.SentenceContextScorer`: the fused score
        over the query's sentences combined with its snippet's fused score over the
        snippets).

    Examples
    --------
    >>> from ragsieve.scoring import Scorer
    >>> class Length(Scorer):  # toy score: longer text = less relevant
    ...     name = "length"
    ...     def score_batch(self, query, snippets):
    ...         return np.array([len(s) / 100 for s in snippets], dtype=float)
    ...     def spec(self):
    ...         return {"scorer": "length"}
    >>> cal = SplitConformalCalibrator(alpha=0.5).fit([0.04, 0.05, 0.06])
    >>> f = ConformalFilter(Length(), cal)
    >>> f.filter("q", ["short", "a much longer snippet", "tiny"]).kept_ids
    ['0', '2']
    """

    def __init__(
        self,
        scorer: Scorer | str = "auto",
        calibrator: BaseCalibrator | str | None = None,
        *,
        alpha: float = 0.1,
        min_keep: int = 0,
        group_by: str | None = None,
        max_chars: int | None = None,
        unit: str = "snippet",
    ) -> None:
        alpha = check_alpha(alpha)  # the user facade checks its plain parameters at once
        self.scorer = resolve_scorer(scorer)
        if calibrator is None or isinstance(calibrator, str):
            calibrator = make_calibrator(calibrator or "marginal", alpha=alpha)
        self.calibrator = check_instance(
            calibrator, BaseCalibrator, "calibrator", expected="a ragsieve calibrator "
            "(ragsieve.calibration.make_calibrator(mode, ...)) or a mode name")
        self.min_keep = check_int(min_keep, "min_keep", min_value=0)
        self.group_by = check_str(group_by, "group_by", non_blank=True, allow_none=True,
                                  hint="the field name of the group")
        max_chars = check_int(max_chars, "max_chars", min_value=DEFAULT_SIZE, allow_none=True,
                              hint="the snippet size the pieces are cut to")
        self.max_chars = MAX_CHARS if max_chars is None else max_chars
        #: What is scored and kept: ``"snippet"`` or ``"sentence"``.
        self.unit = check_unit(unit)
        if self.unit == "snippet" and isinstance(self.scorer, SentenceContextScorer):
            raise ValueError("the sentence_context score scores sentences in their snippets: "
                             "use it with unit='sentence' (CLI --unit sentence).")
        self.calibration_info: dict[str, Any] = {}
        #: The artifact's ``"monitor"`` block (see :mod:`ragsieve.monitoring`), or None.
        self.monitor_reference: dict[str, Any] | None = None
        #: The calibration lists (the artifact's ``"lists"`` block, :mod:`ragsieve.lists`), or
        #: None (not calibrated yet, or an artifact written before it existed).
        self.lists: ListRecord | None = None
        #: The check of the lists this filter is given against :attr:`lists` (None without
        #: them); shared by the filter's copies. :meth:`watch_lists` sets its false-alarm bound.
        self.list_watch: ListWatch | None = None

    # ------------------------------------------------------------------ state
    @property
    def mode(self) -> str:
        """The guarantee mode of the calibrator."""
        return self.calibrator.mode

    @property
    def alpha(self) -> float | None:
        """Target miscoverage (``None`` for a budget without a coverage target)."""
        return self.calibrator.miscoverage()

    def _check_calibrated(self) -> None:
        if not self.calibrator.is_fitted:
            raise NotFittedError(
                "This ConformalFilter is not calibrated; call calibrate(pairs) or "
                "ConformalFilter.load(path) first."
            )

    @property
    def threshold(self) -> float:
        """The calibrated threshold tau (group mode: the pooled one; budget: its cap)."""
        self._check_calibrated()
        return float(self.calibrator.threshold_)

    def guarantee(self) -> dict[str, Any]:
        """What the filter promises: the calibrator's :class:`~ragsieve.calibration.Guarantee`
        as a dict (mode, metric, target, statement, alpha, n_calibration, n_required,
        infinite, details), plus ``coverage_band`` for the marginal mode; for unit
        ``"sentence"`` also ``unit``, and the statement is of evidence sentences."""
        self._check_calibrated()
        out = self.calibrator.guarantee().to_dict()
        if "coverage_band" in out["details"]:
            out["coverage_band"] = list(out["details"]["coverage_band"])
        if self.group_by is not None:
            out["group_by"] = self.group_by
        if self.unit == "sentence":  # the calibrated units are sentences, the relevant ones evidence
            out["unit"] = self.unit
            out["statement"] = _of_sentences(str(out["statement"]))
        return out

    # ------------------------------------------------------------ calibrate
    def calibrate(
        self,
        pairs: Sequence[Pair],
        *,
        progress: bool = False,
        group_by: str | None = None,
        seed: int = 0,
        monitor: bool | None = None,
        language: str | None = None,
        lists: str | Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Score labelled calibration pairs and fit the calibrator.

        Only the relevant pairs are scored when the mode learns from them alone and the
        score of a snippet does not depend on its list; otherwise (list-dependent scores:
        relative, fused; budgets) every pair is scored, in its query's whole list. An
        unfitted fused score (``"best"``) is first fitted on a random quarter
        (``FUSION_FIT_FRACTION``) of the calibration topics (``Pair.group``) and calibrated
        on the rest, so the score is fixed before the data it is calibrated on is seen: the
        fit of :func:`~ragsieve.scoring.fusion.fit_fused`, the one ``evaluate(seed=seed)``
        makes in its split 0. The calibrator gets its inputs from
        :class:`~ragsieve.calibration.inputs.CalibrationInputs`, as every split does.

        With ``unit="sentence"`` the snippet pairs are cut into their sentences
        (:func:`ragsieve.units.sentence_pairs`: evidence sentences from ``meta["evidence"]``
        or the query's ``answers``) and the calibrator learns from the sentences. An unfitted
        score becomes the sentence-in-context score, whose two stages (the score over the
        snippets, the score over the sentences) and their combination are all fitted on the
        same share of the topics (:func:`~ragsieve.scoring.sentence_context.
        fit_sentence_context`); the threshold is calibrated on the other topics' sentences.

        Parameters
        ----------
        pairs : sequence of Pair
            Labelled calibration pairs (``relevant`` in {0, 1} for every pair); snippet
            pairs for either unit.
        progress : bool
            Show a progress bar while scoring.
        group_by : str, optional
            ``group`` mode: the ``Pair.meta`` field holding each pair's group (stored in
            the artifact; filtering reads the same field). Defaults to the constructor's.
        seed : int
            Seed of the fit/calibration topic split of an unfitted fused score, and of the
            subsample of the monitor reference beyond 20,000 queries.
        monitor : bool, optional
            Record the exchangeability monitor's reference (``monitor_reference``, saved in
            the artifact): the separation statistic of every calibration query, computed
            from the scores of all its snippets, so the irrelevant pairs are scored too
            when the mode would not need them. False skips it (the artifact then has no
            monitor block). The default records it unless that would send the irrelevant
            pairs to an LLM score (logged; pass True to pay for it).
        language : str, optional
            Language of the calibration texts, recorded in the artifact (``data.language``)
            and used by an ``"auto"`` score to pick the model. None detects it in a sample
            of the queries and snippets (py3langid); an undetected language is not recorded
            (``"auto"`` then uses English).
        lists : {None, "auto", "retriever", "deployed", "data"} or Mapping
            Where the calibration lists come from (:func:`ragsieve.lists.lists_source`),
            recorded in the artifact's ``lists`` block with their lengths (and, for a
            list-aware score, their list-level statistics), which every surface checks its
            lists against (:attr:`list_watch`). None reads it from the pairs: lists that
            all carry one retriever identity (``ragsieve retrieve``, a component's
            ``calibrate``) are the deployed retriever's, others a data set's own.
            ``"deployed"``: they are the deployed retriever's lists. An ``"auto"`` score is
            the list-aware fused score only on the deployed retriever's lists, else the
            list-free portable one (:func:`~ragsieve.scoring.auto.choose_score`).

        Returns
        -------
        ConformalFilter
            ``self``, calibrated.

        Raises
        ------
        DataError
            A pair is unlabelled, or lacks the group field in group mode; unit
            ``"sentence"``: a relevant snippet with neither ``evidence`` nor ``answers``.
        CalibrationError
            No relevant pair.
        """
        pairs = snippets = list(pairs)
        _check_labels(pairs)
        if self.unit == "sentence":
            pairs = with_parent_text(sentence_pairs(snippets, max_chars=self.max_chars),
                                     snippets)
            _check_labels(pairs)
        self.group_by = group_by or self.group_by
        if self.calibrator.group_kind == "attribute" and self.group_by is None:
            raise ValueError(
                "mode 'group' needs group_by: the Pair.meta field holding each snippet's group "
                "(e.g. group_by='language'; CLI --group-by FIELD)."
            )
        source = lists_source(lists, retriever_of(snippets))
        info, choice = self._resolve_auto(snippets, language,
                                          deployed_lists=source["kind"] != "data")
        fused = None
        if not self.scorer.is_fitted and self.unit == "sentence":
            pairs = self._fit_in_context(snippets, pairs, seed, progress, info, choice)
        elif not self.scorer.is_fitted:  # the fused score: fitted here, on a share of the topics
            pairs, fused = self._fit_fused(pairs, seed, progress, info, choice)
        used, scores = self._calibration_scores(pairs, fused, progress)
        if monitor is None:
            monitor = used is pairs or not self.scorer.costly
            if not monitor:
                logger.info("no exchangeability monitor reference: it would send the %d "
                            "irrelevant calibration pairs to the LLM score (calibrate(..., "
                            "monitor=True) records it)", len(pairs) - len(used))
        self.monitor_reference = (self._monitor_block(pairs, used, scores, seed, progress)
                                  if monitor else None)
        attribute = self.group_by if self.calibrator.group_kind == "attribute" else None
        CalibrationInputs.from_pairs(used, group_by=attribute).fit(self.calibrator, scores)
        self.calibration_info = {
            "fingerprint": fingerprint_pairs(pairs),
            "n_pairs": len(pairs),
            "n_queries": len({p.query_id for p in pairs}),
            "n_relevant": sum(p.relevant == 1 for p in pairs),
            "n_groups": len({p.group for p in pairs}),
            **info,
        }
        if self.unit == "sentence":
            self.calibration_info["n_snippet_pairs"] = len(snippets)
        self._record_lists(snippets, source, seed, progress)
        self._warn_if_short()
        return self

    def _record_lists(self, snippets: list[Pair], source: Mapping[str, Any], seed: int,
                      progress: bool) -> None:
        """Record the calibration lists (their source, lengths and, for a list-aware score
        of a snippet's own root score, its best and mean per list) and start the watch."""
        root = self.scorer.root_scorer()
        scored = self.scorer.list_dependent and self.unit == "snippet" and not root.costly
        self.lists = ListRecord.from_lists(
            [p.query_id for p in snippets],
            root.score_pairs(snippets, progress=progress) if scored else None,
            source=source, list_dependent=self.scorer.list_dependent,
            score=root.keep_rule(0.0).score if scored else None,
            topics=[p.group for p in snippets], seed=seed)
        self.watch_lists()

    def watch_lists(self, *, delta: float = DEFAULT_DELTA, min_lists: int = DEFAULT_MIN_LISTS,
                    ) -> ListWatch | None:
        """(Re)start the check of the lists this filter is given against its calibration
        lists (:class:`ragsieve.lists.ListWatch`): false-alarm bound ``delta`` of its
        sequential test, which may fire after ``min_lists`` lists. None when the filter has
        no record of its calibration lists (an artifact written before it existed)."""
        if self.lists is None:
            self.list_watch = None
            return None
        label = self.scorer.keep_rule(0.0).score
        self.list_watch = ListWatch(self.lists, delta=delta, min_lists=min_lists,
                                    score_name=f"the {label}")
        return self.list_watch

    def _fit_in_context(self, snippets: list[Pair], sentences: list[Pair], seed: int,
                        progress: bool, info: dict[str, Any],
                        choice: ScoreChoice | None) -> list[Pair]:
        """Fit the sentence-in-context score (unit ``"sentence"``): each unfitted stage by
        :meth:`_fit_fused` (the same seeded share of the topics for both), then their
        combination; returns the calibration share of the sentences."""
        ctx = self.scorer
        if not isinstance(ctx, SentenceContextScorer):
            ctx = SentenceContextScorer(ctx)

        def fit_stage(stage: Scorer, stage_pairs: list[Pair]) -> tuple[Scorer, list[Pair]]:
            self.scorer = stage
            cal, _ = self._fit_fused(stage_pairs, seed, progress, info, choice)
            return self.scorer, cal

        self.scorer, cal = fit_sentence_context(ctx, snippets, sentences, fit_stage,
                                                progress=progress)
        return cal

    @property
    def language(self) -> str | None:
        """The language the filter was calibrated on (``data.language``), or None."""
        code = self.calibration_info.get("language")
        return code if isinstance(code, str) else None

    def _resolve_auto(self, pairs: list[Pair], language: str | None, deployed_lists: bool = False,
                      ) -> tuple[dict[str, Any], ScoreChoice | None]:
        """Resolve an ``"auto"`` score; the languages (the snippets' and, when it differs,
        the queries') and the score choice for the artifact. ``deployed_lists``: the pairs'
        lists are the deployed retriever's (the list-aware fused score may then be chosen;
        else the list-free one, :func:`~ragsieve.scoring.auto.choose_score`)."""
        if self.scorer.resolved_at_calibration:
            found = self.scorer.languages(pairs, language=language)  # type: ignore[attr-defined]
            self.scorer, choice, _ = self.scorer.resolve(  # type: ignore[attr-defined]
                pairs, languages=found, deployed_lists=deployed_lists)
            return {**found.info(), "score_choice": choice.to_dict()}, choice
        return choose_languages(pairs, language, fallback=None).info(), None

    def _monitor_block(self, pairs: list[Pair], used: list[Pair], scores: np.ndarray, seed: int,
                       progress: bool) -> dict[str, Any] | None:
        """The monitor reference from the scores of every calibration snippet, per query."""
        qids = [p.query_id for p in used]
        if used is not pairs:  # only the relevant pairs were scored: score the others too
            rest = [p for p in pairs if p.relevant != 1]
            if rest:
                scores = np.concatenate([scores, self.scorer.score_pairs(rest, progress=progress)])
                qids += [p.query_id for p in rest]
        block = reference_block(scores, qids, seed=seed)
        if block is None:
            logger.warning("no calibration query has 2 or more snippets: the artifact gets no "
                           "exchangeability monitor reference")
        return block

    def _fit_fused(self, pairs: list[Pair], seed: int, progress: bool, info: dict[str, Any],
                   choice: ScoreChoice | None) -> tuple[list[Pair], np.ndarray | None]:
        """Fit the unfitted fused score with :func:`~ragsieve.scoring.fusion.fit_fused_scorer`
        (its learner, and the statistics of its text-fitted signals, on the fit share only).

        The fit ``evaluate`` makes in its split 0 of ``seed``. Returns the calibration share
        of the pairs and their fused scores; an ``"auto"`` choice that cannot be fitted
        falls back to ``1 - cos`` (all pairs, scores None: scored by the caller).
        """
        scorer = cast(FusedScorer, self.scorer)  # calibrate calls this for an unfitted one
        inputs = CalibrationInputs.from_pairs(pairs)
        try:
            done = fit_fused_scorer(scorer, pairs, inputs.group_index, seed=seed,
                                    progress=progress)
        except CalibrationError as exc:
            if choice is None:
                raise
            self.scorer, choice = scorer.base, ScoreChoice(
                "embedding", f"the fused score could not be fitted ({exc})")
            logger.warning("score: 1 - cos (embedding), not the fused score: %s", choice.reason)
            info["score_choice"] = choice.to_dict()
            return pairs, None
        self.scorer, fit = done.scorer, done.fit
        logger.info("fused score fitted on %d pairs of some topics; calibrating on the "
                    "other %d", int(fit.sum()), int((~fit).sum()))
        info["fusion_fit_pairs"] = int(fit.sum())
        cal = np.flatnonzero(~fit)
        pairs = [pairs[i] for i in cal]
        if not any(p.relevant == 1 for p in pairs):
            raise CalibrationError("the calibration share of the topics has no relevant pair.")
        return pairs, done.scores[cal]

    def _calibration_scores(self, pairs: list[Pair], fused: np.ndarray | None,
                            progress: bool) -> tuple[list[Pair], np.ndarray]:
        """The pairs the calibrator learns from and their scores.

        Every pair in its query's whole list for a list-dependent score or a mode that uses
        the irrelevant pairs; else the relevant pairs alone (the threshold depends on them
        only). ``fused``: the scores :meth:`_fit_fused` gave every pair.
        """
        if fused is not None:
            return pairs, fused
        if self.scorer.list_dependent or self.calibrator.uses_irrelevant:
            return pairs, self.scorer.score_pairs(pairs, progress=progress)
        used = [p for p in pairs if p.relevant == 1]
        return used, self.scorer.score_pairs(used, progress=progress)

    def _warn_if_short(self) -> None:
        g = self.calibrator.guarantee()
        if g.infinite:
            logger.warning("%s: the calibration data is too small for alpha=%s (has %d, needs %s); "
                           "the filter keeps everything.", g.mode, g.alpha, g.n_calibration,
                           g.n_required)

    # ---------------------------------------------------------------- apply
    def _groups_of(self, items: Sequence[Mapping[str, Any]], group: Any) -> list[Any]:
        keys = [k for k in (self.group_by, "group") if k]
        out = []
        for i, item in enumerate(items):
            value = next((item[k] for k in keys if item.get(k) is not None), group)
            if value is None:
                raise DataError(
                    f"snippet {i} has no group: mode 'group' needs a {' or '.join(map(repr, keys))} "
                    "value on each snippet, or a per-query group."
                )
            out.append(value)
        return out

    def _cut(self, items: Sequence[dict[str, Any]]) -> _Pieces:
        """Cut the texts longer than ``max_chars`` into calibration-sized pieces (unit
        ``"sentence"``: every text into its sentences, the long ones into pieces)."""
        if self.unit == "sentence":
            return self._sentences(items)
        pieces: list[dict[str, Any]] = []
        owner: list[int] = []
        spans: list[tuple[int, int] | None] = []
        for i, item in enumerate(items):
            text = item.get("text")
            if self.scorer.reads_text and isinstance(text, str) and len(text) > self.max_chars:
                # pieces overlap by up to half a window (whole sentences), so evidence at a
                # piece edge is also scored together with what follows it
                for sn in chunk_text(text, str(item["snippet_id"]), overlap=DEFAULT_SIZE // 2):
                    pieces.append({**item, "text": sn.text})
                    owner.append(i)
                    spans.append((sn.start, sn.end))
            else:
                pieces.append(item)
                owner.append(i)
                spans.append(None)
        return _Pieces(items=list(items), pieces=pieces, owner=np.asarray(owner, dtype=int),
                       spans=spans, cut=tuple(sp is not None for sp in spans))

    def _sentences(self, items: Sequence[dict[str, Any]]) -> _Pieces:
        """Every snippet's sentences as pieces, a sentence longer than ``max_chars`` cut
        into pieces of at most 500 characters (:func:`~ragsieve.units.sentence_pieces`, the
        cut calibration makes), each knowing its snippet (its text and position, for a
        score that reads the snippet as context); a snippet without a sentence (blank
        text) has no piece."""
        pieces: list[dict[str, Any]] = []
        owner: list[int] = []
        spans: list[tuple[int, int] | None] = []
        cut: list[bool] = []
        for i, item in enumerate(items):
            text = item.get("text")
            if not isinstance(text, str):
                raise DataError(f"snippet {i} has no text (got {type(text).__name__}); a filter "
                                "of unit 'sentence' scores the sentences of each snippet's text.")
            for sentence in sentence_pieces(text, max_chars=self.max_chars):
                pieces.append({**item, "text": sentence.text, PARENT_TEXT: text,
                               PARENT_POSITION: i})
                owner.append(i)
                spans.append((sentence.start, sentence.end))
                cut.append(sentence.cut)
        return _Pieces(items=list(items), pieces=pieces, owner=np.asarray(owner, dtype=int),
                       spans=spans, merge=False, cut=tuple(cut))

    def piece_texts(self, snippets: Sequence[SnippetLike]) -> list[str]:
        """The texts a :meth:`filter` call hands its scorer for ``snippets`` (no scoring).

        A snippet longer than ``max_chars`` counts as its pieces. Unit ``"sentence"``: every
        snippet's sentences (a sentence longer than ``max_chars`` as its pieces), then each
        snippet once more, whole, as its sentences' context (the sentence-in-context score
        reads it). So these texts are the model work a ``filter`` call may cause (the
        service's budget counts their characters); snippets without text (an outside
        score) are left out.

        Examples
        --------
        >>> flt = ConformalFilter("embedding", alpha=0.2)
        >>> len(flt.piece_texts(["short", "Long sentence here. " * 100]))  # 1 + 7 pieces
        8
        >>> sentences = ConformalFilter("embedding", alpha=0.2, unit="sentence")
        >>> # 2 sentences, 2 pieces of the 1,000-character one, then each snippet whole
        >>> [len(t) for t in sentences.piece_texts(["One. Two.", "x" * 1000])]
        [4, 4, 500, 500, 9, 1000]
        """
        cut = self._cut([_as_item(s, i) for i, s in enumerate(_snippet_list(snippets))])
        texts = [p["text"] for p in cut.pieces if isinstance(p.get("text"), str)]
        if self.unit == "sentence":  # each snippet with a sentence, whole, as the context
            texts.extend(str(cut.items[o]["text"]) for o in dict.fromkeys(cut.owner.tolist()))
        return texts

    def _apply(self, query: str, scores: Any, cut: _Pieces, group: Any,
               root: np.ndarray | None = None, check: ListCheck | None = None) -> FilterResult:
        """Apply the calibrated rule to the pieces' scores; map the result back to the items.

        ``root``: the pieces' root scores, for the list check (:meth:`_see_list`); ``check``:
        the list check made already (a batch checks its lists in a random order)."""
        self._check_calibrated()
        arr = check_scores(scores, name="snippet scores")
        pieces, n = cut.pieces, len(cut.items)
        if len(pieces) != arr.size:
            raise ValueError(f"got {arr.size} scores for {len(pieces)} snippets; they must align.")
        needs = self.calibrator.predict_requires
        groups = self._groups_of(pieces, group) if "groups" in needs and pieces else None
        keep_piece = self.calibrator.predict(
            arr,
            query_ids=np.zeros(arr.size, dtype=int) if "query_ids" in needs else None,
            groups=groups,
            lengths=[str(it.get("text") or "") for it in pieces] if "lengths" in needs else None,
        ) if pieces else np.zeros(0, dtype=bool)
        item_scores = np.full(n, np.inf)
        np.minimum.at(item_scores, cut.owner, arr)
        tau = self.threshold
        if groups and len(set(map(str, groups))) == 1:  # one group: the threshold it meets
            tau = self.calibrator.threshold_for(groups[0])
        sentences = self.unit == "sentence"
        notes = []
        rule_kept_none = bool(n and not keep_piece.any())
        if rule_kept_none and sentences:  # the policy keeps the best sentences
            notes.append(self._empty_policy(keep_piece, arr, tau, "sentence"))
        keep = np.zeros(n, dtype=bool)
        np.logical_or.at(keep, cut.owner, keep_piece)
        n_cut, n_pieces = cut.cut_summary()
        if n_cut and sentences:
            notes.insert(0, f"{n_cut} snippet(s) held a sentence longer than {self.max_chars} "
                         f"characters, cut into {n_pieces} pieces and scored piece by piece "
                         "(each piece kept or removed like a sentence; see spans)")
        elif n_cut:
            notes.insert(0, f"{n_cut} snippet(s) longer than {self.max_chars} characters were "
                         f"cut into {n_pieces} pieces and scored piece by piece (kept when any "
                         "piece is kept; see spans)")
        if rule_kept_none and not sentences:
            notes.append(self._empty_policy(keep, item_scores, tau, "snippet"))
        if rule_kept_none:
            logger.info("query %r: %s", query[:80], notes[-1])
        spans = cut.kept_spans(keep_piece)
        kept = tuple(
            Scored(index=i, snippet_id=str(it["snippet_id"]), text=str(it.get("text") or ""),
                   score=float(item_scores[i]), spans=spans[i])
            for i, it in enumerate(cut.items)
            if keep[i]
        )
        removed = tuple(
            Scored(index=i, snippet_id=str(it["snippet_id"]), text=str(it.get("text") or ""),
                   score=float(item_scores[i]))
            for i, it in enumerate(cut.items)
            if not keep[i]
        )
        scored_sentences = tuple(
            (int(o), int(sp[0]), int(sp[1]), float(a), bool(k))
            for o, sp, a, k in zip(cut.owner, cut.spans, arr, keep_piece, strict=True)
            if sp is not None
        ) if sentences else ()
        check = self._see_list(cut, root) if check is None else check
        return FilterResult(query=query, kept=kept, scores=tuple(float(x) for x in item_scores),
                            threshold=tau, n_input=n, note="; ".join(notes) or None, n_cut=n_cut,
                            removed=removed, rule_kept_none=rule_kept_none, unit=self.unit,
                            sentences=scored_sentences, lists_unlike=check.unlike,
                            lists_note=check.note)

    @property
    def _wants_root(self) -> bool:
        """Whether the list check reads the lists' root scores (a list-aware score whose
        calibration lists' statistics were recorded)."""
        watch = self.list_watch
        return watch is not None and watch.active and watch.record.spread is not None

    def _root_scores(self, query: str, pieces: Sequence[Mapping[str, Any]]) -> np.ndarray | None:
        """The pieces' root scores for the list check (the root of a fused score is its
        ``1 - cos``, whose embeddings scoring has just cached), or None when not wanted."""
        if not self._wants_root or not pieces:
            return None
        return self.scorer.root_scorer().score_items(query, pieces)

    def _see_list(self, cut: _Pieces, root: np.ndarray | None) -> ListCheck:
        """Show one list to the watch: its length (the snippets given) and each snippet's
        best root score (over its pieces)."""
        if self.list_watch is None or not cut.items:
            return ListCheck()
        per_item = None
        if root is not None and self._wants_root:
            per_item = np.full(len(cut.items), np.inf)
            np.minimum.at(per_item, cut.owner, np.asarray(root, dtype=np.float64))
            per_item = per_item[np.isfinite(per_item)]
        return self.list_watch.see(len(cut.items), per_item)

    def _empty_policy(self, keep: np.ndarray, scores: np.ndarray, tau: float,
                      unit: str) -> str:
        """Nothing passed the rule: keep the ``min_keep`` best units (in place) and say why."""
        if not scores.size:
            return (f"no {unit} to keep: every snippet's text is blank; returning an empty "
                    "context")
        if self.min_keep:
            order = np.argsort(scores, kind="stable")[: self.min_keep]
            keep[order] = True
            return (f"no {unit} kept by the {self.mode} rule (tau={tau:.4g}, best score "
                    f"{scores.min():.4g}); kept the {int(keep.sum())} best by the "
                    f"min_keep={self.min_keep} policy, outside the calibrated guarantee")
        return (f"no {unit} kept by the {self.mode} rule (tau={tau:.4g}, best score "
                f"{scores.min():.4g}); returning an empty context (set min_keep to keep the "
                "best ones anyway)")

    def filter(self, query: str, snippets: Sequence[SnippetLike], *, group: Any = None) -> FilterResult:
        """Score one query's snippets and keep what the calibrated mode keeps.

        Parameters
        ----------
        query : str
            The query.
        snippets : sequence
            Each a ``str``, ``Snippet``, ``Pair`` or mapping (see the module docstring).
        group : optional
            ``group`` mode: the group of snippets that carry none of their own.

        Returns
        -------
        FilterResult
            Kept snippets in input order, all scores, tau and a note for unusual results.

        Raises
        ------
        TypeError
            ``snippets`` is one snippet (a ``str``, bytes, a mapping, a ``Snippet``) instead
            of a sequence of them, or holds a form not accepted.
        DataError
            A snippet lacks what the score or the mode needs (text, outside score, group).
        """
        check_str(query, "query")
        self._check_calibrated()  # fail before scoring
        cut = self._cut([_as_item(s, i) for i, s in enumerate(_snippet_list(snippets))])
        scores = self.scorer.score_items(query, cut.pieces) if cut.pieces else np.zeros(0)
        return self._apply(query, scores, cut, group, self._root_scores(query, cut.pieces))

    def filter_scores(self, query: str, scores: Any, snippets: Sequence[SnippetLike], *,
                      group: Any = None, root_scores: Any = None) -> FilterResult:
        """Apply the calibrated rule to precomputed scores of this filter's score (no scoring).

        Parameters
        ----------
        root_scores : array-like, optional
            Each snippet's root score (e.g. the stored ``1 - cos`` of an index's hits under
            a fused score of it), for the list check (:attr:`list_watch`); without them the
            check reads the list's length alone.

        Raises
        ------
        TypeError
            A filter of unit ``"sentence"``: it scores each snippet's sentences, so one
            score per snippet cannot be filtered (use :meth:`filter`).
        """
        self._check_snippet_unit("one precomputed score per snippet")
        items = [_as_item(s, i) for i, s in enumerate(_snippet_list(snippets))]
        root = None if root_scores is None else check_scores(root_scores, name="root_scores")
        return self._apply(query, scores, _Pieces.whole(items), group, root)

    def _check_snippet_unit(self, what: str) -> None:
        if self.unit != "snippet":
            raise TypeError(f"this filter's unit is {self.unit!r}: it scores each snippet's "
                            f"sentences, so it cannot filter from {what}; call filter() with "
                            "the snippets' texts.")

    def filter_vectors(self, query: str, query_vector: Any, snippet_vectors: Any,
                       snippets: Sequence[SnippetLike], *, group: Any = None) -> FilterResult:
        """Filter with the caller's own embeddings: a dot product, no model call.

        For filters on the embedding score (``1 - cos``) and the relative / fused scores
        built on it. The vectors must come from the filter's embedding model
        (``scorer.spec()``); they are normalised here.

        Raises
        ------
        TypeError
            The filter's score cannot be computed from vectors (an LLM, an outside score),
            or its unit is ``"sentence"`` (it scores sentences, the vectors are snippets').
        ValueError
            Vectors that are not finite, zero, or of mismatched dimension or count.
        """
        self._check_calibrated()
        self._check_snippet_unit("the snippets' vectors")
        items = [_as_item(s, i) for i, s in enumerate(_snippet_list(snippets))]
        sv = np.asarray(snippet_vectors, dtype=float) if len(items) else np.zeros((0, 1))
        if sv.ndim != 2 or sv.shape[0] != len(items):
            raise ValueError(f"got snippet_vectors of shape {sv.shape} for {len(items)} snippets; "
                             "expected one vector per snippet.")
        scores = self.scorer.scores_from_vectors(query_vector, sv) if items else np.zeros(0)
        root = (self.scorer.root_scorer().scores_from_vectors(query_vector, sv)
                if items and self._wants_root else None)
        return self._apply(query, scores, _Pieces.whole(items), group, root)

    def filter_pairs(self, pairs: Sequence[Pair], *, progress: bool = False,
                     seed: int = 0) -> dict[str, FilterResult]:
        """Filter many queries at once (batched scoring), keyed by query_id.

        A group-mode filter reads each pair's group from ``Pair.meta[group_by]``. The list
        check (:attr:`list_watch`) sees the batch's lists in a random order (``seed``), so
        a file sorted by topic is compared with the calibration lists as a sample, not as
        a stream of one topic after another; when its sequential test fires on the batch,
        every result of the batch is flagged.
        """
        self._check_calibrated()
        pairs = _snippet_list(pairs, "pairs")
        for i, p in enumerate(pairs):
            if not isinstance(p, Pair):
                raise TypeError(f"pairs[{i}] is a {type(p).__name__}; expected a ragsieve.Pair "
                                "(filter() takes other snippet forms).")
        by_query: dict[str, list[int]] = {}
        for i, p in enumerate(pairs):
            by_query.setdefault(p.query_id, []).append(i)
        cuts = {qid: self._cut([_as_item(pairs[i], i) for i in idx]) for qid, idx in by_query.items()}
        piece_pairs = [  # scored in one batch, so the scorer can batch across queries
            Pair(qid, pairs[idx[0]].query, f"{it['snippet_id']}#{k}", str(it.get("text") or ""),
                 meta=it)
            for qid, idx in by_query.items() for k, it in enumerate(cuts[qid].pieces)
        ]
        scores = self.scorer.score_pairs(piece_pairs, progress=progress)
        roots = (self.scorer.root_scorer().score_pairs(piece_pairs)
                 if self._wants_root and piece_pairs else None)
        offsets = dict(zip(by_query, np.cumsum([0] + [len(c.pieces) for c in cuts.values()]),
                           strict=False))
        checks = self._see_lists(cuts, offsets, roots, seed)
        out = {}
        for qid, idx in by_query.items():
            start, m = int(offsets[qid]), len(cuts[qid].pieces)
            out[qid] = self._apply(pairs[idx[0]].query, scores[start:start + m], cuts[qid], None,
                                   check=checks[qid])
        return out

    def _see_lists(self, cuts: Mapping[str, _Pieces], offsets: Mapping[str, Any],
                   roots: np.ndarray | None, seed: int) -> dict[str, ListCheck]:
        """The list checks of a batch: its lists shown to the watch in a seeded random order;
        every list flagged when the sequential test fired on the batch."""
        checks: dict[str, ListCheck] = {}
        order = list(cuts)
        np.random.default_rng(seed).shuffle(order)
        for qid in order:
            start, m = int(offsets[qid]), len(cuts[qid].pieces)
            checks[qid] = self._see_list(cuts[qid], None if roots is None else roots[start:start + m])
        alarm = self.list_watch.alarm_check() if self.list_watch is not None else ListCheck()
        return {qid: c if c.outside or not alarm.unlike else alarm for qid, c in checks.items()}

    # ------------------------------------------------------------- artifact
    def to_artifact(self) -> Artifact:
        """The calibrated filter as a sealed :class:`~ragsieve.artifact.Artifact`."""
        tau = self.threshold
        cal = self.calibrator
        params = cal.get_params()
        if params.get("tokenizer") is not None:
            raise ArtifactError("a budget with a custom tokenizer cannot be saved; the artifact "
                                "stores parameters as JSON (use unit='tokens' without a tokenizer).")
        block: dict[str, Any] = {
            "mode": cal.mode,
            "params": {k: v for k, v in params.items() if k != "tokenizer"},
            "state": cal.to_state(),
            "alpha": self.alpha,
            "threshold": None if math.isinf(tau) else tau,
            "threshold_is_infinite": math.isinf(tau),
            "group_by": self.group_by,
            "n_calibration": int(cal.n_calibration_),
            "guarantee": self.guarantee(),
        }
        return Artifact.create(scorer=self.scorer.spec(), calibration=block,
                               policy={"min_keep": self.min_keep, "max_chars": self.max_chars,
                                       "unit": self.unit},
                               data=dict(self.calibration_info), monitor=self.monitor_reference,
                               lists=None if self.lists is None else self.lists.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The JSON artifact (format version 2) as a dict (see :meth:`to_artifact`)."""
        return self.to_artifact().to_dict()

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the calibrated filter as a JSON artifact (atomically)."""
        return self.to_artifact().write(path)

    @classmethod
    def from_artifact(
        cls,
        artifact: Artifact,
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Build the filter an :class:`~ragsieve.artifact.Artifact` stores (see :meth:`load`).

        Raises
        ------
        TypeError
            ``artifact`` is not an ``Artifact`` (a dict goes through :meth:`from_dict`).
        ArtifactError, ScorerMismatchError
            As for :meth:`load`.
        """
        if not isinstance(artifact, Artifact):
            raise TypeError(f"artifact is a {type(artifact).__name__}, expected a "
                            "ragsieve.artifact.Artifact (ConformalFilter.from_dict takes a dict).")
        min_keep = artifact.min_keep
        calibrator = artifact.calibrator()
        group_by = artifact.group_by
        spec = dict(artifact.scorer)
        if scorer is None:
            try:
                scorer = resolve_scorer(spec, **dict(scorer_options or {}))
            except (TypeError, ValueError) as exc:
                if isinstance(exc, ArtifactError):
                    raise
                raise ArtifactError(f"artifact scorer {spec!r} cannot be rebuilt: {exc}") from exc
        if scorer.spec() != spec:
            raise ScorerMismatchError(
                f"the artifact was calibrated with scorer {spec!r} but the supplied scorer is "
                f"{scorer.spec()!r}; a threshold is only valid for the score it was calibrated on. "
                "Recalibrate with this scorer or load without passing one."
            )
        try:
            flt = cls(scorer, calibrator, min_keep=min_keep, group_by=group_by,
                      max_chars=artifact.max_chars, unit=artifact.unit)
        except ValueError as exc:
            raise ArtifactError(f"artifact policy: {exc}") from exc
        flt.calibration_info = dict(artifact.data or {})
        flt.monitor_reference = artifact.monitor_reference()
        flt.lists = artifact.list_record()
        flt.watch_lists()
        return flt

    @classmethod
    def from_dict(
        cls,
        payload: Mapping[str, Any],
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Rebuild a filter from an artifact dict, checked as a file is checked (every
        field, the seal: :meth:`Artifact.from_dict <ragsieve.artifact.Artifact.from_dict>`);
        see :meth:`load`."""
        return cls.from_artifact(Artifact.from_dict(payload), scorer=scorer,
                                 scorer_options=scorer_options)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        scorer: Scorer | None = None,
        scorer_options: Mapping[str, Any] | None = None,
    ) -> ConformalFilter:
        """Load a saved filter.

        Parameters
        ----------
        path : path-like
            JSON artifact written by :meth:`save`.
        scorer : Scorer, optional
            Scorer to use; must have the same ``spec()`` as the artifact's, otherwise
            ``ScorerMismatchError``. When None the scorer is rebuilt from the artifact.
        scorer_options : Mapping, optional
            Extra keyword arguments for rebuilding the scorer that do not change its
            scores (e.g. ``{"cache_dir": ...}`` for the embedding scorer).

        Raises
        ------
        ArtifactError
            Unreadable, too large, non-JSON or malformed file, a field of the wrong type,
            an unknown format version, a broken seal, or a threshold that disagrees with
            the stored calibration state (see :func:`read_artifact`).
        ScorerMismatchError
            The supplied scorer differs from the one the threshold was calibrated with.
        """
        return cls.from_artifact(Artifact.read(path), scorer=scorer,
                                 scorer_options=scorer_options)

    def __repr__(self) -> str:
        tau = getattr(self.calibrator, "threshold_", None)
        unit = "" if self.unit == "snippet" else f", unit={self.unit!r}"
        return (f"ConformalFilter(scorer={self.scorer.spec()!r}, mode={self.mode!r}, "
                f"alpha={self.alpha}, threshold={tau}{unit})")


#: The artifact's seal (kept here for callers of the filter module's private names).
_checksum = seal_value


def read_artifact_text(path: str | os.PathLike[str], *,
                       max_bytes: int = MAX_ARTIFACT_BYTES) -> str:
    """The text of an artifact file, size-capped (:func:`ragsieve.artifact.read_text`)."""
    return read_text(path, max_bytes=max_bytes)


def parse_artifact(text: str, source: str) -> dict[str, Any]:
    """Parse an artifact's text, type-check every field and verify its seal; the checked
    dict (:meth:`Artifact.parse <ragsieve.artifact.Artifact.parse>`, which gives the
    typed record).

    Raises
    ------
    ArtifactError
        Not strict JSON, not an object, or a field of the wrong type, or a broken seal;
        the message names ``source``.
    """
    return Artifact.parse(text, source).to_dict()


def check_artifact_fields(payload: Any) -> int:
    """Type-check every top-level field of an artifact dict and verify its seal; the format
    version (:func:`ragsieve.artifact.check_fields`)."""
    return check_fields(payload)


def read_artifact(path: str | os.PathLike[str], *,
                  max_bytes: int = MAX_ARTIFACT_BYTES) -> dict[str, Any]:
    """Read a filter artifact (checked, seal verified) as a dict, without building the filter.

    :meth:`Artifact.read <ragsieve.artifact.Artifact.read>` gives the typed record.

    Parameters
    ----------
    path : path-like
        The JSON artifact.
    max_bytes : int, default=64 MiB
        Larger files are refused before they are read.

    Raises
    ------
    ArtifactError
        The file cannot be read, is too large (``ArtifactTooLargeError``), is not UTF-8 or
        JSON, or a field or the seal is refused.
    """
    return Artifact.read(path, max_bytes=max_bytes).to_dict()
