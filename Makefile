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

.PHONY: demo test lint bench venv clean zoo

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

test: lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

$(ZOO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/python -m pip install -q $(ZOO_TORCH) transformers tabulate numpy
	$(ZOO_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(ZOO_STAMP)

zoo: $(ZOO_STAMP)
	$(ZOO_VENV)/bin/python benchmarks/zoo.py $(ZOO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
