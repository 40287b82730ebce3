"""
The worked example of docs/attention.md (a positional scheme as one module and one registry line) runs as the page
gives it, serves both models, and computes its formula: the vanilla attention and Transformer-XL's (with a memory)
checked against a per-pair loop in float64, chosen by name in `TransformerConfigs`, `TransformerXLConfigs` and
`MemTransformerLM`, and a model trained a step with memory. It runs in a fresh interpreter, so that its registration
does not add an option to this process's configs (docs/options.md lists them).
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
from labml_txl.configs import TransformerConfigs, TransformerXLConfigs
from labml_txl.fast import dispatch
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.xl import MemTransformerLM

torch.manual_seed(0)
result = {}

# The vanilla attention, the full table: A_ij = q_i . k_j - m_h |i - j|, softmax over the allowed keys
attn = MultiHeadAttention(2, 8, dropout_prob=0.0, positions=DistancePenalty()).double().eval()
with torch.no_grad():
    attn.slopes.copy_(torch.tensor([0.3, 1.1]))
seq_q, seq_k, batch = 3, 5, 2
query, key, value = torch.randn(seq_q, batch, 8).double(), torch.randn(seq_k, batch, 8).double(), torch.randn(seq_k, batch, 8).double()
mask = torch.ones(seq_q, seq_k, 1, dtype=torch.bool).tril(seq_k - seq_q)
with dispatch.recording() as choices:
    out, weights = attn(query=query, key=key, value=value, mask=mask, need_weights=True)
torch.set_grad_enabled(False)

q, k, v = (p(x).view(x.shape[0], batch, 2, 4) for p, x in ((attn.query, query), (attn.key, key), (attn.value, value)))
expected = torch.zeros(seq_q, batch, 2, 4, dtype=torch.float64)
for b in range(batch):
    for h in range(2):
        for i in range(seq_q):
            position = seq_k - seq_q + i
            allowed = [j for j in range(seq_k) if mask[i, j, 0]]
            s = torch.tensor([float(q[i, b, h] @ k[j, b, h]) - float(attn.slopes[h]) * abs(position - j)
                              for j in allowed], dtype=torch.float64) / 2.0
            p = torch.softmax(s, 0)
            expected[i, b, h] = sum(p[n] * v[j, b, h] for n, j in enumerate(allowed))
expected = attn.output(expected.reshape(seq_q, batch, 8))
torch.set_grad_enabled(True)
result.update(error=float((out - expected).abs().max()), weights_sum=float(weights.sum(1).sub(1).abs().max()),
              choices=sorted({str(c) for c in choices if c.operation == 'attention'}),
              state=sorted(attn.state_dict()))

# Transformer-XL by name: a decoder's table, a memory before the segment
model = MemTransformerLM(30, 2, 2, 8, 4, 16, 0.0, 0.0, tgt_len=3, mem_len=4, attn_type='distance_penalty').double()
xl = model.layers[0].dec_attn
with torch.no_grad():
    xl.slopes.copy_(torch.tensor([0.7, 0.2]))
qlen, mlen = 3, 4
h, mems = torch.randn(qlen, batch, 8).double(), torch.randn(mlen, batch, 8).double()
with torch.no_grad():
    got = xl(h, attn_mask=model._attn_mask(qlen, mlen, h.device), mems=mems)
    q = (h @ xl.q_net.weight.T).view(qlen, batch, 2, 4)
    kv = torch.cat([mems, h]) @ xl.kv_net.weight.T
    k, v = kv[..., :8].view(-1, batch, 2, 4), kv[..., 8:].view(-1, batch, 2, 4)
    heads = torch.zeros(qlen, batch, 2, 4, dtype=torch.float64)
    for b in range(batch):
        for n in range(2):
            for i in range(qlen):
                allowed = range(mlen + i + 1)
                s = torch.tensor([float(q[i, b, n] @ k[j, b, n]) - float(xl.slopes[n]) * abs(mlen + i - j)
                                  for j in allowed], dtype=torch.float64) / 2.0
                p = torch.softmax(s, 0)
                heads[i, b, n] = sum(p[a] * v[j, b, n] for a, j in enumerate(allowed))
    want = xl.layer_norm(h + heads.reshape(qlen, batch, 8) @ xl.o_net.weight.T)
result.update(xl_error=float((got - want).abs().max()), xl_attn_type=model.attn_type,
              xl_state=sorted(k for k in model.state_dict() if k.startswith('layers.0.dec_attn.')))

# A training step with memory: the slopes learn
model.train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randint(30, (3, 2))
loss, *new_mems = model(data, data)
loss, *new_mems = model(data, data, *new_mems)
loss.mean().backward()
optimizer.step()
result.update(trained=bool(torch.isfinite(loss).all()) and len(new_mems) == 3,
              slopes_moved=float(xl.slopes.grad.abs().sum()) > 0)

# The names: TransformerConfigs' attentions and TransformerXLConfigs' attention
conf = TransformerConfigs()
experiment.create(name='extension', writers=set())
experiment.configs(conf, {'encoder_attn': 'distance_penalty', 'src_embed': 'no_pos', 'd_model': 8, 'n_heads': 2})
xl_conf = TransformerXLConfigs()
experiment.create(name='extension_xl', writers=set())
experiment.configs(xl_conf, {'attention': 'distance_penalty', 'n_token': 20, 'n_layer': 1, 'd_model': 8, 'n_head': 2,
                             'd_head': 4, 'd_inner': 16})
result.update(built=[type(conf.encoder_attn).__name__, type(conf.encoder_attn.positions).__name__],
              xl_built=[xl_conf.model.attn_type, type(xl_conf.model.layers[0].dec_attn.positions).__name__])
print(json.dumps(result))
'''


def _code_blocks(text: str):
    return re.findall(r'```python\n(.*?)```', text, flags=re.S)


def test_the_docs_example_of_a_positional_scheme_serves_both_models(tmp_path):
    blocks = _code_blocks(DOC.read_text())
    # The scheme's module and its registry line: the two blocks that define them
    scheme = next(b for b in blocks if 'class DistancePenalty(PositionScheme)' in b)
    registration = next(b for b in blocks if "register('distance_penalty', DistancePenalty)" in b)
    # The registry line, run as registry.py runs it (its module defined just before)
    script = tmp_path / 'example.py'
    script.write_text(scheme + '\nfrom labml_txl.positions.registry import register\n' + registration + CHECK)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result['error'] < 1e-12
    assert result['weights_sum'] < 1e-12
    assert result['xl_error'] < 1e-12
    # Its parameters are the attention's, under the scheme's name
    assert 'slopes' in result['state'] and 'layers.0.dec_attn.slopes' in result['xl_state']
    assert result['xl_attn_type'] == 'distance_penalty'
    assert result['trained'] and result['slopes_moved']
    assert result['built'] == ['MultiHeadAttention', 'DistancePenalty']
    assert result['xl_built'] == ['distance_penalty', 'DistancePenalty']
    # A bias per distance: a fast path runs it (the composite, as the weights are asked for), not the reference
    assert len(result['choices']) == 1
    assert result['choices'][0].startswith('attention: composite')
    assert 'overridden get_scores' not in result['choices'][0]
