r"""
# Configurable Transformer-XL (`TransformerXLConfigs`)

Every constructor keyword of `xl.MemTransformerLM` is an item, with the defaults of the original `train.py`; the model
is built on first use. `attention` names the positional scheme (`positions/registry.py`: the original's `attn_type`
integers and the schemes added since), `norm` the norm (`transformer.NORMS`), and `preset` the hyperparameters of one
of the original run scripts (`presets.py`). Every memory mechanism's settings (`memories/registry.py`: the compressed
memory's `cmem_len`, `compression_rate`, `compression`, ...) are items too, added as each mechanism is registered.
"""
import copy
from typing import ClassVar, Dict, List, Optional

from labml.configs import aggregate, option
from labml.internal.configs.config_item import ConfigItem

from ..memories import registry as memory_registry
from ..positions import registry
from ..xl import MemTransformerLM
from .presets import PRESETS, TRAINING_COLUMNS
from .transformer import norm_options
from .validation import ValidatedConfigs


class TransformerXLConfigs(ValidatedConfigs):
    """
    Configurations of Transformer-XL (`xl.MemTransformerLM`): every constructor keyword is an item, with the
    defaults of the original `train.py`; `model` is built on first use. `attention` names the attention variant
    and `preset` sets the hyperparameters of one of the original run scripts (`tests/reference/xl/presets.md`).
    """
    # Vocabulary size; set by the corpus
    n_token: int
    # Number of layers
    n_layer: int = 12
    # Number of attention heads
    n_head: int = 10
    # Width of the residual stream
    d_model: int = 500
    # Width of each head
    d_head: int = 50
    # Hidden width of the position-wise feed-forward layer
    d_inner: int = 1000
    # Dropout probability of the residual branches and embeddings
    dropout: float = 0.0
    # Dropout probability of the attention weights
    dropatt: float = 0.0
    # Share the embedding's weights with the softmax's
    tie_weight: bool = True
    # Embedding size; `None` for `d_model`
    d_embed: Optional[int] = None
    # Adaptive embedding: each cluster's width is the previous one's divided by this
    div_val: int = 1
    # Which adaptive-softmax projections share the embedding's; `'none'` or `'all_but_first'`, or a list
    tie_projs: List[bool] = 'none'
    # Normalise before each sub-layer (pre-norm) instead of after it
    pre_lnorm: bool = False
    # LayerNorm (the original's) or RMSNorm in every layer (`norms.py`)
    norm: str = 'layer_norm'
    # Segment length: tokens predicted per step
    tgt_len: int = 70
    # Extended context: tokens before the segment given as input, not predicted
    ext_len: int = 0
    # Memory length: hidden states of earlier segments each layer attends to (0: no memory)
    mem_len: int = 0
    # Adaptive softmax and embedding cluster boundaries (empty: one cluster)
    cutoffs: List[int] = []
    # Adaptive input embedding (the original's `adaptive` for the input)
    adapt_inp: bool = False
    # Every query attends to the same number of keys
    same_length: bool = False
    # 0 relative (the paper's), 1 learnable relative, 2 absolute, 3 absolute deeper, 4 rotary, 5 ALiBi, 6 T5 bias;
    # set by `attention`
    attn_type: int = 0
    # Relative distances beyond this use this one's encoding (-1: no clamp)
    clamp_len: int = -1
    # Sampled softmax with this many samples (-1: the full softmax)
    sample_softmax: int = -1
    # Per-layer $u$, $v$ (the authors' TensorFlow code and published WikiText-103 model)
    untie_r: bool = False
    # Every numerical choice of the original where this package differs (`MemTransformerLM`), for its checkpoints
    original_numerics: bool = False
    # The fraction of each head's features that `'rotary'` attention rotates
    rotary_fraction: float = 1.0
    # `'t5_bias'`: the number of causal distance buckets
    t5_num_buckets: int = 32
    # `'t5_bias'`: the distance from which all keys share the last bucket
    t5_max_distance: int = 128
    # Weight initialisation: 'normal' or 'uniform'
    init: str = 'normal'
    # Range of the uniform initialisation
    init_range: float = 0.1
    # Standard deviation of the normal initialisation
    init_std: float = 0.02
    # Standard deviation of the adaptive softmax's projections' initialisation
    proj_init_std: float = 0.01

    # The attention variant by name
    attention: str = 'relative'
    # The hyperparameters of an original run script
    preset: str = 'none'

    # Segment length of validation during training (the original's `eval_tgt_len`); `tgt_len` by default
    eval_tgt_len: int
    # The paper's final evaluation (the original's `eval.py`, longer memories, clamped distances): segment length
    test_tgt_len: int
    # The paper's final evaluation: memory length
    test_mem_len: int = 0
    # The paper's final evaluation: clamp of relative distances
    test_clamp_len: int = -1
    # The paper's final evaluation: every query attends to the same number of keys
    test_same_length: bool = False

    # The model
    model: MemTransformerLM

    # The documentation of the items added outside the class body (`_memory_items`), for `--help` and the docs
    _generated_item_docs: ClassVar[Dict[str, str]] = {}


@option(TransformerXLConfigs.eval_tgt_len, 'tgt_len')
def _eval_tgt_len(c: TransformerXLConfigs):
    """The training segment length `tgt_len`"""
    return c.tgt_len


@option(TransformerXLConfigs.test_tgt_len, 'tgt_len')
def _test_tgt_len(c: TransformerXLConfigs):
    """The training segment length `tgt_len`"""
    return c.tgt_len


@option(TransformerXLConfigs.tie_projs, 'none')
def _tie_projs_none(c: TransformerXLConfigs):
    """No projection shared: `[False] * (len(cutoffs) + 1)`"""
    return [False] * (len(c.cutoffs) + 1)


@option(TransformerXLConfigs.tie_projs, 'all_but_first')
def _tie_projs_all_but_first(c: TransformerXLConfigs):
    """All tail projections shared with the embedding's (the original's `proj_share_all_but_first`)"""
    return [False] + [True] * len(c.cutoffs)


@option(TransformerXLConfigs.model, 'default')
def _mem_transformer(c: TransformerXLConfigs):
    """`MemTransformerLM` from the items, initialised as the original (`xl.init.init_weights`)"""
    return MemTransformerLM(c.n_token, c.n_layer, c.n_head, c.d_model, c.d_head, c.d_inner, c.dropout, c.dropatt,
                            tie_weight=c.tie_weight, d_embed=c.d_embed, div_val=c.div_val,
                            tie_projs=list(c.tie_projs), pre_lnorm=c.pre_lnorm, tgt_len=c.tgt_len,
                            ext_len=c.ext_len, mem_len=c.mem_len, cutoffs=list(c.cutoffs), adapt_inp=c.adapt_inp,
                            same_length=c.same_length, attn_type=c.attn_type, clamp_len=c.clamp_len,
                            sample_softmax=c.sample_softmax, untie_r=c.untie_r, init=c.init,
                            init_range=c.init_range, init_std=c.init_std, proj_init_std=c.proj_init_std, norm=c.norm,
                            original_numerics=c.original_numerics,
                            rotary_fraction=c.rotary_fraction, t5_num_buckets=c.t5_num_buckets,
                            t5_max_distance=c.t5_max_distance,
                            **{key: getattr(c, key) for key in memory_registry.settings()})


norm_options(TransformerXLConfigs.norm)


# ## Attention variants by name

def _xl_attention_option(name: str) -> None:
    """The scheme `name` of the registry as an option of `attention`: its `attn_type` integer where it has one, else
    its name."""
    aggregate(TransformerXLConfigs.attention, name,
              (TransformerXLConfigs.attn_type, registry.ATTN_TYPES.get(name, name)))


# Every scheme registered, now and later (`positions/registry.py`)
for _name in registry.SCHEMES:
    _xl_attention_option(_name)
registry.LISTENERS.append(_xl_attention_option)


# ## The memory mechanisms' settings

def _memory_items(name: str) -> None:
    """The settings of the memory mechanism `name` (`memories/registry.py`) as items of `TransformerXLConfigs`, each
    with its type, default and line of documentation, as the class body would declare them."""
    for key, setting in memory_registry.MEMORIES[name].settings.items():
        TransformerXLConfigs.__annotations__[key] = setting.annotation
        setattr(TransformerXLConfigs, key, ConfigItem(key=key, configs_class=TransformerXLConfigs, has_annotation=True,
                                                      annotation=setting.annotation, has_value=True,
                                                      value=setting.default))
        TransformerXLConfigs._generated_item_docs[key] = setting.doc


# Every mechanism registered, now and later
for _name in memory_registry.MEMORIES:
    _memory_items(_name)
memory_registry.LISTENERS.append(_memory_items)


# ## Presets of the original run scripts: the model and evaluation columns of `presets.py`'s table

for _name, _row in PRESETS.items():
    aggregate(TransformerXLConfigs.preset, _name,
              *((getattr(TransformerXLConfigs, column), copy.copy(value)) for column, value in _row.items()
                if column not in TRAINING_COLUMNS),
              (TransformerXLConfigs.test_same_length, True))
