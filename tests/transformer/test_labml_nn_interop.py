"""labml_nn 0.5.1's state_dicts load with `load_state_dict(strict=True)` into the modules built here from the same
options, and the two give the same outputs; `TransformerLayer.ff_input` as labml_nn keeps it."""
import pytest
import torch
from labml import tracker
from labml.configs import BaseConfigs, option
from labml_nn.transformers import configs as labml_nn_configs
from labml_nn.transformers.alibi import AlibiMultiHeadAttention as LabmlNNAlibi
from labml_nn.transformers.models import EmbeddingsWithPositionalEncoding as LabmlNNFixedEmbeddings
from labml_nn.transformers.rope import RotaryPEMultiHeadAttention as LabmlNNRotary
from torch import nn

from labml_txl.positions.alibi import Alibi
from labml_txl.attention.masks import subsequent_mask
from labml_txl.configs import TransformerConfigs
from labml_txl.transformer.feed_forward import FeedForward
from labml_txl.transformer.mha import MultiHeadAttention
from labml_txl.transformer.models import EmbeddingsWithPositionalEncoding, TransformerLayer
from labml_txl.positions.rotary import Rotary
from tolerance import assert_same_function

OPTIONS = {'d_model': 16, 'n_heads': 4, 'n_layers': 2, 'ffn.d_ff': 24, 'n_src_vocab': 11, 'n_tgt_vocab': 13}
GLU_VARIANTS = ['none', 'GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU']


class BothConfigs(BaseConfigs):
    """The same overrides given to our `TransformerConfigs` and to labml_nn's."""
    ours: TransformerConfigs
    theirs: labml_nn_configs.TransformerConfigs = 'labml_nn'


@option(BothConfigs.theirs, 'labml_nn')
def _labml_nn_configs():
    # (by name: labml would take the class itself as the option, and warn about its keyword arguments)
    return labml_nn_configs.TransformerConfigs()


@pytest.fixture(autouse=True)
def _labml_nn_runs(monkeypatch):
    """labml_nn 0.5.1's `MultiHeadAttention.forward` calls `tracker.debug`, which labml 0.5.3 no longer has (issue 16,
    item 7): a no-op stands in for it while these tests run labml_nn's modules."""
    monkeypatch.setattr(tracker, 'debug', lambda *args, **kwargs: None, raising=False)


def build_both(labml_experiment, **overrides):
    conf = BothConfigs()
    options = {**OPTIONS, **overrides}
    labml_experiment.configs(conf, {f'{side}.{key}': value for side in ('ours', 'theirs')
                                    for key, value in options.items()})
    return conf.ours, conf.theirs


def randomise(module: nn.Module) -> nn.Module:
    """float64, every parameter random (norm gains and biases, learned positions): an entry that failed to load
    would show in the outputs."""
    module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (p.dim() == 1) * 1.0)
    return module.eval()


def load_theirs(ours: nn.Module, theirs: nn.Module) -> nn.Module:
    """`theirs`'s state_dict loaded into `ours` by plain `load_state_dict(strict=True)`."""
    state_dict = theirs.state_dict()
    ours.double().load_state_dict(state_dict, strict=True)
    return ours.eval()


def assert_same(got: torch.Tensor, expected: torch.Tensor):
    """Both sides in float64: the same function (tolerance.py's rule 1)."""
    assert_same_function(got, expected)


def rotary_tables_in_float64(attention: LabmlNNRotary, seq_len: int) -> LabmlNNRotary:
    """labml_nn builds its rotation tables with `.float()` whatever the dtype of the queries (`_build_cache`): here
    they are built by its own lines in float64, before its first call, which keeps them (`seq_len` fits); the rest
    of its computation follows the queries' dtype."""
    for rope in (attention.query_rotary_pe, attention.key_rotary_pe):
        theta = 1. / (rope.base ** (torch.arange(0, rope.d, 2, dtype=torch.float64) / rope.d))
        idx_theta = torch.einsum('n,d->nd', torch.arange(seq_len, dtype=torch.float64), theta)
        idx_theta2 = torch.cat([idx_theta, idx_theta], dim=1)
        rope.cos_cached = idx_theta2.cos()[:, None, None, :]
        rope.sin_cached = idx_theta2.sin()[:, None, None, :]
    return attention


def padding_mask(lengths, seq_k: int) -> torch.Tensor:
    """Key padding `[1, seq_k, batch]`, True where a key is present."""
    return (torch.arange(seq_k)[:, None] < torch.tensor(lengths)[None, :]).unsqueeze(0)


@pytest.mark.parametrize('embed', ['fixed_pos', 'learned_pos'])
@pytest.mark.parametrize('glu_variant', GLU_VARIANTS)
def test_labml_nns_encoder_decoder_loads_and_gives_its_outputs(labml_experiment, embed, glu_variant):
    ours, theirs = build_both(labml_experiment, src_embed=embed, tgt_embed=embed, **{'ffn.glu_variant': glu_variant})
    their_model = randomise(theirs.encoder_decoder)
    state_dict = their_model.state_dict()
    # labml_nn's names, which ours did not have before this was built
    assert 'encoder.layers.0.self_attn.query.linear.weight' in state_dict
    assert ('src_embed.positional_encodings' in state_dict) and ('tgt_embed.positional_encodings' in state_dict)
    assert ('encoder.layers.0.feed_forward.linear_v.weight' in state_dict) == (glu_variant != 'none')
    our_model = load_theirs(ours.encoder_decoder, their_model)

    src, tgt = torch.randint(11, (7, 3)), torch.randint(13, (5, 3))
    src_mask, tgt_mask = padding_mask([7, 4, 2], 7), subsequent_mask(5)
    with torch.no_grad():
        # the encoder (source embeddings, bidirectional attention over the present keys) ...
        assert_same(our_model.encode(src, src_mask), their_model.encode(src, src_mask))
        # ... and the decoder under a causal mask, with the generator's logits
        expected = their_model.generator(their_model(src, tgt, src_mask, tgt_mask))
        assert_same(our_model.generator(our_model(src, tgt, src_mask, tgt_mask)), expected)


@pytest.mark.parametrize('embed', ['fixed_pos', 'learned_pos', 'no_pos'])
def test_labml_nns_embeddings_load_and_embed_alike(labml_experiment, embed):
    ours, theirs = build_both(labml_experiment, src_embed=embed)
    their_embed = randomise(theirs.src_embed)
    our_embed = load_theirs(ours.src_embed, their_embed)
    tokens = torch.randint(11, (9, 2))
    with torch.no_grad():
        assert_same(our_embed(tokens), their_embed(tokens))


@pytest.mark.parametrize('build', [
    lambda: (MultiHeadAttention(4, 16, dropout_prob=0.0, positions=Alibi()), LabmlNNAlibi(4, 16, dropout_prob=0.0)),
    # labml_nn computes the rotation angles in float32 whatever the dtype of the queries: its tables are built in
    # float64 below
    lambda: (MultiHeadAttention(4, 16, dropout_prob=0.0, positions=Rotary(rotary_fraction=0.5)),
             LabmlNNRotary(4, 16, rope_percentage=0.5)),
], ids=['alibi', 'rotary'])
def test_labml_nns_positional_attentions_load_by_the_same_names(build):
    """labml_nn's ALiBi and RoPE attentions (the options its experiments register) have only the projections of its
    `MultiHeadAttention`: their state_dicts load into ours the same way."""
    ours, theirs = build()
    theirs = randomise(theirs)
    ours = load_theirs(ours, theirs)
    x, mask = torch.randn(6, 2, 16, dtype=torch.float64), subsequent_mask(6)
    if isinstance(theirs, LabmlNNRotary):
        rotary_tables_in_float64(theirs, seq_len=6)
    with torch.no_grad():
        assert_same(ours(query=x, key=x, value=x, mask=mask), theirs(query=x, key=x, value=x, mask=mask))


def test_ff_input_is_labml_nns(labml_experiment):
    ours, theirs = build_both(labml_experiment, **{'ffn.glu_variant': 'SwiGLU'})
    their_decoder = randomise(theirs.decoder)
    our_decoder = load_theirs(ours.decoder, their_decoder)
    assert all(layer.ff_input is None for layer in our_decoder.layers)
    for layer in (*our_decoder.layers, *their_decoder.layers):
        layer.is_save_ff_input = True
    x, memory = torch.randn(5, 2, 16, dtype=torch.float64), torch.randn(7, 2, 16, dtype=torch.float64)
    with torch.no_grad():
        our_decoder(x, memory, None, subsequent_mask(5))
        their_decoder(x, memory, None, subsequent_mask(5))
    for our_layer, their_layer in zip(our_decoder.layers, their_decoder.layers):
        assert our_layer.ff_input.shape == (5, 2, 16)
        assert_same(our_layer.ff_input, their_layer.ff_input)


def test_ff_input_of_a_post_norm_layer_is_what_the_feed_forward_gets():
    """Post-norm (ours only) has no norm before the feed-forward: the layer's output is $LN(z + FFN(z))$ of the
    kept $z$."""
    layer = randomise(TransformerLayer(d_model=16, self_attn=MultiHeadAttention(4, 16), feed_forward=FeedForward(16, 24),
                                       dropout_prob=0.0, norm_first=False))
    layer.is_save_ff_input = True
    x = torch.randn(4, 3, 16, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x=x)
        z = layer.ff_input
        assert_same(out, layer.norm_ff(z + layer.feed_forward(z)))


def test_ff_input_is_not_kept_unless_asked_and_the_switch_takes_a_bool_only(labml_experiment):
    ours, _ = build_both(labml_experiment)
    layer = ours.encoder_layer.eval()
    layer(x=torch.randn(4, 3, 16))
    assert layer.is_save_ff_input is False and layer.ff_input is None
    with pytest.raises(TypeError, match=r"is_save_ff_input='True' is not accepted: .* must be a bool"):
        layer.is_save_ff_input = 'True'


def test_positional_encodings_that_differ_from_ours_are_refused_naming_the_key(labml_experiment):
    ours, theirs = build_both(labml_experiment)
    state_dict = randomise(theirs.encoder_decoder).state_dict()
    state_dict['tgt_embed.positional_encodings'][3, 0, 5] += 1e-3
    with pytest.raises(RuntimeError, match=r"tgt_embed\.positional_encodings is not accepted: it differs from this "
                                           r"module's fixed sinusoids by up to 0\.001"):
        ours.encoder_decoder.double().load_state_dict(state_dict, strict=True)


def test_a_positional_table_of_another_length_is_refused_naming_key_and_shapes():
    theirs = LabmlNNFixedEmbeddings(8, 11, max_len=100)
    with pytest.raises(RuntimeError, match=r"positional_encodings of shape \[100, 1, 8\] and dtype torch.float32 is "
                                           r"not accepted: this module's fixed sinusoids are \[5000, 1, 8\] floats "
                                           r"\(max_len=5000, d_model=8\)"):
        EmbeddingsWithPositionalEncoding(8, 11).load_state_dict(theirs.state_dict(), strict=True)
    # built with the same max_len, it loads
    EmbeddingsWithPositionalEncoding(8, 11, max_len=100).load_state_dict(theirs.state_dict(), strict=True)


def test_both_names_of_a_projection_are_refused():
    attention = MultiHeadAttention(2, 8)
    state_dict = attention.state_dict()
    state_dict['key.linear.weight'] = state_dict['key.weight'].clone()
    with pytest.raises(RuntimeError, match=r"both 'key\.linear\.weight' \(labml_nn's name\) and 'key\.weight' are in "
                                           r"the state_dict"):
        MultiHeadAttention(2, 8).load_state_dict(state_dict, strict=True)


def test_our_own_state_dicts_keep_their_names_and_load(labml_experiment):
    ours, _ = build_both(labml_experiment)
    model = randomise(ours.encoder_decoder)
    # (copies: a state_dict holds the parameters themselves)
    state_dict = {key: value.clone() for key, value in model.state_dict().items()}
    assert 'encoder.layers.0.self_attn.query.weight' in state_dict
    assert not any(key.endswith('positional_encodings') for key in state_dict), 'the fixed table is not saved'
    src, tgt = torch.randint(11, (6, 2)), torch.randint(13, (4, 2))
    with torch.no_grad():
        expected = model(src, tgt, None, subsequent_mask(4))
        randomise(model)
        assert not torch.allclose(model(src, tgt, None, subsequent_mask(4)), expected)
        model.load_state_dict(state_dict, strict=True)
        assert_same(model(src, tgt, None, subsequent_mask(4)), expected)


def test_a_labml_nn_gmlp_block_stacks_in_our_encoder_as_in_labml_nns():
    """labml_nn's experiments put layers of their own into `TransformerConfigs` (gMLP's `GMLPBlock` as the encoder
    layer): our `Encoder` takes any layer labml_nn's takes (called with `x` and `mask`, its width in `size`, a
    LayerNorm after the stack) and computes what labml_nn's computes with the same weights; in float64, the same
    function (tolerance.py's rule 1)."""
    from labml_nn.transformers.gmlp import GMLPBlock
    from labml_nn.transformers.models import Encoder as LabmlNNEncoder
    from labml_txl.transformer.models import Encoder

    block = GMLPBlock(d_model=16, d_ffn=32, seq_len=6).double()
    ours, theirs = Encoder(block, n_layers=2).double(), LabmlNNEncoder(block, n_layers=2).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x, mask = torch.randn(6, 3, 16, dtype=torch.float64), subsequent_mask(6)
    assert isinstance(ours.norm, nn.LayerNorm)
    assert_same_function(ours(x, mask), theirs(x=x, mask=mask))


def test_a_layer_without_its_width_is_refused_naming_size():
    from labml_txl.transformer.models import Decoder, Encoder

    class Widthless(nn.Module):
        def forward(self, *, x, mask=None):
            return x

    for stack in (Encoder, Decoder):
        with pytest.raises(TypeError, match=f'the layers of a {stack.__name__} say their width in `size`.*'
                                            f'Widthless has size=None'):
            stack(Widthless(), n_layers=2)
