"""The layer order of docs/architecture.md (the module map) is a checked contract: lower layers never import upper ones.

Every module under ``src/ragsieve`` is parsed with :mod:`ast` (nothing is imported), and
every import of a ragsieve module is collected: absolute and relative, at module level,
under ``if TYPE_CHECKING:`` and inside functions. Each module belongs to the layer of its
top-level component (``ragsieve.scoring.relative`` -> ``scoring``). A module may import its
own component and components of lower layers, except for the pairs in :data:`FORBIDDEN`
and the allow-list of :data:`ONLY`. Siblings on one layer do not import each other, except
on layer 0 (``errors``, ``types`` and the ``_*`` helpers, which import nothing above) and
the one-way pairs of :data:`SIBLINGS`, each with its reason.
The top-level ``ragsieve/__init__.py`` (the public surface) is exempt.

Every violation is reported with ``file:line``, all at once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ragsieve"

# Layers from low to high (docs/architecture.md, the module map). Components starting with "_"
# (private helpers: _closing, _http, _io, _monitor_reference, _optional, _paths, _settings,
# _sqlite, _validation, _version) are layer 0.
LAYERS: dict[str, int] = {
    "types": 0,
    "errors": 0,
    "chunking": 1,
    # the calibration lists' record and the check of deployment lists (the artifact stores it)
    "lists": 1,
    # the sentence unit: a snippet's sentences (cut by chunking's splitter) as pairs
    "units": 1,
    "embeddings": 1,
    "llm": 1,
    # the rerank API as a client speaks it (wire shapes, HTTP client, cache): a reranker
    # behind Cohere / Jina / vLLM / TEI, for the rerank score and the gateway
    "rerank": 1,
    "scoring": 2,
    # the keep policy (min_keep, group_by, max_chars, unit): one value, below everything
    # that carries it (pieces, keeping, fitting, persistence, filter, integrations, server)
    "keep_policy": 2,
    # the index stores and searches (embeddings, chunking); it knows no score nor filter
    "store": 2,
    "calibration": 3,
    # no embedding twice: an index's stored vectors put into a score's embedding cache
    # (store, scoring), for `retrieve` pairs and the index's hits
    "index_vectors": 3,
    # what a filter scores: the accepted snippet forms as items, cut into pieces
    "pieces": 3,
    # the saved filter: one reader, writer, seal and identity, below everything that reads
    # or writes an artifact (filter, monitoring) and above what it stores (calibration)
    "artifact": 4,
    # fit the score on some topics, calibrate on the rest (calibrate, evaluate, answers)
    "fitting": 4,
    # what a filter keeps: the rule applied to the pieces' scores, the empty-result policy
    "keeping": 4,
    # the filter as an artifact and back: the scorer rebuilt from the artifact's spec (which
    # the artifact itself never does), the calibration block of the calibrator
    "persistence": 5,
    "filter": 6,
    "monitoring": 6,
    "data": 6,
    # generation asks the LLM for answers from kept snippets (it imports llm only); answer
    # evaluation (evaluation/answers.py) generates through it, so it sits below evaluation
    "generation": 6,
    "labeling": 7,
    # labelled retrieval: the index's lists for labelled queries (store, data.queries)
    "retrieval": 7,
    # retrieve, then filter: the index's hits scored and kept by a filter (store, filter)
    "filtered_search": 7,
    "engines": 7,
    "evaluation": 7,
    "integrations": 8,
    "server": 8,
    "cli": 9,
}
TOP = "ragsieve"  # the package itself: it imports every layer, so no module may import it

FORBIDDEN: dict[tuple[str, str], str] = {
    ("calibration", "scoring"): "calibration works on scores and never computes them",
    ("scoring", "calibration"): "scores are computed without knowing how they are calibrated",
    ("filter", "data"): "the filter takes records, it does not read files",
    ("data", "filter"): "loaders produce pairs and know nothing of filtering",
    ("data", "scoring"): "loaders produce pairs and know nothing of scores",
    ("data", "calibration"): "loaders produce pairs and know nothing of calibration",
    ("artifact", "scoring"): "the artifact stores a scorer spec and never builds a scorer",
}
"""(importer, imported) component pairs that are never allowed, whatever the layers say."""

SIBLINGS: dict[tuple[str, str], str] = {
    ("units", "chunking"): "a snippet's sentences are the ones the chunker packs "
                           "(chunking.sentence_spans), so units cuts them with its splitter",
    ("rerank", "llm"): "a reranker's answers are kept in the LLM replies' SQLite cache "
                       "(llm.cache.LLMCache), keyed by endpoint, model, query and text",
}
"""(importer, imported) pairs on one layer that may import each other, with the reason."""

ONLY: dict[str, frozenset[str]] = {
    "data": frozenset({"types", "errors", "chunking"}),
}
"""Components that may import only these (besides themselves and private ``_*`` helpers)."""

Edge = tuple[str, str]  # (imported module, "file:line")


def component(module: str) -> str:
    """``"ragsieve.scoring.relative"`` -> ``"scoring"``; the package itself -> ``"ragsieve"``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else TOP


def layer(comp: str) -> int | None:
    """Layer of a component; ``None`` for one that the module map does not place."""
    if comp.startswith("_"):
        return 0
    if comp == TOP:
        return max(LAYERS.values()) + 1
    return LAYERS.get(comp)


def module_names(src: Path) -> dict[str, Path]:
    """Dotted module name of every ``.py`` file under the package directory ``src``."""
    names: dict[str, Path] = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def collect_imports(src: Path) -> dict[str, list[Edge]]:
    """Every import of a module of the package at ``src``, per importing module.

    Parameters
    ----------
    src : Path
        The package directory (``.../src/ragsieve``); its name is the package name.

    Returns
    -------
    dict of str to list of (str, str)
        Importing module -> (imported module, ``"path:line"``), for absolute and relative
        imports anywhere in the file. ``from pkg import name`` counts as an import of
        ``pkg.name`` when that is a module, else of ``pkg``.
    """
    package = src.name
    modules = module_names(src)
    graph: dict[str, list[Edge]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        where = path.relative_to(src.parent.parent)  # e.g. src/ragsieve/filter.py
        edges: list[Edge] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""])
                    base = base.rstrip(".")
                else:
                    base = node.module or ""
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            for target in dict.fromkeys(targets):
                if target.split(".")[0] == package:
                    edges.append((target, f"{where}:{node.lineno}"))
        graph[name] = edges
    return graph


def check_layers(graph: Mapping[str, Iterable[Edge]]) -> list[str]:
    """One message per import that breaks the layer contract (empty when all is well).

    Parameters
    ----------
    graph : mapping of str to iterable of (str, str)
        Importing module -> (imported module, ``"file:line"``), as from
        :func:`collect_imports`.

    Returns
    -------
    list of str
        ``"file:line: importer (layer i) imports imported (layer j): why"``, sorted.
    """
    problems: list[str] = []
    for importer, edges in graph.items():
        src_comp = component(importer)
        if src_comp == TOP:
            continue  # ragsieve/__init__.py re-exports the public names of every layer
        src_layer = layer(src_comp)
        for imported, where in edges:
            dst_comp = component(imported)
            if dst_comp == src_comp:
                continue
            dst_layer = layer(dst_comp)
            head = (f"{where}: {importer} ({src_comp}, layer {src_layer}) imports {imported} "
                    f"({dst_comp}, layer {dst_layer})")
            if src_layer is None or dst_layer is None:
                unplaced = src_comp if src_layer is None else dst_comp
                problems.append(f"{head}: {unplaced!r} has no layer; place it in LAYERS "
                                "(and in docs/architecture.md)")
            elif (src_comp, dst_comp) in FORBIDDEN:
                problems.append(f"{head}: forbidden, {FORBIDDEN[src_comp, dst_comp]}")
            elif src_comp in ONLY and not (dst_comp.startswith("_")
                                           or dst_comp in ONLY[src_comp]):
                allowed = ", ".join(sorted(ONLY[src_comp]))
                problems.append(f"{head}: {src_comp} may import only {allowed} and _* helpers")
            elif dst_comp == TOP:
                problems.append(f"{head}: the package imports every layer; import the module "
                                "that defines the name")
            elif dst_layer > src_layer:
                problems.append(f"{head}: a lower layer imports an upper one")
            elif (dst_layer == src_layer and src_layer > 0  # layer 0 helpers share freely
                  and (src_comp, dst_comp) not in SIBLINGS):
                problems.append(f"{head}: siblings on one layer do not import each other")
    return sorted(problems)


# ------------------------------------------------------------------------------- the contract


def test_every_module_is_parsed() -> None:
    graph = collect_imports(SRC)
    assert {"ragsieve", "ragsieve.filter", "ragsieve.scoring.relative"} <= set(graph)
    # relative imports are seen, at module level (RelativeScorer resolves its base through
    # the registry) and inside functions (AutoScorer.resolve reads the lists' retriever)
    assert any(t == "ragsieve.scoring.registry" for t, _ in graph["ragsieve.scoring.relative"])
    assert any(t == "ragsieve.lists" for t, _ in graph["ragsieve.scoring.auto"])


def test_lower_layers_never_import_upper_ones() -> None:
    problems = check_layers(collect_imports(SRC))
    assert not problems, f"{len(problems)} layer violation(s):\n" + "\n".join(problems)


# ---------------------------------------------------------------------- the check has teeth


def test_check_catches_each_kind_of_violation() -> None:
    graph = {
        "ragsieve.scoring.relative": [("ragsieve.evaluation.metrics", "relative.py:7"),
                                      ("ragsieve.scoring.base", "relative.py:8"),
                                      ("ragsieve.types", "relative.py:9")],
        "ragsieve.calibration.split": [("ragsieve.scoring", "split.py:3")],
        "ragsieve.scoring.base": [("ragsieve.calibration", "base.py:4")],
        "ragsieve.filter": [("ragsieve.data.jsonl", "filter.py:190"),
                            ("ragsieve.calibration", "filter.py:31")],
        "ragsieve.data.jsonl": [("ragsieve.scoring", "jsonl.py:5"),
                                ("ragsieve.chunking", "jsonl.py:6"),
                                ("ragsieve._io", "jsonl.py:7")],
        "ragsieve.llm.connect": [("ragsieve.data.paths", "connect.py:28"),
                                 ("ragsieve._paths", "connect.py:17")],
        "ragsieve.llm.client": [("ragsieve.embeddings", "client.py:2")],
        "ragsieve.units": [("ragsieve.chunking", "units.py:3")],  # fine: SIBLINGS
        "ragsieve.chunking": [("ragsieve.units", "chunking.py:4")],  # one way only
        "ragsieve.errors": [("ragsieve", "errors.py:1")],
        "ragsieve._validation": [("ragsieve.errors", "_validation.py:3")],  # fine: layer 0
        "ragsieve.newthing": [("ragsieve.types", "newthing.py:1")],
        "ragsieve": [("ragsieve.cli", "__init__.py:1")],
    }
    problems = check_layers(graph)
    where = [p.split(": ")[0] for p in problems]
    assert where == sorted([
        "relative.py:7",  # scoring -> evaluation: upward
        "split.py:3",  # calibration -> scoring: forbidden sibling rule
        "base.py:4",  # scoring -> calibration: upward and forbidden
        "filter.py:190",  # filter -> data: forbidden
        "jsonl.py:5",  # data -> scoring: outside data's allow-list
        "connect.py:28",  # llm -> data: upward
        "client.py:2",  # llm -> embeddings: siblings on one layer
        "chunking.py:4",  # chunking -> units: the allowed sibling pair is one way
        "errors.py:1",  # anything -> the top-level package
        "newthing.py:1",  # an unplaced component
    ]), problems
    assert any("forbidden" in p and "split.py:3" in p for p in problems)
    assert any("has no layer" in p and "'newthing'" in p for p in problems)
    assert check_layers({"ragsieve.filter": [("ragsieve.scoring", "f.py:1")]}) == []


def test_collector_finds_relative_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / "ragsieve"
    (pkg / "scoring").mkdir(parents=True)
    (pkg / "evaluation").mkdir()
    (pkg / "__init__.py").write_text("from .scoring import x\n")
    (pkg / "types.py").write_text("")
    (pkg / "evaluation" / "__init__.py").write_text("")
    (pkg / "evaluation" / "metrics.py").write_text("import numpy\n")
    (pkg / "scoring" / "__init__.py").write_text("from . import relative\n")
    (pkg / "scoring" / "relative.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..types import Pair\n"
        "if TYPE_CHECKING:\n"
        "    import ragsieve.evaluation\n"
        "def f():\n"
        "    from ..evaluation.metrics import rank\n"
        "    from ..evaluation import metrics\n"
    )
    graph = collect_imports(pkg)
    assert graph["ragsieve.scoring"] == [("ragsieve.scoring.relative",
                                          "src/ragsieve/scoring/__init__.py:1")]
    assert sorted(graph["ragsieve.scoring.relative"]) == [
        ("ragsieve.evaluation", "src/ragsieve/scoring/relative.py:4"),
        ("ragsieve.evaluation.metrics", "src/ragsieve/scoring/relative.py:6"),
        ("ragsieve.evaluation.metrics", "src/ragsieve/scoring/relative.py:7"),
        ("ragsieve.types", "src/ragsieve/scoring/relative.py:2"),
    ]
    problems = check_layers(graph)
    assert [p.split(": ")[0] for p in problems] == [
        "src/ragsieve/scoring/relative.py:4",
        "src/ragsieve/scoring/relative.py:6",
        "src/ragsieve/scoring/relative.py:7",
    ]

