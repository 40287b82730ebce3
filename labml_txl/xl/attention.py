r"""
# Transformer-XL's attention, with a positional scheme

Every attention type scores `qlen` queries against `klen = mlen + qlen` keys (the cached memory followed by the
segment), then

$$\mathop{Attn}(Q, K, V) = \mathop{softmax}_j\bigl(\tfrac{1}{\sqrt{d_{head}}}\, A_{i,j}\bigr) V$$

over keys $j$, with masked keys left out, dropout on the attention weights (`dropatt`), the output projection
$W_o$ (`o_net`, no bias), dropout, and the residual connection with layer normalisation after it (post-LN) or
before the projections (`pre_lnorm`). Masks inside `xl/` follow the original: boolean, **True where a key is
masked**, `[qlen, klen, 1]` or `[qlen, klen]`. The types differ only in the score $A_{i,j}$: $q_i^\top k_j$ and what
the positional scheme (`labml_txl/positions/`, by name in `positions/registry.py`) adds to it, from its parameters
on this module and the position arguments the model passes (the sinusoids and $u$, $v$ of type 0, the learned
tables of type 1). The scheme's terms are those of a decoder's table, distances `klen - 1 .. 0`: the keys after a
query are masked. The dispatcher (`dispatch.attend`) decides how the scores are computed.

The parameter names are the original's per type: one joint projection `qkv_net` ($W_q$, $W_k$, $W_v$) for types 0 and
1, `q_net` ($W_q$) and `kv_net` ($W_k$, $W_v$) for the others, no biases.

The original projects `[memory, segment]` with all three of $W_q, W_k, W_v$ and drops the memory's queries. Here
the segment gets all three and the memory only $W_k, W_v$ (a third of that product saved; the memory carries no
gradient, so its rows get no input gradient either). The memory's keys and values may also come from the segment
before (`mems_kv`, see `kv_memo.py`); the ones computed are returned with `return_kv`. Same numbers: each row of a
product depends only on its own input row (`LayerNorm` too, with `pre_lnorm`). The memory's positions are those
before the segment, so with a scheme whose scores depend on $i - j$ only the kept keys and values stay valid as the
window moves (a rotation is applied at each use, to unrotated keys).

`original_numerics` copies what the original computes differently for the scheme: the scaled scores of type 0
rounded to float32 before the softmax (`attn_score.float()`: a change only in float64), and with `pre_lnorm` the
queries of types 2 and 3 from the un-normalised input (the keys and values from the normalised one).
"""
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import torch
from torch import nn

from ..attention.composite import split_heads
from ..attention.reference import RelativeTerms, scores_of_terms
from ..errors import require_bool, require_positive_int, require_probability
from ..fast import dispatch
from ..fast.dispatch import Plan
from ..fast.dropout import Dropout
from ..positions.scheme import PositionScheme, require_scheme
from ..transformer.norms import make_norm


@dataclass(frozen=True)
class KeysValues:
    """The keys and values one attention layer computed: of its memory (None without one, or when they were given
    to it) and of its segment, each `[2, bsz, n_head, len, d_head]` (views of the projections)."""
    memory: Optional[torch.Tensor]
    segment: torch.Tensor

    @property
    def klen(self) -> int:
        """How many keys: the memory's and the segment's."""
        return self.segment.shape[3] + (0 if self.memory is None else self.memory.shape[3])

    def attend_arguments(self) -> dict:
        """The keys and values as `dispatch.attend` takes them: the segment's, and the memory's apart."""
        k, values = self.segment.unbind(0)
        k_memory, values_memory = (None, None) if self.memory is None else self.memory.unbind(0)
        return dict(k=k, values=values, k_memory=k_memory, values_memory=values_memory)


class XLAttention(nn.Module):
    """
    Args:
        n_head: number of heads.
        d_model: number of features of the input and output.
        d_head: number of features of each head (`n_head * d_head` need not equal `d_model`).
        dropout: dropout on the projected output.
        dropatt: dropout on the attention weights.
        pre_lnorm: layer-normalise the input instead of the residual sum.
        positions: the positional scheme (`labml_txl/positions/`), one object per attention; it registers its
            parameters on this module.
        original_numerics: compute as the original does where it differs from this package's default, for the
            scheme (see the module docstring).
        norm: `'layer_norm'` (the original's) or `'rms_norm'` (`norms.py`), kept as `layer_norm` either way.

    Shape:
        `h` `[qlen, bsz, d_model]`; `position_args` as the scheme takes them (`positions/relative.py`: the
        sinusoids `[klen, 1, d_model]` and $u$, $v$ `[n_head, d_head]` of type 0); `attn_mask` boolean
        `[qlen, klen, 1]`, True where masked; `mems` `[mlen, bsz, d_model]` or None; `mems_kv` the keys and values of
        `mems` `[2, bsz, n_head, mlen, d_head]` when they are known (then `mems` is not projected again);
        `branch`, a memory mechanism's second attention (`memories.mechanism.AttentionBranch`: the kNN memory's
        retrieval), takes the queries `[bsz, n_head, qlen, d_head]` and this attention's heads `[qlen, bsz,
        n_head * d_head]` and gives the heads the output projection takes. Output `[qlen, bsz, d_model]`, with
        `return_kv` also the `KeysValues` computed.
    """

    def __init__(self, n_head: int, d_model: int, d_head: int, dropout: float, dropatt: float = 0.0,
                 pre_lnorm: bool = False, *, positions: PositionScheme, original_numerics: bool = False,
                 norm: str = 'layer_norm'):
        super().__init__()
        require_positive_int('n_head', n_head)
        require_positive_int('d_model', d_model)
        require_positive_int('d_head', d_head)
        require_probability('dropout', dropout, allow_one=False)
        require_probability('dropatt', dropatt, allow_one=False)
        require_bool('original_numerics', original_numerics)
        require_scheme(positions)
        self.n_head = n_head
        self.d_model = d_model
        self.d_head = d_head
        self.dropout = dropout
        self.drop = Dropout(dropout)
        self.dropatt = Dropout(dropatt)
        # $W_o$
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = make_norm(norm, d_model)
        # $\frac{1}{\sqrt{d_{head}}}$
        self.scale = 1 / (d_head ** 0.5)
        self.pre_lnorm = pre_lnorm
        self.original_numerics = original_numerics
        if positions.joint_qkv:
            # $W_q$, $W_k$ and $W_v$ in one matrix
            self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        else:
            # $W_q$, and $W_k$ and $W_v$ in one matrix
            self.q_net = nn.Linear(d_model, n_head * d_head, bias=False)
            self.kv_net = nn.Linear(d_model, 2 * n_head * d_head, bias=False)
        self.positions = positions
        positions.attach(self, d_model, n_head, d_head)

    @property
    def raw_queries(self) -> bool:
        """Whether the queries read the input before the pre-LN normalisation (the original's absolute types)."""
        return self.original_numerics and self.positions.original_raw_queries

    @property
    def rounds_scores_to_float32(self) -> bool:
        """Whether the scaled scores are rounded to float32 before the softmax (the original's type 0)."""
        return self.original_numerics and self.positions.original_rounds_scores

    def projection_weights(self) -> Tuple[torch.Tensor, ...]:
        """The matrices that hold $W_q$, $W_k$, $W_v$, in that order (one joint matrix, or $W_q$ and $[W_k; W_v]$)."""
        if self.positions.joint_qkv:
            return (self.qkv_net.weight,)
        return self.q_net.weight, self.kv_net.weight

    def position_terms(self, plan: Plan, qlen: int, klen: int, like: torch.Tensor,
                       *position_args: torch.Tensor) -> Optional[RelativeTerms]:
        """What the scheme adds to $q_i^\\top k_j$ for `qlen` queries that are the last of `klen` key positions
        (a decoder's table), in the dtype and on the device of `like`, from the model's position arguments; None:
        nothing."""
        return self.positions.terms(self, plan, qlen, klen, like, False, *position_args)

    def _project(self, plan: Plan, qkv_weight: torch.Tensor, w: torch.Tensor, mems: Optional[torch.Tensor],
                 mems_kv: Optional[torch.Tensor]) -> Tuple[torch.Tensor, KeysValues]:
        """Head-major queries of the segment `[bsz, n_head, qlen, d_head]` and the keys and values of memory and
        segment (views of their projections): $[W_q; W_k; W_v] w$ of the segment and $[W_k; W_v] m$ of the memory,
        unless `mems_kv` holds those already. The reference projects as the original: $[W_q; W_k; W_v]$ of
        `[memory, segment]`, the memory's queries dropped. With `pre_lnorm` every projection reads the normalised
        input, but the queries read `w` as it is with `raw_queries` (the original's absolute attention)."""
        hd = self.n_head * self.d_head
        has_memory = mems is not None and mems.shape[0] > 0
        if has_memory and dispatch.memory_projection(plan) == 'with the segment':
            mlen, cat = mems.shape[0], torch.cat([mems, w], 0)
            q, kv = self._project_normalised(plan, qkv_weight, cat)
            kv = self._kv_heads(kv)
            return split_heads(q[mlen:], self.n_head), KeysValues(kv[:, :, :, :mlen], kv[:, :, :, mlen:])
        q, kv = self._project_normalised(plan, qkv_weight, w)
        kv_memory = mems_kv
        if kv_memory is None and has_memory:
            kv_memory = self._kv_heads(dispatch.linear(plan, self.layer_norm(mems) if self.pre_lnorm else mems,
                                                       qkv_weight[hd:]))
        return split_heads(q, self.n_head), KeysValues(kv_memory, self._kv_heads(kv))

    def _project_normalised(self, plan: Plan, qkv_weight: torch.Tensor,
                            x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """$W_q x$ and $[W_k; W_v] x$ `[len, bsz, .]` of `x`, layer-normalised first with `pre_lnorm` (the queries
        not, with `raw_queries`)."""
        hd = self.n_head * self.d_head
        normalised = self.layer_norm(x) if self.pre_lnorm else x
        if self.raw_queries and self.pre_lnorm:
            return dispatch.linear(plan, x, qkv_weight[:hd]), dispatch.linear(plan, normalised, qkv_weight[hd:])
        # (`split` rather than slices: its backward pass concatenates, with no zero-filled gradient)
        return dispatch.linear(plan, normalised, qkv_weight).split([hd, 2 * hd], dim=-1)

    @dispatch.replaceable_scores
    def get_scores(self, query: torch.Tensor, key: torch.Tensor, terms: Optional[RelativeTerms]) -> torch.Tensor:
        r"""
        The hook for the scores, as `MultiHeadAttention.get_scores`: $A_{i,j}$ as the scheme's `terms` describe it
        ($q_i^\top k_j$ without terms), before the scale and the softmax. A subclass that overrides it runs by the
        reference path with its override.

        Shape:
            `query` `[qlen, bsz, n_head, d_head]`, `key` `[klen, bsz, n_head, d_head]`; returns
            `[qlen, klen, bsz, n_head]`.
        """
        return scores_of_terms(query, key, terms)

    def _kv_heads(self, kv: torch.Tensor) -> torch.Tensor:
        """$[W_k; W_v] x$ `[len, bsz, 2 * n_head * d_head]` as `[2, bsz, n_head, len, d_head]`, a view."""
        return split_heads(kv, 2 * self.n_head).unflatten(1, (2, self.n_head)).transpose(0, 1)

    def _output(self, plan: Plan, w: torch.Tensor, attn_vec: torch.Tensor) -> torch.Tensor:
        """The output projection, dropout and the residual connection with layer normalisation."""
        attn_out = self.drop(dispatch.linear(plan, attn_vec, self.o_net.weight))
        if self.pre_lnorm:
            # $w + W_o\,\mathop{Attn}(\mathop{LN}(\cdot))$
            return w + attn_out
        # $\mathop{LN}(w + W_o\,\mathop{Attn}(\cdot))$
        return dispatch.residual_layer_norm(plan, w, attn_out, self.layer_norm)

    def forward(self, h: torch.Tensor, *position_args: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                mems: Optional[torch.Tensor] = None, mems_kv: Optional[torch.Tensor] = None,
                plan: Optional[Plan] = None, return_kv: bool = False,
                branch: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, KeysValues]]:
        plan = Plan.now(h.device) if plan is None else plan
        # $[W_q; W_k; W_v]$ as one product of the segment (and of the memory's keys and values)
        weights = self.projection_weights()
        q, kv = self._project(plan, weights[0] if len(weights) == 1 else torch.cat(weights), h, mems, mems_kv)
        # $A_{i,j} = q_i^\top k_j$ with the scheme's position terms
        terms = self.position_terms(plan, q.shape[2], kv.klen, q, *position_args)
        # $\mathop{softmax}_j(A_{i,j} / \sqrt{d_{head}})\, v_j$ over the keys not masked, heads concatenated, by the
        # implementation the dispatcher picks
        attn_vec, _ = dispatch.attend(plan, q, **kv.attend_arguments(), scale=self.scale, masked=attn_mask,
                                      terms=terms, get_scores=dispatch.score_hook(self, terms=terms),
                                      dropout=self.dropatt, round_scores_to_float32=self.rounds_scores_to_float32)
        if branch is not None:
            # A memory mechanism's second attention, combined with this one (the kNN memory's gate)
            attn_vec = branch(q, attn_vec)
        out = self._output(plan, h, attn_vec)
        return (out, kv) if return_kv else out
