r"""
# Position-wise feed-forward network

The FFN of *Attention Is All You Need*, applied to each position alone:

$$FFN(x) = f(x W_1 + b_1) W_2 + b_2$$

with an activation $f$ (ReLU in the paper). *GLU Variants Improve Transformer* gates the hidden layer
with a second projection $V$:

$$FFN_{gated}(x) = \bigl(f(x W_1 + b_1) \otimes (x V + c)\bigr) W_2 + b_2$$

which with $f = \sigma$ is GLU, identity is Bilinear, ReLU ReGLU, GELU GEGLU and Swish SwiGLU
(the paper drops the biases). `FeedForwardConfigs` in `configs/transformer.py` names these variants.
"""
import torch
from torch import nn

from ..errors import require_bool, require_positive_int, require_probability
from ..fast.dropout import Dropout


class FeedForward(nn.Module):
    """
    Position-wise feed-forward layer, plain or gated.

    Args:
        d_model: number of features of the input and the output.
        d_ff: number of features of the hidden layer.
        dropout: dropout probability on the hidden layer.
        activation: the module $f$ applied to $x W_1 + b_1$ (default `nn.ReLU()`).
        is_gated: multiply the activated hidden layer by a linear gate $x V + c$.
        bias1: whether $W_1$ has the bias $b_1$.
        bias2: whether $W_2$ has the bias $b_2$.
        bias_gate: whether the gate $V$ has the bias $c$.

    Shape:
        input `[..., d_model]`, output `[..., d_model]`.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1, activation: nn.Module = None,
                 is_gated: bool = False, bias1: bool = True, bias2: bool = True, bias_gate: bool = True):
        super().__init__()
        require_positive_int('d_model', d_model)
        require_positive_int('d_ff', d_ff)
        require_probability('dropout', dropout)
        for name, value in (('is_gated', is_gated), ('bias1', bias1), ('bias2', bias2), ('bias_gate', bias_gate)):
            require_bool(name, value)
        if activation is None:
            activation = nn.ReLU()
        if not callable(activation):
            raise TypeError(f"activation={activation!r} is not accepted: pass a module such as nn.ReLU()")
        # $W_1, b_1$
        self.layer1 = nn.Linear(d_model, d_ff, bias=bias1)
        # $W_2, b_2$
        self.layer2 = nn.Linear(d_ff, d_model, bias=bias2)
        self.dropout = Dropout(dropout)
        self.activation = activation
        self.is_gated = is_gated
        if is_gated:
            # $V, c$
            self.linear_v = nn.Linear(d_model, d_ff, bias=bias_gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # $f(x W_1 + b_1)$
        hidden = self.activation(self.layer1(x))
        if self.is_gated:
            # $f(x W_1 + b_1) \otimes (x V + c)$
            hidden = hidden * self.linear_v(x)
        # $(\cdot) W_2 + b_2$, with dropout on the hidden layer
        return self.layer2(self.dropout(hidden))
