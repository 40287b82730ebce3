r"""
# Log-uniform sampling and the sampled softmax

From *On Using Very Large Target Vocabulary for Neural Machine Translation* (Jean et al., 2015) as the
original Transformer-XL code (after TensorFlow's `log_uniform_candidate_sampler`) does it: when the
vocabulary is sorted by frequency, Zipf's law makes the *log-uniform* distribution

$$P(k) = \frac{\log(k + 2) - \log(k + 1)}{\log(n_{token} + 1)}, \qquad k = 0, \dots, n_{token} - 1$$

a good proposal. Each training step draws $2 n_{sample}$ classes with replacement and keeps the distinct ones
$S$. Class $k$ is in $S$ with probability $Q(k) = 1 - (1 - P(k))^{2 n_{sample}}$, and the sampled softmax
scores the true class against $S$ with logits corrected by $\log Q$:

$$\tilde{o}_c = h^\top W_c + b_c - \log Q(c), \qquad
  \mathcal{L} = -\log \frac{e^{\tilde{o}_{y}}}{e^{\tilde{o}_{y}} + \sum_{c \in S, c \ne y} e^{\tilde{o}_c}}$$

A sampled class that equals the target is left out (its logit is set to the dtype's most negative number).
The original PyTorch port computed $Q(k)$ as $1 - (1 + P(k))^{-2 n_{sample}}$, a first-order approximation;
this is the exact inclusion probability (TensorFlow's).
"""
from typing import Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import require_positive_int


class LogUniformSampler(nn.Module):
    """
    Args:
        range_max: number of classes $n_{token}$.
        n_sample: half the number of draws per step (the original's `sample_softmax`).

    Buffers (not saved in the `state_dict`): `dist` $P$ `[range_max]` and `log_q` $\\log Q$ `[range_max]`.
    """

    def __init__(self, range_max: int, n_sample: int):
        super().__init__()
        require_positive_int('range_max', range_max)
        require_positive_int('n_sample', n_sample)
        self.range_max = range_max
        self.n_sample = n_sample
        with torch.no_grad():
            log_indices = torch.arange(1., range_max + 2., 1., dtype=torch.float64).log()
            # $P(k) = (\log(k + 2) - \log(k + 1)) / \log(n_{token} + 1)$
            dist = (log_indices[1:] - log_indices[:-1]) / log_indices[-1]
            # $\log Q(k) = \log(1 - (1 - P(k))^{2 n_{sample}})$
            log_q = torch.log(-torch.expm1(2 * n_sample * torch.log1p(-dist)))
        self.register_buffer('dist', dist.float(), persistent=False)
        self.register_buffer('log_q', log_q.float(), persistent=False)

    def sample(self, labels: torch.Tensor, generator: Optional[torch.Generator] = None
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """
        Draw $2 n_{sample}$ classes and keep the distinct ones.

        Returns `true_log_probs` $\\log Q$ of `labels` (same shape), `samp_log_probs` $\\log Q$ of the samples
        `[S]` and the sampled classes `neg_samples` `[S]` (sorted, distinct).
        """
        with torch.no_grad():
            # $2 n_{sample}$ draws from $P$, with replacement; the distinct ones are $S$
            neg_samples = torch.multinomial(self.dist, 2 * self.n_sample, replacement=True,
                                            generator=generator).unique()
            neg_samples = neg_samples.to(labels.device)
            log_q = self.log_q.to(labels.device)
            return log_q[labels], log_q[neg_samples], neg_samples


def sample_logits(weight: torch.Tensor, bias: torch.Tensor, labels: torch.Tensor, inputs: torch.Tensor,
                  sampler: LogUniformSampler, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""
    Logits of the true class and of the sampled classes, corrected by $\log Q$.

    Args:
        weight: output weights $W$ `[n_token, d]` (the input embeddings when tied).
        bias: output biases $b$ `[n_token]`.
        labels: true classes `[seq, batch]`.
        inputs: hidden states $h$ `[seq, batch, d]`.
        sampler: the `LogUniformSampler`.

    Shape:
        returns `[seq, batch, 1 + S]`: column 0 the true class, then the $S$ sampled classes.
        The sampled-softmax loss is `-log_softmax(logits, -1)[:, :, 0]`.
    """
    true_log_probs, samp_log_probs, neg_samples = sampler.sample(labels, generator)
    n_sample = neg_samples.shape[0]
    b1, b2 = labels.shape
    all_ids = torch.cat([labels.reshape(-1), neg_samples])
    all_w = F.embedding(all_ids, weight)
    all_b = bias[all_ids]
    true_w = all_w[:-n_sample].view(b1, b2, -1)
    sample_w = all_w[-n_sample:]
    true_b = all_b[:-n_sample].view(b1, b2)
    sample_b = all_b[-n_sample:]
    # $\tilde{o}_y = h^\top W_y + b_y - \log Q(y)$
    true_logits = (true_w * inputs).sum(-1) + true_b - true_log_probs.to(inputs.dtype)
    # $\tilde{o}_c = h^\top W_c + b_c - \log Q(c)$ for $c \in S$
    sampled = torch.einsum('lk,ijk->ijl', sample_w, inputs) + sample_b - samp_log_probs.to(inputs.dtype)
    # A sample that is the target is not a negative
    hit = labels[:, :, None] == neg_samples
    sampled = sampled.masked_fill(hit, torch.finfo(sampled.dtype).min)
    return torch.cat([true_logits[:, :, None], sampled], -1)
