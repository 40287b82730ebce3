r"""
# What a memory mechanism says to the recurrence that carries it

Transformer-XL reads a text in segments; what a layer knows of the segments before is its memory. A memory
mechanism is one way of keeping it: Transformer-XL's own (the last `mem_len` layer inputs, `transformer_xl.py`),
the Compressive Transformer's (what falls out of that memory, compressed, `compressed.py`), and any registered
beside them (`registry.py`). The recurrence (`xl.MemTransformerLM`) carries every mechanism that is on through the
same segment step; a mechanism says

* **its settings** (`settings`, each with its default and a line of documentation; `size` names the one that turns
  it on: a mechanism is on when its size is above 0, so mechanisms compose where the papers compose them), checked
  whether it is on or not (`check_settings`), so a sweep that turns it on finds no bad value late;
* **its state per layer** (`state_layout`): named lists of tensors `[length, batch, *features]` (the batch always
  in dimension 1, so training splits, joins and gathers them by column whatever the mechanism), its initial state
  (`init_state`) and how the tensors of each are named in messages (`describe_state`);
* **what a layer attends to before its segment** (`joined_rows`): rows joined before Transformer-XL's memory, oldest
  first, which every positional scheme covers with its own positions (`joined_length` rows at most);
* **a second attention of a layer** (`attention_branch`): a computation over the layer's queries, combined with the
  layer's own attention before its output projection (the kNN memory's retrieval over stored keys and values);
* **rows it places around the segment** (`placed_rows`): rows of the first layer's input before and after the
  segment's token embeddings (the Recurrent Memory Transformer's read and write memory tokens), computed by every
  layer as the segment is (`placed_length` rows at most), left out of the loss and of Transformer-XL's memory;
* **how many segments its gradient spans** (`gradient_segments`): a state that keeps its graph (where the call asks,
  `carry_gradient`) lets training back-propagate through that many segments before it detaches;
* **the next state** (`next_state`) from what the segment computed (`Segment`: every layer's input, the rows of
  `[memory, segment]` that fall out of Transformer-XL's memory, `evicted_rows`);
* **its named auxiliary losses** (`losses`: a name and the series it is tracked as; `aux_losses` computes them),
  which training weighs by name (`aux_loss_weights`);
* **what it adds to a checkpoint**: its parameters, under its `attribute` of the model (so a checkpoint's names are
  the mechanism's own), and its state, which checkpoints keep as they keep the memories.

The original's calling convention `model(data, target, *mems)` takes and returns every state as one flat list:
each mechanism that is on, in the registry's order, each of its state names in `state_layout`'s order, one tensor
per layer there (`state.py`).
"""
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ..fast.dispatch import Plan

# One mechanism's state: per state name, one tensor per layer that keeps it
State = Dict[str, List[torch.Tensor]]
# A layer's second attention: from its queries `[bsz, n_head, qlen, d_head]` and its own attention's heads concatenated
# `[qlen, bsz, n_head * d_head]`, the heads the output projection takes instead (the same shape)
AttentionBranch = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Setting:
    """
    One setting of a mechanism: a keyword of `MemTransformerLM` and an item of `TransformerXLConfigs`.

    Args:
        annotation: its type (`int`, `str`, `float`, ...), as the configs check an override against it.
        default: its value when not given.
        doc: one line for `--help` and `docs/options.md`.
    """
    annotation: type
    default: Any
    doc: str


@dataclass(frozen=True)
class ModelSizes:
    """The sizes of the model a mechanism serves."""
    n_layer: int
    d_model: int
    n_head: int
    d_head: int


@dataclass
class Segment:
    r"""
    What one segment step computed, from which every mechanism makes its next state and its losses.

    Args:
        plan: the call's `fast.dispatch.Plan` (whether it keeps caches, compiles, ...).
        layers: the model's decoder layers (`layers[n].dec_attn` is layer $n$'s attention).
        inputs: $h^0, \dots, h^N$: every layer's input, then the last layer's output, `[qlen, batch, d_model]`.
        memories: Transformer-XL's memories before the segment, one per input (None where it has none).
        evicted: how many rows of `[memory, segment]` fall out of Transformer-XL's memory after this segment (the
            memory keeps rows `[evicted, end)`).
        end: the end of the rows the memory keeps (the original's rule, `MemTransformerLM._mem_bounds`).
        caches: the model's `xl.memory.ModelMemory` (append buffers, kept keys and values), which Transformer-XL's
            memory writes into.
        keys_values: each layer's `xl.attention.KeysValues` where the call computed them (it keeps them for the next
            segment, `keeps_keys_values`, or a mechanism `reads_keys_values`), else empty.
        outputs: the last layer's output over every row the layers computed (the rows mechanisms placed around the
            segment among them), before the final dropout.
        placed: per mechanism that placed rows, the slices of `outputs` before and after the segment that are its.
        carry_gradient: whether the next state keeps its graph (training within a window of `bptt_segments`).
        tokens: the rows of the layers' outputs (and of `keys_values`' segment) that are the segment's tokens.
        keeps_keys_values: whether Transformer-XL's memory keeps `keys_values` for the next segment.
    """
    plan: Plan
    layers: nn.ModuleList
    inputs: Sequence[torch.Tensor]
    memories: Optional[Sequence[torch.Tensor]]
    evicted: int
    end: int
    caches: Any
    keys_values: Sequence[Any] = ()
    outputs: Optional[torch.Tensor] = None
    placed: Dict[Any, Tuple[slice, slice]] = None
    carry_gradient: bool = False
    tokens: Optional[slice] = None
    keeps_keys_values: bool = False

    def kept_rows(self) -> slice:
        """The rows of the segment's tokens (among every row the layers computed) that Transformer-XL's memory keeps:
        all but the `ext_len` rows the next segment reads again."""
        mlen = 0 if not self.memories or self.memories[0] is None else self.memories[0].shape[0]
        start = self.tokens.start
        return slice(start, start + min(self.tokens.stop - start, self.end - mlen))


class MemoryMechanism(nn.Module):
    """
    A memory mechanism of the recurrence (see the module docstring): a module built by the model with the model's
    sizes and the mechanism's settings, only when it is on.

    A subclass sets the class attributes and overrides what it does differently from this base, which keeps no state,
    joins no rows, evicts what Transformer-XL evicts and has no loss.
    """
    # The setting that turns it on (above 0), one of `settings` or the model's own `mem_len`
    size: ClassVar[str] = ''
    # Its settings (the size among them, unless it is the model's `mem_len`), by keyword
    settings: ClassVar[Dict[str, Setting]] = {}
    # Where the model keeps it: the prefix of its parameters in a state_dict
    attribute: ClassVar[str] = ''
    # What it is, for messages: "the compressed memory"
    title: ClassVar[str] = ''
    # Its auxiliary losses: a name (the key of `aux_losses` and `aux_loss_weights`) and the series it is tracked as
    losses: ClassVar[Dict[str, str]] = {}
    # Built whatever its size, as `reset_length` may turn it on later (a mechanism without parameters); else built
    # only when on
    always_built: ClassVar[bool] = False
    # Reads every layer's keys and values of the segment (`Segment.keys_values`) for its next state
    reads_keys_values: ClassVar[bool] = False
    # Its state changes once per segment of the training length, whatever the call's (memory tokens, a kNN store), so
    # sampling computes a segment's tokens over the state before that segment (`xl/generation.py`)
    written_per_segment: ClassVar[bool] = False

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any], mem_len: int) -> None:
        """A `ValueError` naming what is wrong with `settings` (every one of `settings`, with Transformer-XL's
        `mem_len`), on or off."""

    def __init__(self, sizes: ModelSizes, settings: Mapping[str, Any]):
        super().__init__()
        self.sizes = sizes
        # Each setting as an attribute of its name (`reset` changes those evaluation may change)
        for name, value in settings.items():
            setattr(self, name, value)

    def is_on(self, mem_len: int) -> bool:
        """Whether the recurrence carries it now, with the model's `mem_len` (a mechanism built only when on always
        is)."""
        return True

    def state_layout(self) -> Dict[str, int]:
        """Per state name, how many tensors it keeps (one per layer that keeps it)."""
        return {}

    def describe_state(self, name: str) -> str:
        """The state `name` for a message: how many tensors of which shape, e.g. `n_layer = 2 compressed memories
        [cmlen, bsz, d_model]`."""
        return f"{self.state_layout()[name]} tensors [length, bsz, {', '.join(map(str, self.state_features(name)))}]"

    def state_title(self, name: str) -> str:
        """What the tensors of the state `name` are, plural, for a message: `'compressed memories'`."""
        return f"{self.title}'s {name} tensors"

    def state_features(self, name: str) -> Tuple[int, ...]:
        """The trailing dimensions of each tensor of the state `name`, after `[length, batch]`."""
        return (self.sizes.d_model,)

    def init_state(self, bsz: Optional[int], like: torch.Tensor) -> State:
        """The state of a new stream: every tensor with no rows, `[0, bsz, *features]` (`[0]`, as the original's
        memories, where `bsz` is not given), of `like`'s dtype and device."""
        return {name: [like.new_empty((0,) if bsz is None else (0, bsz) + self.state_features(name))
                       for _ in range(count)]
                for name, count in self.state_layout().items()}

    def joined_rows(self, state: State, layer: int) -> Optional[torch.Tensor]:
        """The rows layer `layer` attends to before Transformer-XL's memory, oldest first, `[rows, batch, d_model]`,
        or None."""
        return None

    def joined_length(self) -> int:
        """The most rows `joined_rows` gives a layer."""
        return 0

    def attention_branch(self, state: State, layer: int) -> Optional[AttentionBranch]:
        """Layer `layer`'s second attention for this segment, or None (the layer's own attention alone)."""
        return None

    def placed_rows(self, state: State, bsz: int, like: torch.Tensor
                    ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """The rows of the first layer's input before and after the segment's token embeddings, each
        `[rows, bsz, d_model]` of `like`'s dtype, or None."""
        return None, None

    def placed_length(self) -> int:
        """The most rows `placed_rows` gives, before and after together."""
        return 0

    def gradient_segments(self) -> int:
        """Through how many segments training back-propagates into this mechanism's state (1: none before)."""
        return 1

    def evicted_rows(self, evicted: int) -> int:
        """How many rows of `[memory, segment]` fall out of Transformer-XL's memory, where its own rule evicts
        `evicted`: a mechanism that takes them in groups may evict more (never fewer)."""
        return evicted

    def next_state(self, state: State, segment: Segment) -> State:
        """The state after `segment`, detached (unless `segment.carry_gradient` and the state has a gradient to
        carry)."""
        return state

    def aux_losses(self, state: State, segment: Segment) -> Dict[str, torch.Tensor]:
        """Each of `losses` of this segment, a scalar by name."""
        return {}

    def init_parameters(self, init_weight) -> None:
        """Initialise its parameters as the model's (`xl.init.init_weights`), where PyTorch's own initialisation is
        not what it wants: `init_weight(parameter)` draws the model's weights' distribution in place."""

    def check_reset(self, sizes: Mapping[str, Any], mem_len: int) -> None:
        """A `ValueError` unless `MemTransformerLM.reset_length` may set this mechanism's settings `sizes` (maybe none)
        with the model's `mem_len` to be: checked for every built mechanism, before anything changes."""
        if sizes:
            raise ValueError(f"{', '.join(f'{name}={value!r}' for name, value in sizes.items())} is not accepted by "
                             f"reset_length: {self.title} keeps the settings it was built with")

    def reset(self, sizes: Mapping[str, Any]) -> None:
        """Take the settings `sizes`, which `check_reset` accepted."""
