r"""
# The original Transformer-XL initialisation

What the authors' `train.py` does to a new model (its defaults: `init='normal'`, `init_std=0.02`,
`init_range=0.1`, `proj_init_std=0.01`), written as one function instead of a hook on class names:

| parameters | initialised to |
| --- | --- |
| weights of `Linear` and `Embedding`, `cluster_weight`, `r_emb`, `r_w_bias`, `r_r_bias` | $\mathcal{N}(0, \sigma^2)$ with $\sigma$ = `init_std` (`init='normal'`), or $\mathcal{U}(-a, a)$ with $a$ = `init_range` (`init='uniform'`) |
| projections `emb_projs`, `out_projs` | $\mathcal{N}(0, \sigma_p^2)$ with $\sigma_p$ = `proj_init_std` |
| `LayerNorm` (and `RMSNorm`) weights | $\mathcal{N}(1, \sigma^2)$ with $\sigma$ = `init_std` (for either `init`) |
| biases of `Linear` and `LayerNorm`, `cluster_bias`, `r_bias` | $0$ |
| a memory mechanism's own (the Recurrent Memory Transformer's `memory_tokens.initial`) | what its `init_parameters` draws (new; the original has none) |

`MemTransformerLM` calls it from its constructor, so a new model starts as the original's did.
"""
from torch import nn

from ..memories.mechanism import MemoryMechanism
from .adaptive_embedding import AdaptiveEmbedding
from .adaptive_softmax import ProjectedAdaptiveLogSoftmax

INIT_CHOICES = ('normal', 'uniform')


def check_init(init: str, init_range: float, init_std: float, proj_init_std: float) -> None:
    """`ValueError` unless the initialisation options are valid."""
    if init not in INIT_CHOICES:
        raise ValueError(f"init={init!r} is not accepted: init must be 'normal' or 'uniform'")
    for name, value in (('init_range', init_range), ('init_std', init_std), ('proj_init_std', proj_init_std)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name}={value!r} is not accepted: {name} must be a positive number")


def init_weights(model: nn.Module, init: str = 'normal', init_range: float = 0.1, init_std: float = 0.02,
                 proj_init_std: float = 0.01) -> nn.Module:
    """
    Initialise every parameter of `model` (a `MemTransformerLM` or any module built of its parts) in place,
    as the original `train.py` did; returns `model`.

    Args:
        init: `'normal'` or `'uniform'`, for weights, embeddings and the relative-position parameters.
        init_range: $a$ of $\\mathcal{U}(-a, a)$ with `init='uniform'`.
        init_std: $\\sigma$ of $\\mathcal{N}(0, \\sigma^2)$ with `init='normal'`, and of the LayerNorm weights.
        proj_init_std: $\\sigma_p$ of the adaptive embedding and softmax projections.
    """
    check_init(init, init_range, init_std, proj_init_std)

    def init_weight(weight: nn.Parameter) -> None:
        if init == 'uniform':
            # $\mathcal{U}(-a, a)$
            nn.init.uniform_(weight, -init_range, init_range)
        else:
            # $\mathcal{N}(0, \sigma^2)$
            nn.init.normal_(weight, 0.0, init_std)

    def init_projs(projs: nn.ParameterList) -> None:
        for proj in projs:
            # $\mathcal{N}(0, \sigma_p^2)$
            nn.init.normal_(proj, 0.0, proj_init_std)

    for module in model.modules():
        if isinstance(module, nn.Linear):
            init_weight(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init_weight(module.weight)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                # $\mathcal{N}(1, \sigma^2)$
                nn.init.normal_(module.weight, 1.0, init_std)
            if getattr(module, 'bias', None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, AdaptiveEmbedding):
            init_projs(module.emb_projs)
        elif isinstance(module, MemoryMechanism):
            # (a memory mechanism's own, e.g. the Recurrent Memory Transformer's initial memory)
            module.init_parameters(init_weight)
        elif isinstance(module, ProjectedAdaptiveLogSoftmax):
            if module.n_clusters > 0:
                init_weight(module.cluster_weight)
                nn.init.zeros_(module.cluster_bias)
            init_projs(module.out_projs)
        # The relative-position parameters: the model's (r_emb, r_w_bias, r_r_bias, r_bias) or,
        # with `untie_r`, each attention layer's own r_w_bias and r_r_bias
        for name in ('r_emb', 'r_w_bias', 'r_r_bias'):
            param = module._parameters.get(name)
            if param is not None:
                init_weight(param)
        param = module._parameters.get('r_bias')
        if param is not None:
            nn.init.zeros_(param)
    return model
