"""LLM nonconformity score: ``A(q, s) = 1 - r`` with ``r`` in [0, 1] from an LLM.

Two modes (prompt texts and versions in :mod:`ragsieve.llm.prompts`):

``rating``
    The paper's verbal rating: the model replies with a number in [0, 1], parsed
    strictly. An unparseable reply is asked again once and then recorded as an error.
``logprob``
    ``r`` = P(yes) / (P(yes) + P(no)) from the first-token log-probabilities of the
    yes/no relevance prompt: continuous, free of the coarse steps of verbal ratings.

Ties and discrete scores
------------------------
Verbal ratings take few values (0.0, 0.1, ..., 1.0), so many calibration and test
scores tie with tau. Keeping ``A <= tau`` then over-covers: coverage is at least
``1 - alpha`` but can be far above it, and removal suffers. ``tie_breaking="random"``
adds to each score a uniform jitter in ``[0, TIE_JITTER)`` drawn from a hash of
(seed, query, snippet), the same for a pair at calibration and at test time and
independent across pairs. The jittered scores are continuous and exchangeable, so
coverage lands in ``[1 - alpha, 1 - alpha + 1/(n+1)]`` instead of above it
(randomised / smoothed conformal prediction). ``TIE_JITTER`` (1e-4) is below the step
of any rating grid we parse (two decimals at most give steps of 0.01), so the jitter
only orders tied pairs and never swaps pairs with different ratings. The default
``"none"`` keeps the conservative rule.

Errors
------
Pairs whose reply could not be used never get a score: :meth:`LLMScorer.score_pairs`
raises :class:`~ragsieve.errors.ScorerError` whose ``scores`` attribute holds every
score that was obtained (NaN for the failed pairs) and whose ``errors`` lists the
failures, and every good reply is in the persistent LLM cache, so nothing computed is
lost and a rerun asks only again for what failed.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import ScorerError
from ..types import Pair
from .base import Scorer
from .options import ScorerOption
from .tags import ScorerTags

if TYPE_CHECKING:
    from ..llm.connect import LLMConnection, LLMTarget
    from ..llm.judge import RelevanceJudge

__all__ = ["LLM_MODES", "TIE_JITTER", "LLMScorer"]

logger = logging.getLogger(__name__)

LLM_MODES = ("logprob", "rating")
TIE_BREAKING = ("none", "random")
TIE_JITTER = 1e-4


def _prompt_version(mode: str, style: str) -> str:
    """Version of the prompt ``mode`` uses in ``style`` (as ``RelevanceJudge.prompt_version``)."""
    from ..llm.prompts import build_prompt

    return build_prompt("rating" if mode == "rating" else "judge", "q", "s", style=style).version


def _jitter(seed: int, query: str, snippet: str) -> float:
    digest = hashlib.sha256(f"{seed}\x1f{query}\x1f{snippet}".encode()).digest()
    return struct.unpack(">Q", digest[:8])[0] / 2**64 * TIE_JITTER


class LLMScorer(Scorer):
    """Relevance rated by an LLM behind an OpenAI-compatible API.

    Parameters
    ----------
    connection : LLMConnection, optional
        An open connection (see :func:`ragsieve.llm.connect`). When None, one is opened
        on first use from ``base_url`` / ``model`` — or, without a base URL, by starting
        the local default model on 127.0.0.1 for the lifetime of the scorer.
    mode : {"logprob", "rating"}
        How the LLM's judgement becomes a score (see the module docstring).
    model, base_url : str, optional
        Endpoint to open when no connection is given.
    prompt_version : str, optional
        When given (e.g. from a saved artifact) it must equal the version of the prompt
        this library would use, otherwise ``ValueError``: a threshold calibrated with
        one prompt is not valid for another.
    tie_breaking : {"none", "random"}
        See "Ties and discrete scores" above.
    seed : int
        Seed of the tie-breaking jitter.
    **connect_options
        Passed to :func:`ragsieve.llm.connect` (``style``, ``threads``, ``cache``,
        ``concurrency``, ``api_key_env``, ``timeout``).
    """

    name: ClassVar[str] = "llm"
    score_label: ClassVar[str] = "1 - P(yes)"
    tags = ScorerTags(costly=True)  # a model call per snippet
    declared_options: ClassVar[tuple[ScorerOption, ...]] = (
        ScorerOption("mode", str, "logprob", "scorer llm: P(yes) from logprobs (default) or a "
                     "verbal rating in [0, 1]", "--llm-mode", choices=LLM_MODES, group="llm"),
        ScorerOption("tie_breaking", str, "none", "scorer llm: random jitter so tied (discrete) "
                     "scores cover exactly", "--tie-breaking", choices=TIE_BREAKING, group="llm"),
        ScorerOption("model", str, None, "model name at base_url, or the local model",
                     "--llm-model", group="llm"),
        # the connection's: they change where and how fast, not the scores
        ScorerOption("base_url", str, None, "OpenAI-compatible base URL incl. /v1",
                     "--base-url", runtime=True, group="llm"),
        ScorerOption("style", str, None, "prompt style (completion or chat)", "--llm-style",
                     runtime=True, group="llm"),
        ScorerOption("threads", int, None, "CPU threads of the local model", "--llm-threads",
                     runtime=True, group="llm"),
        ScorerOption("concurrency", int, None, "requests in flight", "--llm-concurrency",
                     runtime=True, group="llm"),
        ScorerOption("api_key_env", str, "OPENAI_API_KEY", "env var holding the API key",
                     "--api-key-env", runtime=True, group="llm"),
        ScorerOption("cache", bool, True, "keep the replies in the on-disk cache", "--no-cache",
                     runtime=True, group="llm"),
        ScorerOption("prompt_version", str, None, "the prompt version a saved filter expects"),
        ScorerOption("seed", int, 0, "seed of the tie-breaking jitter"),
    )

    def __init__(
        self,
        connection: LLMConnection | None = None,
        *,
        mode: str = "logprob",
        model: str | None = None,
        base_url: str | None = None,
        prompt_version: str | None = None,
        tie_breaking: str = "none",
        seed: int = 0,
        **connect_options: Any,
    ) -> None:
        if mode not in LLM_MODES:
            raise ValueError(f"mode == {mode!r}, must be one of {LLM_MODES}.")
        if tie_breaking not in TIE_BREAKING:
            raise ValueError(f"tie_breaking == {tie_breaking!r}, must be one of {TIE_BREAKING}.")
        self.mode = mode
        self.tie_breaking = tie_breaking
        self.seed = int(seed)
        self._connection = connection
        self._owns_connection = connection is None
        self._connect_args = {"model": model, "base_url": base_url, **connect_options}
        self._expected_version = prompt_version
        self.errors: list[dict[str, Any]] = []
        self._judge: RelevanceJudge | None = None
        self._check_version()

    # ------------------------------------------------------------ connection
    @property
    def connection(self) -> LLMConnection:
        """The LLM connection (opened on first use)."""
        if self._connection is None:
            from ..llm.connect import connect

            self._connection = connect(**self._connect_args)
            self._check_version()
        return self._connection

    def _target(self) -> LLMTarget:
        """Model name and prompt style in use, or that the first use will open.

        Never connects: with no connection yet, they come from the constructor arguments
        and the environment, resolved exactly as :func:`ragsieve.llm.connect` will resolve
        them (the local model's name is the one its server will answer to).
        """
        from ..llm.connect import LLMTarget, resolve_target

        conn = self._connection
        if conn is not None:
            return LLMTarget(base_url=conn.base_url, model=conn.model, style=conn.style)
        args = self._connect_args
        return resolve_target(base_url=args["base_url"], model=args["model"],
                              style=args.get("style"))

    def _check_version(self) -> None:
        style = self._target().style
        version = _prompt_version(self.mode, style)
        if self._expected_version is not None and self._expected_version != version:
            raise ValueError(
                f"prompt_version == {self._expected_version!r}, but this ragsieve uses "
                f"{version!r} for mode={self.mode!r} with {style} prompts; "
                "recalibrate with the current prompt."
            )

    @property
    def judge(self) -> RelevanceJudge:
        """The relevance judge on this scorer's connection."""
        from ..llm.judge import RelevanceJudge

        conn = self.connection
        if self._judge is None or self._judge.client is not conn.client:
            self._judge = RelevanceJudge(conn.client, style=conn.style)
        return self._judge

    def close(self) -> None:
        """Close the connection this scorer opened (stops a local server it started)."""
        if self._owns_connection and self._connection is not None:
            self._connection.close()
            self._connection = None

    def spec(self) -> dict[str, Any]:
        """``{"scorer": "llm", "mode", "model", "prompt_version", "tie_breaking", "seed"}``.

        Derived from the constructor arguments (or the open connection): asking for the
        spec never starts a server or opens a connection. Without a ``base_url`` the
        model is the local model's name (``"gemma3-270m"`` by default), the name its
        server answers to once started, so artifacts match either way.

        Raises
        ------
        ValueError
            For a ``base_url`` without a model name (as the first use would).
        """
        target = self._target()
        return {
            "scorer": self.name,
            "mode": self.mode,
            "model": target.require_model(),
            "prompt_version": _prompt_version(self.mode, target.style),
            "tie_breaking": self.tie_breaking,
            "seed": self.seed,
        }

    # -------------------------------------------------------------- scoring
    def _score_items(self, items: Sequence[tuple[str, str]], *, progress: bool,
                     labels: Sequence[str] | None = None) -> np.ndarray:
        uniq = list(dict.fromkeys(items))
        judgements = self.judge.judge_many(self.mode, uniq, progress=progress,
                                           desc=f"LLM {self.mode} ({self.connection.model})")
        by_item = dict(zip(uniq, judgements))
        scores = np.full(len(items), np.nan)
        self.errors = []
        for i, item in enumerate(items):
            j = by_item[item]
            if j.value is None:
                self.errors.append({"index": i, "id": labels[i] if labels else str(i),
                                    "answer": j.answer, "error": j.error})
                continue
            score = 1.0 - j.value
            if self.tie_breaking == "random":
                score += _jitter(self.seed, item[0], item[1])
            scores[i] = score
        if self.errors:
            first = self.errors[0]
            err = ScorerError(
                f"{len(self.errors)} of {len(items)} LLM replies could not be used "
                f"(first: {first['id']}: {first['error']}); the other scores are in "
                "ScorerError.scores and every good reply is cached, so a rerun only asks again "
                "for these."
            )
            err.scores = scores  # type: ignore[attr-defined]
            err.errors = list(self.errors)  # type: ignore[attr-defined]
            raise err
        return scores

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        """Score one query's snippets; see :meth:`Scorer.score_batch`."""
        if not isinstance(query, str):
            raise TypeError(f"query is {type(query).__name__}, expected str.")
        if isinstance(snippets, str):
            raise TypeError("snippets is a single string; pass a list of str, e.g. [text].")
        return self._score_items([(query, s) for s in snippets], progress=False)

    def score_pairs(self, pairs: Sequence[Pair], *, progress: bool = False) -> np.ndarray:
        """Score many pairs concurrently (one pass over all unique pairs)."""
        pairs = list(pairs)
        return self._score_items([(p.query, p.text) for p in pairs], progress=progress,
                                 labels=[f"{p.query_id}/{p.snippet_id}" for p in pairs])

    def __repr__(self) -> str:
        return f"LLMScorer(mode={self.mode!r}, tie_breaking={self.tie_breaking!r})"
