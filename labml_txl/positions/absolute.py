r"""
# Absolute positions added to the inputs (`'absolute'`, `'absolute_deeper'`: Transformer-XL's `attn_type` 2 and 3)

$$A_{i,j} = q_i^\top k_j$$

The attention sees no positions: `MemTransformerLM` adds them to the inputs, the sinusoids of the window positions
to the first layer's (type 2), or learned embeddings `r_emb` to every layer's (type 3). The scheme adds nothing but
what the original's `original_numerics` means for it: with `pre_lnorm`, the original took the queries from the
un-normalised input (the keys and values from the normalised one).
"""
from .scheme import PositionScheme


class Absolute(PositionScheme):
    """Positions added to the inputs by the model: no position terms in the attention."""
    original_raw_queries = True
    needs_model_positions = True
