r"""
# What a positional scheme says to the attention that uses it

A scheme whose positions live in the attention adds to the score $q_i^\top k_j$ of query $i$ and key $j$ something
that depends on $i - j$: a relative table with biases $u$ and $v$, a bias per distance $b_s$, a rotation of the
queries and keys (`RelativeTerms`, `labml_txl/attention/reference.py`). It is written once and serves both the
vanilla `MultiHeadAttention` (`TransformerConfigs`) and Transformer-XL's `XLAttention` (`MemTransformerLM`); the two
differ only in the table they ask for:

* the full one (an encoder, or a decoder with its causal mask: vanilla), distances `seq_k - 1 .. -(seq_q - 1)`,
  every pair scored exactly;
* a decoder's (Transformer-XL), distances `klen - 1 .. 0`: the keys after a query are masked anyway.

Either way the queries are the last `seq_q` of the `seq_k` key positions (a memory, if any, first).

A scheme object says

* which parameters it adds to the attention (`attach`): registered **on the attention**, under the names the
  scheme has always had there (`r_net`, `relative_attention_bias`, ...), so a state_dict does not see the scheme;
* its `RelativeTerms` for a call (`terms`), from those parameters and the position arguments a model gives per call
  (Transformer-XL's own tables of its types 0 and 1), None where it adds nothing.

A scheme is built per attention (its settings, and what it computed of the attention's sizes at `attach`), by name
from `registry.py` with the settings of a model or config (`SchemeSettings`).
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..attention.reference import RelativeTerms
from ..fast.dispatch import Plan


@dataclass(frozen=True)
class SchemeSettings:
    """
    The settings a model or config gives every scheme it builds; each scheme reads its own (`from_settings`).

    Args:
        bidirectional: the attention sees keys after the query (an encoder) or not (a causal decoder).
        rotary_fraction: the fraction of each head's features `'rotary'` turns.
        t5_num_buckets, t5_max_distance: the distance buckets of `'t5_bias'`.
        own_biases: `'relative'` owns its $u$, $v$ (vanilla; Transformer-XL's `untie_r`) or takes the model's.
    """
    bidirectional: bool = True
    rotary_fraction: float = 1.0
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    own_biases: bool = True


class PositionScheme:
    """
    A positional scheme for one attention: its parameters (`attach`) and its position terms (`terms`). This base
    adds nothing (the model adds positions to the inputs, or there are none).
    """
    # Transformer-XL's original types 0 and 1 project queries, keys and values with one matrix, `qkv_net`; every
    # other scheme there has `q_net` and `kv_net`. A checkpoint's names, nothing more.
    joint_qkv = False
    # What Transformer-XL's `original_numerics` copies of the original for this scheme: the scaled scores rounded to
    # float32 before the softmax (type 0), the queries from the un-normalised input with `pre_lnorm` (types 2, 3)
    original_rounds_scores = False
    original_raw_queries = False
    # The positions come from the model (added to its inputs, or tables it owns and passes): only a model that
    # provides them (`MemTransformerLM`'s types 1 to 3) serves the scheme, not `TransformerConfigs`' attentions
    needs_model_positions = False

    _attached = False

    @classmethod
    def from_settings(cls, settings: SchemeSettings) -> 'PositionScheme':
        """The scheme with the settings of a model or config (the registry builds it so); none read here."""
        return cls()

    def attach(self, attn: nn.Module, d_model: int, heads: int, d_head: int) -> None:
        """Register the scheme's parameters on `attn` (`d_model` features in, `heads` heads of `d_head`), once: a
        scheme serves the one attention it is attached to. Called by the attention after its own modules."""
        if self._attached:
            raise ValueError(f"this {type(self).__name__} scheme is attached to an attention already: a scheme holds "
                             f"what it computed of its attention's sizes, so build one per attention")
        self._attached = True
        self.add_parameters(attn, d_model, heads, d_head)

    def add_parameters(self, attn: nn.Module, d_model: int, heads: int, d_head: int) -> None:
        """The scheme's parameters and buffers, set on `attn` under their names; none here."""

    def terms(self, attn: nn.Module, plan: Plan, seq_q: int, seq_k: int, like: torch.Tensor, full_table: bool,
              *position_args: torch.Tensor) -> Optional[RelativeTerms]:
        """
        What the scheme adds to $q_i^\\top k_j$ for `seq_q` queries that are the last of `seq_k` key positions, in
        the dtype and on the device of `like`, with the full table (`full_table`) or a decoder's, from `attn`'s
        parameters and the model's `position_args`; None: nothing.
        """
        if position_args:
            raise ValueError(f"{type(self).__name__} takes no position arguments, got {len(position_args)}: its "
                             f"positions are the model's inputs' or its parameters'")
        return None


def require_scheme(positions) -> PositionScheme:
    """`positions`, or a `TypeError` naming what an attention accepts: a `PositionScheme` object."""
    if not isinstance(positions, PositionScheme):
        raise TypeError(f"positions={positions!r} is not accepted: a PositionScheme object (labml_txl/positions/, "
                        f"e.g. Rotary(), or by name: positions.registry.build(name, settings))")
    return positions
