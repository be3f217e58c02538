# agentsession-cas. `make demo` and `make test` work on a fresh machine:
# each creates the virtualenv and installs what it needs first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all venv demo test test-fast bench fixtures clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The main job on bundled example sessions.
demo: $(STAMP)
	@echo "== agentsession show fixtures/branches.jsonl"
	$(BIN)/agentsession show fixtures/branches.jsonl
	@echo
	@echo "== agentsession verify fixtures/fork.jsonl"
	$(BIN)/agentsession verify fixtures/fork.jsonl
	@echo
	@echo "== agentsession hash-object (first two entries of fixtures/branches.jsonl)"
	head -n 3 fixtures/branches.jsonl | tail -n 2 | $(BIN)/agentsession hash-object -
	@echo
	@echo "== agentsession verify fixtures/truncated.jsonl (a damaged file: exits 1)"
	-$(BIN)/agentsession verify fixtures/truncated.jsonl

# The whole suite, slow tests included.
test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m 'not slow'

bench: $(STAMP)
	$(PY) tests/bench/bench_verify.py

# Regenerate the project's own fixtures with the project's writer.
fixtures: $(STAMP)
	$(PY) fixtures/generate.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
