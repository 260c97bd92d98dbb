# Plumbing (hand-written): the two commands of the README and their helpers.
#   make course   build and run the whole course headless (build/: executed notebooks, HTML, summary)
#   make test     run the test suite (which also executes and renders every notebook)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test

# Child processes (notebook kernels, engine ranks) use one BLAS thread each,
# unless the user chose otherwise.
export OMP_NUM_THREADS ?= 1
export OPENBLAS_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: venv install test course lab export check-export clean-notebooks bench clean

venv: $(BIN)/python

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# The stamp is newer than pyproject.toml only after a successful install,
# so editing the dependencies triggers a reinstall.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/python -m pytest -q

course: install
	$(BIN)/python tools/build_course.py

lab: install
	$(BIN)/python -m pip install -e '.[lab]'
	$(BIN)/jupyter lab notebooks/

export: install
	$(BIN)/python tools/export.py

check-export: install
	$(BIN)/python tools/export.py --check

clean-notebooks: install
	$(BIN)/python tools/notebooks.py --clean

bench: install
	@found=0; for script in benchmarks/*.py; do \
		[ -e "$$script" ] || continue; \
		found=1; echo "== $$script"; \
		$(BIN)/python "$$script" || exit 1; \
	done; \
	[ $$found -eq 1 ] || echo "no benchmarks/*.py scripts yet"

clean:
	rm -rf build
