"""The original's initialisation, `labml_txl.xl.init_weights`, the default of new models."""
import pytest
import torch

from labml_txl.xl import MemTransformerLM, init_weights


def big_model(**overrides):
    torch.manual_seed(0)
    config = dict(n_token=2000, n_layer=2, n_head=4, d_model=128, d_head=32, d_inner=256, dropout=0.0,
                  dropatt=0.0, d_embed=96, div_val=2, cutoffs=[800, 1600], tie_projs=[False, True, True],
                  tgt_len=32, mem_len=32, ext_len=0)
    config.update(overrides)
    return MemTransformerLM(**config)


def assert_std(t, std, rel=0.1):
    assert abs(t.std().item() - std) < rel * std, f"std {t.std().item()} != {std}"


def test_default_is_normal_init():
    model = big_model()
    for name, p in model.named_parameters():
        if 'layer_norm.weight' in name:
            # LayerNorm weights ~ N(1, init_std)
            assert abs(p.mean().item() - 1) < 0.01
            assert_std(p, 0.02, rel=0.35)                 # only 128 values
        elif name.endswith('bias'):
            if name in ('r_w_bias', 'r_r_bias'):
                assert_std(p, 0.02, rel=0.35)
            else:
                assert (p == 0).all(), name
        elif 'emb_projs' in name or 'out_projs' in name:
            assert_std(p, 0.01)                           # proj_init_std
            assert abs(p.mean().item()) < 0.002
        else:
            assert_std(p, 0.02)                           # Linear, Embedding, cluster_weight
            assert abs(p.mean().item()) < 0.003


def test_cluster_and_learned_tables():
    model = big_model(attn_type=1)
    assert_std(model.crit.cluster_weight, 0.02, rel=0.2)
    assert (model.crit.cluster_bias == 0).all()
    assert_std(model.r_emb, 0.02)
    assert_std(model.r_w_bias, 0.02, rel=0.2)
    assert (model.r_bias == 0).all()


def test_uniform_init_and_options():
    model = big_model(init='uniform', init_range=0.05, init_std=0.03, proj_init_std=0.004)
    w = model.layers[0].dec_attn.qkv_net.weight
    assert w.abs().max() <= 0.05 and w.abs().max() > 0.049
    assert_std(w, 0.05 / 3 ** 0.5)                        # U(-a, a) has std a / sqrt(3)
    assert_std(model.word_emb.emb_projs[1], 0.004)
    ln = torch.cat([l.pos_ff.layer_norm.weight for l in model.layers])
    assert abs(ln.mean().item() - 1) < 0.01
    assert_std(ln, 0.03, rel=0.3)


def test_untied_biases_are_initialised():
    model = big_model(untie_r=True, cutoffs=[], div_val=1, d_embed=None, tie_projs=[False])
    for layer in model.layers:
        assert_std(layer.dec_attn.r_w_bias, 0.02, rel=0.25)
        assert_std(layer.dec_attn.r_r_bias, 0.02, rel=0.25)


def test_init_weights_reinitialises_in_place():
    model = big_model()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)
    assert init_weights(model, init_std=0.05) is model
    assert_std(model.layers[1].pos_ff.CoreNet[0].weight, 0.05)
    assert (model.layers[1].pos_ff.CoreNet[0].bias == 0).all()


@pytest.mark.parametrize('kwargs', [dict(init='xavier'), dict(init_std=0), dict(init_range=-1.0),
                                    dict(proj_init_std='0.01')])
def test_bad_init_options(kwargs):
    with pytest.raises(ValueError, match=list(kwargs)[0]):
        big_model(**kwargs)
