"""
The worked example of docs/memories.md (a memory mechanism defined outside the package, one module and one
`register` line) runs as the page gives it: the model builds it from its setting, a layer attends over its rows as it
would over a memory holding them, its state is what its formula says, it carries information across segments by
itself, and a run with it trains, stops, resumes exactly and generates through `experiments/train_xl.py`. It runs in a
fresh interpreter, so that its registration does not add an item to this process's configs (docs/options.md lists
them), with the doc's module written to a folder outside the package.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labml_txl.memories import registry
from labml_txl.memories.mechanism import MemoryMechanism, Setting

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / 'docs' / 'memories.md'

CHECK = r'''
import json, os, signal, sys
import torch
from labml import lab

import segment_summaries
from labml_txl.configs.settings import item_docs
from labml_txl.memories import registry
from labml_txl.train.configs import TrainXLConfigs
from labml_txl.train.interruption import TrainingInterrupted
from labml_txl.train.trainer import Trainer
from labml_txl.xl import MemTransformerLM
from labml_txl.xl.generation import generate
from tolerance import assert_same_function

result = {'registered': list(registry.MEMORIES), 'doc': item_docs(TrainXLConfigs).get('summary_len'),
          'default': TrainXLConfigs()._Configs__defaults.get('summary_len')}
SMALL = dict(n_token=40, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0, tgt_len=5)
stream = torch.randint(0, 40, (16, 2), generator=torch.Generator().manual_seed(1))
segments = [(stream[i:i + 5], stream[i + 1:i + 6]) for i in (0, 5, 10)]

# A layer attends over the summaries as over a memory holding them: Transformer-XL with `mem_len + summary_len`, given
# [summaries, memory] as its memory, computes the same loss (float64), under every attention type that has a table
for attn_type in ('relative', 'learnable', 'rotary', 'absolute'):
    torch.manual_seed(0)
    summaries = MemTransformerLM(**SMALL, mem_len=5, summary_len=2, attn_type=attn_type).double().eval()
    xl = MemTransformerLM(**SMALL, mem_len=7, attn_type=attn_type).double().eval()
    xl.load_state_dict(summaries.state_dict())
    mems = []
    with torch.no_grad():
        for data, target in segments[:2]:
            _, *new = summaries(data, target, *mems)
            memory, summary = new[:3], new[3:]
            # the state: the mean of each layer's input over the segment, the newest row (with mem_len = qlen the
            # memory is that input)
            for n in range(2):
                assert_same_function(summary[n][-1:], memory[n].mean(dim=0, keepdim=True))
            mems = new
        data, target = segments[2]
        ours = summaries(data, target, *mems)[0]
        memory, summary = mems[:3], mems[3:]
        given = [torch.cat([summary[n], memory[n]]) for n in range(2)] + [torch.cat([memory[2][:2], memory[2]])]
        theirs = xl(data, target, *given)[0]
    assert_same_function(ours, theirs)
    result.setdefault('summary_rows', []).append([s.shape[0] for s in summary])
    result.setdefault('joined', []).append(attn_type)

# Information reaches a later segment through the summaries alone (mem_len 0): a token of segment 1 changes the loss of
# segment 3, and does not without them
def third_loss(summary_len, first_token):
    torch.manual_seed(0)
    model = MemTransformerLM(**SMALL, mem_len=0, summary_len=summary_len).double().eval()
    mems = []
    with torch.no_grad():
        for i, (data, target) in enumerate(segments):
            data = data.clone()
            if i == 0:
                data[0, 0] = first_token
            loss, *mems = model(data, target, *mems)
    return loss
result['reaches'] = not torch.equal(third_loss(2, 3), third_loss(2, 4))
result['without_reaches'] = not torch.equal(third_loss(0, 3), third_loss(0, 4))

# Generation carries the summaries: the tokens of a greedy loop that carries the state, and not of one that drops it
torch.manual_seed(3)
model = MemTransformerLM(**SMALL, mem_len=4, summary_len=3, init_std=0.5).double().eval()
prompt = stream[:3]
sampled = generate(model, prompt, 12, context=4, top_k=1)
model.reset_length(1, 0, 4)
with torch.no_grad():
    log_probs, mems = model.log_probs(prompt)
    dropped = list(mems)
    greedy, forgetful = [], []
    log_forgetful = log_probs
    for _ in range(12):
        greedy.append(log_probs[-1].argmax(-1))
        forgetful.append(log_forgetful[-1].argmax(-1))
        log_probs, mems = model.log_probs(greedy[-1][None], mems)
        # (the summaries emptied at every step: Transformer-XL's memory alone)
        dropped = [m[:0] if i > model.n_layer else m for i, m in enumerate(dropped)]
        log_forgetful, dropped = model.log_probs(forgetful[-1][None], dropped)
result['generates'] = torch.equal(sampled, torch.stack(greedy))
result['forgetful_differs'] = not torch.equal(sampled, torch.stack(forgetful))

# Training through experiments/train_xl.py: stopped by SIGINT mid-run, resumed, equal to a run never stopped
lab.configure({'path': sys.argv[1]})
import train_xl
OVERRIDES = {'n_layer': 2, 'd_model': 32, 'n_head': 2, 'd_head': 16, 'd_inner': 64, 'dropout': 0.1, 'tgt_len': 8,
             'mem_len': 8, 'summary_len': 3, 'batch_size': 4, 'max_step': 12, 'eval_interval': 6,
             'max_eval_steps': 2, 'checkpoint_interval': 4, 'warmup_step': 2}
train_window = Trainer.train_window
def stopped_train_window(self, segments):
    if self.step + 1 == 7:
        os.kill(os.getpid(), signal.SIGINT)
    return train_window(self, segments)
Trainer.train_window = stopped_train_window
os.environ['RUN_UUID'] = 'summaries'
try:
    train_xl.train(dict(OVERRIDES), screen=False)
    result['stopped'] = False
except TrainingInterrupted:
    result['stopped'] = True
Trainer.train_window = train_window
resumed = train_xl.train({}, resume='summaries', screen=False)
os.environ['RUN_UUID'] = 'uninterrupted'
uninterrupted = train_xl.train(dict(OVERRIDES), screen=False)
expected = dict(uninterrupted.history)
result['resumed_steps'] = [step for step, _ in resumed.history]
result['resumed_exactly'] = [(step, expected[step]) for step, _ in resumed.history] == resumed.history
result['weights_equal'] = all(torch.equal(a, b) for a, b in zip(resumed.model.state_dict().values(),
                                                               uninterrupted.model.state_dict().values()))
result['state_carried'] = [m.shape[0] for m in resumed.mems]
print(json.dumps(result))
'''


def _doc_module() -> str:
    """The doc's code block that defines the mechanism (the one that registers it)."""
    blocks = re.findall(r'```python\n(.*?)```', DOC.read_text(), flags=re.S)
    return next(block for block in blocks if 'registry.register(' in block)


def test_the_docs_mechanism_trains_resumes_and_generates(tmp_path):
    module = tmp_path / 'plugins' / 'segment_summaries.py'
    module.parent.mkdir()
    module.write_text(_doc_module())
    path = [str(module.parent), str(REPO / 'tests'), str(REPO / 'experiments'), str(REPO)]
    done = subprocess.run([sys.executable, '-c', CHECK, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, 'PYTHONPATH': ':'.join(path)})
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result['registered'] == [*registry.MEMORIES, 'segment_summaries']
    assert result['doc'].startswith('Segment summaries') and result['default'] == 0
    assert result['joined'] == ['relative', 'learnable', 'rotary', 'absolute']
    assert result['summary_rows'] == [[2, 2]] * 4
    assert result['reaches'] and not result['without_reaches']
    assert result['generates'] and result['forgetful_differs']
    assert result['stopped'] and result['resumed_steps'] == list(range(8, 13))
    assert result['resumed_exactly'] and result['weights_equal']
    # the n_layer + 1 memories, then the n_layer summaries (3 of them, full)
    assert result['state_carried'] == [8, 8, 8, 3, 3]


class _Sized(MemoryMechanism):
    size = 'probe_len'
    settings = {'probe_len': Setting(int, 0, 'probe')}
    attribute = 'probe'


@pytest.mark.parametrize('name, cls, message', [
    ('not an identifier', _Sized, r"name='not an identifier' is not accepted: .* an identifier"),
    ('compressed', _Sized, r"'compressed' is not accepted: a memory mechanism has that name already"),
    ('probe', int, r"mechanism=<class 'int'> is not accepted for 'probe': a subclass of MemoryMechanism"),
    ('probe', type('NoSize', (_Sized,), {'size': 'width'}),
     r"NoSize.size='width' is not accepted: .* one of its settings \(probe_len\) or the model's mem_len"),
    ('probe', type('Clash', (_Sized,), {'size': 'cmem_len', 'settings': {'cmem_len': Setting(int, 0, '')}}),
     r"the settings \['cmem_len'\] of 'probe' are not accepted: .*cmem_len: compressed"),
    ('probe', type('Taken', (_Sized,), {'attribute': 'compressed_memory'}),
     r"Taken.attribute='compressed_memory' is not accepted: an identifier no other mechanism has"),
])
def test_register_refuses_what_would_clash(name, cls, message):
    before = dict(registry.MEMORIES)
    with pytest.raises((ValueError, TypeError), match=message):
        registry.register(name, cls)
    assert registry.MEMORIES == before


def test_the_scripts_take_the_docs_mechanism_with_imports(tmp_path):
    """`imports=segment_summaries` from the folder that holds the module: `train_xl.py` trains with its setting and
    keeps `imports` with the run, so `eval_xl.py` and `generate_xl.py` of the run (from the same folder, with no
    PYTHONPATH) build the model with its summaries; a module that is not found is named."""
    (tmp_path / 'segment_summaries.py').write_text(_doc_module())
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}

    def script(name, *argv):
        return subprocess.run([sys.executable, str(REPO / 'experiments' / name), *argv], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path, env=env)

    trained = script('train_xl.py', 'imports=segment_summaries', 'summary_len=2', 'n_layer=2', 'd_model=16',
                     'n_head=2', 'd_head=8', 'd_inner=32', 'tgt_len=8', 'mem_len=8', 'batch_size=2', 'max_step=4',
                     'eval_interval=4', 'max_eval_steps=2', 'checkpoint_interval=2', 'warmup_step=1')
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = next(tmp_path.glob('logs/train_xl/*/overrides.json')).parent
    assert json.loads((run / 'overrides.json').read_text())['imports'] == 'segment_summaries'
    evaluated = script('eval_xl.py', run.name, 'split=valid', 'max_eval_steps=2')
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    sampled = script('generate_xl.py', run.name, 'n_tokens=5', 'prompt=ROMEO:')
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert 'ROMEO:' in sampled.stdout
    missing = script('train_xl.py', 'imports=no_such_memories', 'max_step=1')
    assert missing.returncode != 0
    assert "the module 'no_such_memories' is not found in the working directory" in missing.stderr, missing.stderr
