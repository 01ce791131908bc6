# Two entry points for a fresh machine: `make demo` and `make test`. Both create .venv first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: env demo test test-py test-c bench clean
env: $(STAMP)

$(STAMP): setup.py requirements-cpu.txt
	bash scripts/bootstrap.sh $(VENV)
	touch $@

demo: $(STAMP)
	$(PY) -m gmux.examples.multiplex_demo
	$(PY) -m gmux.examples.runtime_demo

test: $(STAMP) test-c test-py

# Two workers: most end-to-end tests wait on real processes and timers, so a second worker uses the idle core.
# A file stays on one worker (its module fixtures are started once). TEST_WORKERS=0 runs them in this process.
# --timeout: a test that hangs fails alone (with its stack) instead of holding the whole run until CI gives up.
TEST_WORKERS ?= 2
test-py: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --timeout 900 --durations=15 tests

test-c: $(STAMP)
	bash scripts/ctest.sh

bench: $(STAMP)
	$(PY) benchmarks/suspend_resume.py

clean:
	rm -rf $(VENV) build *.egg-info
