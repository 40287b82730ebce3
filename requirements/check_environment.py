"""`pip check` for the test environment: every installed package's requirements are installed, except those of
the packages in no-deps.lock, which are installed without their declared dependencies on purpose. And the locks of
the optional extras (tf.lock, faiss.lock), installed after test.lock without resolution, pin no package that test.lock
pins, so they change no locked version.
Exits 1 naming what is wrong (a package the lock lacks: run `make lock`)."""
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
LOCK, NO_DEPS_LOCK = HERE / 'test.lock', HERE / 'no-deps.lock'
# The optional extras' locks (`make test-tf`, `make test-faiss`)
EXTRA_LOCKS = (HERE / 'tf.lock', HERE / 'faiss.lock')


def pinned(lock: Path) -> dict:
    """`{normalised name: line}` of a lock's pins (names compared as PyPI does: case, `-`, `_`, `.` alike)."""
    return {re.sub(r'[-_.]+', '-', line.split('==')[0].strip()).lower(): line.strip()
            for line in lock.read_text().splitlines() if line.strip() and not line.startswith('#')}


def main() -> int:
    exempt = tuple(line.split('==')[0] + ' ' for line in pinned(NO_DEPS_LOCK).values())
    report = subprocess.run([sys.executable, '-m', 'pip', 'check'], capture_output=True, text=True).stdout
    broken = [line for line in report.splitlines()
              if line and not line.startswith(exempt) and line != 'No broken requirements found.']
    for line in broken:
        print(f'make: {line}: requirements/test.lock lacks it; run `make lock`', file=sys.stderr)
    locked = pinned(LOCK)
    twice = [(f'{locked[name]} (test.lock) and {line} ({extra.name})', extra.name)
             for extra in EXTRA_LOCKS for name, line in pinned(extra).items() if name in locked]
    for pins, extra in twice:
        print(f'make: {pins}: {extra} must pin only what test.lock does not; run `make lock`', file=sys.stderr)
    return 1 if broken or twice else 0


if __name__ == '__main__':
    sys.exit(main())
