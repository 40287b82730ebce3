r"""
# Projected adaptive softmax

From *Efficient softmax approximation for GPUs* (Grave et al., 2017), with the projections Transformer-XL
adds. The vocabulary, sorted by frequency, is split by `cutoffs` into a *head* (the shortlist
$[0, c_1)$) and tail clusters $[c_1, c_2), \dots, [c_n, n_{token})$. The head scores the shortlist words and
one entry per tail cluster; a word $w$ in tail cluster $i$ then gets

$$\log p(w \mid h) = \log p_{head}(\text{cluster } i \mid h) + \log p_i(w \mid h)$$

where each softmax sees its own logits $\mathop{logit}_i(h) = (h P_i) W_i^\top + b_i$: $P_i$ `[d_proj, d_i]`
projects the model's hidden state to the cluster's $d_i = d_{embed} / \mathit{div\_val}^i$ features
(`out_projs`, left out when `div_val == 1` and $d_{proj} = d_{embed}$), $W_i$, $b_i$ are `out_layers` (tied to the
adaptive input embeddings with `tie_weight`). With `div_val == 1` all clusters slice one `[n_token, d_embed]`
layer. The cluster entries of the head are `cluster_weight` `[n_clusters, d_embed]` and `cluster_bias`.
As in the original, tail cluster $i$ (counting from 1) is the head's column $-i$: the last column is the
first tail cluster.

The loss comes out **in position order**, always: `nll[t]` belongs to `target[t]` (the original's
`keep_order=True`; its default put the positions in cluster order).
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from ..fast import dispatch
from ..fast.dispatch import Plan
from .checks import check_adaptive, cluster_embedding_sizes


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """
    Args:
        n_token: vocabulary size.
        d_embed: features of the head cluster.
        d_proj: features of the hidden states (the model's `d_model`).
        cutoffs: strictly increasing cluster boundaries in `(0, n_token)`; `[]` for a plain softmax.
        div_val: each cluster has `div_val` times fewer features than the one before.

    Shape:
        `hidden` `[N, d_proj]`, `target` `[N]`; `forward` returns the negative log-likelihood `[N]` in
        the order of `target`; `log_prob` returns full log-probabilities `[N, n_token]`.
    """

    def __init__(self, n_token: int, d_embed: int, d_proj: int, cutoffs: Sequence[int], div_val: int = 1):
        super().__init__()
        # Cluster $i$ holds the ids `[cutoff_ends[i], cutoff_ends[i + 1])`; the last ends at `n_token`
        self.cutoffs: List[int] = check_adaptive(n_token, d_embed, d_proj, cutoffs, div_val)
        self.cutoff_ends: List[int] = [0] + self.cutoffs
        self.n_token, self.d_embed, self.d_proj, self.div_val = n_token, d_embed, d_proj, div_val
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters

        if self.n_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))

        self.out_layers = nn.ModuleList()
        self.out_projs = nn.ParameterList()
        if div_val == 1:
            if d_proj != d_embed:
                for _ in range(len(self.cutoffs)):
                    self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
            self.out_layers.append(nn.Linear(d_embed, n_token))
        else:
            # $d_i = d_{embed} / \mathit{div\_val}^i$, as the adaptive embedding's clusters
            for i, d_emb_i in enumerate(cluster_embedding_sizes(d_embed, div_val, len(self.cutoffs))):
                l_idx, r_idx = self.cutoff_ends[i], self.cutoff_ends[i + 1]
                self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_emb_i)))
                self.out_layers.append(nn.Linear(d_emb_i, r_idx - l_idx))

    def _proj(self, i: int) -> Optional[torch.Tensor]:
        """$P_i$, or None when there are no projections."""
        return self.out_projs[i] if len(self.out_projs) > 0 else None

    def _compute_logit(self, plan: Plan, hidden: torch.Tensor, i: int) -> torch.Tensor:
        """$\\mathop{logit}_i(h)$ of cluster `i`; the head's end with its entries for the tail clusters."""
        proj = self._proj(i)
        if proj is not None:
            # $h P_i$
            hidden = F.linear(hidden, proj.t())
        # $(h P_i) W_i^\top + b_i$
        logit = dispatch.linear(plan, hidden, *self._cluster_params(i))
        if i == 0 and self.n_clusters > 0:
            # The head's entries of the tail clusters, a product of their own: joining the weights instead would
            # copy the shortlist's `[shortlist, d_0]` matrix in every call
            logit = torch.cat([logit, dispatch.linear(plan, hidden, self.cluster_weight, self.cluster_bias)], dim=1)
        return logit

    def _cluster_params(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """$W_i$ and $b_i$ of the words of cluster `i` (the head's: of the shortlist)."""
        if self.div_val == 1 and self.n_clusters > 0:
            l_idx, r_idx = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            return self.out_layers[0].weight[l_idx:r_idx], self.out_layers[0].bias[l_idx:r_idx]
        return self.out_layers[i].weight, self.out_layers[i].bias

    def _check(self, hidden: torch.Tensor) -> None:
        if hidden.dim() != 2 or hidden.shape[1] != self.d_proj:
            raise ValueError(f"hidden of shape {list(hidden.shape)} is not accepted: expected [N, d_proj] "
                             f"with d_proj={self.d_proj}")

    def forward(self, hidden: torch.Tensor, target: torch.Tensor, *, plan: Optional[Plan] = None) -> torch.Tensor:
        self._check(hidden)
        plan = Plan.now(hidden.device) if plan is None else plan
        if target.shape != hidden.shape[:1]:
            raise ValueError(f"target of shape {list(target.shape)} is not accepted: expected [N] = "
                             f"[{hidden.shape[0]}], one id per row of hidden")
        if self.n_clusters == 0:
            logit = self._compute_logit(plan, hidden, 0)
            # $-\log p(w \mid h)$
            return -F.log_softmax(logit, dim=-1).gather(1, target[:, None]).squeeze(1)

        if dispatch.softmax_clusters(plan) == 'every cluster':
            # Every cluster for every row, then the target's
            return -self.log_prob(hidden, plan=plan).gather(1, target[:, None]).squeeze(1)
        # $\log p_{head}(\cdot \mid h)$, `[N, shortlist + n_clusters]`
        head_logprob = F.log_softmax(self._compute_logit(plan, hidden, 0), dim=1)
        nll = hidden.new_zeros(target.shape)
        for i in range(len(self.cutoffs)):
            l_idx, r_idx = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            indices_i = ((target >= l_idx) & (target < r_idx)).nonzero().squeeze(1)
            if indices_i.numel() == 0:
                continue
            target_i = target.index_select(0, indices_i) - l_idx
            head_logprob_i = head_logprob.index_select(0, indices_i)
            if i == 0:
                # A shortlist word: $\log p_{head}(w \mid h)$
                logprob_i = head_logprob_i.gather(1, target_i[:, None]).squeeze(1)
            else:
                tail_logit_i = self._compute_logit(plan, hidden.index_select(0, indices_i), i)
                tail_logprob_i = F.log_softmax(tail_logit_i, dim=1)
                # $\log p_{head}(\text{cluster } i \mid h) + \log p_i(w \mid h)$
                logprob_i = head_logprob_i[:, -i] + tail_logprob_i.gather(1, target_i[:, None]).squeeze(1)
            # Back to the positions these targets came from
            nll = nll.index_copy(0, indices_i, -logprob_i)
        return nll

    def logits(self, hidden: torch.Tensor, *, plan: Optional[Plan] = None) -> torch.Tensor:
        """Scores whose softmax is $p(\\cdot \\mid h)$, `[N, n_token]`: the logits of a plain softmax; with tail
        clusters (no single logit per word) the log-probabilities, which have the same softmax."""
        if self.n_clusters > 0:
            return self.log_prob(hidden, plan=plan)
        self._check(hidden)
        plan = Plan.now(hidden.device) if plan is None else plan
        return self._compute_logit(plan, hidden, 0)

    def log_prob(self, hidden: torch.Tensor, *, plan: Optional[Plan] = None) -> torch.Tensor:
        """Full log-probabilities $\\log p(w \\mid h)$ of every word, `[N, n_token]`."""
        self._check(hidden)
        plan = Plan.now(hidden.device) if plan is None else plan
        if self.n_clusters == 0:
            return F.log_softmax(self._compute_logit(plan, hidden, 0), dim=-1)
        head_logprob = F.log_softmax(self._compute_logit(plan, hidden, 0), dim=1)
        out = [head_logprob[:, :self.shortlist_size]]
        for i in range(1, len(self.cutoffs)):
            tail_logprob_i = F.log_softmax(self._compute_logit(plan, hidden, i), dim=1)
            # $\log p_{head}(\text{cluster } i \mid h) + \log p_i(\cdot \mid h)$
            out.append(head_logprob[:, -i, None] + tail_logprob_i)
        return torch.cat(out, dim=1)
