r"""
# Compressive memory: the compression functions and the attention-reconstruction loss

From *Compressive Transformers for Long-Range Sequence Modelling* (Rae et al., 2020). Transformer-XL drops the
memories that fall out of its window of `mem_len`; the Compressive Transformer keeps them in a second, compressed
memory: each layer's oldest $n c$ memories become $n$ compressed ones by a compression function

$$f_c: \mathbb{R}^{n c \times d} \rightarrow \mathbb{R}^{n \times d}$$

at the compression rate $c$. The paper compares (its Table 1) max and mean pooling (kernel and stride $c$), a 1D
convolution (kernel and stride $c$, learned), a dilated convolution and keeping the most used memories; the
convolution did best. Each layer has its own $f_c$.

The compression is trained by the **attention-reconstruction loss**, not through the language model's loss (which
would need back-propagation through time over the old memories): the layer's attention over the old memories
$m$ should be what it is over their compression $f_c(m)$,

$$\mathcal{L}^{attn} = \bigl\| \mathop{attn}(h, m) - \mathop{attn}(h, f_c(m)) \bigr\|_2^2,$$

with $h$ the layer's input (its queries), the attention content-based (no positions, no mask), and the gradient
stopped into everything but $f_c$: the attention's parameters, $h$ and $m$ (the paper's Algorithm 1).
"""
from typing import TYPE_CHECKING, Callable, Dict, List

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import require_positive_int

if TYPE_CHECKING:
    from ..xl.attention import XLAttention


class ConvCompression(nn.Module):
    """
    The paper's best compression: a 1D convolution over positions with kernel and stride $c$, $d$ channels in and
    out, learned.

    Args:
        d_model: the features of a memory.
        rate: the compression rate $c$.

    Shape:
        `memory` `[n * rate, batch, d_model]`; returns `[n, batch, d_model]`.
    """

    def __init__(self, d_model: int, rate: int):
        super().__init__()
        require_positive_int('d_model', d_model)
        require_positive_int('compression_rate', rate)
        self.rate = rate
        self.conv = nn.Conv1d(d_model, d_model, kernel_size=rate, stride=rate)

    def forward(self, memory: torch.Tensor) -> torch.Tensor:
        _check_length(memory, self.rate)
        # Positions last for `Conv1d`: `[batch, d_model, n * rate]`, and back
        return self.conv(memory.permute(1, 2, 0)).permute(2, 0, 1)


class PoolCompression(nn.Module):
    """
    Max or mean pooling over positions with kernel and stride $c$: no parameters, so nothing for the
    reconstruction loss to train.

    Args:
        rate: the compression rate $c$.
        kind: `'max'` or `'mean'`.

    Shape:
        `memory` `[n * rate, batch, d_model]`; returns `[n, batch, d_model]`.
    """

    def __init__(self, rate: int, kind: str):
        super().__init__()
        require_positive_int('compression_rate', rate)
        if kind not in ('max', 'mean'):
            raise ValueError(f"kind={kind!r} is not accepted: 'max' or 'mean'")
        self.rate, self.kind = rate, kind

    def forward(self, memory: torch.Tensor) -> torch.Tensor:
        _check_length(memory, self.rate)
        # $f_c(m)_k = \max_{0 \le r < c} m_{kc + r}$, or their mean
        groups = memory.unflatten(0, (memory.shape[0] // self.rate, self.rate))
        return groups.amax(dim=1) if self.kind == 'max' else groups.mean(dim=1)


def _check_length(memory: torch.Tensor, rate: int) -> None:
    if memory.dim() != 3 or memory.shape[0] % rate != 0:
        raise ValueError(f"memory of shape {list(memory.shape)} is not accepted: expected [n * compression_rate, "
                         f"batch, d_model] with compression_rate={rate}")


# The compression functions by the name a config chooses them with
COMPRESSIONS: Dict[str, Callable[[int, int], nn.Module]] = {
    'conv': ConvCompression,
    'max_pool': lambda d_model, rate: PoolCompression(rate, 'max'),
    'mean_pool': lambda d_model, rate: PoolCompression(rate, 'mean'),
}


def make_compression(name: str, d_model: int, rate: int) -> nn.Module:
    """The compression function `name` (`COMPRESSIONS`) for memories of `d_model` features at rate `rate`."""
    if name not in COMPRESSIONS:
        raise ValueError(f"compression={name!r} is not accepted: one of {', '.join(map(repr, COMPRESSIONS))}")
    return COMPRESSIONS[name](d_model, rate)


def content_attention(attn: 'XLAttention', queries: torch.Tensor, *memories: torch.Tensor) -> List[torch.Tensor]:
    r"""
    $\mathop{softmax}_j\bigl(q_i^\top k_j / \sqrt{d_{head}}\bigr) v_j$ of `attn`'s heads for `queries` over each of
    `memories` alone (no positions, no mask, no dropout, before $W_o$), with its $W_q$, $W_k$, $W_v$ (and its layer
    norm's scale and shift, with `pre_lnorm`) detached: the attention the reconstruction loss compares, through which
    no gradient reaches the layer. The queries are projected once for all the memories.

    Shape:
        `queries` `[qlen, batch, d_model]`, each memory `[mlen, batch, d_model]`; returns one
        `[qlen, batch, n_head, d_head]` per memory.
    """
    hd = attn.n_head * attn.d_head
    # $[W_q; W_k; W_v]$, detached (one joint matrix is split as it is, two are joined first)
    weights = attn.projection_weights()
    w_q, w_k, w_v = (weights[0] if len(weights) == 1 else torch.cat(weights)).detach().split(hd)

    def heads(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """`x` normalised as the layer normalises it (with `pre_lnorm`) and projected by `w`, head-major
        `[batch, n_head, len, d_head]` so that both products are batched matrix products."""
        if attn.pre_lnorm:
            norm = attn.layer_norm
            weight = None if norm.weight is None else norm.weight.detach()
            bias = None if norm.bias is None else norm.bias.detach()
            x = F.layer_norm(x, norm.normalized_shape, weight, bias, norm.eps)
        return F.linear(x, w).unflatten(-1, (attn.n_head, attn.d_head)).permute(1, 2, 0, 3)

    q = heads(queries, w_q)
    outputs = []
    for memory in memories:
        # $\mathop{softmax}_j(q_i^\top k_j / \sqrt{d_{head}})$, `[batch, n_head, qlen, mlen]`
        scores = torch.softmax(q @ heads(memory, w_k).transpose(-1, -2) * attn.scale, dim=-1)
        outputs.append((scores @ heads(memory, w_v)).permute(2, 0, 1, 3))
    return outputs


def attention_reconstruction_loss(attn: 'XLAttention', compress: nn.Module, queries: torch.Tensor,
                                  old: torch.Tensor) -> torch.Tensor:
    r"""
    $\bigl\| \mathop{attn}(h, m) - \mathop{attn}(h, f_c(m)) \bigr\|^2$, the mean over its elements, for the layer's
    input `queries` $h$ and the `old` memories $m$ that `compress` ($f_c$) turns into compressed ones: its gradient
    reaches $f_c$ only.

    Shape:
        `queries` `[qlen, batch, d_model]`, `old` `[n * rate, batch, d_model]`; returns a scalar.
    """
    queries, old = queries.detach(), old.detach()
    reconstructed, target = content_attention(attn, queries, compress(old), old)
    return F.mse_loss(reconstructed, target)
