#!/usr/bin/env bash
# Regenerates requirements/EXTRA.lock for one optional extra of setup.py (tf: TensorFlow, for the TensorFlow
# checkpoint converter's tests; faiss: faiss-cpu, for the kNN memory's faiss index): the extra and the packages it
# adds, resolved beside the versions of requirements/test.lock, which stay as they are (the lock is a constraint
# here). Run by `make lock` after test.lock, once per extra; alone (`requirements/regenerate_extra.sh faiss`), it
# resolves that extra against the test.lock in place. If no version of the extra fits the lock, pip says which pins
# conflict and nothing is written.
set -euo pipefail
extra=${1:?usage: requirements/regenerate_extra.sh EXTRA (tf or faiss)}
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --quiet)
"${pip[@]}" install --only-binary=:all: --constraint requirements/test.lock pip setuptools
"${pip[@]}" install --only-binary=:all: --constraint requirements/test.lock torch
"${pip[@]}" install --only-binary=:all: --no-deps --requirement requirements/test.lock
freeze() { "$work/venv/bin/python" -m pip freeze --all --exclude-editable | LC_ALL=C sort; }
freeze > "$work/locked"
"${pip[@]}" install --only-binary=:all: --constraint requirements/test.lock --no-build-isolation -e ".[$extra]"
freeze > "$work/with-extra"
{
  echo "# The $extra extra of setup.py and every package it adds to requirements/test.lock, at exact versions resolved"
  echo "# beside that lock, none of whose versions it changes (requirements/check_environment.py checks that no package"
  echo "# is pinned in both). \`make test-$extra\` installs it with --no-deps after the lock. Made on $(date -u +%F) by"
  echo "# requirements/regenerate_extra.sh $extra with $("$work/venv/bin/python" --version): do not edit by hand."
  LC_ALL=C comm -13 "$work/locked" "$work/with-extra" | sort -f
} > "requirements/$extra.lock"
echo "wrote requirements/$extra.lock ($(grep -vc '^#' "requirements/$extra.lock") packages)"
