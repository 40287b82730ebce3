"""
Bad input raises at the point of entry (constructor, `reset_length`, `forward`) an exception that names the
argument, the value and what is accepted: never a bare assert, never a silent clamp.
"""
import re

import pytest
import torch

from labml_txl.positions.relative import Relative
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.xl import MemTransformerLM

from .helpers import small_config, small_model


def raises(exception, *fragments):
    """`pytest.raises` that also checks every fragment appears in the message."""
    return pytest.raises(exception, match=''.join(f'(?=[\\s\\S]*{re.escape(f)})' for f in fragments))


def test_token_ids_outside_vocabulary():
    model = small_model()
    data = torch.randint(0, 40, (5, 2))
    bad = data.clone()
    bad[2, 1] = 40
    with raises(IndexError, 'data', '40', 'n_token=40', '0 .. 39'):
        model(bad, data)
    bad[2, 1] = -3
    with raises(IndexError, 'data', '-3', 'n_token=40'):
        model.log_probs(bad)
    with raises(IndexError, 'target', '40'):
        model(data, torch.full((5, 2), 40))
    with raises(TypeError, 'data', 'torch.float32', 'integer'):
        model(data.float(), data)


def test_cutoffs_not_increasing_or_not_below_n_token():
    with raises(ValueError, 'cutoffs=[20, 10]', 'strictly increasing', 'n_token=40'):
        MemTransformerLM(**small_config(cutoffs=[20, 10], tie_projs=[False] * 3))
    with raises(ValueError, 'cutoffs=[10, 40]', 'below n_token=40'):
        MemTransformerLM(**small_config(cutoffs=[10, 40], tie_projs=[False] * 3))


def test_tie_projs_of_wrong_length():
    with raises(ValueError, 'tie_projs=[False, True]', 'len(cutoffs) + 1 = 3'):
        MemTransformerLM(**small_config(cutoffs=[10, 20], tie_projs=[False, True], d_embed=8, div_val=2))


@pytest.mark.parametrize('attn_type', [0, 2])
def test_odd_d_model_with_sinusoidal_positions(attn_type):
    with raises(ValueError, 'd_model=15', f'attn_type={attn_type}', 'even'):
        MemTransformerLM(**small_config(d_model=15, attn_type=attn_type))


def test_odd_d_model_in_relative_mha():
    with raises(ValueError, 'd_model=15', 'even'):
        MultiHeadAttention(heads=3, d_model=15, positions=Relative())


def test_batch_size_differs_from_memories():
    model = small_model()
    data = torch.randint(0, 40, (6, 3))
    _, *mems = model(data[:5], data[1:6])
    other = torch.randint(0, 40, (5, 2))
    with raises(ValueError, 'mems[0]', 'batch size 3', 'batch size 2'):
        model(other, other, *mems)


def test_memories_of_wrong_count():
    model = small_model()
    data = torch.randint(0, 40, (6, 3))
    _, *mems = model(data[:5], data[1:6])
    with raises(ValueError, '2 memories', 'n_layer + 1 = 3'):
        model(data[:5], data[1:6], *mems[:2])


def test_memories_of_wrong_width():
    model = small_model()
    data = torch.randint(0, 40, (6, 3))
    mems = [torch.zeros(4, 3, 12, dtype=torch.float64) for _ in range(3)]
    with raises(ValueError, 'mems[0]', '[4, 3, 12]', 'd_model=16'):
        model.forward_hidden(data, mems)


def test_tgt_len_below_one():
    with raises(ValueError, 'tgt_len=0', 'positive integer'):
        MemTransformerLM(**small_config(tgt_len=0))
    model = small_model()
    with raises(ValueError, 'tgt_len=0', 'positive integer'):
        model.reset_length(0, 0, 5)


def test_negative_mem_len():
    with raises(ValueError, 'mem_len=-1', 'non-negative'):
        MemTransformerLM(**small_config(mem_len=-1))
    model = small_model()
    with raises(ValueError, 'mem_len=-2', 'non-negative'):
        model.reset_length(5, 0, -2)


def test_relative_mha_heads_must_divide_d_model():
    with raises(ValueError, 'd_model=16', 'heads=3', '[1, 2, 4, 8, 16]'):
        MultiHeadAttention(heads=3, d_model=16, positions=Relative())


def test_relative_mha_mask_shape():
    mha = MultiHeadAttention(heads=2, d_model=8, positions=Relative())
    x = torch.randn(4, 2, 8)
    with raises(ValueError, 'mask of shape [4, 5, 2]', '[4 or 1, 4, 2 or 1]'):
        mha(query=x, key=x, value=x, mask=torch.ones(4, 5, 2, dtype=torch.bool))


def test_target_longer_than_data():
    model = small_model()
    data = torch.randint(0, 40, (5, 2))
    with raises(ValueError, 'target of shape [6, 2]', '1 <= tgt_len <= 5'):
        model(data, torch.randint(0, 40, (6, 2)))


def test_other_constructor_arguments():
    with raises(ValueError, 'attn_type=7', '4 (rotary), 5 (alibi), 6 (t5_bias)'):
        MemTransformerLM(**small_config(attn_type=7))
    with raises(ValueError, 'untie_r=True', 'attn_type=2'):
        MemTransformerLM(**small_config(attn_type=2, untie_r=True))
    with raises(ValueError, 'original_numerics=True', 'attn_type=5', 'types 0 to 3'):
        MemTransformerLM(**small_config(attn_type=5, original_numerics=True))
    with raises(ValueError, 'same_length=True', 'mem_len=0'):
        MemTransformerLM(**small_config(same_length=True, mem_len=0))
    with raises(ValueError, 'n_head * d_head', 'attn_type=3'):
        MemTransformerLM(**small_config(attn_type=3, d_head=4))
    with raises(ValueError, 'tgt_len=None'):
        MemTransformerLM(**small_config(attn_type=1, tgt_len=None))
    with raises(ValueError, 'dropout=1.5'):
        MemTransformerLM(**small_config(dropout=1.5))
    with raises(ValueError, 'sample_softmax=4', 'div_val=2'):
        MemTransformerLM(**small_config(sample_softmax=4, div_val=2, cutoffs=[20], d_embed=8))


def test_div_val_too_large_for_d_embed():
    # d_embed 8 with div_val 4 and two cutoffs: the third cluster would get 8 // 16 = 0 features
    with pytest.raises(ValueError, match=r"div_val=4 is not accepted with d_embed=8 and 2 cutoffs: cluster 2 "
                                         r"would get .* = 0 features; accepted: d_embed >= div_val\*\*2"):
        MemTransformerLM(n_token=60, n_layer=1, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.0,
                         dropatt=0.0, d_embed=8, div_val=4, cutoffs=[20, 40], tie_projs=[False, False, False],
                         tgt_len=4, mem_len=4)


@pytest.mark.parametrize('dtype', [torch.uint8, torch.bool, torch.int16])
def test_token_ids_of_another_integer_dtype_are_refused_not_read_as_indices(dtype):
    model = small_model()
    data = torch.randint(0, 2, (5, 2))
    with raises(TypeError, f'data has dtype {dtype}', 'torch.long', 'data.long()'):
        model(data.to(dtype), data)
    with raises(TypeError, f'target has dtype {dtype}'):
        model(data, data.to(dtype))
    # int32, which an embedding takes, is accepted and scores as int64 does
    torch.testing.assert_close(model.eval()(data.int(), data.int())[0], model(data, data)[0])


def test_memories_of_another_dtype_are_named():
    model = small_model().float()
    data = torch.randint(0, 40, (5, 2))
    _, *mems = model(data, data)
    with raises(TypeError, 'mems[0] is a torch.float64 tensor', 'parameters are torch.float32'):
        model(data, data, *[m.double() for m in mems])


def test_a_transposed_target_is_named_as_such():
    model = small_model()
    data = torch.randint(0, 40, (5, 3))
    with raises(ValueError, 'target of shape [3, 5]', 'looks transposed', '[seq_len, batch]'):
        model(data, data.t())
    with raises(ValueError, 'target of shape [5, 2]') as error:
        model(data, data[:, :2])
    assert 'transposed' not in str(error.value)


@pytest.mark.parametrize('argument', ['pre_lnorm', 'same_length', 'tie_weight', 'adapt_inp', 'untie_r',
                                      'original_numerics'])
@pytest.mark.parametrize('value', ['False', 'no', 0, None])
def test_boolean_arguments_take_only_bools(argument, value):
    with raises(TypeError, f'{argument}={value!r} is not accepted', 'must be a bool'):
        MemTransformerLM(**small_config(**{argument: value}))


def test_tie_projs_takes_only_bools():
    with raises(TypeError, "tie_projs[1]='True' is not accepted"):
        MemTransformerLM(**small_config(cutoffs=[10], tie_projs=[False, 'True']))
