"""`'rotary'`: RoFormer's rotary position embeddings (`rotary_mha.py`), against labml_nn's module and a naive loop."""
import math
import warnings

import pytest
import torch
from labml.configs import BaseConfigs
from labml_nn.transformers.rope import RotaryPositionalEmbeddings

from labml_txl.fast import dispatch
from labml_txl.configs import TransformerConfigs
from labml_txl.positions.encoding import relative_distances, rotate, rotate_queries_and_keys
from labml_txl.positions.rotary import Rotary
from labml_txl.transformer.mha import MultiHeadAttention

from tolerance import assert_close_rounding, assert_same_function


@pytest.mark.parametrize('d_rotary', [8, 4])
def test_rotation_equals_labml_nn(d_rotary):
    """The same rotation as labml_nn's `RotaryPositionalEmbeddings` (positions 0 .. seq - 1), the whole head or its
    first `d_rotary` features."""
    x = torch.randn(7, 2, 3, 8)
    expected = RotaryPositionalEmbeddings(d_rotary)(x)
    # Rule 2 (labml_nn builds its angles in float32 only): its angle m theta carries 4 float32 roundings (theta's
    # division, power and reciprocal, then the product), each relative to |m theta| <= 6, so depth 4 * 6; then cos
    # and sin, the two products and their sum, 3 more; the terms are |x1| + |x2| <= 2 max |x|
    assert_close_rounding(rotate(x, torch.arange(7), d_rotary), expected, depth=4 * 6 + 3,
                          magnitude=2 * x.abs().max().item())


def test_rotated_scores_depend_on_the_distance_only():
    q, k = torch.randn(5, 1, 2, 8, dtype=torch.float64), torch.randn(5, 1, 2, 8, dtype=torch.float64)
    positions = torch.arange(5)
    scores = torch.einsum('ibhd,jbhd->ijbh', rotate(q, positions, 8), rotate(k, positions, 8))
    shifted = torch.einsum('ibhd,jbhd->ijbh', rotate(q, positions + 11, 8), rotate(k, positions + 11, 8))
    # Rule 1: float64 both (the identity of the scores at positions shifted by 11)
    assert_same_function(shifted, scores)


def _naive(attn: MultiHeadAttention, query, key, value, mask):
    """Pair by pair: rotate each query and key feature pair by its position, softmax over the allowed keys."""
    seq_q, batch, _ = query.shape
    seq_k, heads, d_k, d = key.shape[0], attn.heads, attn.d_k, attn.positions.d_rotary
    q, k, v = (p(x).view(x.shape[0], batch, heads, d_k) for p, x in ((attn.query, query), (attn.key, key),
                                                                     (attn.value, value)))

    def rope(vector, m):
        out = vector.clone()
        for i in range(d // 2):
            angle = m * 10000 ** (-2 * i / d)
            a, b = float(vector[i]), float(vector[i + d // 2])
            out[i] = a * math.cos(angle) - b * math.sin(angle)
            out[i + d // 2] = b * math.cos(angle) + a * math.sin(angle)
        return out

    result = torch.zeros(seq_q, batch, heads, d_k, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(seq_q):
                allowed = [j for j in range(seq_k) if mask[i, j, 0]]
                q_i = rope(q[i, b, h], seq_k - seq_q + i)
                scores = torch.tensor([float(q_i @ rope(k[j, b, h], j)) / math.sqrt(d_k) for j in allowed],
                                      dtype=torch.float64)
                weights = torch.softmax(scores, 0)
                result[i, b, h] = sum(w * v[j, b, h] for w, j in zip(weights, allowed))
    return attn.output(result.reshape(seq_q, batch, heads * d_k))


@pytest.mark.parametrize('seq_q, seq_k, fraction', [(5, 5, 1.0), (3, 7, 1.0), (4, 4, 0.5)])
@pytest.mark.parametrize('impl, chosen', [('auto', 'sdpa'), ('reference', 'reference')])
def test_rotary_attention_equals_a_naive_loop(seq_q, seq_k, fraction, impl, chosen):
    """The fast path (the rotation, then SDPA) and the reference (the rotation in the score hook) against the loop."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(2, 16, dropout_prob=0.0, impl=impl,
                              positions=Rotary(rotary_fraction=fraction)).double().eval()
    query = torch.randn(seq_q, 2, 16, dtype=torch.float64)
    key, value = torch.randn(seq_k, 2, 16, dtype=torch.float64), torch.randn(seq_k, 2, 16, dtype=torch.float64)
    # Causal, with the queries the last `seq_q` of the `seq_k` positions
    mask = torch.ones(seq_q, seq_k, 1, dtype=torch.bool).tril(seq_k - seq_q)
    with torch.no_grad(), dispatch.recording() as choices:
        out = attn(query=query, key=key, value=value, mask=mask)
        expected = _naive(attn, query, key, value, mask)
    # Rule 1: float64 both
    assert_same_function(out, expected)
    assert attn.positions.d_rotary == (8 if fraction == 1.0 else 4)
    assert [c.chosen for c in choices if c.operation == 'attention'] == [chosen]


def test_rotary_gradients_of_the_fast_path_equal_the_references():
    torch.manual_seed(0)
    x = torch.randn(6, 2, 16, dtype=torch.float64)
    mask = torch.ones(6, 6, 1, dtype=torch.bool).tril()
    grads = {}
    for impl in ('auto', 'reference'):
        torch.manual_seed(1)
        attn = MultiHeadAttention(2, 16, dropout_prob=0.0, impl=impl, positions=Rotary(rotary_fraction=0.5)).double()
        attn(query=x, key=x, value=x, mask=mask).square().sum().backward()
        grads[impl] = [p.grad for p in attn.parameters()]
    for fast, reference in zip(grads['auto'], grads['reference']):
        # Rule 1: float64 both
        assert_same_function(fast, reference)


def test_rotary_fraction_is_checked():
    for bad in (0, 1.5, True, 'all'):
        with pytest.raises(ValueError, match="rotary_fraction=.* is not accepted: .* in \\(0, 1\\]"):
            MultiHeadAttention(2, 16, positions=Rotary(rotary_fraction=bad))
    with pytest.raises(ValueError, match="rotates 0 of the 8 features of a head: at least one pair"):
        MultiHeadAttention(2, 16, positions=Rotary(rotary_fraction=0.1))


class _Configs(BaseConfigs):
    transformer: TransformerConfigs


def test_the_rotary_option_of_the_configs(labml_experiment):
    conf = _Configs()
    labml_experiment.configs(conf, {'transformer.encoder_attn': 'rotary', 'transformer.rotary_fraction': 0.5,
                                    'transformer.src_embed': 'no_pos', 'transformer.d_model': 16,
                                    'transformer.n_heads': 2})
    attn = conf.transformer.encoder_attn
    assert type(attn.positions) is Rotary and attn.positions.d_rotary == 4


@pytest.mark.parametrize('embed', ['fixed_pos', 'learned_pos'])
def test_rotary_with_a_position_embedding_warns_of_positions_added_twice(labml_experiment, embed):
    conf = _Configs()
    labml_experiment.configs(conf, {'transformer.encoder_attn': 'rotary', 'transformer.src_embed': embed,
                                    'transformer.d_model': 16, 'transformer.n_heads': 2})
    with pytest.warns(UserWarning, match=f"encoder_attn='rotary' with src_embed='{embed}' adds positions twice.*"
                                         f"src_embed='no_pos' leaves them to it"):
        _ = conf.transformer.encoder_attn


def test_rotary_with_no_position_embedding_does_not_warn(labml_experiment):
    conf = _Configs()
    labml_experiment.configs(conf, {'transformer.decoder_attn': 'rotary', 'transformer.tgt_embed': 'no_pos',
                                    'transformer.d_model': 16, 'transformer.n_heads': 2})
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert type(conf.transformer.decoder_attn.positions) is Rotary


# -- cross-attention: queries of one sequence (the target), keys of another (the source), of any two lengths

def _rotation_matrix(m: int, d_k: int, d_rotary: int) -> torch.Tensor:
    r"""The `[d_k, d_k]` matrix of RoFormer's rotation at position $m$, written out: the 2x2 block
    $\begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i \end{pmatrix}$ on the
    features $(i, i + d/2)$ for $i < d/2$, the identity on the $d_k - d$ features left as they are."""
    r = torch.eye(d_k, dtype=torch.float64)
    for i in range(d_rotary // 2):
        angle = m * 10000 ** (-2 * i / d_rotary)
        a, b = i, i + d_rotary // 2
        r[a, a], r[a, b], r[b, a], r[b, b] = math.cos(angle), -math.sin(angle), math.sin(angle), math.cos(angle)
    return r


def _cross_attention_by_matrices(attn: MultiHeadAttention, query, key, value, masked_keys):
    """Scores and output of cross-attention, by explicit rotation matrices: query $i$ at $m_i = S - T + i$ (the last
    $T$ of the $S$ key positions, before the first key when $T > S$), key $j$ at $j$; `masked_keys` `[S]` (True:
    left out, as a source's padding)."""
    seq_q, batch, _ = query.shape
    seq_k, heads, d_k = key.shape[0], attn.heads, attn.d_k
    q, k, v = (p(x).view(x.shape[0], batch, heads, d_k) for p, x in ((attn.query, query), (attn.key, key),
                                                                     (attn.value, value)))
    # $R(m_i) q_i$ and $R(j) k_j$
    q = torch.stack([_rotation_matrix(seq_k - seq_q + i, d_k, attn.positions.d_rotary) @ q[i].unsqueeze(-1)
                     for i in range(seq_q)]).squeeze(-1)
    k = torch.stack([_rotation_matrix(j, d_k, attn.positions.d_rotary) @ k[j].unsqueeze(-1)
                     for j in range(seq_k)]).squeeze(-1)
    # $A_{ij} = (R(m_i) q_i)^\top R(j) k_j / \sqrt{d_k}$, `[T, S, batch, heads]`
    scores = torch.einsum('ibhd,jbhd->ijbh', q, k) / math.sqrt(d_k)
    weights = torch.softmax(scores.masked_fill(masked_keys[None, :, None, None], -math.inf), dim=1)
    out = torch.einsum('ijbh,jbhd->ibhd', weights, v)
    return scores, attn.output(out.reshape(seq_q, batch, heads * d_k))


@pytest.mark.parametrize('seq_q, seq_k', [(7, 3), (3, 7), (6, 1), (1, 6), (4, 4)])
@pytest.mark.parametrize('fraction', [1.0, 0.5])
@pytest.mark.parametrize('impl, chosen', [('auto', 'sdpa'), ('reference', 'reference')])
def test_rotary_cross_attention_of_any_two_lengths_equals_rotation_matrices(seq_q, seq_k, fraction, impl, chosen):
    """A target longer (7 > 3: `The size of tensor a (7) must match ... (3)` before) or shorter than the source,
    against rotations written out as matrices: each side turned by its own positions."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(2, 16, dropout_prob=0.0, impl=impl,
                              positions=Rotary(rotary_fraction=fraction)).double().eval()
    query = torch.randn(seq_q, 2, 16, dtype=torch.float64)
    key, value = torch.randn(seq_k, 2, 16, dtype=torch.float64), torch.randn(seq_k, 2, 16, dtype=torch.float64)
    # The last source entry is padding (when there are two or more), the mask `[1, S, 1]` of a source
    masked_keys = torch.zeros(seq_k, dtype=torch.bool)
    masked_keys[-1] = seq_k > 1
    with torch.no_grad(), dispatch.recording() as choices:
        out = attn(query=query, key=key, value=value, mask=~masked_keys[None, :, None])
        scores, expected = _cross_attention_by_matrices(attn, query, key, value, masked_keys)
    # Rule 1: float64 both
    assert_same_function(out, expected)
    assert [c.chosen for c in choices if c.operation == 'attention'] == [chosen]
    if impl == 'reference':
        # The scores themselves, from the reference's score hook (unscaled, `[T, S, batch, heads]`)
        q, k = (p(x).view(x.shape[0], 2, 2, 8) for p, x in ((attn.query, query), (attn.key, key)))
        with torch.no_grad():
            assert_same_function(attn.get_scores(q, k) / math.sqrt(8), scores)


def test_rotary_cross_attention_scores_depend_on_the_distance_the_other_schemes_use():
    """The score of query $i$ and key $j$ depends on $i - j + S - T$ only, the distance ALiBi and T5 bias give the same
    pair (`relative_distances`): the same query and key vectors placed at any $(i, j)$ of equal distance score the
    same, for $T > S$ and $T < S$."""
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    for seq_q, seq_k in ((7, 3), (3, 7)):
        # The same vectors at every position, `[seq, batch = 1, heads = 1, 8]`
        rotated_q, rotated_k = rotate_queries_and_keys(q.expand(seq_q, 1, 1, 8), k.expand(seq_k, 1, 1, 8), 8)
        scores = torch.einsum('ibhd,jbhd->ij', rotated_q, rotated_k)
        distances = relative_distances(seq_q, seq_k, bidirectional=True, dtype=torch.float64)
        for i in range(seq_q):
            for j in range(seq_k):
                # Table entry $s = j + T - 1 - i$ holds the distance of the pair, $i - j + S - T$
                distance = int(distances[j + seq_q - 1 - i])
                assert distance == i - j + seq_k - seq_q
                # $R(d) q \cdot R(0) k$: the query at that distance from a key at 0
                alone = rotate(q.view(1, 1, 1, 8), torch.tensor([distance]), 8).flatten() @ k
                # Rule 1: float64 both
                assert_same_function(scores[i, j], alone)


@pytest.mark.parametrize('scheme', ['rotary', 'alibi', 't5_bias'])
@pytest.mark.parametrize('src_len, tgt_len', [(3, 7), (7, 3)])
def test_decoder_mem_attn_takes_a_target_longer_or_shorter_than_the_source(labml_experiment, scheme, src_len,
                                                                           tgt_len):
    """The case reported: `decoder_mem_attn='rotary'` in the vanilla encoder-decoder with 7 target tokens for 3 source
    tokens, as `'alibi'` and `'t5_bias'` take them."""
    from labml_txl.attention.masks import subsequent_mask

    conf = _Configs()
    labml_experiment.configs(conf, {'transformer.decoder_mem_attn': scheme, 'transformer.src_embed': 'no_pos',
                                    'transformer.n_src_vocab': 5, 'transformer.n_tgt_vocab': 6,
                                    'transformer.d_model': 16, 'transformer.n_heads': 2, 'transformer.n_layers': 1})
    model = conf.transformer.encoder_decoder.eval()
    src, tgt = torch.randint(5, (src_len, 2)), torch.randint(6, (tgt_len, 2))
    with torch.no_grad():
        out = model(src, tgt, None, subsequent_mask(tgt_len))
    assert out.shape == (tgt_len, 2, 16) and torch.isfinite(out).all()


def test_rotate_refuses_positions_of_another_length():
    """One position per entry: a table of another length is named, not broadcast into a shape error."""
    with pytest.raises(ValueError, match=r"rotate: 3 positions for 7 entries on axis 0 of x \(7, 2, 3, 8\); each "
                                         r"entry is turned by its own position"):
        rotate(torch.randn(7, 2, 3, 8), torch.arange(3), 8)
