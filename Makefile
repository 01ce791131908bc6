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

test-py: $(STAMP)
	$(PY) -m pytest -q --durations=10 tests

test-c: $(STAMP)
	bash scripts/ctest.sh

bench: $(STAMP)
	$(PY) benchmarks/suspend_resume.py

clean:
	rm -rf $(VENV) build *.egg-info
