"""The log-uniform sampler and the sampled-softmax training path."""
import math

import torch

from labml_txl.xl import LogUniformSampler, MemTransformerLM, sample_logits

from tolerance import assert_close_rounding, assert_same_function, rounding_bound

from .helpers import small_config


def test_distribution_is_log_uniform():
    sampler = LogUniformSampler(50, 4)
    expected = torch.tensor([(math.log(k + 2) - math.log(k + 1)) / math.log(51) for k in range(50)],
                            dtype=torch.float64)
    # Rule 2: computed in float64, rounded once to float32 (relative: of the largest P's size)
    assert_close_rounding(sampler.dist, expected, depth=1, magnitude=expected.max().item())
    # ... and summed here in float32: 50 additions, and the 50 roundings (relative, of a P that sums to 1)
    assert abs(sampler.dist.sum().item() - 1) < rounding_bound(torch.float32, 50 + 1)
    assert (sampler.dist[1:] < sampler.dist[:-1]).all()       # more frequent words (lower ids) more likely


def test_log_q_is_the_inclusion_probability():
    """$Q(k)$ is the chance class k is among $2 n_{sample}$ draws: check against drawn samples."""
    n_token, n_sample, trials = 10, 3, 4000
    sampler = LogUniformSampler(n_token, n_sample)
    p = sampler.dist.double()
    # Rule 2: log Q rounded once to float32; P rounded once too (relative), which moves log Q by at most as much
    # (its condition number in P, m P (1 - P)^(m - 1) / (1 - (1 - P)^m) with m = 2 n_sample, is at most 1)
    assert_close_rounding(sampler.log_q, torch.log(1 - (1 - p) ** (2 * n_sample)), depth=2)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(n_token)
    labels = torch.zeros(1, 1, dtype=torch.long)
    for _ in range(trials):
        _, _, samples = sampler.sample(labels, generator)
        assert (samples[1:] > samples[:-1]).all()               # distinct
        counts[samples] += 1
    q = sampler.log_q.exp()
    sigma = (q * (1 - q) / trials).sqrt()
    # (statistical, not rounding: five standard deviations of each class's binomial fraction)
    assert ((counts / trials - q).abs() < 5 * sigma + 1e-3).all()


def test_sample_logits_masks_hits():
    torch.manual_seed(0)
    sampler = LogUniformSampler(20, 30)                         # 60 draws: nearly every class, targets too
    weight, bias = torch.randn(20, 4), torch.randn(20)
    labels = torch.tensor([[0, 1], [2, 3]])
    inputs = torch.randn(2, 2, 4)
    torch.manual_seed(1)
    _, _, samples = sampler.sample(labels)
    torch.manual_seed(1)
    logits = sample_logits(weight, bias, labels, inputs, sampler)
    assert logits.shape == (2, 2, 1 + len(samples))
    for i in range(2):
        for j in range(2):
            y = labels[i, j]
            # Rule 2, float32 both: the product over 4 features, the bias and log Q
            assert_close_rounding(logits[i, j, 0], inputs[i, j] @ weight[y] + bias[y] - sampler.log_q[y],
                                  depth=4 + 2)
            hit = (samples == y).nonzero()
            if len(hit):
                assert logits[i, j, 1 + hit[0, 0]] == torch.finfo(torch.float32).min


def test_sampled_softmax_trains_with_finite_gradients():
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(sample_softmax=6, dropout=0.1)).train()
    data = torch.randint(0, 40, (11, 3))
    loss, *mems = model(data[:5], data[1:6])
    loss, *mems = model(data[5:10], data[6:11], *mems)
    assert loss.shape == (5, 3) and torch.isfinite(loss).all() and (loss > 0).all()
    loss.mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.out_layer.weight is model.word_emb.emb_layers[0].weight


def test_only_targets_and_samples_get_output_gradients():
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(sample_softmax=3, tie_weight=False)).double().train()
    data = torch.randint(0, 40, (6, 2))
    torch.manual_seed(7)
    samples = torch.multinomial(model.sampler.dist, 6, replacement=True).unique()
    torch.manual_seed(7)
    loss = model(data[:5], data[1:6])[0]
    loss.sum().backward()
    touched = set(model.out_layer.weight.grad.abs().sum(1).nonzero().flatten().tolist())
    assert touched <= set(samples.tolist()) | set(data[1:6].flatten().tolist())
    assert len(touched) > 0


def test_all_classes_sampled_gives_the_full_softmax():
    """
    With so many draws that every class is drawn and $Q(k) = 1$ for all $k$ (so $\\log Q = 0$), the
    sampled softmax is the full softmax: the training loss equals the evaluation (full-softmax) loss.
    """
    torch.manual_seed(0)
    model = MemTransformerLM(**small_config(sample_softmax=5000)).double()
    assert (model.sampler.log_q == 0).all()
    data = torch.randint(0, 40, (6, 2))
    model.train()                                   # dropout is 0: only the loss differs between modes
    sampled = model(data[:5], data[1:6])[0]
    model.eval()
    full = model(data[:5], data[1:6])[0]
    # Rule 1: float64 both
    assert_same_function(sampled, full)
