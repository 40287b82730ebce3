"""
The worked example of docs/attention.md (a positional scheme as one `get_scores` override and one registration)
runs as the page gives it, and computes its formula: checked against a per-pair loop. It runs in a fresh
interpreter, so that its registration does not add an option to this process's configs (docs/options.md lists
them).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / 'docs' / 'attention.md'

CHECK = r'''
import json
import torch
from labml import experiment
from labml_txl.fast import dispatch
from labml_txl.attention.masks import subsequent_mask

torch.manual_seed(0)
attn = DistancePenaltyAttention(2, 8, dropout_prob=0.0).double().eval()
with torch.no_grad():
    attn.slopes.copy_(torch.tensor([0.3, 1.1]))
seq_q, seq_k, batch = 3, 5, 2
query, key, value = torch.randn(seq_q, batch, 8).double(), torch.randn(seq_k, batch, 8).double(), torch.randn(seq_k, batch, 8).double()
mask = torch.ones(seq_q, seq_k, 1, dtype=torch.bool).tril(seq_k - seq_q)
with dispatch.recording() as choices:
    out, weights = attn(query=query, key=key, value=value, mask=mask, need_weights=True)

# The formula, pair by pair: A_ij = q_i . k_j - m_h |i - j|, softmax over the allowed keys
q, k, v = (p(x).view(x.shape[0], batch, 2, 4) for p, x in ((attn.query, query), (attn.key, key), (attn.value, value)))
expected = torch.zeros(seq_q, batch, 2, 4, dtype=torch.float64)
for b in range(batch):
    for h in range(2):
        for i in range(seq_q):
            scores = []
            for j in range(seq_k):
                position = seq_k - seq_q + i
                scores.append(float(q[i, b, h] @ k[j, b, h]) - float(attn.slopes[h]) * abs(position - j))
            allowed = [j for j in range(seq_k) if mask[i, j, 0]]
            s = torch.tensor([scores[j] for j in allowed], dtype=torch.float64) / 2.0
            p = torch.softmax(s, 0)
            expected[i, b, h] = sum(p[n] * v[j, b, h] for n, j in enumerate(allowed))
expected = attn.output(expected.reshape(seq_q, batch, 8))

# The registration: the option builds this module through TransformerConfigs
conf = TransformerConfigs()
experiment.create(name='extension', writers=set())
experiment.configs(conf, {'encoder_attn': 'distance_penalty', 'd_model': 8, 'n_heads': 2})
print(json.dumps({'error': float((out - expected).abs().max()),
                  'weights_sum': float(weights.sum(1).sub(1).abs().max()),
                  'choices': sorted({str(c) for c in choices if c.operation == 'attention'}),
                  'built': type(conf.encoder_attn).__name__}))
'''


def _code_blocks(text: str):
    return re.findall(r'```python\n(.*?)```', text, flags=re.S)


def test_the_docs_example_of_a_positional_scheme_computes_its_formula(tmp_path):
    blocks = _code_blocks(DOC.read_text())
    # The scheme's file and its registration: the two blocks that define them
    scheme = next(b for b in blocks if 'class DistancePenaltyAttention' in b)
    registration = next(b for b in blocks if "calculate(TransformerConfigs.encoder_attn, 'distance_penalty'" in b)
    # The registration imports the scheme from the file the page names; here it is defined just before
    registration = registration.replace('from labml_txl.distance_penalty import DistancePenaltyAttention\n', '')
    script = tmp_path / 'example.py'
    script.write_text(scheme + '\n' + registration + '\n' + CHECK)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result['error'] < 1e-12
    assert result['weights_sum'] < 1e-12
    assert result['built'] == 'DistancePenaltyAttention'
    # Its own `get_scores`: the reference runs it, and the faster paths say why they do not
    assert len(result['choices']) == 1
    assert result['choices'][0].startswith('attention: reference')
    assert 'overridden get_scores' in result['choices'][0]
