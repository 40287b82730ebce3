"""experiments/glu_variants.py is a sweep of char_transformer.py: one run per GLU variant, each with `d_ff` scaled by
2/3 where the variant is gated, all tagged with one sweep and compared at the end."""
import subprocess
import sys
from pathlib import Path

from labml_txl.runs.records import load_runs

REPO = Path(__file__).resolve().parents[2]
TINY = ['max_step=2', 'eval_interval=1', 'max_eval_steps=1', 'transformer.n_layers=1', 'transformer.d_model=16',
        'transformer.n_heads=2', 'transformer.ffn.d_ff=24', 'batch_size=2', 'seq_len=8']


def test_one_run_per_variant_with_the_papers_d_ff_scaling(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / 'experiments' / 'glu_variants.py'), *TINY], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = load_runs(tmp_path)
    assert len(runs) == 6 and len({tag for r in runs for tag in r.tags}) == 1
    d_ff = {r.config('transformer.ffn.glu_variant').value: r.config('transformer.ffn.d_ff').value for r in runs}
    assert d_ff == {'none': 24, 'GLU': 16, 'Bilinear': 16, 'ReGLU': 16, 'GEGLU': 16, 'SwiGLU': 16}
    assert all(r.status == 'completed' and r.last_step('loss.train') == 1 and r.last('loss.valid') > 0
               for r in runs)
    assert '6 runs of' in result.stdout and 'config items differ' in result.stdout
    assert (next((tmp_path / 'logs' / 'sweeps').iterdir()) / 'comparison.md').is_file()
