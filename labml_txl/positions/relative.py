r"""
# Transformer-XL's relative positions (`'relative'`, Transformer-XL's `attn_type` 0)

From *Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context* (Dai et al., 2019). The score of
query $i$ and key $j$ is

$$A^{rel}_{i,j} = \underbrace{(q_i + u)^\top k_j}_{(a) + (c)} + \underbrace{(q_i + v)^\top W_{k,R} R_{i-j}}_{(b) + (d)}$$

with $R_{i-j}$ the fixed sinusoid of the distance (`encoding.sinusoidal_embeddings`), $W_{k,R}$ = `r_net` (no bias)
and learned $u$ = `r_w_bias`, $v$ = `r_r_bias` `[heads, d_head]`. The terms and the shift are
`labml_txl.attention.reference`'s.

* In `MultiHeadAttention` the scheme computes the sinusoids of the full table itself, distances `seq_k - 1` down to
  `-(seq_q - 1)`, so every pair is scored exactly: an unmasked encoder works, and a decoder passes a causal mask.
* In Transformer-XL the model gives the sinusoids of a decoder's table, `klen - 1 .. 0` (with its dropout and
  `clamp_len`), and its $u$, $v$ shared by all layers (the original PyTorch code), unless each layer owns its own
  (`untie_r`, the authors' TensorFlow code and their published WikiText-103 model).
"""
from typing import Optional

import torch
from torch import nn

from ..attention.reference import RelativeTerms
from ..errors import require_bool
from ..fast.dispatch import Plan
from ..fast.kept import KeptValue, last_rows_of
from .encoding import relative_distances, sinusoid_inverse_frequencies, sinusoidal_embeddings
from .scheme import PositionScheme, SchemeSettings


class Relative(PositionScheme):
    """
    Transformer-XL's relative positions: a projected sinusoid per distance, with learned biases $u$ and $v$.

    On the attention: `r_net` ($W_{k,R}$), and `r_w_bias`, `r_r_bias` ($u$, $v$) unless the model gives them.

    Args:
        own_biases: the attention owns $u$ and $v$ (`r_w_bias`, `r_r_bias`), or the model passes its shared ones
            with each call.

    Position arguments:
        `r` the sinusoids of the table `[rlen, 1, d_model]` (None: the scheme computes them), `r_w_bias`,
        `r_r_bias` `[heads, d_head]` (the model's, without `own_biases`).
    """
    joint_qkv = True
    original_rounds_scores = True

    def __init__(self, own_biases: bool = True):
        require_bool('own_biases', own_biases)
        self.own_biases = own_biases
        # The sinusoids $R_d$ of the last shape, and $W_{k,R} R$ of the last table and weight, where a call keeps them
        self._sinusoids = KeptValue(of_parameters=False)
        self._projected = KeptValue(of_parameters=True)

    @classmethod
    def from_settings(cls, settings: SchemeSettings) -> 'Relative':
        return cls(own_biases=settings.own_biases)

    def add_parameters(self, attn: nn.Module, d_model: int, heads: int, d_head: int) -> None:
        if d_model % 2 != 0:
            raise ValueError(f"d_model={d_model} is not accepted for relative attention: its sinusoidal "
                             f"distance embeddings pair a sine and a cosine per frequency, so d_model must be even")
        self.heads, self.d_head = heads, d_head
        # $W_{k,R}$
        attn.r_net = nn.Linear(d_model, heads * d_head, bias=False)
        if self.own_biases:
            # $u$ and $v$
            attn.r_w_bias = nn.Parameter(torch.zeros(heads, d_head))
            attn.r_r_bias = nn.Parameter(torch.zeros(heads, d_head))

    def _sinusoids_of(self, d_model: int, seq_q: int, seq_k: int, full_table: bool, dtype: torch.dtype,
                      device) -> torch.Tensor:
        """$R_d$ for the distances $d$ of the table, `[rlen, d_model]`."""
        # Distances are exact integers only in float32 or float64
        pos_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        distances = relative_distances(seq_q, seq_k, bidirectional=full_table, dtype=pos_dtype, device=device)
        # $\omega_i = 1 / 10000^{2i/d}$, computed in the precision of the distances (no buffer to lose it)
        inv_freq = sinusoid_inverse_frequencies(d_model, dtype=pos_dtype, device=device)
        # $R_d$
        return sinusoidal_embeddings(distances, inv_freq).to(dtype)

    def _own_sinusoids(self, attn: nn.Module, plan: Plan, seq_q: int, seq_k: int, full_table: bool,
                       like: torch.Tensor) -> torch.Tensor:
        """The sinusoids of the table; they depend only on the shape."""
        shape = (seq_q, seq_k, full_table, like.dtype, like.device)
        return self._sinusoids.get(plan, lambda: self._sinusoids_of(attn.r_net.in_features, *shape), *shape)

    def _projected_table(self, attn: nn.Module, plan: Plan, r: torch.Tensor) -> torch.Tensor:
        """$W_{k,R} R$ as `[heads, rlen, d_head]`, made again only for another table or `r_net`. Row $d$ is
        $W_{k,R} R_d$ alone, so where `r` is the last rows of a longer table (the model's, `ModelMemory.last_rows`),
        that whole table is projected and kept, and its last rows serve: one-token steps, whose table is one row
        longer each, project nothing."""
        whole = last_rows_of(r)
        whole = r if whole is None else whole
        projected = self._projected.get(
            plan, lambda: attn.r_net(whole).reshape(whole.shape[0], self.heads, self.d_head).transpose(0, 1), whole,
            attn.r_net.weight)
        return projected[:, whole.shape[0] - r.shape[0]:]

    def terms(self, attn: nn.Module, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor, full_table: bool,
              r: Optional[torch.Tensor] = None, r_w_bias: Optional[torch.Tensor] = None,
              r_r_bias: Optional[torch.Tensor] = None) -> RelativeTerms:
        r"""$W_{k,R} R$ with $u$ and $v$: the attention's own, or the model's given."""
        if self.own_biases:
            r_w_bias, r_r_bias = attn.r_w_bias, attn.r_r_bias
        elif r_w_bias is None or r_r_bias is None:
            raise ValueError("r_w_bias and r_r_bias are required: this attention was built without its own biases "
                             "(untie_r=False), so the model passes its shared biases u and v")
        if r is None:
            r = self._own_sinusoids(attn, plan, seq_q, seq_k, full_table, like)
        # $A^{rel}_{i,j} = (q_i + u)^\top k_j + (q_i + v)^\top W_{k,R} R_{i-j}$
        return RelativeTerms(self._projected_table(attn, plan, r), content_bias=r_w_bias, position_bias=r_r_bias)
