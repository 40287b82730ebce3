r"""
# Transformer-XL's memory

Dai et al. (2019), section 3.2: each layer $n$ attends over its segment and a memory of up to `mem_len` hidden states
of the layer below from earlier segments, kept without gradient,

$$\tilde{h}^{n-1}_{\tau+1} = [\mathop{SG}(m^{n-1}_{\tau}) \circ h^{n-1}_{\tau+1}], \qquad
  m^{n-1}_{\tau+1} = [m^{n-1}_\tau \circ h^{n-1}_{\tau+1}]_{[beg, end)}.$$

It is the recurrence's own memory: the model reads it as every layer's memory (what the fast paths keep keys, values
and append buffers of, `xl/memory.py`), and every other mechanism's rows are joined before it. Its state is
`'mem'`, the `n_layer + 1` layer inputs (the last layer's output too, as the original keeps it), and its size is the
model's `mem_len`.
"""
from typing import Dict

from .mechanism import MemoryMechanism, Segment, State


class TransformerXLMemory(MemoryMechanism):
    """Transformer-XL's memory of the last `mem_len` layer inputs (see the module docstring); on with `mem_len > 0`."""
    size = 'mem_len'
    attribute = 'xl_memory'
    title = "Transformer-XL's memory"
    # Always there: `reset_length` may give a model without a memory one, and it has no parameters
    always_built = True

    def is_on(self, mem_len: int) -> bool:
        return mem_len > 0

    def state_layout(self) -> Dict[str, int]:
        return {'mem': self.sizes.n_layer + 1}

    def describe_state(self, name: str) -> str:
        return (f"n_layer + 1 = {self.sizes.n_layer + 1} tensors [mlen, bsz, d_model] (the input of every layer and "
                f"the last output)")

    def state_title(self, name: str) -> str:
        return 'memories'

    def next_state(self, state: State, segment: Segment) -> State:
        # $m^{n-1}_{\tau+1} = [m^{n-1}_\tau \circ h^{n-1}_{\tau+1}]_{[beg, end)}$, written by the model's caches (append
        # buffers, kept keys and values) where the call keeps them
        kept_keys_values = segment.keys_values if segment.keeps_keys_values else []
        return {'mem': segment.caches.next_memories(segment.plan, segment.inputs, state['mem'], kept_keys_values,
                                                    segment.layers, segment.evicted, segment.end)}
