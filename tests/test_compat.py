"""
`import labml_txl.compat` makes labml_nn 0.5.1's own experiment scripts run on labml 0.5.3: its
`transformers/basic/autoregressive_experiment.py` trains (with this package's `TransformerConfigs`, on the
bundled Tiny Shakespeare) and saves its model, and labml_nn's own loader of that experiment
(`sampling/experiment_tiny.py`) loads it by run UUID, with the same weights.

Each run is a process of its own, as each is a script: labml keeps its experiment, tracker and configs in
process-wide state, and `compat` changes the labml modules for the rest of the process.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import safetensors.torch
import torch

from labml_txl.data import load_tiny_shakespeare
from labml_txl.train.checkpoint import CHECKSUMS_FILE, checkpoint_steps, read_checkpoint

REPO = Path(__file__).resolve().parents[1]

# What both runs do first. labml_nn's helpers/datasets.py imports torchvision at the top for its image data sets,
# and torchvision has no CPU wheel here: empty stand-ins of the modules and the three names its class
# annotations read let it import; the text experiment never touches them.
PROLOGUE = '''
import os, sys, types
torchvision = types.ModuleType('torchvision')
torchvision.datasets = types.ModuleType('torchvision.datasets')
torchvision.transforms = types.ModuleType('torchvision.transforms')
torchvision.datasets.MNIST = torchvision.datasets.CIFAR10 = torchvision.transforms.Compose = object
sys.modules.update({'torchvision': torchvision, 'torchvision.datasets': torchvision.datasets,
                    'torchvision.transforms': torchvision.transforms})

import torch
torch.set_num_threads(1)
import labml_txl.compat
from labml import experiment, lab, tracker
from labml.configs import option
from labml_nn.transformers.basic import autoregressive_experiment as script
from labml_txl.configs import TransformerConfigs

lab.configure({'path': os.getcwd()})  # runs and data in the test's folder


# The script's own option for `transformer`, with this package's TransformerConfigs
@option(script.Configs.transformer, 'labml_txl')
def _labml_txl_transformer(c):
    conf = TransformerConfigs()
    conf.n_src_vocab = c.n_tokens
    conf.n_tgt_vocab = c.n_tokens
    conf.d_model = c.d_model
    return conf
'''

TRAIN = PROLOGUE + '''
from labml.internal.experiment import global_params_singleton
import safetensors.torch

# Overrides merged into the script's own (labml's hook for configs given from outside a script): our configs, a
# model and an epoch small enough for a test, on the CPU
global_params_singleton().configs = {
    'transformer': 'labml_txl', 'transformer.n_layers': 1, 'transformer.n_heads': 2, 'transformer.ffn.d_ff': 32,
    'd_model': 16, 'seq_len': 16, 'batch_size': 8, 'epochs': 1, 'inner_iterations': 1, 'device.use_cuda': False}

# The weights the script registers, as registered (before training) and after its run
registered = {}
add_pytorch_models = experiment.add_pytorch_models
def recording(models):
    registered.update(models)
    safetensors.torch.save_file(models['model'].state_dict(), 'initial.safetensors')
    add_pytorch_models(models)
experiment.add_pytorch_models = recording

script.main()
safetensors.torch.save_file(registered['model'].state_dict(), 'trained.safetensors')
print('RESULT', json.dumps({'uuid': experiment.get_uuid(), 'step': tracker.get_global_step()}))
'''

# labml_nn's gMLP experiment, its `GMLPBlock` as the encoder layer of this package's TransformerConfigs (what its own
# `transformer` option does with labml_nn's), at a test's size. Its gating unit has a weight per pair of positions, so
# it takes inputs of at most `seq_len`, and the script samples a prompt of 6 characters and 25 more between epochs
GMLP = PROLOGUE + '''
from labml.internal.experiment import global_params_singleton
from labml_nn.transformers.gmlp import GMLPBlock, experiment as gmlp


@option(gmlp.Configs.transformer, 'labml_txl_gmlp')
def _labml_txl_gmlp_transformer(c):
    conf = _labml_txl_transformer(c)
    conf.encoder_layer = c.gmlp
    return conf


global_params_singleton().configs = {
    'transformer': 'labml_txl_gmlp', 'transformer.n_layers': 2, 'd_model': 16, 'd_ffn': 32, 'seq_len': 32,
    'batch_size': 8, 'epochs': 1, 'inner_iterations': 1, 'device.use_cuda': False}
models = {}
add_pytorch_models = experiment.add_pytorch_models
def recording(registered):
    models.update(registered)
    models['initial'] = {k: v.clone() for k, v in registered['model'].state_dict().items()}
    add_pytorch_models(registered)
experiment.add_pytorch_models = recording

gmlp.main()
model = models['model']
trained = model.state_dict()
print('RESULT', json.dumps({
    'encoder': type(model.encoder).__module__, 'layers': sorted({type(l).__name__ for l in model.encoder.layers}),
    'final_norm': type(model.encoder.norm).__name__, 'step': tracker.get_global_step(),
    'trained': any(not torch.equal(models['initial'][k], trained[k]) for k in trained),
    'finite': all(torch.isfinite(v).all().item() for v in trained.values())}))
'''

LOAD = PROLOGUE + '''
import safetensors.torch
from labml_nn.sampling import experiment_tiny

model, dataset = experiment_tiny.get_model_dataset(sys.argv[1])
safetensors.torch.save_file(model.state_dict(), 'loaded.safetensors')
print('RESULT', json.dumps({'step': tracker.get_global_step(), 'encoder': type(model.encoder).__module__}))
'''


def _run(script: str, cwd: Path, *args: str) -> dict:
    out = subprocess.run([sys.executable, '-c', 'import json\n' + script, *args], cwd=cwd, capture_output=True,
                         text=True, timeout=300, env={**os.environ, 'PYTHONPATH': str(REPO)})
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    line = next(line for line in out.stdout.splitlines() if line.startswith('RESULT '))
    return json.loads(line[len('RESULT '):])


def test_labml_nn_autoregressive_experiment_saves_and_its_sampler_loads_the_model_by_uuid(tmp_path):
    # labml_nn's Tiny Shakespeare data set reads `<data path>/tiny_shakespeare.txt` (downloading it when missing):
    # the bundled text's first 3,000 characters. It trains on the first 90%, cut into sequences of 16 characters
    # with one more for the last target: one epoch is 168 sequences, 21 steps.
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'tiny_shakespeare.txt').write_text(load_tiny_shakespeare()[:3000])
    n_train_sequences = (int(0.9 * 3000) - 1) // 16

    trained_run = _run(TRAIN, tmp_path)
    folder = tmp_path / 'logs' / 'transformer' / trained_run['uuid'] / 'checkpoints'
    # Saved when `with experiment.start():` completed, at the global step (labml_nn counts the tokens trained on)
    assert checkpoint_steps(folder) == [trained_run['step']] == [n_train_sequences * 16]
    assert (folder / str(trained_run['step']) / CHECKSUMS_FILE).is_file()
    initial = safetensors.torch.load_file(tmp_path / 'initial.safetensors')
    trained = safetensors.torch.load_file(tmp_path / 'trained.safetensors')
    saved = read_checkpoint(folder / str(trained_run['step']))['models']['model']
    assert trained.keys() == saved.keys() and all(torch.equal(trained[k], saved[k]) for k in trained)
    assert not all(torch.equal(initial[k], trained[k]) for k in trained)  # it trained

    loading_run = _run(LOAD, tmp_path, trained_run['uuid'])
    loaded = safetensors.torch.load_file(tmp_path / 'loaded.safetensors')
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)
    assert loading_run == {'step': trained_run['step'], 'encoder': 'labml_txl.transformer.models'}


def test_labml_nns_gmlp_experiment_trains_its_block_through_our_configs(tmp_path):
    """labml_nn's gMLP experiment with this package's TransformerConfigs: its `GMLPBlock` becomes our `Encoder`'s
    layer (which once asked every layer for our `norm_name`), and one epoch trains it."""
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'tiny_shakespeare.txt').write_text(load_tiny_shakespeare()[:3000])
    n_train_sequences = (int(0.9 * 3000) - 1) // 32

    run = _run(GMLP, tmp_path)
    assert run == {'encoder': 'labml_txl.transformer.models', 'layers': ['GMLPBlock'], 'final_norm': 'LayerNorm',
                   'step': n_train_sequences * 32, 'trained': True, 'finite': True}


def test_the_opt_in_adds_the_calls_to_labml():
    out = subprocess.run([sys.executable, '-c', textwrap.dedent('''
        import labml.experiment, labml.tracker
        assert not hasattr(labml.experiment, 'add_pytorch_models') and not hasattr(labml.tracker, 'set_text')
        labml_start = labml.experiment.start
        import labml_txl.compat
        from labml_txl.train import run_models, tracker_text_and_debug
        for name in ('add_pytorch_models', 'save_checkpoint', 'load', 'start'):
            assert getattr(labml.experiment, name) is getattr(run_models, name), name
        assert labml.tracker.set_text is tracker_text_and_debug.set_text
        assert labml.tracker.debug is tracker_text_and_debug.debug
        import importlib
        importlib.reload(labml_txl.compat)  # a second import changes nothing more
        assert labml.experiment.start is run_models.start
        print('added')
    ''')], capture_output=True, text=True, timeout=120, env={**os.environ, 'PYTHONPATH': str(REPO)})
    assert out.returncode == 0 and out.stdout.strip() == 'added', out.stderr[-2000:]
