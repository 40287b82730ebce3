r"""
# The Recurrent Memory Transformer's memory tokens

*Recurrent Memory Transformer* (Bulatov et al., NeurIPS 2022) passes a segment's memory to the next through
`n_mem_tokens` memory tokens that the layers read and write as they compute the segment, with no other change to the
Transformer. For a decoder (the paper's section 3, its language models built on Transformer-XL, `booydar/LM-RMT`),
the memory $H^{mem}_\tau$ is placed both before the segment's token embeddings $H^0_\tau$ (the *read* memory, which
every token of the segment attends to) and after them (the *write* memory, which attends to the whole segment):

$$\tilde{H}^0_\tau = [H^{mem}_\tau \circ H^0_\tau \circ H^{mem}_\tau], \qquad
  \bar{H}^N_\tau = \mathop{Transformer}(\tilde{H}^0_\tau), \qquad
  [H^{read}_\tau \circ H^N_\tau \circ H^{write}_\tau] := \bar{H}^N_\tau, \qquad H^{mem}_{\tau+1} := H^{write}_\tau.$$

The attention is the model's causal attention over the whole row sequence, so each token sees the read memory and
the tokens before it, and the write memory sees everything; the tokens never see the write memory, so their outputs
do not depend on it. $H^{mem}_0$ is learned (`initial`). The memory tokens take positions in the row sequence as
tokens do (every positional scheme covers them), are not scored, and are not kept in Transformer-XL's memory: with
`mem_len > 0` (the paper's "RMT + XL", its best WikiText-103 model) a layer attends over
$[\mathop{SG}(m^{n-1}_\tau) \circ \tilde{H}^{n-1}_\tau]$ with $m$ the earlier segments' token states only.

Unlike Transformer-XL's memory, $H^{mem}$ is trained through the recurrence: training back-propagates through
`bptt_segments` segments (the paper's BPTT unroll) before it detaches the memory, one optimizer step per window of
segments (`train.trainer`).

The write memory is the last layer's output $H^N$ before the model's final dropout.
"""
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

from ..errors import require_positive_int
from .mechanism import MemoryMechanism, ModelSizes, Segment, Setting, State


class RecurrentMemoryTokens(MemoryMechanism):
    """
    The Recurrent Memory Transformer's memory tokens (see the module docstring); on with `n_mem_tokens > 0`.

    Args:
        sizes: the model's sizes (`d_model`, the features of a memory token).
        settings: `n_mem_tokens` (the memory tokens read and written per segment) and `bptt_segments` (the segments
            training back-propagates through, at least 1).

    Shape:
        the state `'tokens'` is one tensor `[n_mem_tokens, bsz, d_model]` (none before the first segment, where the
        learned `initial` memory is read).
    """
    size = 'n_mem_tokens'
    settings = {
        'n_mem_tokens': Setting(int, 0, "Recurrent Memory Transformer: the memory tokens each segment reads (before "
                                        "it) and writes (after it) (0: none)"),
        'bptt_segments': Setting(int, 1, "Recurrent Memory Transformer: the segments training back-propagates "
                                         "through the memory tokens, one optimizer step per window of them"),
    }
    attribute = 'memory_tokens'
    title = "the Recurrent Memory Transformer's memory tokens"
    written_per_segment = True

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any], mem_len: int) -> None:
        require_positive_int('n_mem_tokens', settings['n_mem_tokens'], allow_zero=True)
        require_positive_int('bptt_segments', settings['bptt_segments'])

    def __init__(self, sizes: ModelSizes, settings: Mapping[str, Any]):
        super().__init__(sizes, settings)
        require_positive_int('n_mem_tokens', self.n_mem_tokens)
        # $H^{mem}_0$, learned (drawn as the model's embeddings are, `init_parameters`)
        self.initial = nn.Parameter(torch.empty(self.n_mem_tokens, sizes.d_model))
        nn.init.normal_(self.initial, 0.0, 0.02)

    def init_parameters(self, init_weight) -> None:
        # $H^{mem}_0$ drawn as the embeddings are
        init_weight(self.initial)

    def state_layout(self) -> Dict[str, int]:
        return {'tokens': 1}

    def describe_state(self, name: str) -> str:
        return f"1 tensor of memory tokens [{self.n_mem_tokens}, bsz, d_model]"

    def state_title(self, name: str) -> str:
        return 'memory tokens'

    def placed_rows(self, state: State, bsz: int, like: torch.Tensor
                    ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        # $H^{mem}_\tau$ (the learned $H^{mem}_0$ before the first segment), read before and written after the segment
        memory = state['tokens'][0]
        if memory.dim() != 3 or memory.shape[0] == 0:
            memory = self.initial[:, None].expand(-1, bsz, -1)
        memory = memory.to(like.dtype)
        return memory, memory

    def placed_length(self) -> int:
        return 2 * self.n_mem_tokens

    def gradient_segments(self) -> int:
        return self.bptt_segments

    def next_state(self, state: State, segment: Segment) -> State:
        # $H^{mem}_{\tau+1} := H^{write}_\tau$, the last layer's output at the write memory
        written = segment.outputs[segment.placed[self][1]]
        return {'tokens': [written if segment.carry_gradient else written.detach()]}
