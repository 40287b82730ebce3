# The README's two commands: `make test` and `make demo`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: test demo install clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch==2.13.0 is a CPU build on this project's machines; setup.py's range accepts any torch >= 2.1.
# labml-nn (the peer for the drop-in tests) is installed without its declared torchvision/torchtext/fairscale,
# which would pull a multi-GB CUDA build of torch; its transformer modules need only torch and labml.
$(STAMP): setup.py | $(PY)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet 'torch==2.13.0' || $(PIP) install --quiet 'torch>=2.1'
	$(PIP) install --quiet -e '.[test]'
	$(PIP) install --quiet --no-deps 'labml-nn==0.5.1'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(PY) experiments/char_transformer.py

clean-venv:
	rm -rf $(VENV)
