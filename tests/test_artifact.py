"""The saved filter's room: ``ragsieve.artifact`` reads, writes, seals and identifies it.

Real components throughout: a filter calibrated on an outside score (no model needed) is
written, read back, tampered with and compared.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragsieve import ConformalFilter, FieldScorer, Pair
from ragsieve.artifact import ARTIFACT_FORMAT, Artifact
from ragsieve.errors import ArtifactError, ScorerMismatchError

SRC = Path(__file__).resolve().parents[1] / "src" / "ragsieve"


def _pairs(shift: float = 0.0) -> list[Pair]:
    rng = np.random.default_rng(0)
    pairs = []
    for q in range(40):
        for s in range(4):
            relevant = int(s == 0)
            score = float(rng.uniform(0.0, 0.5) if relevant else rng.uniform(0.3, 1.0)) + shift
            pairs.append(Pair(f"q{q}", f"question {q}", f"s{s}", f"snippet {s}", relevant,
                              group=f"t{q % 8}", meta={"score": score}))
    return pairs


@pytest.fixture(scope="module")
def flt() -> ConformalFilter:
    return ConformalFilter(FieldScorer("score"), alpha=0.2).calibrate(_pairs())


@pytest.fixture(scope="module")
def artifact(flt: ConformalFilter) -> Artifact:
    return flt.to_artifact()


def _edited(artifact: Artifact, **fields: Any) -> dict[str, Any]:
    payload = artifact.to_dict()
    payload.update(fields)
    return payload


# ------------------------------------------------------------------------- round trip
def test_write_read_parse_round_trip(flt: ConformalFilter, artifact: Artifact,
                                     tmp_path: Path) -> None:
    path = artifact.write(tmp_path / "filter.json")
    assert path == tmp_path / "filter.json"
    read = Artifact.read(path)
    assert read == artifact
    assert Artifact.parse(path.read_text(encoding="utf-8"), str(path)) == artifact
    assert Artifact.from_dict(artifact.to_dict()) == artifact
    assert read.format_version == 3 and read.scorer == flt.scorer_.spec()
    assert read.monitor is not None and read.seal is not None and read.data is not None
    back = ConformalFilter.from_artifact(read)
    assert back.threshold == flt.threshold and back.mode == flt.mode
    assert back.monitor_reference == flt.monitor_reference
    items = [{"text": f"s{i}", "score": v} for i, v in enumerate([0.1, 0.4, 0.9])]
    assert back.filter("q", items).kept_ids == flt.filter("q", items).kept_ids
    assert back.to_artifact().identity == artifact.identity  # rebuilt, same content
    # the thin wrappers write and read the same record
    assert Artifact.read(flt.save(tmp_path / "saved.json")).identity == artifact.identity
    assert ConformalFilter.load(path).threshold == flt.threshold
    assert ConformalFilter.from_dict(flt.to_dict()).threshold == flt.threshold


def test_the_record_is_frozen_and_hands_out_copies(artifact: Artifact) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        artifact.scorer = {}  # type: ignore[misc]
    payload = artifact.to_dict()
    payload["scorer"]["field"] = "other"
    payload["calibration"]["state"]["threshold"] = 99.0
    assert artifact.scorer["field"] == "score" and artifact.to_dict() != payload
    assert hash(artifact) == hash(Artifact.from_dict(artifact.to_dict()))


def test_from_artifact_takes_an_artifact(flt: ConformalFilter, artifact: Artifact) -> None:
    with pytest.raises(TypeError, match="expected a ragsieve.artifact.Artifact"):
        ConformalFilter.from_artifact(artifact.to_dict())  # type: ignore[arg-type]
    with pytest.raises(ScorerMismatchError, match="calibrated with scorer"):
        ConformalFilter.from_artifact(artifact, scorer=FieldScorer("other"))


# ------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("edit", [
    lambda p: p["calibration"]["state"].update(threshold=p["calibration"]["state"]["threshold"] + 0.01),
    lambda p: p["scorer"].update(higher_is_better=True),
    lambda p: p["policy"].update(min_keep=3),
    lambda p: p["monitor"]["reference"].__setitem__(0, p["monitor"]["reference"][0] + 0.01),
    lambda p: p["checksum"].update(value="0" * 64),
])
def test_a_tampered_sealed_block_is_refused(artifact: Artifact, edit: Any,
                                            tmp_path: Path) -> None:
    payload = artifact.to_dict()
    edit(payload)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    for read in (lambda: Artifact.read(path), lambda: Artifact.from_dict(payload),
                 lambda: Artifact.parse(path.read_text(encoding="utf-8"), "edited.json")):
        with pytest.raises(ArtifactError, match="checksum mismatch"):
            read()


@pytest.mark.parametrize(("fields", "match"), [
    ({"created": {"at": "noon"}}, "'created' is a dict .* expected an ISO-8601"),
    ({"created": "yesterday"}, "expected an ISO-8601"),
    ({"library_version": 3}, "'library_version' is a int .* expected a string"),
    ({"data": ["x"]}, "'data' is a list .* expected an object"),
    ({"format_version": "2"}, "format_version == '2'"),
    ({"format": "other"}, f"format == 'other', expected {ARTIFACT_FORMAT!r}"),
    ({"notes": "hi"}, r"unknown field\(s\) \['notes'\]"),
])
def test_a_wrong_type_is_refused_in_one_line(artifact: Artifact, fields: dict[str, Any],
                                             match: str) -> None:
    text = json.dumps(_edited(artifact, **fields))
    with pytest.raises(ArtifactError, match=match) as info:
        Artifact.parse(text, "edited.json")
    message = str(info.value)
    assert "\n" not in message and message.startswith("filter artifact 'edited.json': ")
    with pytest.raises(ArtifactError, match=match):
        Artifact.from_dict(json.loads(text))


def test_not_json_and_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="is not valid JSON"):
        Artifact.parse('{"threshold": NaN}', "nan.json")
    with pytest.raises(ArtifactError, match="holds a JSON list, expected an object"):
        Artifact.parse("[1, 2]", "list.json")
    with pytest.raises(ArtifactError, match="cannot read filter artifact"):
        Artifact.read(tmp_path / "missing.json")


def test_create_refuses_blocks_that_are_not_json() -> None:
    with pytest.raises(ArtifactError, match="not plain JSON"):
        Artifact.create(scorer={"scorer": "field", "field": "score"},
                        calibration={"threshold": float("nan")}, policy={}, data={})


# ------------------------------------------------------------------------- identity
def test_identity_is_equal_for_the_same_content(artifact: Artifact) -> None:
    compact = json.dumps(artifact.to_dict(), separators=(",", ":"))
    same = Artifact.parse(compact, "compact.json")
    later = Artifact.from_dict(_edited(artifact, created="2030-01-01T00:00:00+00:00",
                                       data={"note": "provenance is not identity"}))
    assert same.identity == later.identity == artifact.identity == artifact.checksum
    assert len(artifact.identity) == 64


def test_identity_differs_for_another_filter(artifact: Artifact) -> None:
    other = ConformalFilter(FieldScorer("score"), alpha=0.1).calibrate(_pairs(shift=0.05))
    assert other.to_artifact().identity != artifact.identity


def test_version_1_artifacts_read_and_have_an_identity() -> None:
    v1 = {"format": ARTIFACT_FORMAT, "format_version": 1,
          "scorer": {"scorer": "field", "field": "score", "higher_is_better": False},
          "calibration": {"alpha": 0.1, "threshold": 0.3, "threshold_is_infinite": False,
                          "n_calibration": 40}}
    art = Artifact.from_dict(v1)
    assert art.checksum is None and art.seal is None and art.monitor is None
    assert art.to_dict() == v1
    assert Artifact.parse(json.dumps(v1, indent=4), "v1.json").identity == art.identity
    moved = json.loads(json.dumps(v1))
    moved["calibration"]["threshold"] = 0.31
    assert Artifact.from_dict(moved).identity != art.identity
    assert ConformalFilter.from_artifact(art).threshold == 0.3
    with pytest.raises(ArtifactError, match="version 1 artifacts have no"):
        Artifact.from_dict({**v1, "checksum": {"algorithm": "sha256"}})


# ------------------------------------------------------------------------- one reader
#: Top-level fields only an artifact has: read them from an ``Artifact``, not a dict.
_TOP_LEVEL = frozenset({"checksum", "format_version", "library_version", "created"})
#: Dict readers that ``ragsieve.filter`` once forwarded (they returned dicts): no module uses them.
_DICT_READERS = frozenset({"parse_artifact", "read_artifact", "read_artifact_text",
                           "check_artifact_fields"})
#: Modules that still read the dict view of an ``Artifact`` (``to_dict()``), and why.
_DICT_VIEWS: dict[str, str] = {}


def _string_keys(tree: ast.AST) -> list[tuple[str, int]]:
    """``x["key"]`` and ``x.get("key")`` with a constant string key, and their lines."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args
              and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if isinstance(key, str):
            found.append((key, node.lineno))
    return found


def test_no_module_outside_artifact_parses_artifact_dicts() -> None:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "artifact.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if rel not in _DICT_VIEWS:
            problems += [f"{rel}:{line}: reads the artifact field {key!r} from a dict"
                         for key, line in _string_keys(tree) if key in _TOP_LEVEL]
        for node in ast.walk(tree):
            name = (node.id if isinstance(node, ast.Name) else node.attr
                    if isinstance(node, ast.Attribute) else None)
            if isinstance(node, (ast.alias, ast.FunctionDef)):
                name = node.name
            if name in _DICT_READERS:
                problems.append(f"{rel}:{getattr(node, 'lineno', '?')}: uses {name}; "
                                "read with ragsieve.artifact.Artifact")
    assert not problems, "\n".join(problems)
    assert not (SRC / "_seal.py").exists(), "the seal lives in ragsieve.artifact"


def test_artifact_has_its_own_layer() -> None:
    from test_layers import LAYERS, check_layers

    assert LAYERS["calibration"] < LAYERS["artifact"] < min(LAYERS["filter"],
                                                             LAYERS["monitoring"])
    graph = {"ragsieve.artifact": [("ragsieve.filter", "artifact.py:1"),
                                   ("ragsieve.scoring", "artifact.py:2"),
                                   ("ragsieve.calibration", "artifact.py:3")]}
    where = [p.split(": ")[0] for p in check_layers(graph)]
    assert where == ["artifact.py:1", "artifact.py:2"]


def test_llamaindex_serialises_through_the_artifact(flt: ConformalFilter,
                                                    artifact: Artifact) -> None:
    pytest.importorskip("llama_index.core")
    from ragsieve.integrations.llamaindex import ConformalPostprocessor

    post = ConformalPostprocessor(filter=flt)
    data = json.loads(post.to_json())
    assert Artifact.from_dict(data["filter"]).identity == artifact.identity
    back = ConformalPostprocessor.from_json(post.to_json())
    assert back.filter.threshold == flt.threshold
    given = ConformalPostprocessor(filter=artifact)  # an Artifact is rebuilt too
    assert given.filter.to_artifact().identity == artifact.identity
    data["filter"]["calibration"]["state"]["threshold"] += 0.01
    with pytest.raises(ValueError, match="checksum mismatch"):  # pydantic wraps ArtifactError
        ConformalPostprocessor.from_dict(data)


# ------------------------------------------------------------------------- files written before
#: Format version 2 artifacts, written by the code before the calibration block stored each
#: value once (it also held copies of alpha, the threshold, the count and the guarantee): a
#: default (marginal) filter, a sentence-unit one and a PAC one, each calibrated on 24 toy
#: queries with MiniLM.
WRITTEN_BEFORE = sorted((Path(__file__).resolve().parent / "data").glob("artifact_v2_*.json"))


def test_the_files_written_before_are_there() -> None:
    assert [p.stem for p in WRITTEN_BEFORE] == ["artifact_v2_default", "artifact_v2_pac",
                                               "artifact_v2_sentence"]


@pytest.mark.parametrize("path", WRITTEN_BEFORE, ids=lambda p: p.stem)
def test_an_artifact_written_before_loads_and_saves_as_version_3(path: Path,
                                                                 tmp_path: Path) -> None:
    from ragsieve.artifact import CALIBRATION_KEYS, CalibrationBlock

    art = Artifact.read(path)
    stored = art.calibration
    assert art.format_version == 2
    flt = ConformalFilter.load(path)
    assert flt.threshold == stored["threshold"] and flt.mode == stored["mode"]
    assert flt.alpha == stored["alpha"] and flt.unit == art.unit
    assert flt.guarantee() == stored["guarantee"]  # recomputed from the state, the same promise
    block = CalibrationBlock.of(flt.calibrator, group_by=flt.group_by)
    assert block == art.calibration_block()  # the copies are dropped, the state kept
    again = Artifact.read(flt.save(tmp_path / "v3.json"))
    assert again.format_version == 3 and set(again.calibration) == set(CALIBRATION_KEYS)
    back = ConformalFilter.from_artifact(again)
    assert back.threshold == flt.threshold and back.guarantee() == flt.guarantee()
    assert again.monitor == art.monitor and again.lists == art.lists


@pytest.mark.parametrize("copy", ["threshold", "alpha", "n_calibration"])
def test_a_version_2_copy_that_disagrees_with_the_state_is_refused(copy: str) -> None:
    from ragsieve.artifact import seal_value

    payload = json.loads(WRITTEN_BEFORE[0].read_text(encoding="utf-8"))
    payload["calibration"][copy] = {"threshold": 0.5, "alpha": 0.3, "n_calibration": 23}[copy]
    payload["checksum"]["value"] = seal_value(payload)  # a forger who reseals
    with pytest.raises(ArtifactError, match=f"artifact {copy} .* disagrees with its "
                                            "calibration state"):
        ConformalFilter.from_dict(payload)
