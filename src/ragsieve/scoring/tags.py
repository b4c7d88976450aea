"""What a scorer can do, in one record: :class:`ScorerTags` (scikit-learn's ``Tags``).

Callers ask a scorer's ``tags`` instead of checking its class or name. Every field is a
bool whose default claims nothing unusual, so a scorer written by a user that sets no tags
is treated as a text-reading, pointwise, thread-unsafe score that calls a model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["TAG_NAMES", "ScorerTags"]


@dataclass(frozen=True)
class ScorerTags:
    """The capabilities of a scorer, asked by callers instead of its type.

    A scorer states them once, as the class attribute ``tags`` (or, where a flag follows
    the scorer's parts, per instance in ``__init__``); the defaults fit a user's scorer
    that sets nothing.

    Attributes
    ----------
    list_dependent : bool
        True: a snippet's score depends on the other snippets of its query's list
        (relative and fused scores); calibration then scores whole lists and the served
        lists are watched. Default False.
    reads_text : bool
        True: the score is computed from the snippet's text, so a text longer than the
        model's window is cut into pieces. False for a score handed in (``field``).
        Default True.
    costly : bool
        True: every scored snippet costs a model call callers should not spend without
        need (an LLM, a reranker endpoint); ``calibrate`` then skips the monitor's
        reference. Default False.
    resolved_at_calibration : bool
        True: a stand-in that ``ConformalFilter.calibrate`` turns into a real score once
        it sees the calibration pairs (``"auto"``: ``Scorer.resolve_for``). Default False.
    thread_safe : bool
        True: ``score_batch`` may be called from several threads at once (after a first
        call has loaded what it needs); the service then scores without a lock.
        Default False.
    model_free : bool
        True: scoring loads and calls no model (the score is handed in: ``field``); the
        service then has nothing to warm up and scores outside its model thread.
        Default False.
    sentence_in_context : bool
        True: a score of sentences that reads each sentence's snippet as its context
        (``sentence_context``); it is used with unit ``"sentence"`` only. Default False.

    Examples
    --------
    >>> ScorerTags(reads_text=False, model_free=True).reads_text
    False
    >>> ScorerTags().thread_safe
    False
    """

    list_dependent: bool = False
    reads_text: bool = True
    costly: bool = False
    resolved_at_calibration: bool = False
    thread_safe: bool = False
    model_free: bool = False
    sentence_in_context: bool = False


#: The names of the tags: a scorer class that still defines one as its own attribute is
#: refused (``Scorer.__init_subclass__``), since nothing reads it there any more.
TAG_NAMES: frozenset[str] = frozenset(f.name for f in fields(ScorerTags))
