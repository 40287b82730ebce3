#!/usr/bin/env bash
# Regenerates requirements/tf.lock: TensorFlow (setup.py's tf extra) and the packages it adds, resolved beside the
# versions of requirements/test.lock, which stay as they are (the lock is a constraint here). Run by
# `make lock` after test.lock; alone, it resolves the tf extra against the test.lock in place. If no TensorFlow
# fits the lock, pip says which pins conflict and nothing is written.
set -euo pipefail
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
"${pip[@]}" install --only-binary=:all: --constraint requirements/test.lock --no-build-isolation -e '.[tf]'
freeze > "$work/with-tf"
{
  echo "# TensorFlow (the tf extra, for tests/xl/test_tf_checkpoint.py) and every package it adds to requirements/test.lock,"
  echo "# at exact versions resolved beside that lock, none of whose versions it changes (requirements/check_environment.py"
  echo "# checks that no package is pinned in both). \`make test\` installs it with --no-deps after the lock. Made on"
  echo "# $(date -u +%F) by requirements/regenerate_tf.sh with $("$work/venv/bin/python" --version): do not edit by hand."
  LC_ALL=C comm -13 "$work/locked" "$work/with-tf" | sort -f
} > requirements/tf.lock
echo "wrote requirements/tf.lock ($(grep -vc '^#' requirements/tf.lock) packages)"
