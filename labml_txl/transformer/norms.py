r"""
# Normalisation layers, by name

* `'layer_norm'`: *Layer Normalization* (Ba et al., 2016), over the features of each position,
  $\mathop{LN}(x) = g \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + b$ with the mean $\mu$ and variance $\sigma^2$
  of $x$'s $d$ features: `torch.nn.LayerNorm`. The default everywhere, as in labml_nn and the original
  Transformer-XL.
* `'rms_norm'`: *Root Mean Square Layer Normalization* (Zhang & Sennrich, 2019). It drops the re-centring and the
  bias, which the paper finds the re-scaling does not need:
  $\mathop{RMSNorm}(x) = g \odot \frac{x}{\mathop{RMS}(x)}$, $\mathop{RMS}(x) = \sqrt{\frac{1}{d} \sum_i x_i^2 +
  \epsilon}$: `torch.nn.RMSNorm`.

Both keep their gain as `weight` (and LayerNorm its bias as `bias`), so a module's parameter names stay the same
whichever it uses.
"""
from torch import nn

from ..errors import require_one_of

def check_norm(norm: str) -> str:
    """`norm`, or a `ValueError` naming what is accepted."""
    return require_one_of('norm', norm, {'layer_norm': 'LayerNorm', 'rms_norm': 'RMSNorm, Zhang & Sennrich 2019'})


def make_norm(norm: str, d_model: int, eps: float = 1e-5) -> nn.Module:
    """The normalisation `norm` over the last axis of `d_model` features, with $\\epsilon$ = `eps`."""
    if check_norm(norm) == 'layer_norm':
        return nn.LayerNorm(d_model, eps=eps)
    return nn.RMSNorm(d_model, eps=eps)
