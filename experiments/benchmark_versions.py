r"""
# The fast path's speed at another commit against this working tree, in alternating processes

    python experiments/benchmark_versions.py BASE               # e.g. 95a172c: five rounds (about 3 minutes on 2 cores)
    python experiments/benchmark_versions.py BASE --rounds 9
    python experiments/benchmark_versions.py BASE --quick       # a smoke run on tiny sizes

A change that should not touch Transformer-XL's speed is checked here: the fast path (`impl='auto'`) of
`benchmark.py`'s small configuration, training steps, evaluation segments and batch-1 greedy generation, at commit
BASE (checked out by `git worktree add` into a temporary folder, removed at the end) and in this working tree. Each
round runs one fresh process per version, in alternating order (BASE first, then this tree first), so a machine whose
speed drifts between processes (by up to 25% on the 2-core machines of docs/performance.md) slows both alike. Each
process times its own tree's code through its own tree's `benchmark.py` (`make_xl`, `Stream`, `interleaved`), so
the measurement is the same at both commits as long as those are.

Printed: the medians over rounds of each version's tokens/s, their ratio, the median of the per-round ratios and the
ratios themselves; and whether both versions sampled the same greedy tokens from the same weights (a change that
moves no number samples the same tokens).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
MODES = ('train', 'eval', 'generate')


def child(tree: Path, quick: bool) -> None:
    """In a process of its own: `tree`'s fast path timed, one JSON line on stdout."""
    sys.path[:0] = [str(tree / 'experiments'), str(tree)]
    import torch
    import benchmark as bench
    from labml_txl.xl.generation import generate

    cfg = bench.QUICK if quick else bench.FULL
    rates = {}
    for mode in ('train', 'eval'):
        seconds = bench.interleaved({mode: bench.Stream(bench.make_xl(cfg), cfg, mode == 'train')}, cfg.repeats)
        rates[mode] = cfg.tokens() / seconds[mode]
    model = bench.make_xl(cfg, mem_len=cfg.gen_context).eval()
    prompt = torch.randint(cfg.n_token, (cfg.gen_context, 1), generator=torch.Generator().manual_seed(5))
    tokens = generate(model, prompt, cfg.gen_tokens, context=cfg.gen_context, top_k=1)
    seconds = bench.interleaved({'generate': lambda: generate(model, prompt, cfg.gen_tokens, context=cfg.gen_context,
                                                              top_k=1)}, cfg.gen_repeats, warmup=0)
    rates['generate'] = cfg.gen_tokens / seconds['generate']
    print(json.dumps({'rates': rates, 'tokens': tokens.flatten().tolist()}))


def measure(tree: Path, quick: bool) -> Dict:
    """One fresh process timing `tree`."""
    args = [sys.executable, str(Path(__file__).resolve()), '--child', str(tree)] + (['--quick'] if quick else [])
    out = subprocess.run(args, capture_output=True, text=True, cwd=tree)
    if out.returncode != 0:
        raise RuntimeError(f"timing {tree} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def checked_out(base: str, folder: Path) -> Path:
    """`base` checked out into `folder` (a detached worktree of this repository); an exception naming `base` where
    git does not know it."""
    known = subprocess.run(['git', 'rev-parse', '--verify', '--quiet', f'{base}^{{commit}}'], cwd=REPO,
                           capture_output=True, text=True)
    if known.returncode != 0:
        raise SystemExit(f"error: BASE={base!r} is not a commit of {REPO} (give a commit id, tag or branch that "
                         f"`git rev-parse` knows)")
    tree = folder / 'base'
    subprocess.run(['git', 'worktree', 'add', '--detach', '--quiet', str(tree), base], cwd=REPO, check=True)
    return tree


def table(runs: Dict[str, List[Dict]], base: str) -> str:
    """Medians per version, their ratio, and the per-round ratios (this tree over BASE)."""
    lines = [f"| tokens/s | {base} | this tree | ratio of medians | median of round ratios | round ratios |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for mode in MODES:
        before = [run['rates'][mode] for run in runs['base']]
        after = [run['rates'][mode] for run in runs['tree']]
        paired = [a / b for a, b in zip(after, before)]
        lines.append(f"| {mode} | {statistics.median(before):,.0f} | {statistics.median(after):,.0f} | "
                     f"{statistics.median(after) / statistics.median(before):.2f} | {statistics.median(paired):.2f} | "
                     f"{' '.join(f'{r:.2f}' for r in paired)} |")
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0].strip('# \n'),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('base', nargs='?', help='the commit to compare this working tree with')
    parser.add_argument('--rounds', type=int, default=5, help='rounds of one process per version (default 5)')
    parser.add_argument('--quick', action='store_true', help='tiny sizes, a smoke run')
    parser.add_argument('--child', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child), args.quick)
        return
    if args.base is None:
        parser.error('BASE is required: the commit to compare this working tree with')
    if args.rounds < 1:
        parser.error(f'--rounds={args.rounds} is not accepted: at least one round')
    with tempfile.TemporaryDirectory(prefix='benchmark_versions-') as folder:
        base = checked_out(args.base, Path(folder))
        try:
            start, runs = time.time(), {'base': [], 'tree': []}
            for r in range(args.rounds):
                order = [('base', base), ('tree', REPO)]
                for version, tree in order if r % 2 == 0 else order[::-1]:
                    runs[version].append(measure(tree, args.quick))
                    print(f"round {r + 1} of {args.rounds}, {version}: "
                          + ', '.join(f"{mode} {runs[version][-1]['rates'][mode]:,.0f}" for mode in MODES),
                          file=sys.stderr, flush=True)
        finally:
            subprocess.run(['git', 'worktree', 'remove', '--force', str(base)], cwd=REPO, check=True)
    print(table(runs, args.base))
    same = all(run['tokens'] == runs['base'][0]['tokens'] for run in runs['base'] + runs['tree'])
    print(f"\ngreedy tokens of the same weights: {'the same' if same else 'DIFFERENT'} at both versions; "
          f"{args.rounds} rounds in {(time.time() - start) / 60:.1f} minutes")


if __name__ == '__main__':
    main()
