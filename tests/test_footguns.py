"""What a new user trips over first: each gets a clear error or the behaviour expected.

A bare string where a list of snippets goes; ``ConformalFilter(alpha=10)``; policy
keywords to ``from_file``; argparse's usage block before a one-line error; the ``id`` key
on the Python API and over HTTP; the ``langchain`` extra's ``ContextualCompressionRetriever``;
``to_json`` of the LlamaIndex postprocessor.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ragsieve import ConformalFilter, Pair, Snippet
from ragsieve.calibration import SplitConformalCalibrator
from ragsieve.errors import DataError
from ragsieve.scoring import FieldScorer

ROOT = Path(__file__).resolve().parents[1]
QUERY = "Which team won Super Bowl 50?"
TEXTS = ["The Denver Broncos defeated the Carolina Panthers to win Super Bowl 50.",
         "Zebra migration patterns in the Serengeti.",
         "The boiling point of tungsten is about 5,930 degrees Celsius."]


@pytest.fixture(scope="module")
def text_filter(minilm_scorer: Any) -> ConformalFilter:
    """MiniLM with a threshold between the answer's score and the others'."""
    scores = minilm_scorer.score_batch(QUERY, TEXTS)
    tau = float(scores[0] + scores[1:].min()) / 2
    cal = SplitConformalCalibrator(alpha=0.5).fit([tau - 0.01, tau, tau + 0.01])
    return ConformalFilter(minilm_scorer, cal)


@pytest.fixture(scope="module")
def strict_artifact(tmp_path_factory: pytest.TempPathFactory, minilm_scorer: Any) -> Path:
    """An embedding-score artifact whose threshold keeps nothing of :data:`TEXTS`."""
    cal = SplitConformalCalibrator(alpha=0.5).fit([0.001, 0.002, 0.003])
    flt = ConformalFilter(minilm_scorer, cal)
    return flt.save(tmp_path_factory.mktemp("footguns") / "strict.json")


def _field_pairs() -> list[Pair]:
    rng = np.random.default_rng(0)
    pairs = []
    for q in range(40):
        for s in range(4):
            relevant = int(s == 0)
            score = float(rng.uniform(0.0, 0.5) if relevant else rng.uniform(0.3, 1.0))
            pairs.append(Pair(f"q{q}", f"question {q}", f"s{s}", f"snippet {s}", relevant,
                              group=f"t{q % 8}", meta={"score": score}))
    return pairs


@pytest.fixture(scope="module")
def field_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    flt = ConformalFilter(FieldScorer("score"), alpha=0.2).calibrate(_field_pairs())
    return flt.save(tmp_path_factory.mktemp("footguns-field") / "field.json")


# ---------------------------------------------------------------- 1. a bare str
@pytest.mark.parametrize("one", ["a string", b"a string", {"text": "a string"},
                                 Snippet("d", 0, 8, "a string")],
                         ids=["str", "bytes", "mapping", "Snippet"])
def test_one_snippet_where_a_sequence_goes(text_filter: ConformalFilter, one: Any) -> None:
    calls = {
        "filter": lambda: text_filter.filter(QUERY, one),
        "filter_scores": lambda: text_filter.filter_scores(QUERY, [0.1] * 8, one),
        "filter_vectors": lambda: text_filter.filter_vectors(QUERY, np.ones(384),
                                                              np.ones((8, 384)), one),
        "piece_texts": lambda: text_filter.piece_texts(one),
    }
    for call in calls.values():
        with pytest.raises(TypeError, match=rf"snippets is a {type(one).__name__} .*"
                                            r"expected a sequence of snippets, e\.g\. \["):
            call()
    pair = Pair("q", QUERY, "0", "a string")
    with pytest.raises(TypeError, match=r"pairs is a Pair .*expected a sequence"):
        text_filter.filter_pairs(pair)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pairs\[0\] is a str; expected a ragsieve.Pair"):
        text_filter.filter_pairs(["a string"])  # type: ignore[list-item]


def test_string_message_shows_the_fix(text_filter: ConformalFilter) -> None:
    with pytest.raises(TypeError, match=r"e\.g\. \['a string'\]"):
        text_filter.filter(QUERY, "a string")
    # the accepted forms still work, and a one-element list is one snippet
    assert text_filter.filter(QUERY, ["a string"]).n_input == 1
    assert text_filter.filter(QUERY, TEXTS).kept_ids == ["0"]
    assert text_filter.filter(QUERY, tuple(TEXTS)).kept_ids == ["0"]


def test_framework_components_refuse_one_document(strict_artifact: Path,
                                                  embedding_cache_dir: Path) -> None:
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.langchain import ConformalCompressor
    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    comp = ConformalCompressor.from_file(strict_artifact, cache_dir=embedding_cache_dir)
    for one in ("a string", Document(page_content="a string")):
        with pytest.raises(TypeError, match=r"documents is a \w+ .*expected a sequence of "
                                            r"langchain_core.documents.*Document"):
            comp.compress_documents(one, QUERY)  # type: ignore[arg-type]
    post = ConformalPostprocessor.from_file(strict_artifact, cache_dir=embedding_cache_dir)
    node = NodeWithScore(node=TextNode(text="a string"), score=0.5)
    for one in ("a string", node):
        with pytest.raises(TypeError, match=r"nodes is a \w+ .*expected a sequence of "
                                            r".*NodeWithScore"):
            post.postprocess_nodes(one, query_str=QUERY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"nodes\[0\] is a str"):
        post.postprocess_nodes(["a string"], query_str=QUERY)  # type: ignore[list-item]


# ---------------------------------------------------------------- 2. alpha at once
@pytest.mark.parametrize("calibrator", [None, "pac", "query-all"])
def test_alpha_checked_in_the_constructor(calibrator: str | None) -> None:
    with pytest.raises(ValueError, match=r"^alpha == 10, must be in \(0, 1\)\.$"):
        ConformalFilter("embedding", calibrator, alpha=10)
    with pytest.raises(ValueError, match=r"alpha == 0, must be in \(0, 1\)"):
        ConformalFilter("embedding", calibrator, alpha=0)
    with pytest.raises(TypeError, match=r"alpha must be a real number, got str"):
        ConformalFilter("embedding", calibrator, alpha="0.1")  # type: ignore[arg-type]
    assert ConformalFilter("embedding", calibrator, alpha=0.25).alpha == 0.25


def test_other_plain_parameters_checked_in_the_constructor() -> None:
    with pytest.raises(ValueError, match=r"min_keep == -1, must be an int >= 0"):
        ConformalFilter("embedding", min_keep=-1)
    with pytest.raises(ValueError, match=r"max_chars == 10"):
        ConformalFilter("embedding", max_chars=10)
    with pytest.raises(ValueError, match=r"group_by == ''"):
        ConformalFilter("embedding", group_by="")


# ---------------------------------------------------------------- 3. from_file keywords
def _components() -> dict[str, Any]:
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    from ragsieve.integrations.haystack import ConformalRanker
    from ragsieve.integrations.langchain import ConformalCompressor
    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    return {"langchain": ConformalCompressor, "llamaindex": ConformalPostprocessor,
            "haystack": ConformalRanker}


def _kept_texts(name: str, component: Any) -> list[str]:
    if name == "langchain":
        from langchain_core.documents import Document

        docs = component.compress_documents([Document(page_content=t) for t in TEXTS], QUERY)
        return [d.page_content for d in docs]
    if name == "llamaindex":
        from llama_index.core.schema import NodeWithScore, TextNode

        nodes = [NodeWithScore(node=TextNode(text=t), score=0.5) for t in TEXTS]
        return [n.node.get_content() for n in component.postprocess_nodes(nodes, query_str=QUERY)]
    from haystack import Document as HDocument

    docs = component.run(query=QUERY, documents=[HDocument(content=t) for t in TEXTS])
    return [d.content for d in docs["documents"]]


@pytest.mark.parametrize("name", ["langchain", "llamaindex", "haystack"])
def test_from_file_takes_policy_keywords(name: str, strict_artifact: Path,
                                         embedding_cache_dir: Path) -> None:
    cls = _components()[name]
    plain = cls.from_file(strict_artifact, cache_dir=embedding_cache_dir)
    assert plain.filter.min_keep == 0 and _kept_texts(name, plain) == []
    kept = cls.from_file(strict_artifact, min_keep=1, cache_dir=embedding_cache_dir)
    assert kept.filter.min_keep == 1
    assert _kept_texts(name, kept) == [TEXTS[0]]  # the best one, by the policy
    assert kept.filter.threshold == plain.filter.threshold
    assert cls.from_file(strict_artifact, max_chars=1000).filter.max_chars == 1000
    with pytest.raises(ValueError, match=r"min_keep == -1, must be an int >= 0"):
        cls.from_file(strict_artifact, min_keep=-1)


@pytest.mark.parametrize("name", ["langchain", "llamaindex", "haystack"])
def test_from_file_unknown_keyword_lists_the_accepted(name: str, strict_artifact: Path,
                                                      field_artifact: Path) -> None:
    cls = _components()[name]
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['min_kep'\]; it "
                                        r"accepts the policy keywords \['min_keep', 'max_chars'\]"
                                        r" and the options of the artifact's 'embedding' scorer "
                                        r"\['backend', 'batch_size', 'cache_dir', 'language'\]"):
        cls.from_file(strict_artifact, min_kep=1)
    with pytest.raises(TypeError, match=r"\['cache_dir'\].*'field' scorer \[\]"):
        cls.from_file(field_artifact, cache_dir="x")


def test_haystack_policy_survives_serialisation(strict_artifact: Path,
                                                embedding_cache_dir: Path) -> None:
    ranker_cls = _components()["haystack"]
    ranker = ranker_cls.from_file(strict_artifact, min_keep=1, cache_dir=embedding_cache_dir)
    data = ranker.to_dict()
    assert data["init_parameters"]["min_keep"] == 1
    again = ranker_cls.from_dict(data)
    assert again.filter.min_keep == 1 and _kept_texts("haystack", again) == [TEXTS[0]]
    with pytest.raises(ValueError, match="apply when loading from path"):
        ranker_cls(filter=ranker.filter, min_keep=1)


# ---------------------------------------------------------------- 4. one-line usage errors
@pytest.mark.parametrize("argv, needle", [
    (["calibrate", "--data", "d.jsonl", "--out", "f.json", "--alpha", "0.9,0.1"],
     "ragsieve calibrate: error: argument --alpha: expected a finite number, got '0.9,0.1'"),
    (["evaluate", "--data", "d.jsonl", "--splits", "0"],
     "ragsieve evaluate: error: argument --splits: "),
    (["calibrate", "--data", "d.jsonl", "--out", "f.json", "--mod", "pac"],
     "ragsieve: error: unrecognized arguments: --mod pac"),
    (["calibrate", "--out", "f.json"],
     "ragsieve calibrate: error: the following arguments are required: --data"),
    (["no-such-command"], "ragsieve: error: argument COMMAND: invalid choice: 'no-such-command'"),
])
def test_usage_errors_are_one_line(argv: list[str], needle: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(needle), err
    assert "usage:" not in err and err.rstrip().endswith("--help')")


def test_help_still_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from ragsieve.cli import build_parser, main

    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--help"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("usage: ragsieve calibrate")
    parser = build_parser()
    subparsers = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert not parser.allow_abbrev and all(not p.allow_abbrev for p in subparsers.values())


# ---------------------------------------------------------------- 5. id on both surfaces
def test_id_key_one_rule_in_python(field_artifact: Path) -> None:
    flt = ConformalFilter.load(field_artifact)
    res = flt.filter(QUERY, [{"id": "a", "score": 0.01}, {"snippet_id": "b", "score": 0.99}])
    assert res.kept_ids == ["a"]
    with pytest.raises(DataError, match=r"snippet 0 has both 'snippet_id' \('a'\) and 'id' "
                                        r"\('a'\).*give one"):
        flt.filter(QUERY, [{"snippet_id": "a", "id": "a", "score": 0.01}])


def test_id_key_one_rule_over_http(field_artifact: Path, tmp_path: Path) -> None:
    from servers import serving

    flt = ConformalFilter.load(field_artifact)
    snippets = [{"id": "a", "score": 0.01}, {"snippet_id": "b", "score": 0.99}, {"score": 0.02}]
    with serving(field_artifact, state_dir=tmp_path / "state") as srv:
        r = httpx.post(srv.url + "/filter", json={"query": QUERY, "snippets": snippets},
                       timeout=30)
        assert r.status_code == 200, r.text
        kept = [s["snippet_id"] for s in r.json()["kept"]]
        assert kept == flt.filter(QUERY, snippets).kept_ids == ["a", "2"]
        both = {"query": QUERY, "snippets": [{"snippet_id": "a", "id": "a", "score": 0.01}]}
        r = httpx.post(srv.url + "/filter", json=both, timeout=30)
        assert r.status_code == 422, r.text
        assert "both 'snippet_id' and 'id'" in r.text
        schema = httpx.get(srv.url + "/openapi.json", timeout=30).json()
        assert "also accepted as 'id'" in json.dumps(schema["components"]["schemas"]["SnippetIn"])


# ---------------------------------------------------------------- 6. the langchain extra
def test_langchain_extra_has_the_retriever_the_docs_name() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(r.startswith("langchain-classic") for r in extras["langchain"])
    from ragsieve.integrations import langchain as module

    found = re.search(r"``from (\S+) import (ContextualCompressionRetriever)``",
                      module.__doc__ or "")
    assert found is not None, module.__doc__
    assert found.group(1) == "langchain_classic.retrievers"
    # the import the docs give works with the extra installed
    retriever = getattr(importlib.import_module(found.group(1)), found.group(2))
    assert retriever.__name__ == "ContextualCompressionRetriever"


# ---------------------------------------------------------------- 7. LlamaIndex to_json
def test_llamaindex_postprocessor_serialises(strict_artifact: Path, embedding_cache_dir: Path,
                                             field_artifact: Path) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    post = ConformalPostprocessor.from_file(strict_artifact, min_keep=1,
                                            cache_dir=embedding_cache_dir)
    text = post.to_json()
    data = json.loads(text)
    assert data["class_name"] == "RagsieveConformalPostprocessor"
    assert data["filter"]["format"] == "ragsieve.filter"
    assert data["scorer_options"] == {"cache_dir": str(embedding_cache_dir)}
    for again in (ConformalPostprocessor.from_json(text),
                  ConformalPostprocessor.from_dict(post.to_dict())):
        assert again is not post and again.filter is not post.filter
        assert again.filter.threshold == post.filter.threshold
        assert again.filter.min_keep == 1
        assert again.scorer_options == {"cache_dir": os.fspath(embedding_cache_dir)}
        assert again.filter.scorer.spec() == post.filter.scorer.spec()
        assert _kept_texts("llamaindex", again) == _kept_texts("llamaindex", post) == [TEXTS[0]]
    # a filter built in memory serialises the same way
    mem = ConformalPostprocessor(filter=ConformalFilter.load(field_artifact))
    back = ConformalPostprocessor.from_json(mem.to_json())
    nodes = [NodeWithScore(node=TextNode(text=t, metadata={"score": s}), score=0.5)
             for t, s in zip(TEXTS, (0.01, 0.99, 0.02), strict=True)]
    assert ([n.node.get_content() for n in back.postprocess_nodes(nodes, query_str=QUERY)]
            == [TEXTS[0], TEXTS[2]])
    # an edited artifact in the dict is refused like an edited file
    data["filter"]["calibration"]["state"]["threshold"] = 0.5
    with pytest.raises(Exception, match="checksum|disagrees"):
        ConformalPostprocessor.from_dict(data)
