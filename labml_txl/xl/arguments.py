"""
# `MemTransformerLM`'s constructor arguments, checked

Every argument is checked before anything is built, each failure an exception that names the argument, the value
it got and what is accepted (`checks.py` has the checks the other entry points share).
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Union

from ..errors import require_bool, require_positive_int, require_probability
from ..memories import registry as memory_registry
from ..positions import registry
from ..positions.rotary import rotary_features
from ..positions.t5_bias import check_t5_buckets
from ..transformer.norms import check_norm
from .checks import check_clamp_len, check_cutoffs, check_lengths, check_same_length
from .init import check_init
from .model_positions import model_positions

# The original's types, which `original_numerics` copies
ORIGINAL_TYPES = (0, 1, 2, 3)

@dataclass(frozen=True)
class ModelArguments:
    """`MemTransformerLM`'s arguments as the model keeps them, after `check_model_arguments`."""
    # The positional scheme's name, and its `attn_type` (the integer where it has one)
    scheme: str
    attn_type: Union[int, str]
    d_embed: int
    cutoffs: List[int]
    tie_projs: List[bool]
    ext_len: int
    mem_len: int
    # Every memory mechanism's settings, given or their defaults
    memory_settings: Dict[str, Any]


def check_model_arguments(*, n_token, n_layer, n_head, d_model, d_head, d_inner, dropout, dropatt, tie_weight,
                          d_embed, div_val, tie_projs, pre_lnorm, tgt_len, ext_len, mem_len, cutoffs, adapt_inp,
                          same_length, attn_type, clamp_len, sample_softmax, untie_r, init, init_range, init_std,
                          proj_init_std, original_numerics, norm, rotary_fraction, t5_num_buckets, t5_max_distance,
                          memory_settings) -> ModelArguments:
    """`MemTransformerLM`'s constructor arguments (see its docstring), checked before anything is built: an exception
    naming the first that is not accepted, and what is; else the arguments as the model keeps them. The settings of
    the schemes and of the memory mechanisms are checked whichever is chosen, so a sweep finds no bad value late."""
    for name, value in (('n_token', n_token), ('n_layer', n_layer), ('n_head', n_head),
                        ('d_model', d_model), ('d_head', d_head), ('d_inner', d_inner)):
        require_positive_int(name, value)
    require_probability('dropout', dropout, allow_one=False)
    require_probability('dropatt', dropatt, allow_one=False)
    for name, value in (('tie_weight', tie_weight), ('pre_lnorm', pre_lnorm), ('adapt_inp', adapt_inp),
                        ('same_length', same_length), ('untie_r', untie_r),
                        ('original_numerics', original_numerics)):
        require_bool(name, value)
    # The scheme's name, and its integer where it has one (a checkpoint's and Hugging Face's `attn_type`)
    scheme = registry.scheme_name(attn_type)
    attn_type = registry.ATTN_TYPES.get(scheme, scheme)
    if attn_type in (0, 2) and d_model % 2 != 0:
        raise ValueError(f"d_model={d_model} is not accepted with attn_type={attn_type}: its sinusoidal "
                         f"position embeddings pair a sine and a cosine per frequency, so d_model must be even")
    if attn_type == 3 and n_head * d_head != d_model:
        raise ValueError(f"n_head * d_head = {n_head} * {d_head} = {n_head * d_head} is not accepted with "
                         f"attn_type=3: its learned embeddings [n_head, d_head] are added to the "
                         f"[.., d_model={d_model}] inputs, so n_head * d_head must equal d_model")
    d_embed = d_model if d_embed is None else d_embed
    require_positive_int('d_embed', d_embed)
    require_positive_int('div_val', div_val)
    cutoffs = check_cutoffs(cutoffs, n_token)
    tie_projs = list(tie_projs) if tie_projs is not None else [False]
    for i, tied in enumerate(tie_projs):
        require_bool(f'tie_projs[{i}]', tied)
    if len(tie_projs) != len(cutoffs) + 1 and tie_projs != [False]:
        raise ValueError(f"tie_projs={tie_projs!r} is not accepted: expected one boolean per cluster, "
                         f"len(cutoffs) + 1 = {len(cutoffs) + 1} of them for cutoffs={cutoffs} "
                         f"(or the default [False], tying none)")
    ext_len = 0 if ext_len is None else ext_len
    mem_len = 0 if mem_len is None else mem_len
    check_lengths(tgt_len, ext_len, mem_len, allow_none_tgt=not model_positions(attn_type).sized_by_lengths)
    check_same_length(same_length, mem_len)
    check_clamp_len(clamp_len)
    if isinstance(sample_softmax, bool) or not isinstance(sample_softmax, int):
        raise ValueError(f"sample_softmax={sample_softmax!r} is not accepted: an integer (<= 0 for none)")
    if sample_softmax > 0 and tie_weight and (div_val != 1 or d_embed != d_model):
        raise ValueError(f"sample_softmax={sample_softmax} with tie_weight=True is not accepted with "
                         f"div_val={div_val}, d_embed={d_embed}, d_model={d_model}: the output layer "
                         f"[n_token, d_model] shares the single embedding table, which needs div_val=1 "
                         f"and d_embed=d_model")
    if original_numerics and attn_type not in ORIGINAL_TYPES:
        raise ValueError(f"original_numerics=True is not accepted with attn_type={attn_type!r}: the original "
                         f"has attention types 0 to 3 only, so there are no numerics of its own to copy")
    if untie_r and attn_type != 0:
        raise ValueError(f"untie_r=True is not accepted with attn_type={attn_type}: it unties the u, v "
                         f"biases of attn_type 0 (type 1 has per-layer biases already, 2 and 3 have none)")
    check_init(init, init_range, init_std, proj_init_std)
    check_norm(norm)
    memory_settings = memory_registry.with_defaults(memory_settings)
    for mechanism in memory_registry.MEMORIES.values():
        mechanism.check_settings(memory_settings, mem_len)
    # The settings of the schemes, checked whichever type is chosen
    rotary_features(d_head, rotary_fraction)
    check_t5_buckets(t5_num_buckets, t5_max_distance, False, names=('t5_num_buckets', 't5_max_distance'))
    return ModelArguments(scheme, attn_type, d_embed, cutoffs, tie_projs, ext_len, mem_len, memory_settings)

