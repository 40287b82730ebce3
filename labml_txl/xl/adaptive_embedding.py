r"""
# Adaptive input embeddings

From *Adaptive Input Representations for Neural Language Modeling* (Baevski and Auli, 2019), as Transformer-XL
uses them. The vocabulary, sorted by frequency, is split by `cutoffs` into clusters
$[0, c_1), [c_1, c_2), \dots, [c_n, n_{token})$; cluster $i$ has embeddings of
$d_i = d_{embed} / \mathit{div\_val}^i$ features (frequent words get more), each projected to
$d_{proj}$ by $P_i$ `[d_proj, d_i]`:

$$e(x) = \sqrt{d_{proj}}\; P_{i(x)}\, E_{i(x)}[x - c_{i(x)}]$$

With `div_val == 1` there is a single table of all $n_{token}$ words of $d_{embed}$ features, projected only
when $d_{embed} \ne d_{proj}$. The scale $\sqrt{d_{proj}}$ is the original's.
"""
from typing import List, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .checks import check_adaptive, cluster_embedding_sizes


class AdaptiveEmbedding(nn.Module):
    """
    Args:
        n_token: vocabulary size.
        d_embed: features of the first (most frequent) cluster.
        d_proj: features of the output (the model's `d_model`).
        cutoffs: strictly increasing cluster boundaries in `(0, n_token)`; `[]` for a single cluster.
        div_val: each cluster has `div_val` times fewer features than the one before.
        sample_softmax: when positive, the (single) table is a sparse embedding, as in the original.

    Shape:
        `inp` `[seq, batch]` token ids in `[0, n_token)` (not checked here: `MemTransformerLM` checks them);
        output `[seq, batch, d_proj]`.

    Parameters are named as in the original: `emb_layers.N.weight` and `emb_projs.N`.
    """

    def __init__(self, n_token: int, d_embed: int, d_proj: int, cutoffs: Sequence[int], div_val: int = 1,
                 sample_softmax: bool = False):
        super().__init__()
        # Cluster $i$ holds the ids `[cutoff_ends[i], cutoff_ends[i + 1])`; the last ends at `n_token`
        self.cutoffs: List[int] = check_adaptive(n_token, d_embed, d_proj, cutoffs, div_val)
        self.cutoff_ends: List[int] = [0] + self.cutoffs
        self.n_token, self.d_embed, self.d_proj, self.div_val = n_token, d_embed, d_proj, div_val
        # $\sqrt{d_{proj}}$
        self.emb_scale = d_proj ** 0.5

        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(n_token, d_embed, sparse=sample_softmax > 0))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
        else:
            # $d_i = d_{embed} / \mathit{div\_val}^i$
            sizes = cluster_embedding_sizes(d_embed, div_val, len(self.cutoffs))
            for i, d_emb_i in enumerate(sizes):
                l_idx, r_idx = self.cutoff_ends[i], self.cutoff_ends[i + 1]
                self.emb_layers.append(nn.Embedding(r_idx - l_idx, d_emb_i))
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_emb_i)))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        if self.div_val == 1:
            embed = self.emb_layers[0](inp)
            if self.d_proj != self.d_embed:
                # $P E[x]$
                embed = F.linear(embed, self.emb_projs[0])
        else:
            embed = None
            for i in range(len(self.cutoffs)):
                l_idx, r_idx = self.cutoff_ends[i], self.cutoff_ends[i + 1]
                in_cluster = (inp >= l_idx) & (inp < r_idx)
                # Every token is looked up in every cluster (ids clipped into range) and the cluster it
                # belongs to is kept: no data-dependent shapes, so no host-device synchronisation.
                local = (inp - l_idx).clamp(0, r_idx - l_idx - 1)
                # $P_i E_i[x - c_i]$
                emb_i = F.linear(self.emb_layers[i](local), self.emb_projs[i])
                embed = emb_i if embed is None else torch.where(in_cluster[..., None], emb_i, embed)
        # $\sqrt{d_{proj}} \cdot$
        return embed * self.emb_scale
