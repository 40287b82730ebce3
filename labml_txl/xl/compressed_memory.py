r"""
# The compressed memory: where Transformer-XL's forgotten memories go

The Compressive Transformer (Rae et al., 2020) keeps, beside each layer's memory $m$ of `mem_len` hidden states, a
compressed memory $cm$ of `cmem_len`. Attention reads both, oldest first: layer $n$ attends over

$$\tilde{h}^{n-1}_{\tau+1} = [\mathop{SG}(cm^{n-1}_\tau) \circ \mathop{SG}(m^{n-1}_\tau) \circ h^{n-1}_{\tau+1}],$$

so the model sees `cmem_len` positions further back at a cost of `cmem_len`, not `compression_rate * cmem_len`,
keys. (Passed to attention as a longer memory, every positional scheme covers the compressed positions with its own
distance table, one distance per compressed row, as the paper's relative attention does.)

After a segment, the rows of $[m^{n-1}_\tau \circ h^{n-1}_{\tau+1}]$ that fall out of the memory's window (the rows
before `beg` of `MemTransformerLM._mem_bounds`) are compressed by the layer's $f_c$ and appended to the compressed
memory, which keeps its last `cmem_len` rows (the paper's Algorithm 1):

$$cm^{n-1}_{\tau+1} = [cm^{n-1}_\tau \circ f_c(\text{old})]_{[-\mathit{cmem\_len}:]}.$$

$f_c$ turns `compression_rate` rows into one, so the rows that fall out are rounded *up* to a multiple of the rate
(as labml_nn rounds them): the memory then keeps up to `compression_rate - 1` rows fewer than `mem_len` until the
next segment. After $T$ inputs (without `ext_len`) the rows compressed so far are the first
$B_T = c \lceil \max(0, T - \mathit{mem\_len}) / c \rceil$ of the history, so the compressed memory is
$f_c$ of the history's rows $[0, B_T)$, its last `cmem_len` rows: segments compress their rows in groups of $c$ that
never straddle two segments. At rate 1 with an identity $f_c$ (max or mean pooling of one row) the two memories are
Transformer-XL's memory of `mem_len + cmem_len`.

The attention-reconstruction loss (`compression.attention_reconstruction_loss`) trains each $f_c$ on the rows it
compressed, with the layer's segment input as the queries; it is summed over the layers, as labml_nn sums it.
"""
from typing import List, Optional, Sequence

import torch
from torch import nn

from ..errors import require_positive_int
from .compression import COMPRESSIONS, attention_reconstruction_loss, make_compression


def check_compressed_memory(cmem_len: int, compression_rate: int, compression: str, mem_len: int) -> None:
    """A `ValueError` naming what is wrong with the compressed memory's settings, checked whether it is on or not
    (`cmem_len > 0`), so a sweep that turns it on finds no bad value late."""
    require_positive_int('cmem_len', cmem_len, allow_zero=True)
    require_positive_int('compression_rate', compression_rate)
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r} is not accepted: one of "
                         f"{', '.join(map(repr, COMPRESSIONS))}")
    if cmem_len > 0 and mem_len < compression_rate:
        raise ValueError(f"cmem_len={cmem_len} is not accepted with mem_len={mem_len} and "
                         f"compression_rate={compression_rate}: the compressed memory is made of the memories that "
                         f"fall out of the memory, compression_rate at a time, so mem_len must be at least "
                         f"compression_rate (or cmem_len 0 for Transformer-XL's memory alone)")


class CompressedMemory(nn.Module):
    """
    Each layer's compression function and the rule that fills its compressed memory (see the module docstring).

    Args:
        n_layer: the number of layers, each with its own $f_c$ (`functions`).
        d_model: the features of a memory.
        cmem_len: the compressed rows each layer keeps (at least 1).
        compression_rate: the memories $c$ that make one compressed row.
        compression: $f_c$ by name (`compression.COMPRESSIONS`): `'conv'`, `'max_pool'` or `'mean_pool'`.

    Shape:
        compressed memories are `[cmlen, bsz, d_model]` with `cmlen <= cmem_len`, one per layer.
    """

    def __init__(self, n_layer: int, d_model: int, cmem_len: int, compression_rate: int, compression: str):
        super().__init__()
        require_positive_int('cmem_len', cmem_len)
        self.cmem_len, self.rate, self.compression = cmem_len, compression_rate, compression
        self.functions = nn.ModuleList(make_compression(compression, d_model, compression_rate)
                                       for _ in range(n_layer))

    def evicted_rows(self, beg: int) -> int:
        r"""How many rows of `[memory, segment]` are compressed when the window starts at `beg`:
        $c \lceil \mathit{beg} / c \rceil$."""
        return -(-beg // self.rate) * self.rate

    @staticmethod
    def old_rows(memory: Optional[torch.Tensor], segment: torch.Tensor, evicted: int) -> torch.Tensor:
        """The first `evicted` rows of `[memory, segment]`."""
        mlen = 0 if memory is None else memory.shape[0]
        rows = segment[:max(0, evicted - mlen)]
        return rows if memory is None else torch.cat([memory[:evicted], rows])

    def next_compressed(self, cmems: Sequence[torch.Tensor], mems: Sequence[Optional[torch.Tensor]],
                        hids: Sequence[torch.Tensor], evicted: int) -> List[torch.Tensor]:
        r"""
        $cm^{n}_{\tau+1} = [cm^{n}_\tau \circ f_c(\text{old}^n)]_{[-\mathit{cmem\_len}:]}$ for each layer $n$, with
        $\text{old}^n$ the first `evicted` rows of `[mems[n], hids[n]]`; detached.

        Shape:
            `cmems`, `mems`, `hids` one per layer at least (`[cmlen | mlen | qlen, bsz, d_model]`); returns one
            `[min(cmem_len, cmlen + evicted / rate), bsz, d_model]` per layer.
        """
        if evicted == 0:
            return list(cmems[:len(self.functions)])
        with torch.no_grad():
            return [torch.cat([cmem, compress(self.old_rows(memory, segment, evicted))])[-self.cmem_len:]
                    for compress, cmem, memory, segment in zip(self.functions, cmems, mems, hids)]

    def reconstruction_loss(self, layers: nn.ModuleList, mems: Sequence[Optional[torch.Tensor]],
                            hids: Sequence[torch.Tensor], evicted: int) -> torch.Tensor:
        r"""
        $\sum_n \mathcal{L}^{attn}_n$ over the layers (`compression.attention_reconstruction_loss`, each layer's
        attention `layers[n].dec_attn` with its segment input `hids[n]` as the queries) on the rows this segment
        compresses. Zero where it compresses none, with zero gradients for the compression functions' parameters:
        they take part in every step, as `DistributedDataParallel` needs.
        """
        if evicted == 0:
            return sum((p.sum() * 0 for p in self.functions.parameters()), hids[0].new_zeros(()))
        return sum(attention_reconstruction_loss(layer.dec_attn, compress, segment,
                                                 self.old_rows(memory, segment, evicted))
                   for layer, compress, memory, segment in zip(layers, self.functions, mems, hids))
