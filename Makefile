# The README's two commands: `make test` and `make demo`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --quiet
STAMP := $(VENV)/.installed
TF_STAMP := $(VENV)/.installed-tf
FAISS_STAMP := $(VENV)/.installed-faiss
# Every Python package of the test environment at an exact version (`make lock` regenerates it), and the ones
# installed without their declared dependencies (labml-nn: see the file); TensorFlow and what it adds, resolved beside
# the lock (the tf extra, for the tests of the TensorFlow checkpoint converter only: `make test-tf` installs it, `make
# test` does not, which keeps .venv at half its size: 1.3 GB against 2.7 GB)
LOCK := requirements/test.lock
NO_DEPS_LOCK := requirements/no-deps.lock
TF_LOCK := requirements/tf.lock
# faiss-cpu (the faiss extra, for the kNN memory's faiss index: `make test-faiss` installs it and runs its tests)
FAISS_LOCK := requirements/faiss.lock

.PHONY: test test-avx2 test-tf test-faiss demo install lock clean-venv

# The lock's wheels were resolved for one Python minor version (its `# python:` line); another one is refused
# before any install, naming the fixes
LOCK_PYTHON := $(shell sed -n 's/^\# python: //p' $(LOCK))

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$(LOCK_PYTHON)".split("."))))' || { \
	  echo "make: $(LOCK) pins wheels for Python $(LOCK_PYTHON), and $(PYTHON) is $$($(PYTHON) -V 2>&1);" \
	       "run with PYTHON=python$(LOCK_PYTHON), or resolve the lock for this Python with make lock"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Only wheels (--only-binary): nothing is built from an sdist. The order makes the result exactly the lock:
# pip and setuptools first, at their locked versions; torch with its own dependencies (on machines where PyPI's
# torch is a CUDA build they add its CUDA libraries, which torch pins itself); then every locked package with
# no resolution at all; the project itself, built with the locked setuptools; a `pip check` then fails, naming it, if any package needs one the locks
# lack (run `make lock`), labml-nn's own left out. The browser libraries of the dashboard page come from
# package-lock.json.
$(STAMP): setup.py $(LOCK) $(NO_DEPS_LOCK) $(TF_LOCK) $(FAISS_LOCK) package.json package-lock.json | $(PY)
	@command -v npm >/dev/null || { echo "make: npm is missing; install Node.js with npm (Debian: apt-get install npm)"; exit 1; }
	$(PIP) install --only-binary=:all: --constraint $(LOCK) pip setuptools
	$(PIP) install --only-binary=:all: --constraint $(LOCK) torch
	$(PIP) install --only-binary=:all: --no-deps --requirement $(LOCK)
	$(PIP) install --no-deps --no-build-isolation --editable .
	$(PY) requirements/check_environment.py
	$(PIP) install --only-binary=:all: --no-deps --requirement $(NO_DEPS_LOCK)
	npm ci --no-audit --no-fund --silent
	touch $(STAMP)

install: $(STAMP)

# The tests build and check our C++ kernels, which needs a C++ compiler
test: $(STAMP)
	@command -v $${CXX:-c++} >/dev/null || { echo "make: no C++ compiler ($${CXX:-c++}); install g++ (Debian: apt-get install g++)"; exit 1; }
	$(PY) -m pytest -q tests

# The numerically sensitive tests (comparisons between implementations, kernels, fast paths, reference vectors),
# run again by `make test-avx2` on the vector paths of an AVX2 machine: ATen's dispatch, oneDNN's ISA and our kernels'
# -march all limited to AVX2 (tests/fast/test_cpu_isa.py checks that each took effect; MKL takes its AVX2 path on AMD
# CPUs either way). On an AVX-512 machine this runs other kernels and other orders of addition, so a tolerance that
# holds only for one CPU fails here, not on a newcomer's machine. Torch's compiled-code cache is kept apart, since
# its key ignores ATEN_CPU_CAPABILITY.
NUMERICS_TESTS := tests/fast tests/attention tests/positions tests/transformer tests/xl tests/memories
AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 LABML_TXL_NATIVE_ARCH=x86-64-v3 \
	TORCHINDUCTOR_CACHE_DIR=$${TMPDIR:-/tmp}/labml_txl_inductor_avx2

test-avx2: $(STAMP)
	$(AVX2) $(PY) -m pytest -q $(NUMERICS_TESTS)

# The tests of the TensorFlow checkpoint converter (marked tf), with TensorFlow installed from $(TF_LOCK) beside
# the lock (no locked version moves): on this machine's vector paths, then on AVX2's
$(TF_STAMP): $(STAMP) $(TF_LOCK)
	$(PIP) install --only-binary=:all: --no-deps --requirement $(TF_LOCK)
	$(PY) requirements/check_environment.py
	touch $(TF_STAMP)

test-tf: $(TF_STAMP)
	$(PY) -m pytest -q --with-tf -m tf tests
	$(AVX2) $(PY) -m pytest -q --with-tf -m tf tests

# The tests of the kNN memory's faiss index (marked faiss), with faiss-cpu installed from $(FAISS_LOCK) beside the
# lock
$(FAISS_STAMP): $(STAMP) $(FAISS_LOCK)
	$(PIP) install --only-binary=:all: --no-deps --requirement $(FAISS_LOCK)
	$(PY) requirements/check_environment.py
	touch $(FAISS_STAMP)

test-faiss: $(FAISS_STAMP)
	$(PY) -m pytest -q --with-faiss -m faiss tests

demo: $(STAMP)
	$(PY) experiments/demo.py

# Resolves setup.py's ranges afresh (the newest releases) and rewrites $(LOCK), then $(TF_LOCK) beside it; see
# requirements/regenerate.sh and regenerate_extra.sh
lock:
	PYTHON=$(PYTHON) requirements/regenerate.sh
	PYTHON=$(PYTHON) requirements/regenerate_extra.sh tf
	PYTHON=$(PYTHON) requirements/regenerate_extra.sh faiss

clean-venv:
	rm -rf $(VENV)
