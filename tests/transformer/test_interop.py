"""from_torch / to_torch: this package's encoder-decoder equals torch.nn.Transformer given its weights."""
import warnings

import pytest
import torch
from torch import nn

from labml_txl.fast import dispatch
from labml_txl.attention.masks import subsequent_mask
from labml_txl.transformer.interop import from_torch, to_torch
from labml_txl.transformer.mha import MultiHeadAttention
from tolerance import assert_same_function


def randomise(module: nn.Module):
    """Every parameter random, layer norms included: untouched norms (weight 1, bias 0) would hide a missed copy."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0) * torch.rand(()))


def make_torch_transformer(**kwargs) -> nn.Transformer:
    """A random `nn.Transformer` in float64, so that ours and torch's are compared as functions (see tolerance.py)."""
    defaults = dict(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=24,
                    dropout=0.0, layer_norm_eps=1e-3)
    defaults.update(kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # nn.Transformer warns about nested tensors when batch_first is False
        t = nn.Transformer(**defaults)
    randomise(t)
    return t.double().eval()


def torch_masks(src_lengths, tgt_len):
    """torch's convention: float causal mask (float64, the models') and key-padding masks, True where padded."""
    src_len = max(src_lengths)
    src_padding = torch.arange(src_len)[None, :] >= torch.tensor(src_lengths)[:, None]  # [batch, src_len]
    causal = nn.Transformer.generate_square_subsequent_mask(tgt_len, dtype=torch.float64)
    return src_padding, causal


def our_masks(src_lengths, tgt_len):
    """The same masks in this package's convention: boolean [seq_q, seq_k, batch], True where allowed."""
    src_len = max(src_lengths)
    keys_present = (torch.arange(src_len)[:, None] < torch.tensor(src_lengths)[None, :]).unsqueeze(0)
    return keys_present, subsequent_mask(tgt_len)


@pytest.mark.parametrize('norm_first', [True, False])
@pytest.mark.parametrize('activation', ['relu', 'gelu'])
@pytest.mark.parametrize('n_encoder,n_decoder', [(1, 1), (2, 3), (3, 1)])
@pytest.mark.parametrize('batch_first', [False, True])
def test_from_torch_output_equals_torch(norm_first, activation, n_encoder, n_decoder, batch_first):
    t = make_torch_transformer(norm_first=norm_first, activation=activation, num_encoder_layers=n_encoder,
                               num_decoder_layers=n_decoder, batch_first=batch_first)
    m = from_torch(t).eval()
    src_lengths, tgt_len, batch = [6, 4, 2], 5, 3
    src = torch.randn(batch, 6, 16) if batch_first else torch.randn(6, batch, 16)
    tgt = torch.randn(batch, tgt_len, 16) if batch_first else torch.randn(tgt_len, batch, 16)
    src, tgt = src.double(), tgt.double()
    src_padding, causal = torch_masks(src_lengths, tgt_len)
    keys_present, our_causal = our_masks(src_lengths, tgt_len)
    with torch.no_grad():
        expected = t(src, tgt, tgt_mask=causal, src_key_padding_mask=src_padding,
                     memory_key_padding_mask=src_padding)
        got = m(src, tgt, src_mask=keys_present, tgt_mask=our_causal, memory_mask=keys_present)
    assert got.dtype == torch.float64
    assert_same_function(got, expected)


@pytest.mark.parametrize('impl', ['auto', 'reference'])
def test_every_attention_path_gives_torchs_output(impl):
    """The converted model's attentions by the dispatcher's choice (SDPA: no weights, no gradients, every query keeps
    a key) and by the reference (`impl='reference'`): torch's output either way."""
    t = make_torch_transformer()
    m = from_torch(t).eval()
    attentions = [a for a in m.modules() if isinstance(a, MultiHeadAttention)]
    assert len(attentions) == 2 + 2 * 2
    for attention in attentions:
        attention.impl = impl
    src_lengths, tgt_len = [6, 4, 2], 5
    src, tgt = torch.randn(6, 3, 16).double(), torch.randn(tgt_len, 3, 16).double()
    src_padding, causal = torch_masks(src_lengths, tgt_len)
    keys_present, our_causal = our_masks(src_lengths, tgt_len)
    with torch.no_grad():
        expected = t(src, tgt, tgt_mask=causal, src_key_padding_mask=src_padding,
                     memory_key_padding_mask=src_padding)
        with dispatch.recording() as choices:
            got = m(src, tgt, src_mask=keys_present, tgt_mask=our_causal, memory_mask=keys_present)
    paths = [c.chosen for c in choices if c.operation == 'attention']
    assert paths == ['sdpa' if impl == 'auto' else 'reference'] * len(attentions)
    assert_same_function(got, expected)


def test_every_parameter_is_copied_and_eps_kept():
    t = make_torch_transformer(num_encoder_layers=2, num_decoder_layers=2)
    m = from_torch(t)
    n_theirs = sum(p.numel() for p in t.parameters())
    n_ours = sum(p.numel() for p in m.parameters())
    assert n_ours == n_theirs
    # The same values, sorted: nothing left at its initial value (exact: copies)
    assert torch.equal(torch.cat([p.flatten() for p in m.parameters()]).sort().values,
                       torch.cat([p.flatten() for p in t.parameters()]).sort().values)
    eps = {mod.eps for mod in m.modules() if isinstance(mod, nn.LayerNorm)}
    assert eps == {1e-3}
    # Each decoder layer has its third norm, and both stacks their final norm
    assert all(hasattr(layer, 'norm_src_attn') for layer in m.decoder.layers)
    assert torch.equal(m.decoder.norm.weight, t.decoder.norm.weight)
    assert torch.equal(m.encoder.norm.bias, t.encoder.norm.bias)


def test_to_torch_round_trip_restores_every_weight():
    t = make_torch_transformer(norm_first=True, activation='gelu', batch_first=True)
    back = to_torch(from_torch(t))
    theirs, ours = t.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    assert back.batch_first and back.encoder.layers[0].norm_first
    src, tgt = torch.randn(2, 5, 16).double(), torch.randn(2, 4, 16).double()
    with torch.no_grad():
        assert_same_function(back.eval()(src, tgt), t(src, tgt))


def test_from_torch_rejects_other_modules():
    with pytest.raises(TypeError, match='accepts a torch.nn.Transformer, got Linear'):
        from_torch(nn.Linear(2, 2))
