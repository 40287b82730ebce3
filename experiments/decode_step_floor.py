r"""
# How fast can a one-token step written in Python be?

Batch-1 generation spends most of a step outside the products (`docs/performance.md`, issue 17). This measures how
much of that any step written in Python would spend, in one process, interleaved (`benchmark.interleaved`), on the
benchmark's model with a full memory of `gen_context` positions:

* **model step**: `MemTransformerLM.log_probs` of one token, feeding its memories back, as `generate` does (its
  layers in one call of the decoder-layer kernel, `xl/fused_step.py`);
* **model step, layers by their modules**: the same on a copy of the model with a no-op hook on each layer, which
  makes the dispatcher refuse the fused call: each layer runs its modules, each operation by its fastest path;
* **lean step**: the same layers (Transformer-XL's relative attention, post-LN, ReLU feed-forward) written as bare
  tensor code for one token, with nothing else: no checks, dispatcher, modules, caches or memory update; the
  memory's keys and values and the projected distance table are given, and the products run our few-rows kernel;
* **lean step, compiled**: that function under `torch.compile` (static shapes, its guards skipped, the kernel
  registered as an opaque custom op);
* **products alone**: the step's products (four a layer and the softmax layer's) by the kernel, nothing between them.

The lean step's log-probabilities are checked equal to the model's before any timing, so it is the same
computation. It does less work than a step (no memory update), so its time is below what any Python step with
these kernels could take.

    python experiments/decode_step_floor.py              # the benchmark's model (under a minute)
    python experiments/decode_step_floor.py --quick      # tiny sizes, without torch.compile
"""
import argparse
import copy
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark import FULL, QUICK, BenchConfig, format_table, interleaved, make_xl  # noqa: E402
from labml_txl.fast import dispatch  # noqa: E402
from labml_txl.fast.native import few_rows_linear as native_few_rows  # noqa: E402
from labml_txl.xl import MemTransformerLM  # noqa: E402


def kernel_product() -> Callable:
    """Our few-rows kernel, `(x, weight, bias, relu)`, as `dispatch.linear` calls it."""
    if not native_few_rows.kernel_available():
        sys.exit('decode_step_floor: the few-rows kernel is not available here (see the warning above)')
    return native_few_rows.few_rows_linear


def opaque_product(product: Callable) -> Callable:
    """`product` as a custom op that `torch.compile` calls as it is (its output shape declared for tracing)."""
    @torch.library.custom_op('decode_step_floor::few_rows_linear', mutates_args=())
    def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                        relu: bool) -> torch.Tensor:
        return product(x, weight, bias, relu)

    @few_rows_linear.register_fake
    def _(x, weight, bias, relu):
        return x.new_empty(x.shape[0], weight.shape[0])
    return few_rows_linear


class LeanStep:
    """
    One token's step of `model` (attention type 0, post-LN, one softmax cluster) as bare tensor code, over a memory
    `mems` whose keys and values, and the distance table for it, are computed once here.
    """

    def __init__(self, model: MemTransformerLM, mems: List[torch.Tensor]):
        if model.attn_type != 0 or model.layers[0].dec_attn.pre_lnorm or len(model.crit.out_layers) != 1:
            raise ValueError('the lean step is written for attention type 0, post-LN, one softmax cluster')
        self.model = model
        klen = mems[0].shape[0] + 1
        h, dh = model.n_head, model.d_head
        # The positions' sinusoids, farthest first: key j of the one query lies at distance klen - 1 - j
        pos_emb = model.pos_emb(torch.arange(klen - 1, -1, -1.0))[:, 0]
        self.keys, self.values, self.tables = [], [], []
        for layer, mem in zip(model.layers, mems):
            attn = layer.dec_attn
            k, v = F.linear(mem[:, 0], attn.qkv_net.weight[h * dh:]).view(-1, 2, h, dh).unbind(1)
            self.keys.append(k.transpose(0, 1).contiguous())
            self.values.append(v.transpose(0, 1).contiguous())
            # $W_{k,R} R_{i-j}$ per head
            self.tables.append(F.linear(pos_emb, attn.r_net.weight).view(klen, h, dh).transpose(0, 1).contiguous())

    def __call__(self, token: torch.Tensor, product: Callable) -> torch.Tensor:
        """Log-probabilities `[1, n_token]` of the next token after `token` `[1]`."""
        m = self.model
        h, dh = m.n_head, m.d_head
        x = F.embedding(token, m.word_emb.emb_layers[0].weight) * m.word_emb.emb_scale
        for layer, keys, values, table in zip(m.layers, self.keys, self.values, self.tables):
            attn, ff = layer.dec_attn, layer.pos_ff
            q, k, v = product(x, attn.qkv_net.weight, None, False).view(3, h, dh).unbind(0)
            keys, values = torch.cat([keys, k[:, None]], 1), torch.cat([values, v[:, None]], 1)
            # $(q + u)^\top k_j + (q + v)^\top W_{k,R} R_{i-j}$, scaled, softmax over the keys
            scores = (torch.einsum('hd,hkd->hk', q + m.r_w_bias, keys)
                      + torch.einsum('hd,hkd->hk', q + m.r_r_bias, table))
            weights = torch.softmax(scores * attn.scale, dim=-1)
            out = torch.einsum('hk,hkd->hd', weights, values).reshape(1, h * dh)
            norm = attn.layer_norm
            x = F.layer_norm(x + product(out, attn.o_net.weight, None, False), norm.normalized_shape, norm.weight,
                             norm.bias, norm.eps)
            first, second = ff.CoreNet[0], ff.CoreNet[3]
            inner = product(x, first.weight, first.bias, True)
            norm = ff.layer_norm
            x = F.layer_norm(x + product(inner, second.weight, second.bias, False), norm.normalized_shape,
                             norm.weight, norm.bias, norm.eps)
        out_layer = m.crit.out_layers[0]
        return torch.log_softmax(product(x, out_layer.weight, out_layer.bias, False), dim=-1)


def products_alone(model: MemTransformerLM, product: Callable) -> Callable[[], None]:
    """The step's products (four a layer and the softmax layer's) by `product`, one after another."""
    weights = []
    for layer in model.layers:
        ff = layer.pos_ff
        weights += [(layer.dec_attn.qkv_net.weight, None), (layer.dec_attn.o_net.weight, None),
                    (ff.CoreNet[0].weight, ff.CoreNet[0].bias), (ff.CoreNet[3].weight, ff.CoreNet[3].bias)]
    weights.append((model.crit.out_layers[0].weight, model.crit.out_layers[0].bias))
    inputs = [torch.randn(1, weight.shape[1]) for weight, _ in weights]

    def run():
        for x, (weight, bias) in zip(inputs, weights):
            product(x, weight, bias, False)
    return run


@torch.no_grad()
def measure(cfg: BenchConfig, compile_step: bool = True, repeats: int = 300) -> Dict[str, float]:
    """Median seconds per step of each contender (the module's docstring), and the largest difference of the lean
    steps' log-probabilities from the model's (`'max |lean - model|'`)."""
    model = make_xl(cfg, mem_len=cfg.gen_context).eval()
    model.reset_length(1, 0, cfg.gen_context)
    prompt = torch.randint(cfg.n_token, (cfg.gen_context, 1), generator=torch.Generator().manual_seed(5))
    by_modules = copy.deepcopy(model)
    for layer in by_modules.layers:
        # (a hook on a layer, which the fused call would not run: the dispatcher refuses it, the modules run)
        layer.register_forward_pre_hook(lambda module, args: None)
    _, mems = model.log_probs(prompt, None)
    token = torch.tensor([3])
    lean, product = LeanStep(model, mems), kernel_product()
    expected, next_mems = model.log_probs(token[None], mems)
    expected = expected[0]
    steps = {'lean step': lambda: lean(token, product)}
    if compile_step:
        compiled = torch.compile(lean.__call__, fullgraph=True, dynamic=False,
                                 options={'guard_filter_fn': torch.compiler.skip_all_guards_unsafe})
        opaque = opaque_product(product)
        steps['lean step, compiled'] = lambda: compiled(token, opaque)
    difference = max((step() - expected).abs().max().item() for step in steps.values())
    if difference > 1e-4:
        raise RuntimeError(f'the lean step does not compute the model\'s step: log-probabilities differ by {difference}')
    # Both models one token further, then a second token each: the path each takes, and the same numbers
    _, by_modules_mems = by_modules.log_probs(prompt, None)
    state = {model: next_mems, by_modules: by_modules.log_probs(token[None], by_modules_mems)[1]}
    second = {}
    for stepped, path in ((model, 'fused'), (by_modules, 'modules')):
        with dispatch.recording() as choices:
            second[path], state[stepped] = stepped.log_probs(token[None], state[stepped])
        chosen = {c.chosen for c in choices if c.operation == 'decoder layers'}
        if chosen != {path}:
            raise RuntimeError(f'a model step meant to run its layers as {path!r} ran them as {chosen}')
    if not torch.allclose(second['fused'], second['modules'], rtol=1e-5, atol=1e-5):
        raise RuntimeError('the model step gives other numbers with its layers by their modules')

    def step_of(stepped: MemTransformerLM) -> Callable[[], None]:
        def step():
            state[stepped] = stepped.log_probs(token[None], state[stepped])[1]
        return step
    runners = {'model step': step_of(model), 'model step, layers by their modules': step_of(by_modules), **steps,
               'products alone': products_alone(model, product)}
    seconds = interleaved(runners, repeats, warmup=20)
    return {**seconds, 'max |lean - model|': difference}


def table(seconds: Dict[str, float]) -> str:
    model = seconds['model step']
    rows = [[name, f'{seconds[name] * 1e3:.2f} ms', f'{model / seconds[name]:.2f}x']
            for name in ('model step', 'model step, layers by their modules', 'lean step', 'lean step, compiled',
                         'products alone') if name in seconds]
    return format_table(rows, header=('one token, batch 1, full memory', 'median', 'model step / this'))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1].lstrip('# '))
    parser.add_argument('--quick', action='store_true', help='tiny sizes, a few repeats, without torch.compile')
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    seconds = measure(cfg, compile_step=not args.quick, repeats=5 if args.quick else 300)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} CPU threads, float32; context {cfg.gen_context}, '
          f'{cfg.n_layer} layers, d_model {cfg.d_model}, d_inner {cfg.d_inner}')
    print(table(seconds))
    print(f"* the lean steps' log-probabilities differ from the model's by at most "
          f"{seconds['max |lean - model|']:.1e}")


if __name__ == '__main__':
    main()
