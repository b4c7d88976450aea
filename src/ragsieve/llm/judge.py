"""Ask an LLM about the relevance of (query, snippet) pairs; parse strictly.

``RelevanceJudge`` is shared by the LLM scorer and the LLM labeller. It has three
ways of asking, each returning a :class:`Judgement`:

``logprob``
    The yes/no prompt, one generated token, and P(yes) / (P(yes) + P(no)) from the
    first token's top log-probabilities: a continuous value in [0, 1].
``rating``
    The rating prompt; the reply must be a single number in [0, 1]
    (:func:`~ragsieve.llm.prompts.parse_rating`).
``yes-no``
    The yes/no prompt; the reply's first word must be yes or no.

A reply that cannot be parsed is asked again once with a repair request (chat: a
follow-up message; completion: one sampled retry at temperature 0.7) and is then
recorded as an error (``Judgement.error``); it never becomes a value. HTTP failures are
retried by the client and, if they persist, also end as an error of that pair only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import LLMError
from .prompts import (
    REPAIR_MESSAGE,
    Prompt,
    build_prompt,
    parse_rating,
    parse_yes_no,
    yes_probability,
)

if TYPE_CHECKING:
    from .client import Completion, LLMClient

__all__ = ["JUDGE_MODES", "Judgement", "RelevanceJudge"]

logger = logging.getLogger(__name__)

JUDGE_MODES = ("logprob", "rating", "yes-no")
TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Judgement:
    """The outcome of asking about one pair.

    Attributes
    ----------
    value : float or None
        P(yes) (``logprob``), the rating (``rating``) or 1.0 / 0.0 (``yes-no``);
        ``None`` when the pair ended in an error.
    answer : str
        The raw reply text of the last attempt (empty when no reply arrived).
    error : str or None
        Why there is no value.
    attempts : int
        Requests made for this pair (1, or 2 with a repair).
    prompt_tokens, completion_tokens : int
        Token usage reported by the server (0 for cached replies is not assumed: the
        cached reply's usage is reported too).
    """

    value: float | None
    answer: str
    error: str | None = None
    attempts: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.value is not None


class RelevanceJudge:
    """Ask an OpenAI-compatible LLM about relevance, with versioned prompts.

    Parameters
    ----------
    client : LLMClient
        The one LLM client (retries, concurrency, persistent cache).
    style : {"completion", "chat"}
        Prompt style: ``completion`` for base models, ``chat`` for instruction models.
    """

    def __init__(self, client: LLMClient, *, style: str = "completion") -> None:
        if style not in ("completion", "chat"):
            raise ValueError(f"style == {style!r}, must be 'completion' or 'chat'.")
        self.client = client
        self.style = style

    def prompt_version(self, mode: str) -> str:
        """Version string of the prompt used by ``mode``."""
        return build_prompt(_task(mode), "q", "s", style=self.style).version

    def send(self, prompt: Prompt, *, max_tokens: int, logprobs: int | None = None,
             temperature: float = 0.0, repair: tuple[str, str] | None = None) -> Completion:
        """Send a prompt in this judge's style and return the raw completion.

        Text answers of completion-style prompts stop at the end of the line (a base model
        would go on writing the next example); a logprob request reads only the first
        token and sets no stop, so a newline token keeps its log-probabilities.
        """
        if self.style == "completion":
            assert prompt.text is not None
            extra: dict[str, Any] = {"seed": 1234} if temperature > 0 else {}
            if logprobs is None:
                extra["stop"] = ["\n"]
            return self.client.complete(
                prompt.text, max_tokens=max_tokens, temperature=temperature, logprobs=logprobs,
                prompt_version=prompt.version, **extra,
            )
        assert prompt.messages is not None
        messages = [dict(m) for m in prompt.messages]
        if repair is not None:
            messages += [{"role": "assistant", "content": repair[0]}, {"role": "user", "content": repair[1]}]
        return self.client.chat(
            messages, max_tokens=max_tokens, temperature=temperature, logprobs=logprobs,
            prompt_version=prompt.version,
        )

    def judge(self, mode: str, query: str, snippet: str) -> Judgement:
        """Ask about one pair; never raises for a bad reply or a failed request."""
        if mode not in JUDGE_MODES:
            raise ValueError(f"mode == {mode!r}, must be one of {JUDGE_MODES}.")
        prompt = build_prompt(_task(mode), query, snippet, style=self.style)
        try:
            if mode == "logprob":
                return self._judge_logprob(prompt)
            return self._judge_text(mode, prompt)
        except LLMError as exc:  # recorded for this pair; the other pairs go on
            return Judgement(value=None, answer="", error=f"request failed: {exc}")

    def _judge_logprob(self, prompt: Prompt) -> Judgement:
        c = self.send(prompt, max_tokens=1, logprobs=TOP_LOGPROBS)
        first = c.top_logprobs[0] if c.top_logprobs else {}
        p = yes_probability(first)
        error = None
        if p is None:
            shown = ", ".join(repr(t) for t in list(first)[:5]) or "none"
            error = (f"neither 'yes' nor 'no' among the first token's top {TOP_LOGPROBS} "
                     f"alternatives (got {shown})")
        return Judgement(p, c.text, error=error, prompt_tokens=c.prompt_tokens,
                         completion_tokens=c.completion_tokens)

    def _judge_text(self, mode: str, prompt: Prompt) -> Judgement:
        parse = parse_rating if mode == "rating" else parse_yes_no
        max_tokens = 6 if mode == "rating" else 3
        c = self.send(prompt, max_tokens=max_tokens)
        tokens = [c.prompt_tokens, c.completion_tokens]
        value = parse(c.text)
        if value is not None:
            return Judgement(float(value), c.text, prompt_tokens=tokens[0], completion_tokens=tokens[1])
        first_reply = c.text
        if self.style == "chat":
            c = self.send(prompt, max_tokens=max_tokens, repair=(first_reply, REPAIR_MESSAGE[_task(mode)]))
        else:
            c = self.send(prompt, max_tokens=max_tokens, temperature=0.7)
        tokens = [tokens[0] + c.prompt_tokens, tokens[1] + c.completion_tokens]
        value = parse(c.text)
        if value is not None:
            return Judgement(float(value), c.text, attempts=2, prompt_tokens=tokens[0],
                             completion_tokens=tokens[1])
        what = "a number in [0, 1]" if mode == "rating" else "yes or no"
        return Judgement(None, c.text, attempts=2, prompt_tokens=tokens[0], completion_tokens=tokens[1],
                         error=f"unparseable reply {first_reply!r}, then {c.text!r}; expected {what}")

    def judge_many(self, mode: str, items: Sequence[tuple[str, str]], *, progress: bool = False,
                   desc: str = "") -> list[Judgement]:
        """Judge many (query, snippet) pairs concurrently through the client; order kept."""
        results = self.client.map(lambda qs: self.judge(mode, qs[0], qs[1]), list(items),
                                  progress=progress, desc=desc or f"LLM {mode}")
        out: list[Judgement] = []
        for r in results:
            if isinstance(r, BaseException):
                # judge() already records LLM failures per pair; anything else is a bug or an
                # interrupt, and must not pass for an unusable reply
                raise r
            else:
                out.append(r)
        return out


def _task(mode: str) -> str:
    return "rating" if mode == "rating" else "judge"
