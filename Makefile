# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The coverage zoo (docs/coverage.md) needs torchvision: its own venv, so `make test`
# stays on the pinned CPU torch above. Run it in pieces with ZOO_ARGS="--only nn" etc.
ZOO_VENV ?= .venv-zoo
ZOO_TORCH ?= torch==2.14.1 torchvision==0.29.1
ZOO_ARGS ?=
ZOO_STAMP := $(ZOO_VENV)/.installed

.PHONY: demo test lint bench venv clean zoo compat

$(STAMP): pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/flopcount count example:resnet50 --depth 2

lint: $(STAMP)
	$(VENV)/bin/ruff check flopcount tests benchmarks examples
	$(VENV)/bin/mypy

# The full suite on the pinned torch (also the oldest supported: pyproject's floor), then the
# tests not marked slow on the newest torch this machine can install (the zoo's venv).
# Each suite runs in two parts (docs/internals.md, "The test suite"): everything not marked
# `serial` on PYTEST_JOBS processes (pytest-xdist, work-stealing), then the `serial`
# tests (real gloo ranks, real wall-clock timings) alone on the machine.
# The serial run collects only the files that hold such tests (found by the literal
# `mark.serial`: write the marker out, no alias), which saves it collecting the whole tree.
PYTEST_JOBS ?= 2
# Python's default, bytecode caching: with PYTHONDONTWRITEBYTECODE set (some shells and agents
# set it) every process of the suite compiled flopcount and rewrote the tests' asserts anew
# (2 s of its 5 s collection here).
unexport PYTHONDONTWRITEBYTECODE
PYTEST_PARALLEL := -n $(PYTEST_JOBS) --dist worksteal
SERIAL_FILES = $(shell grep -rlE 'mark\.serial' tests --include='*.py' | sort)

test: lint
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not serial"
	$(PY) -m pytest -q -m serial $(SERIAL_FILES)
	$(MAKE) compat

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# torch 2.14.1's CUDA build takes ~6 GB installed: say so before pip fails halfway with ENOSPC
# (a CI run on a disk that other jobs' clones had filled died there, 2026-11-29).
ZOO_NEEDS_GB ?= 7

$(ZOO_STAMP): pyproject.toml
	@free_kb=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	if [ "$$free_kb" -lt $$(( $(ZOO_NEEDS_GB) * 1048576 )) ]; then \
	  echo "make: $(ZOO_VENV) (torch 2.14.1, a CUDA build: ~6 GB installed) needs $(ZOO_NEEDS_GB) GB free on this disk; $$(( free_kb / 1048576 )) GB free (df -h .)" >&2; \
	  exit 1; \
	fi
	$(PYTHON) -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/python -m pip install -q $(ZOO_TORCH) transformers tabulate numpy
	$(ZOO_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(ZOO_STAMP)

zoo: $(ZOO_STAMP)
	$(ZOO_VENV)/bin/python benchmarks/zoo.py $(ZOO_ARGS)

# torch 2.14.1 (CUDA build with its nvidia wheels, ~5 GB, about 5 min to install here; runs on CPU)
COMPAT_STAMP := $(ZOO_VENV)/.compat-installed

$(COMPAT_STAMP): $(ZOO_STAMP) requirements-dev.txt
	$(ZOO_VENV)/bin/python -m pip install -q -r requirements-dev.txt
	touch $(COMPAT_STAMP)

compat: $(COMPAT_STAMP)
	$(ZOO_VENV)/bin/python -c "import torch; print('compat: torch', torch.__version__)"
	$(ZOO_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "not slow and not serial"
	$(ZOO_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "serial and not slow" $(SERIAL_FILES)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
