# The README's two commands: `make test` and `make demo`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: test demo install clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch==2.13.0 is a CPU build on this project's machines; setup.py's range accepts any torch >= 2.4.
# labml-nn (the peer for the drop-in tests) is installed without its declared torchvision/torchtext/fairscale,
# which would pull a multi-GB CUDA build of torch; its transformer modules need only torch and labml.
# The dashboard's browser libraries: d3 v6 from the npm registry (package.json), Bootstrap and Font Awesome from
# PyPI's xstatic packages; the page falls back to public CDNs for any that is missing.
$(STAMP): setup.py package.json package-lock.json | $(PY)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet 'torch==2.13.0' || $(PIP) install --quiet 'torch>=2.4'
	$(PIP) install --quiet -e '.[test,dashboard]'
	$(PIP) install --quiet --no-deps 'labml-nn==0.5.1'
	printf 'setuptools<81\n' > $(VENV)/build-constraints.txt
	PIP_CONSTRAINT=$(VENV)/build-constraints.txt $(PIP) install --quiet --no-deps 'xstatic-bootstrap==5.3.8.0'
	npm ci --no-audit --no-fund --silent
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(PY) experiments/demo.py

clean-venv:
	rm -rf $(VENV)
