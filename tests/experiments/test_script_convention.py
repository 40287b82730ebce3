"""Every script in experiments/ takes its settings one way: `--help` lists them from the configs (type, default,
options, doc), and an argument that is not `key=value` is refused with the `key=value` that script takes."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / 'experiments'
# (script, a line its --help must show: a setting with its type, the script's default and its doc)
SCRIPTS = {
    'train_xl.py': r'n_layer\s+int\s+12\s+Number of layers',
    'eval_xl.py': r'same_length\s+Optional\[bool\]\s+None\s+Every query attends to the same number of keys',
    'generate_xl.py': r'temperature\s+float\s+0.8\s+Softmax temperature',
    'demo.py': r'd_model\s+int\s+128\s+Width of the residual stream',
    'position_schemes.py': r'schemes\s+list\s+\[.absolute.*attention variants',
    'memory_schemes.py': r'memories\s+list\s+\[.none.*memory mechanisms',
    'char_transformer.py': r'transformer.d_model\s+int\s+128\s+Transformer embedding size',
    'reverse.py': r'transformer.d_model\s+int\s+64\s+Transformer embedding size',
    'glu_variants.py': r"transformer.ffn.glu_variant\s+str\s+'none'\s+.*\[none \| Bilinear",
}
# The scripts that are not entry points of their own
NOT_SCRIPTS = {'benchmark.py', 'benchmark_peers.py', 'benchmark_versions.py', 'benchmark_wt103.py',
               'decode_step_floor.py'}


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXPERIMENTS / script), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_every_experiment_script_is_covered():
    scripts = {p.name for p in EXPERIMENTS.glob('*.py')} - NOT_SCRIPTS
    assert scripts == set(SCRIPTS)


@pytest.mark.parametrize('script', sorted(SCRIPTS))
def test_help_lists_every_setting_with_type_default_and_doc(script):
    result = _run(script, '--help')
    assert result.returncode == 0, result.stderr
    assert 'Settings (key=value; type, default, what it is, [options]):' in result.stdout
    assert __import__('re').search(SCRIPTS[script], result.stdout), result.stdout[-3000:]


def test_help_lists_the_nested_items_and_the_options_of_an_item():
    out = _run('char_transformer.py', '--help').stdout
    # Every item of the configs, nested ones with dotted keys, and an option item's choices
    for key in ('max_step', 'lr', 'eval_interval', 'transformer.n_layers', 'transformer.ffn.d_ff',
                'transformer.encoder_attn'):
        assert f'  {key} ' in out
    assert 'relative | rotary' in out or 'mha |' in out


@pytest.mark.parametrize('script, args, meant', [
    ('train_xl.py', ['--n_layer', '2'], 'here n_layer=2'),
    ('char_transformer.py', ['--n_layers', '2'], "Did you mean 'transformer.n_layers'?"),
    ('reverse.py', ['--steps', '5'], "Did you mean"),
    ('eval_xl.py', ['--mem_len', '5'], 'here mem_len=5'),
])
def test_an_argument_that_is_not_key_value_gets_a_suggestion_that_works_for_that_script(script, args, meant):
    result = _run(script, *args)
    assert result.returncode == 2
    assert f"error: argument {args[0]!r} is not accepted" in result.stderr and meant in result.stderr


def test_the_same_idea_has_the_same_name_in_every_training_script():
    for script in ('train_xl.py', 'char_transformer.py', 'reverse.py'):
        out = _run(script, '--help').stdout
        for key in ('max_step', 'lr', 'eval_interval'):
            assert f'\n  {key} ' in out, (script, key)
        for old in ('steps', 'learning_rate', 'eval_every'):
            assert f'\n  {old} ' not in out, (script, old)
