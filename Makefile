# The kit's two commands. Each creates .venv on first use and installs the pinned
# dependencies (torch==2.13.0 is the CPU build on this machine's disk).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-slow test-all bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvkit grade --jobs 2

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -q

# The runs of minutes that `make test` leaves out (marked slow): the attacks on a measurement, the
# verdicts under four more seeds, nbgrader's own grading, the bench smoke run. CI runs them after `make test`.
test-slow: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -q -m slow

test-all: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -q -m ''

bench: $(STAMP)
	$(VENV)/bin/kvkit bench

clean:
	rm -rf $(VENV) build *.egg-info
