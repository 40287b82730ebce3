r"""
# Position-wise feed-forward network

$$FFN(x) = \max(0, x W_1 + b_1) W_2 + b_2$$

applied to every position alone, with dropout after the activation and after the second layer, and a
residual connection with layer normalisation: after the sum (post-LN, the paper's default,
$\mathop{LN}(x + FFN(x))$) or before the network (`pre_lnorm`, $x + FFN(\mathop{LN}(x))$).
The layers sit in `CoreNet` at indices 0 and 3, as in the original, so its checkpoints load.
"""
from typing import Optional

import torch
from torch import nn

from ..fast import dispatch
from ..fast.dispatch import Plan
from ..fast.dropout import Dropout
from ..transformer.norms import make_norm


class PositionwiseFF(nn.Module):
    """
    Args:
        d_model: number of input and output features.
        d_inner: number of hidden features.
        dropout: dropout after the activation and after the second layer.
        pre_lnorm: layer-normalise the input instead of the residual sum.
        norm: `'layer_norm'` or `'rms_norm'` (`norms.py`), kept as `layer_norm` either way.

    Shape:
        `inp` `[seq, batch, d_model]`; output the same.
    """

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool = False, norm: str = 'layer_norm'):
        super().__init__()
        self.d_model = d_model
        self.d_inner = d_inner
        self.dropout = dropout
        self.CoreNet = nn.Sequential(
            # $x W_1 + b_1$
            nn.Linear(d_model, d_inner),
            # $\max(0, \cdot)$, in place on the fresh product (as the original)
            nn.ReLU(inplace=True),
            Dropout(dropout),
            # $\cdot W_2 + b_2$
            nn.Linear(d_inner, d_model),
            Dropout(dropout),
        )
        self.layer_norm = make_norm(norm, d_model)
        self.pre_lnorm = pre_lnorm

    def _core(self, plan: Plan, x: torch.Tensor) -> torch.Tensor:
        """`CoreNet(x)`: its ReLU (index 1, kept there so that the `Linear`s stay at 0 and 3) and first dropout are
        applied by `dispatch.linear` with the first product, in place on it."""
        linear_1, _, dropout_1, linear_2, dropout_2 = self.CoreNet
        # On `[seq * batch, d]`: the product is then a tensor of its own, not a view, so the in-place step needs no
        # copy in autograd's backward
        x_rows = x.reshape(-1, x.shape[-1])
        # $\max(0, x W_1 + b_1)$, dropped out
        h = dispatch.linear(plan, x_rows, linear_1.weight, linear_1.bias, relu=True, dropout=dropout_1)
        # $h W_2 + b_2$, dropped out
        return dispatch.linear(plan, h, linear_2.weight, linear_2.bias, dropout=dropout_2).view(x.shape[:-1] + (-1,))

    def forward(self, inp: torch.Tensor, *, plan: Optional[Plan] = None) -> torch.Tensor:
        plan = Plan.now(inp.device) if plan is None else plan
        if self.pre_lnorm:
            # $x + FFN(\mathop{LN}(x))$
            return inp + self._core(plan, self.layer_norm(inp))
        # $\mathop{LN}(x + FFN(x))$
        return dispatch.residual_layer_norm(plan, inp, self._core(plan, inp), self.layer_norm)
