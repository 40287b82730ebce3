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
from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

from ..errors import require_positive_int
from .compression import COMPRESSIONS, attention_reconstruction_loss, make_compression
from .mechanism import MemoryMechanism, ModelSizes, Segment, Setting, State


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


def old_rows(memory: Optional[torch.Tensor], segment: torch.Tensor, evicted: int) -> torch.Tensor:
    """The first `evicted` rows of `[memory, segment]`."""
    mlen = 0 if memory is None else memory.shape[0]
    rows = segment[:max(0, evicted - mlen)]
    return rows if memory is None else torch.cat([memory[:evicted], rows])


class CompressedMemory(MemoryMechanism):
    """
    Each layer's compression function and the rule that fills its compressed memory (see the module docstring); on
    with `cmem_len > 0`.

    Args:
        sizes: the model's sizes: `n_layer` compression functions (`functions`), each of `d_model` features.
        settings: `cmem_len` (the compressed rows each layer keeps, at least 1), `compression_rate` (the memories $c$
            that make one compressed row) and `compression` ($f_c$ by name, `compression.COMPRESSIONS`: `'conv'`,
            `'max_pool'` or `'mean_pool'`).

    Shape:
        compressed memories (the state `'cmem'`) are `[cmlen, bsz, d_model]` with `cmlen <= cmem_len`, one per layer.
    """
    size = 'cmem_len'
    settings = {
        'cmem_len': Setting(int, 0, "Compressed memory (the Compressive Transformer): compressed rows each layer "
                                    "keeps of the memories that fall out of `mem_len` (0: none)"),
        'compression_rate': Setting(int, 4, "Compressed memory: how many memories make one compressed row (at most "
                                            "`mem_len`)"),
        'compression': Setting(str, 'conv', "Compressed memory: the compression function, 'conv' (learned), "
                                            "'max_pool' or 'mean_pool'"),
    }
    attribute = 'compressed_memory'
    title = 'the compressed memory'
    losses = {'reconstruction': 'ar_loss'}

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any], mem_len: int) -> None:
        check_compressed_memory(settings['cmem_len'], settings['compression_rate'], settings['compression'], mem_len)

    def __init__(self, sizes: ModelSizes, settings: Mapping[str, Any]):
        super().__init__(sizes, settings)
        require_positive_int('cmem_len', self.cmem_len)
        self.functions = nn.ModuleList(make_compression(self.compression, sizes.d_model, self.compression_rate)
                                       for _ in range(sizes.n_layer))

    def state_layout(self) -> Dict[str, int]:
        return {'cmem': self.sizes.n_layer}

    def describe_state(self, name: str) -> str:
        return f"n_layer = {self.sizes.n_layer} compressed memories [cmlen, bsz, d_model]"

    def state_title(self, name: str) -> str:
        return 'compressed memories'

    def joined_rows(self, state: State, layer: int) -> Optional[torch.Tensor]:
        # $[\mathop{SG}(cm^{n-1}_\tau) \circ \mathop{SG}(m^{n-1}_\tau) \circ h^{n-1}_{\tau+1}]$: before the memory
        return state['cmem'][layer]

    def joined_length(self) -> int:
        return self.cmem_len

    def evicted_rows(self, evicted: int) -> int:
        r"""Whole groups of `compression_rate` rows fall out: $c \lceil \mathit{evicted} / c \rceil$."""
        return -(-evicted // self.compression_rate) * self.compression_rate

    def next_state(self, state: State, segment: Segment) -> State:
        r"""
        $cm^{n}_{\tau+1} = [cm^{n}_\tau \circ f_c(\text{old}^n)]_{[-\mathit{cmem\_len}:]}$ for each layer $n$, with
        $\text{old}^n$ the first `segment.evicted` rows of `[memory, segment input]`; detached.
        """
        cmems = state['cmem']
        if segment.evicted == 0:
            return {'cmem': list(cmems)}
        with torch.no_grad():
            return {'cmem': [torch.cat([cmem, compress(old_rows(memory, inputs, segment.evicted))])[-self.cmem_len:]
                             for compress, cmem, memory, inputs in zip(self.functions, cmems, segment.memories,
                                                                       segment.inputs)]}

    def aux_losses(self, state: State, segment: Segment) -> Dict[str, torch.Tensor]:
        r"""
        `'reconstruction'`: $\sum_n \mathcal{L}^{attn}_n$ over the layers (`compression.attention_reconstruction_loss`,
        each layer's attention with its segment input as the queries) on the rows this segment compresses. Zero where
        it compresses none, with zero gradients for the compression functions' parameters: they take part in every
        step, as `DistributedDataParallel` needs.
        """
        if segment.evicted == 0:
            zero = sum((p.sum() * 0 for p in self.functions.parameters()), segment.inputs[0].new_zeros(()))
            return {'reconstruction': zero}
        return {'reconstruction': sum(
            attention_reconstruction_loss(layer.dec_attn, compress, inputs, old_rows(memory, inputs, segment.evicted))
            for layer, compress, memory, inputs in zip(segment.layers, self.functions, segment.memories,
                                                       segment.inputs))}

    def check_reset(self, sizes: Mapping[str, Any], mem_len: int) -> None:
        """`cmem_len` may change (a longer compressed memory for evaluation), to at least 1; the memory must still be
        at least `compression_rate`."""
        others = {name: value for name, value in sizes.items() if name != 'cmem_len'}
        super().check_reset(others, mem_len)
        cmem_len = sizes.get('cmem_len', self.cmem_len)
        if not isinstance(cmem_len, int) or isinstance(cmem_len, bool) or cmem_len < 1:
            raise ValueError(f"cmem_len={cmem_len!r} is not accepted by a model built with cmem_len={self.cmem_len}: "
                             f"a model with a compressed memory keeps one of at least 1, and one without has no "
                             f"compression functions (build it with cmem_len > 0)")
        check_compressed_memory(cmem_len, self.compression_rate, self.compression, mem_len)

    def reset(self, sizes: Mapping[str, Any]) -> None:
        self.cmem_len = sizes.get('cmem_len', self.cmem_len)
