"""A scorer's flags are one record, ``Scorer.tags`` (:class:`ragsieve.ScorerTags`).

Every registered scorer states its tags as one ``ScorerTags`` of bools (per instance where a
flag follows the scorer's parts), no scorer class keeps a flag as its own attribute, a user's
scorer that sets nothing gets the defaults, and nothing outside ``scoring/`` asks a scorer's
class what it can do (``isinstance``): it asks the tags.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ragsieve.engines  # noqa: F401  (EngineScorer, a Scorer outside scoring/)
from ragsieve import Pair, ScorerTags
from ragsieve.engines.scorer import EngineScorer
from ragsieve.scoring import (
    FieldScorer,
    FusedScorer,
    Scorer,
    SentenceContextScorer,
    registered_scorers,
    resolve_scorer,
)
from ragsieve.scoring.registry import _lookup
from ragsieve.scoring.tags import TAG_NAMES

SRC = Path(__file__).resolve().parents[1] / "src" / "ragsieve"


def _all_bools(tags: Any) -> None:
    assert isinstance(tags, ScorerTags), f"tags is {tags!r}, expected a ScorerTags"
    for field in dataclasses.fields(ScorerTags):
        value = getattr(tags, field.name)
        assert isinstance(value, bool), f"{field.name} is {value!r}, expected a bool"


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.mark.parametrize("alias", registered_scorers())
def test_every_registered_scorer_has_one_record_of_bools(alias: str) -> None:
    factory = _lookup(alias)
    cls = getattr(factory, "__self__", factory)  # FusedScorer.unfitted: its class
    assert issubclass(cls, Scorer)
    _all_bools(cls.tags)


def test_no_scorer_class_keeps_a_flag_as_its_own_attribute() -> None:
    assert TAG_NAMES == {"list_dependent", "reads_text", "costly", "resolved_at_calibration",
                         "thread_safe", "model_free", "sentence_in_context"}
    classes = [Scorer, *_subclasses(Scorer)]
    assert EngineScorer in classes and FusedScorer in classes
    for cls in classes:
        assert not TAG_NAMES & set(vars(cls)), cls
    for name in TAG_NAMES:  # and none inherited either: the record is the one place
        assert not hasattr(Scorer, name), name


def test_instance_tags_follow_the_parts() -> None:
    """The fused and sentence-in-context scores are list-aware when their parts are; the
    engine wrapper reads and depends on lists as the scorer it wraps."""
    portable = FusedScorer.unfitted("embedding", preset="portable")
    fast = FusedScorer.unfitted("embedding", preset="fast")
    assert not portable.tags.list_dependent and fast.tags.list_dependent
    assert type(fast).tags == ScorerTags()  # the class record is untouched
    context = SentenceContextScorer("relative")
    assert context.tags.list_dependent and context.tags.sentence_in_context
    assert not SentenceContextScorer("embedding").tags.list_dependent
    field = FieldScorer(field="bm25")
    wrapped = EngineScorer(field, engine=None)
    assert (wrapped.tags.reads_text, wrapped.tags.list_dependent) == (False, False)
    assert EngineScorer(resolve_scorer("relative"), engine=None).tags.list_dependent
    for scorer in (portable, fast, context, field, wrapped):
        _all_bools(scorer.tags)


def test_the_record_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ScorerTags().reads_text = False  # type: ignore[misc]


class _Plain(Scorer):
    """A user's scorer that sets no tags: the snippet's length."""

    name = "plain-length"

    def score_batch(self, query: str, snippets: Sequence[str]) -> np.ndarray:
        return np.array([float(len(s)) for s in snippets])

    def spec(self) -> dict[str, Any]:
        return {"scorer": self.name}


def test_a_user_scorer_that_sets_nothing_gets_the_defaults() -> None:
    scorer = _Plain()
    assert scorer.tags == ScorerTags()
    assert scorer.tags.reads_text and not scorer.tags.list_dependent
    assert not (scorer.tags.thread_safe or scorer.tags.model_free or scorer.tags.costly)
    assert scorer.is_fitted  # state, not a tag
    pairs = [Pair("q1", "Q?", "a", "abc"), Pair("q1", "Q?", "b", "a")]
    np.testing.assert_array_equal(scorer.score_pairs(pairs), [3.0, 1.0])


def test_a_flag_set_as_a_class_attribute_is_refused() -> None:
    with pytest.raises(TypeError, match=r"reads_text.*tags = ScorerTags\(reads_text=\.\.\.\)"):
        type("Loose", (_Plain,), {"reads_text": False})
    tagged = type("Tagged", (_Plain,), {"tags": ScorerTags(reads_text=False)})
    assert tagged().tags.reads_text is False


def _scorer_class_names() -> set[str]:
    return {cls.__name__ for cls in (Scorer, *_subclasses(Scorer))
            if cls.__module__.startswith("ragsieve.")}


def _names(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Tuple):
        for element in node.elts:
            yield from _names(element)
    elif isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield node.attr


def test_nothing_outside_scoring_checks_a_scorer_class() -> None:
    """Ask, don't peek: outside ``scoring/`` no ``isinstance`` / ``issubclass`` names a
    scorer class (``check_instance(x, Scorer, ...)`` at an input boundary validates, it
    does not ask what a scorer can do)."""
    scorers = _scorer_class_names()
    assert {"Scorer", "FusedScorer", "RerankScorer", "EngineScorer"} <= scorers
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if (SRC / "scoring") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
                hit = scorers & set(_names(node.args[1]))
                if hit:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {sorted(hit)}")
    assert found == []
