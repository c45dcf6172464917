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

# The suite starts hundreds of Python processes (graders, sandboxes, step runs): where the environment sets
# PYTHONDONTWRITEBYTECODE, each would compile the kit's modules (and pytest rewrite the tests) again.
# An empty value lets them share __pycache__ (ignored by git); the sandboxes run with -B all the same.
NOCACHE_OFF := PYTHONDONTWRITEBYTECODE=

test: $(STAMP)
	$(NOCACHE_OFF) $(PY) -m pytest -n 2 --dist loadgroup -q

# The runs that `make test` leaves out (marked slow): most of the attack and hostile corpora, the examples
# whose verdict another example earns too, the verdicts under four more seeds, nbgrader's own grading, the
# bench smoke run, the learner's backstop for a loop that swallows its interruption, and second ways to a
# check (the bundle's every step, a second notebook grading, the GPU script's dry run). CI runs them after
# `make test`.
test-slow: $(STAMP)
	$(NOCACHE_OFF) $(PY) -m pytest -n 2 --dist loadgroup -q -m slow

test-all: $(STAMP)
	$(NOCACHE_OFF) $(PY) -m pytest -n 2 --dist loadgroup -q -m ''

bench: $(STAMP)
	$(VENV)/bin/kvkit bench

clean:
	rm -rf $(VENV) build *.egg-info
