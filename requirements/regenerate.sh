#!/usr/bin/env bash
# Regenerates requirements/test.lock: resolves setup.py's ranges (with its test, dashboard, experiments and peers
# extras) and torch==2.13.0 afresh, in a throwaway virtual environment, and writes every installed package at its
# exact version. This is the one step that takes the newest releases; run it on purpose (`make lock`), run `make test`
# on the result, and commit the lock with a message that says what moved.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=2.13.0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --quiet)
"${pip[@]}" install --only-binary=:all: --upgrade pip setuptools
"${pip[@]}" install --only-binary=:all: "torch==$TORCH"
# The project itself is only resolved here, never locked: its requirements are what the lock must satisfy
"${pip[@]}" install -e '.[test,dashboard,experiments,peers]'
{
  echo "# Every package of the test environment at its exact version, for \`make test\` (installed with its"
  echo "# dependencies checked: pip resolves this file against itself and adds nothing). Made on $(date -u +%F) by"
  echo "# \`make lock\` (requirements/regenerate.sh) with $("$work/venv/bin/python" --version): do not edit by hand."
  echo "# The Python minor version these wheels are for (the Makefile refuses another):"
  echo "# python: $("$work/venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  echo "# torch is pinned without its local label (+cpu), so the same line takes the CPU build where a local"
  echo "# wheel exists and PyPI's build elsewhere."
  "$work/venv/bin/python" -m pip freeze --all --exclude-editable | sed -E 's/^(torch==[^+]*)\+.*/\1/' | sort -f
} > requirements/test.lock
echo "wrote requirements/test.lock ($(grep -vc '^#' requirements/test.lock) packages)"
