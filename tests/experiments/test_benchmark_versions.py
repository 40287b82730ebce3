"""`experiments/benchmark_versions.py` on tiny sizes: both versions are timed in alternating processes, each through its
own tree's code, the table has a row per mode, the greedy tokens of equal code agree, the worktree is removed, and a
commit git does not know is refused by name."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / 'experiments' / 'benchmark_versions.py'


def _worktrees():
    return subprocess.run(['git', 'worktree', 'list'], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.splitlines()


def test_two_rounds_against_head_time_both_versions_and_remove_the_worktree():
    before = _worktrees()
    out = subprocess.run([sys.executable, str(SCRIPT), 'HEAD', '--quick', '--rounds', '2'], capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    # alternating order: BASE first in round 1, this tree first in round 2
    rounds = re.findall(r'round (\d) of 2, (base|tree):', out.stderr)
    assert rounds == [('1', 'base'), ('1', 'tree'), ('2', 'tree'), ('2', 'base')]
    for mode in ('train', 'eval', 'generate'):
        row = re.search(rf'^\| {mode} \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) ([\d.]+) \|$',
                        out.stdout, re.M)
        assert row is not None, out.stdout
        assert all(float(v.replace(',', '')) > 0 for v in row.groups())
    # HEAD and this tree compute with the same model code, so they sample the same tokens
    assert 'greedy tokens of the same weights: the same at both versions' in out.stdout
    assert _worktrees() == before


def test_a_commit_git_does_not_know_is_refused_by_name():
    out = subprocess.run([sys.executable, str(SCRIPT), 'no-such-commit', '--quick'], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode != 0
    assert "BASE='no-such-commit' is not a commit" in out.stderr
