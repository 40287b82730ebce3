r"""
# What the Transformer-XL attention variants share

Every variant scores `qlen` queries against `klen = mlen + qlen` keys (the cached memory followed by the
segment), then

$$\mathop{Attn}(Q, K, V) = \mathop{softmax}_j\bigl(\tfrac{1}{\sqrt{d_{head}}}\, A_{i,j}\bigr) V$$

over keys $j$, with masked keys left out (`masked_softmax`: safe in fp16/bf16, no NaN for a fully masked row),
dropout on the attention weights (`dropatt`), the output projection $W_o$ (`o_net`, no bias), dropout, and the
residual connection with layer normalisation after it (post-LN) or before the projections (`pre_lnorm`).
Masks inside `xl/` follow the original: boolean, **True where a key is masked**, `[qlen, klen, 1]` or
`[qlen, klen]`. The variants differ only in the score $A_{i,j}$.
"""
from typing import Optional

import torch
from torch import nn

from ..errors import require_positive_int
from ..relative_attention import masked_softmax
from .checks import check_probability


class XLAttentionBase(nn.Module):
    """
    Args:
        n_head: number of heads.
        d_model: number of features of the input and output.
        d_head: number of features of each head (`n_head * d_head` need not equal `d_model`).
        dropout: dropout on the projected output.
        dropatt: dropout on the attention weights.
        pre_lnorm: layer-normalise the input instead of the residual sum.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False):
        super().__init__()
        require_positive_int('n_head', n_head)
        require_positive_int('d_model', d_model)
        require_positive_int('d_head', d_head)
        check_probability('dropout', dropout)
        check_probability('dropatt', dropatt)
        self.n_head = n_head
        self.d_model = d_model
        self.d_head = d_head
        self.dropout = dropout
        self.drop = nn.Dropout(dropout)
        self.dropatt = nn.Dropout(dropatt)
        # $W_o$
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        # $\frac{1}{\sqrt{d_{head}}}$
        self.scale = 1 / (d_head ** 0.5)
        self.pre_lnorm = pre_lnorm
        # The original rounds attention type 0's scores to float32 before its softmax; see `MemTransformerLM`
        self.round_scores_to_float32 = False

    def _attend(self, score: torch.Tensor, attn_mask: Optional[torch.Tensor], head_v: torch.Tensor) -> torch.Tensor:
        """Scaled, masked softmax of `score` `[qlen, klen, bsz, n_head]` applied to `head_v`
        `[klen, bsz, n_head, d_head]`; returns the concatenated heads `[qlen, bsz, n_head * d_head]`."""
        score = score * self.scale
        if self.round_scores_to_float32:
            score = score.float().to(score.dtype)
        # $\mathop{softmax}_j(A_{i,j} / \sqrt{d_{head}})$
        attn_prob = masked_softmax(score, attn_mask, dim=1)
        attn_prob = self.dropatt(attn_prob)
        # $\sum_j p_{i,j} v_j$
        attn_vec = torch.einsum('ijbn,jbnd->ibnd', attn_prob, head_v)
        return attn_vec.reshape(attn_vec.shape[0], attn_vec.shape[1], self.n_head * self.d_head)

    def _output(self, w: torch.Tensor, attn_vec: torch.Tensor) -> torch.Tensor:
        """Output projection, dropout and the residual connection with layer normalisation."""
        attn_out = self.drop(self.o_net(attn_vec))
        if self.pre_lnorm:
            # $w + W_o\,\mathop{Attn}(\mathop{LN}(\cdot))$
            return w + attn_out
        # $\mathop{LN}(w + W_o\,\mathop{Attn}(\cdot))$
        return self.layer_norm(w + attn_out)

    def _keys_input(self, w: torch.Tensor, mems: Optional[torch.Tensor]) -> torch.Tensor:
        """The memory followed by the segment, `[mlen + qlen, bsz, d_model]`, layer-normalised with `pre_lnorm`.
        The memory is only read: cached tensors are never changed in place."""
        cat = w if mems is None or mems.shape[0] == 0 else torch.cat([mems, w], 0)
        return self.layer_norm(cat) if self.pre_lnorm else cat
