# agentsession-cas. `make demo` and `make test` work on a fresh machine:
# each creates the virtualenv and installs what it needs first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all venv demo test test-fast lint postgresql-server bench bench-quick fixtures clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,server,postgresql]'
	touch $(STAMP)

venv: $(STAMP)

# The main job on bundled example sessions: read and verify files, then
# hold them in a store made under a temp directory.
AS = $(BIN)/agentsession
SID = $(PY) -c 'import json,sys; print(json.loads(sys.stdin.readline())["id"])'
demo: $(STAMP)
	@echo "== agentsession show fixtures/branches.jsonl"
	$(AS) show fixtures/branches.jsonl
	@echo
	@echo "== agentsession verify fixtures/fork.jsonl"
	$(AS) verify fixtures/fork.jsonl
	@echo
	@echo "== agentsession hash-object (first two entries of fixtures/branches.jsonl)"
	head -n 3 fixtures/branches.jsonl | tail -n 2 | $(AS) hash-object -
	@echo
	@echo "== agentsession verify fixtures/truncated.jsonl (a damaged file: exits 1)"
	@$(AS) verify fixtures/truncated.jsonl || echo "(verify exited $$? on the damaged file, as it should)"
	@echo
	@set -e; store=$$(mktemp -d)/store; export AGENTSESSION_STORE=$$store; \
	echo "== a store in $$store"; \
	$(AS) init; \
	for f in basic branches extensions; do echo "import fixtures/$$f.jsonl -> $$($(AS) import fixtures/$$f.jsonl)"; done; \
	echo "import --record fixtures/fork-origin.jsonl -> $$($(AS) import --record fixtures/fork-origin.jsonl)"; \
	echo "import fixtures/fork.jsonl -> $$($(AS) import fixtures/fork.jsonl)"; \
	echo; echo "== agentsession list"; $(AS) list; \
	sid=$$($(SID) < fixtures/branches.jsonl); \
	echo; echo "== agentsession show $$sid"; $(AS) show $$sid; \
	echo; echo "== agentsession export $$sid, compared with the file it was imported from"; \
	$(AS) export $$sid | cmp - fixtures/branches.jsonl && echo "byte-identical to fixtures/branches.jsonl"; \
	echo; echo "== record from the command line: create, append, log"; \
	new=$$($(AS) create --id demo-recorded); \
	echo '{"type":"config","model":"gpt-5"}' | $(AS) append --json $$new; \
	echo '{"type":"item","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}}' | $(AS) append --json $$new; \
	$(AS) log $$new; \
	echo; echo "== verify every session"; \
	for s in $$($(AS) list --json | $(PY) -c 'import json,sys; print(" ".join(x["session"] for x in json.load(sys.stdin)))'); do \
	  $(AS) verify $$s; done; \
	echo; echo "== a named ref, then push the recorded session to a second store (it lands as a mirror)"; \
	$(AS) ref update demo/latest $$new; $(AS) ref list; \
	remote=$$(dirname $$store)/remote; $(AS) --store $$remote init >/dev/null; \
	$(AS) push $$new $$remote --ref demo/latest; \
	$(AS) push $$new $$remote; \
	$(AS) --store $$remote list; \
	echo; echo "== delete a session, then sweep what nothing retains (dry run, then for real), pack, fsck"; \
	$(AS) delete $$sid; \
	$(AS) sweep --grace 0 --dry-run | grep -v '^sha256:'; \
	$(AS) sweep --grace 0; \
	$(AS) pack; \
	$(AS) fsck; \
	rm -rf "$$(dirname $$store)"
	@echo
	@echo "== a Python harness records locally, crashes, resumes and pushes (docs/examples/record_and_push.py)"
	@set -e; work=$$(mktemp -d); \
	$(PY) docs/examples/record_and_push.py $$work/ex; \
	echo; echo "== agentsession show --runs on the mirror it pushed to (runs, end reasons, calls; the run the crash cut off ended error)"; \
	id=$$($(AS) --store $$work/ex/remote list --json | $(PY) -c 'import json,sys; print(json.load(sys.stdin)[0]["session"])'); \
	$(AS) --store $$work/ex/remote show --runs $$id | sed -n '/^runs on the path/,$$p'; \
	$(AS) --store $$work/ex/remote verify $$id; \
	rm -rf $$work
	@echo
	@echo "== done: every step above succeeded (the one exit status 1 was the damaged file, on purpose)."
	@echo "   Put the command on your PATH with: export PATH=\"$$PWD/.venv/bin:\$$PATH\""

# The linter (over the library, the command and the tests) and the type checker
# (over the library and the command; both configured in pyproject.toml), then the whole
# suite, slow tests included. The PostgreSQL tests start a server of their own
# (tests/pg_server.py) and fail, not skip, without one: install it where missing.
# The suite runs on TEST_WORKERS processes (pytest-xdist; each worker starts its own
# PostgreSQL test server when it needs one): the long crash, kill and damage tests are
# spread over the machine's cores instead of queueing behind each other.
TEST_WORKERS ?= 2
test: lint postgresql-server
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-fast: lint postgresql-server
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m 'not slow'

postgresql-server:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	else echo "installing PostgreSQL (the PostgreSQL tests start a throwaway server)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; fi

lint: $(STAMP)
	$(BIN)/ruff check agentsession_cas cli tests
	$(BIN)/mypy

# Benchmarks: ratios against baselines measured in the same run. The full set
# takes about half an hour (the pack benchmark builds a 100-fork store and a git
# repository of the same objects); bench-quick runs each at a small size.
bench: $(STAMP) postgresql-server
	$(PY) tests/bench/bench_verify.py
	$(PY) tests/bench/bench_store.py
	$(PY) tests/bench/bench_fsck.py
	$(PY) tests/bench/bench_pack.py
	$(PY) tests/bench/bench_exchange.py
	$(PY) tests/bench/bench_startup.py
	$(PY) tests/bench/bench_storage.py
	$(PY) tests/bench/bench_commands.py
	$(PY) tests/bench/bench_server.py
	$(PY) tests/bench/bench_postgresql.py

bench-quick: $(STAMP) postgresql-server
	$(PY) tests/bench/bench_verify.py --quick
	$(PY) tests/bench/bench_store.py --quick
	$(PY) tests/bench/bench_fsck.py --quick
	$(PY) tests/bench/bench_pack.py --quick
	$(PY) tests/bench/bench_exchange.py --quick
	$(PY) tests/bench/bench_startup.py --quick
	$(PY) tests/bench/bench_storage.py --quick
	$(PY) tests/bench/bench_commands.py --quick
	$(PY) tests/bench/bench_server.py --quick
	$(PY) tests/bench/bench_postgresql.py --quick

# Regenerate the project's own fixtures with the project's writer.
fixtures: $(STAMP)
	$(PY) fixtures/generate.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
