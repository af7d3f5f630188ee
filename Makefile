# The two entry points: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU wheel of torch; on this machine pip takes it from the local wheel directory.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test lint format bench clean chromium gpu-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,service,bench]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m autocomp_bench.demo

test: $(STAMP) chromium
	$(PY) -m ruff check autocomp autocomp_bench tests examples
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The dashboard's browser test needs Debian's chromium; installed when missing and possible
# (root with apt-get). Where it cannot be installed, that one test skips and says why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium not installed: the dashboard browser test will be skipped"; }

lint: $(STAMP)
	$(PY) -m ruff check autocomp autocomp_bench tests examples
	$(PY) -m ruff format --check autocomp autocomp_bench tests examples

format: $(STAMP)
	$(PY) -m ruff format autocomp autocomp_bench tests examples
	$(PY) -m ruff check --fix autocomp autocomp_bench tests examples

bench: $(STAMP)
	$(PY) -m autocomp_bench.compressors

# CUDA checks (tests/gpu: compressors against the CPU, the hook on one GPU, CUDA-event timing
# under NCCL) and the compressors' cost table on the GPU, written to $(GPU_COSTS). Without a
# GPU it says so, shows each skipped test's reason and succeeds.
GPU_COSTS ?= gpu-costs.md
gpu-check: $(STAMP)
	@if $(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(PY) -m pytest -q -rs -m gpu tests/gpu && \
		$(PY) -m autocomp_bench.gpu_check --markdown $(GPU_COSTS); \
	else \
		echo "gpu-check: no CUDA GPU present (torch.cuda.is_available() is False):" \
			"the GPU tests are skipped and no cost table is written"; \
		$(PY) -m pytest -q -rs -m gpu tests/gpu && \
		echo "gpu-check: skipped, no GPU here (nothing above ran on CUDA)"; \
	fi

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
