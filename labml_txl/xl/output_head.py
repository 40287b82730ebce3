r"""
# The output head: the adaptive softmax, or the sampled softmax over a full output layer

Transformer-XL scores the next word from the last layer's output $h$ with one of two heads, as the original does:

* the **adaptive softmax** (`crit`, `adaptive_softmax.py`; `sample_softmax <= 0`), its clusters tied to the adaptive
  embedding's where `tie_weight` and `tie_projs` say so;
* the **sampled softmax** (`sample_softmax > 0`): a full-vocabulary layer `out_layer` (its weight the embedding's with
  `tie_weight`), trained on the true word against `sample_softmax` log-uniform draws (`log_uniform_sampler.py`) and
  evaluated with its full softmax.

The layers are the model's own attributes (`crit.*` or `out_layer.*` in a state_dict, the original's names);
`OutputHead` builds them on the model and computes from them.
"""
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..fast.dispatch import Plan
from .adaptive_softmax import ProjectedAdaptiveLogSoftmax
from .log_uniform_sampler import LogUniformSampler, sample_logits


class OutputHead:
    """
    The head of `model` (see the module docstring), built on it.

    Args:
        model: the `MemTransformerLM` whose `word_emb` the head may share weights with; the head's layers become its
            attributes `crit`, or `out_layer` and `sampler`.
        n_token, d_embed, d_model, cutoffs, div_val: the vocabulary and the adaptive clusters, as the embedding's.
        tie_weight: share the output layers' weights with the embedding's.
        tie_projs: per cluster, share the softmax projection with the embedding's.
        sample_softmax: `> 0` for the sampled softmax with that many draws.
    """

    def __init__(self, model: nn.Module, n_token: int, d_embed: int, d_model: int, cutoffs: Sequence[int],
                 div_val: int, tie_weight: bool, tie_projs: Sequence[bool], sample_softmax: int):
        self.model, self.n_token, self.sampled = model, n_token, sample_softmax > 0
        embedding = model.word_emb
        if self.sampled:
            # Full-vocabulary output layer, trained through the sampled softmax
            model.out_layer = nn.Linear(d_model, n_token)
            if tie_weight:
                model.out_layer.weight = embedding.emb_layers[0].weight
            model.sampler = LogUniformSampler(n_token, sample_softmax)
            return
        model.crit = crit = ProjectedAdaptiveLogSoftmax(n_token, d_embed, d_model, cutoffs, div_val=div_val)
        if tie_weight:
            for i in range(len(crit.out_layers)):
                crit.out_layers[i].weight = embedding.emb_layers[i].weight
        for i, tie_proj in enumerate(tie_projs):
            if tie_proj and div_val == 1 and d_model != d_embed:
                crit.out_projs[i] = embedding.emb_projs[0]
            elif tie_proj and div_val != 1:
                crit.out_projs[i] = embedding.emb_projs[i]

    def loss(self, hidden: torch.Tensor, target: torch.Tensor, plan: Plan) -> torch.Tensor:
        """
        $-\\log p(\\text{target} \\mid h)$ per position: the sampled softmax's in training with it, else the full
        (adaptive) softmax's.

        Shape:
            `hidden` `[tgt_len, bsz, d_model]`, `target` `[tgt_len, bsz]`; returns `[tgt_len, bsz]`.
        """
        model = self.model
        if self.sampled and model.training:
            logit = sample_logits(model.out_layer.weight, model.out_layer.bias, target, hidden, model.sampler)
            # $-\log$ of the true class's share among it and the samples
            return -F.log_softmax(logit, -1)[:, :, 0]
        if self.sampled:
            return -self.log_probs(hidden, plan).gather(2, target[:, :, None]).squeeze(2)
        return model.crit(hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1), plan=plan).view(target.shape)

    def log_probs(self, hidden: torch.Tensor, plan: Plan) -> torch.Tensor:
        """Full-vocabulary log-probabilities `[..., n_token]` of hidden states `[..., d_model]`."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        if self.sampled:
            log_probs = F.log_softmax(self.model.out_layer(flat), dim=-1)
        else:
            log_probs = self.model.crit.log_prob(flat, plan=plan)
        return log_probs.view(*hidden.shape[:-1], self.n_token)

    def logits(self, hidden: torch.Tensor, plan: Plan) -> torch.Tensor:
        """Scores whose softmax is the next-word distribution, `[..., n_token]`: the full layer's logits, or (the
        adaptive softmax has no single logit per word) its log-probabilities, which have the same softmax."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        scores = self.model.out_layer(flat) if self.sampled else self.model.crit.logits(flat, plan=plan)
        return scores.view(*hidden.shape[:-1], self.n_token)
