r"""How close is close enough: the suite's tolerance policy.

The machines this suite runs on change (AVX2 or AVX-512, other GEMM kernels in oneDNN and ATen, other orders of
addition), so a float32 tolerance tuned until it passes on one CPU fails on the next. No tolerance here is tuned.
Each comparison is one of two kinds, and says which beside it.

1. **The same function, two implementations** (ours against the original's reference vectors, Hugging Face's
   TransfoXL, labml_nn, `torch.nn.Transformer`, TensorFlow's converted weights, a naive loop, the fast path against
   the reference where both run in float64). Both sides run in float64, whose unit roundoff (1.1e-16) is six orders
   below `SAME_FUNCTION`: a difference beyond it is a difference of function on every CPU, never of rounding.
   `assert_same_function` compares so, and refuses float32 inputs.

2. **Float32 is the point** (a kernel or fast path that runs only in float32, an autocast, a float32 model checked
   against the float64 computation). The bound is derived, not tuned: a sum of $n$ terms rounded in any order, as any
   GEMM on any CPU may add them, is within $\gamma_n \sum_i |x_i| \approx n u \sum_i |x_i|$ of the exact sum
   (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5), with $u = \epsilon / 2$ the unit
   roundoff. `rounding_bound(dtype, depth, magnitude)` is $\text{depth} \cdot \epsilon \cdot \text{magnitude}$:
   `depth` is the number of rounded additions on the longest path to a value (the reduction lengths of the products,
   softmaxes and norms it passes through, added up: a first-order propagation that holds while each step is
   well-conditioned, as layer norms and softmaxes over bounded inputs are); `magnitude` the size of the terms added
   (the largest |value| or the sum of |terms|). Two float32 implementations each within it of the exact value are
   within twice it of each other, which `assert_close_rounding` allows. The caller names depth and magnitude.

bf16 follows rule 2 with bf16's $\epsilon$ ($2^{-7}$), where autocast rounds each product's inputs and output.
"""
import torch

# Rule 1: float64 against float64, relative to the larger of 1 and the largest |expected|
SAME_FUNCTION = 1e-10


def assert_same_function(actual: torch.Tensor, expected: torch.Tensor, msg: str = None, *,
                         tolerance: float = SAME_FUNCTION):
    """Rule 1: `actual` equals `expected` to `tolerance` times the larger of 1 and `expected`'s largest magnitude;
    both must be float64, or the comparison would measure float32's rounding instead of the function."""
    for name, tensor in (('actual', actual), ('expected', expected)):
        if tensor.dtype != torch.float64:
            raise TypeError(f'assert_same_function compares float64 results; {name} is {tensor.dtype}. Run both '
                            f'implementations in float64, or use assert_close_rounding with a derived bound')
    scale = max(1.0, expected.detach().abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=0, atol=tolerance * scale, msg=msg)


def rounding_bound(dtype: torch.dtype, depth: int, magnitude: float = 1.0) -> float:
    """Rule 2: the largest rounding error of `depth` rounded additions of terms of size `magnitude` in `dtype`
    ($\\text{depth} \\cdot \\epsilon \\cdot \\text{magnitude}$, twice $\\gamma_n \\sum |x_i|$ to first order: see the module's
    docstring). Holds whatever order the additions run in, so on every CPU."""
    if depth < 1:
        raise ValueError(f'depth is the number of rounded additions on the longest path, at least 1; got {depth}')
    return depth * torch.finfo(dtype).eps * magnitude


def assert_close_rounding(actual: torch.Tensor, expected: torch.Tensor, *, depth: int, magnitude: float = None,
                          dtype: torch.dtype = None, msg: str = None):
    """Rule 2: `actual` within `rounding_bound(dtype, depth, magnitude)` of `expected`, elementwise. `dtype` is the
    precision the computation rounds in (the lower of the two inputs' by default); `magnitude` is the largest
    |expected| (at least 1) unless given."""
    if dtype is None:
        dtype = min((actual.dtype, expected.dtype), key=lambda t: torch.finfo(t).bits)
    if magnitude is None:
        magnitude = max(1.0, expected.detach().abs().max().item()) if expected.numel() else 1.0
    bound = rounding_bound(dtype, depth, magnitude)
    torch.testing.assert_close(actual.to(expected.dtype), expected, rtol=0, atol=bound, msg=msg)


def xl_depths(config, klen: int, *, adaptive: bool = False, dropout: bool = False):
    """Rule 2's depths of a `MemTransformerLM` of `config` (a mapping with n_layer, d_model, n_head, d_head, d_inner,
    n_token; `xl_config(model)` gives a model's) over `klen` keys: `(inputs, log_probs)`, the depth of each layer's
    input (the memories, `inputs[0]` the embedding's output) and of the log-probabilities."""
    d_model, d_head, n_head = config['d_model'], config['d_head'], config['n_head']
    # A layer: the joint projection (d_model), a score's product (d_head) and the sum of its three terms (2), the
    # softmax's normaliser and the weighted values (klen each), the output projection (n_head d_head), the
    # feed-forward (d_model, d_inner), two residual additions and two layer norms (mean and variance, d_model each);
    # with dropout, its 4 scalings
    layer = (d_model + d_head + 2 + 2 * klen + n_head * d_head + d_model + config['d_inner'] + 2 + 4 * d_model
             + (4 if dropout else 0))
    # The embedding's scaling (and the adaptive embedding's projection); from the first layer on, the sinusoid's
    # angles (4 float32 roundings: the frequencies' division, power and reciprocal, the product; each of the angle's
    # size, up to klen)
    embedding = 1 + (d_model if adaptive else 0)
    inputs = [embedding] + [embedding + 4 * klen + i * layer for i in range(1, config['n_layer'] + 1)]
    # The logits (d_model; the adaptive softmax's projection too, and its head's and tail's log-probabilities
    # added) and the log-softmax's normaliser (n_token)
    log_probs = inputs[-1] + d_model * (2 if adaptive else 1) + (1 if adaptive else 0) + config['n_token']
    return inputs, log_probs


def xl_config(model) -> dict:
    """The sizes of a `MemTransformerLM` that `xl_depths` reads."""
    return dict(n_layer=model.n_layer, d_model=model.d_model, n_head=model.n_head, d_head=model.d_head,
                d_inner=model.layers[0].pos_ff.d_inner, n_token=model.n_token)
