"""`pip check` for the test environment: every installed package's requirements are installed, except those of
the packages in no-deps.lock, which are installed without their declared dependencies on purpose. Exits 1 naming
what is missing (a package the lock lacks: run `make lock`)."""
import subprocess
import sys
from pathlib import Path

NO_DEPS_LOCK = Path(__file__).with_name('no-deps.lock')


def main() -> int:
    exempt = tuple(line.split('==')[0].strip() + ' ' for line in NO_DEPS_LOCK.read_text().splitlines()
                   if line.strip() and not line.startswith('#'))
    report = subprocess.run([sys.executable, '-m', 'pip', 'check'], capture_output=True, text=True).stdout
    broken = [line for line in report.splitlines()
              if line and not line.startswith(exempt) and line != 'No broken requirements found.']
    for line in broken:
        print(f'make: {line}: requirements/test.lock lacks it; run `make lock`', file=sys.stderr)
    return 1 if broken else 0


if __name__ == '__main__':
    sys.exit(main())
