"""Importing the package changes nothing global: no optimizer hook, no kernel built, no extension builder imported,
and labml as it is (only `import labml_txl.compat` adds labml 0.4's calls back to it)."""
import subprocess
import sys

CHECK = r'''
import sys
import torch
import torch.optim.optimizer as optimizer
import labml.experiment, labml.tracker
hooks = len(optimizer._global_optimizer_post_hooks)
labml_names = (dict(vars(labml.experiment)), dict(vars(labml.tracker)))
import labml_txl, labml_txl.configs, labml_txl.xl, labml_txl.train.trainer, labml_txl.fast.native
import labml_txl.fast.dispatch, labml_txl.attention.composite, labml_txl.attention.reference, labml_txl.attention.masks
import labml_txl.positions.encoding, labml_txl.transformer.mha, labml_txl.positions.relative, labml_txl.fast.dropout
import labml_txl.fast.prepacked_linear, labml_txl.train.run_models, labml_txl.train.tracker_text_and_debug
import labml_txl.xl.formats.tf_checkpoint, labml_txl.xl.formats.published
assert 'labml_txl.compat' not in sys.modules, 'labml_txl.compat was imported'
assert (dict(vars(labml.experiment)), dict(vars(labml.tracker))) == labml_names, 'labml was changed'
assert 'tensorflow' not in sys.modules, 'TensorFlow was imported (only reading a checkpoint may import it)'
assert len(optimizer._global_optimizer_post_hooks) == hooks, 'an optimizer hook was registered at import'
assert 'torch.utils.cpp_extension' not in sys.modules, 'the extension builder was imported'
from labml_txl.fast.native import build
assert not build._loaded and not build._checked, 'a kernel was loaded at import'
assert labml_txl.fast.prepacked_linear._available is None, "oneDNN's ops were checked at import"
print('clean')
'''


def test_importing_the_package_changes_nothing_global():
    out = subprocess.run([sys.executable, '-c', CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == 'clean', out.stderr[-2000:]


def test_the_fused_optimizer_hook_comes_with_the_first_cache():
    """The code that makes a cache which trusts version counters registers what keeps it correct, when it makes one."""
    out = subprocess.run([sys.executable, '-c', r'''
import torch
import torch.optim.optimizer as optimizer
from labml_txl.xl import MemTransformerLM
model = MemTransformerLM(n_token=20, n_layer=1, n_head=2, d_model=8, d_head=4, d_inner=8, dropout=0.0, dropatt=0.0,
                         tgt_len=4, mem_len=4).eval()
assert not optimizer._global_optimizer_post_hooks
data = torch.randint(20, (4, 1))
with torch.no_grad():
    model(data, data)
assert len(optimizer._global_optimizer_post_hooks) == 1
print('registered')
'''], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == 'registered', out.stderr[-2000:]
