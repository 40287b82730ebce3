r"""
# The positions the original's attention types take from the model

The original Transformer-XL keeps the position tables of its four attention types in the model, not in the
attention, and passes them to every layer (or adds them to its input). Their names are the model's own in a
state_dict (`pos_emb`, `r_emb`, `r_w_bias`, `r_r_bias`, `r_bias`), so the published checkpoints load. Each type is
one class here; the schemes added since (rotary, ALiBi, T5, any registered by name) keep their positions in their
attention (`positions/`), and take nothing from the model (`ModelPositions`).

* `0`: the paper's relative attention, sinusoidal $R$ of distances `klen - 1 .. 0` (clipped at `clamp_len`),
  biases $u$ = `r_w_bias`, $v$ = `r_r_bias` shared by all layers (per layer with `untie_r=True`).
* `1`: learned relative embeddings `r_emb` `[n_layer, max_klen, n_head, d_head]`, biases `r_bias`
  `[n_layer, max_klen, n_head]` and `r_w_bias` `[n_layer, n_head, d_head]`; `max_klen = tgt_len + ext_len + mem_len`
  (and the rows memory mechanisms add).
* `2`: absolute sinusoidal embeddings of the window position counted back from its last token
  (`klen - 1 .. 0`), added to the input of the first layer.
* `3`: learned absolute embeddings `r_emb` `[n_layer, max_klen, n_head, d_head]` (needs
  `n_head * d_head == d_model`), added to the input of every layer.

For types 2 and 3 the memories hold the layer inputs **without** position embeddings; the embeddings of the positions
a memory takes in the current window are added to a new tensor at every use. (The original added them in place into
the cached tensors, counting them again at every segment; its reference files for 2 and 3 use no memory.)
"""
from typing import Dict, Optional, Tuple, Type

import torch
from torch import nn

from ..fast.dispatch import Plan
from ..positions.encoding import relative_distances
from ..positions.learned_relative import last_rows
from .positional_embedding import PositionalEmbedding

# What a layer takes: its input, its memory and the position arguments of its attention
LayerInputs = Tuple[torch.Tensor, Optional[torch.Tensor], tuple]


class ModelPositions:
    """What the model gives its layers of positions: nothing, for the schemes whose positions are their attention's.
    A subclass is one of the original's types (see the module docstring)."""
    # Whether a memory is projected as it is (no positions added), so its keys and values may be kept for the next
    # segment
    projects_memory_as_is: bool = True
    # Whether its learned tables are sized by `tgt_len + ext_len + mem_len`, so `tgt_len` must be given
    sized_by_lengths: bool = False

    def add_parameters(self, model: nn.Module) -> None:
        """Register its tables on `model` (as the original names them)."""

    def shared(self, model: nn.Module, plan: Plan, klen: int, longest: int, like: torch.Tensor
               ) -> Optional[torch.Tensor]:
        """What every layer of a call reads, computed once per call (the sinusoids of `klen` positions), before
        dropout; `longest` is the most keys a call of the model's lengths has (the table kept serves them all)."""
        return None

    def layer_inputs(self, model: nn.Module, i: int, core_out: torch.Tensor, memory: Optional[torch.Tensor],
                     mlen: int, klen: int, shared: Optional[torch.Tensor]) -> LayerInputs:
        """What layer `i` takes: its input `core_out`, its `memory` of `mlen` rows (with the positions the absolute
        types add, in new tensors: the cache stays position-free) and the position arguments of its attention."""
        return core_out, memory, ()


class _Sinusoids(ModelPositions):
    """Sinusoidal embeddings of `klen - 1 .. 0` (clipped at `clamp_len`), `pos_emb`: types 0 and 2."""

    def add_parameters(self, model: nn.Module) -> None:
        model.pos_emb = PositionalEmbedding(model.d_model)

    def shared(self, model: nn.Module, plan: Plan, klen: int, longest: int, like: torch.Tensor) -> torch.Tensor:
        """The last `klen` rows of one kept table as long as the longest segment over a full memory (one-token
        steps, one key longer each, read the same table), `[klen, 1, d_model]`; the key holds the frequencies'
        version, so a loaded `inv_freq` is seen."""
        dtype, device, inv_freq = like.dtype, like.device, model.pos_emb.inv_freq
        key = ('pos', model.clamp_len, dtype, device, inv_freq.data_ptr(), inv_freq._version)

        def table(rows: int) -> torch.Tensor:
            # Positions are exact integers only in float32 or float64
            pos_dtype = torch.float64 if dtype == torch.float64 else torch.float32
            distances = relative_distances(rows, rows, bidirectional=False, clamp_len=model.clamp_len,
                                           dtype=pos_dtype, device=device)
            return model.pos_emb(distances).to(dtype)
        return model._memory.last_rows(plan, key, klen, longest, table)


class RelativeSinusoids(_Sinusoids):
    """Type 0: the sinusoids $R$ of every distance and the biases $u$, $v$, shared by the layers (each layer's own
    with `untie_r`, on its attention)."""

    def add_parameters(self, model: nn.Module) -> None:
        super().add_parameters(model)
        if not model.untie_r:
            # $u$ and $v$, shared by all layers
            model.r_w_bias = nn.Parameter(torch.empty(model.n_head, model.d_head))
            model.r_r_bias = nn.Parameter(torch.empty(model.n_head, model.d_head))

    def layer_inputs(self, model, i, core_out, memory, mlen, klen, shared) -> LayerInputs:
        biases = (None, None) if model.untie_r else (model.r_w_bias, model.r_r_bias)
        return core_out, memory, (shared,) + biases


class LearnedRelative(ModelPositions):
    """Type 1: each layer's learned table $e$ of distances, its bias $u$ and its bias $b$ per table entry."""
    sized_by_lengths = True

    def add_parameters(self, model: nn.Module) -> None:
        model.r_emb = nn.Parameter(torch.empty(model.n_layer, model.max_klen, model.n_head, model.d_head))
        model.r_w_bias = nn.Parameter(torch.empty(model.n_layer, model.n_head, model.d_head))
        model.r_bias = nn.Parameter(torch.empty(model.n_layer, model.max_klen, model.n_head))

    def layer_inputs(self, model, i, core_out, memory, mlen, klen, shared) -> LayerInputs:
        r_emb, r_bias = model.r_emb[i], model.r_bias[i]
        if model.clamp_len > 0:
            r_emb, r_bias = r_emb[-model.clamp_len:], r_bias[-model.clamp_len:]
        return core_out, memory, (r_emb, model.r_w_bias[i], r_bias)


class AbsoluteSinusoids(_Sinusoids):
    """Type 2: sinusoidal positions of the window, added to the first layer's input."""
    projects_memory_as_is = False

    def layer_inputs(self, model, i, core_out, memory, mlen, klen, shared) -> LayerInputs:
        if i > 0:
            return core_out, memory, ()
        return core_out + shared[mlen:], None if memory is None else memory + shared[:mlen], ()


class LearnedAbsolute(ModelPositions):
    """Type 3: learned embeddings of the window positions, `[klen, 1, d_model]`, added to every layer's input."""
    projects_memory_as_is = False
    sized_by_lengths = True

    def add_parameters(self, model: nn.Module) -> None:
        model.r_emb = nn.Parameter(torch.empty(model.n_layer, model.max_klen, model.n_head, model.d_head))

    def layer_inputs(self, model, i, core_out, memory, mlen, klen, shared) -> LayerInputs:
        table = last_rows(model.r_emb[i], klen).reshape(klen, 1, model.d_model)
        return core_out + table[mlen:], None if memory is None else memory + table[:mlen], ()


# The original's types by `attn_type`
ORIGINAL: Dict[int, Type[ModelPositions]] = {0: RelativeSinusoids, 1: LearnedRelative, 2: AbsoluteSinusoids,
                                             3: LearnedAbsolute}


def model_positions(attn_type) -> ModelPositions:
    """What the model gives the layers of the scheme `attn_type` (its integer, or its name where it has none)."""
    return ORIGINAL.get(attn_type, ModelPositions)()
