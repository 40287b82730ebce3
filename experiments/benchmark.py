r"""
# Transformer-XL speed: the fast path against the plain path, labml_nn and the peers a user would pick instead

    python experiments/benchmark.py                  # both configurations on the CPU (about 12 minutes on 2 cores)
    python experiments/benchmark.py --config small   # the small one alone (about 6 minutes)
    python experiments/benchmark.py --quick          # a smoke run on tiny sizes
    python experiments/benchmark.py --device cuda    # on a GPU: every row that can run there

Two configurations: the small one below (4 layers, d_model 256, batch 8: its 13 MB of weights sit in the cache, so
a step is mostly the cost of calls), then the published WikiText-103 model's shapes (`benchmark_wt103.py`: 285M
parameters, evaluation at the paper's test settings and batch-1 sampling against Hugging Face's, on the CPU).

Every number is a ratio of medians of runs interleaved in this process (round robin: one call of each contender
per round, the order rotated every round), so a load that comes and goes slows all contenders alike. Rows:

* training and evaluation tokens/s of `MemTransformerLM` (fast: `impl='auto'`, and it under `torch.compile`)
  against labml_nn's `TransformerXL`, this package's plain path (`impl='reference'`, the original's computation)
  and the peers of `benchmark_peers.py`: Hugging Face's TransfoXL holding the same weights (its log-probabilities
  checked equal to ours before any timing) and x-transformers of the same size with XL memories (not the same
  attention: T5's bucketed bias instead of Transformer-XL's position terms, so only its speed compares);
* batch-1 greedy generation tokens/s of the fast path (`labml_txl.xl.generation.generate`, `top_k=1`) against the two
  peers through their own `generate` (Hugging Face's with its memories, x-transformers' with `cache_kv=True`): a
  prompt of `gen_context` tokens, then `gen_tokens` tokens, each seeing the last `gen_context` positions; the time of
  the whole call (prompt included) over `gen_tokens`;
* issue 17's targets for the ratios over the peers, and whether this run meets them;
* training and evaluation tokens/s of the fast path against itself without our C++ kernels
  (`labml_txl.fast.native.disabled()`: PyTorch's attention (in evaluation SDPA with the position terms as its bias),
  PyTorch's dropout masks, residual additions and layer norms);
* the tokens/s of the products of a fast evaluation segment alone (`products_runner`), which bounds what any
  evaluation with those products can reach on the machine;
* the achieved matmul FLOP/s of a training step (FLOPs counted analytically, backward = 2x forward) as a
  fraction of the machine's float32 GEMM peak, measured in the same rounds through the fastest path PyTorch has
  on the CPU (oneDNN's linear with a prepacked weight, `labml_txl.fast.prepacked_linear`) and through `torch.mm`
  (MKL's sgemm on the CPU, cuBLAS on CUDA);
* the products of a one-token step with 1 to 32 rows (batched generation's sequences) by our few-rows kernel against
  oneDNN's prepacked product and `F.linear`, which back the most rows the dispatcher gives the kernel (`MOST_ROWS`);
* evaluation per token of Transformer-XL with a memory against a vanilla Transformer that recomputes a window
  of the same attention length for every token (the paper's Table 9), at several lengths;
* training and evaluation tokens/s of each memory mechanism (`labml_txl/memories/`) against Transformer-XL's memory,
  the same model otherwise: the compressed memory (half the memory, half compressed, with its reconstruction loss in
  the training step, as the trainer computes it), the Recurrent Memory Transformer's memory tokens alone and beside
  Transformer-XL's memory (a step of one segment);
* bf16 autocast against float32, and a bf16 product against a float32 one at the feed-forward layer's shape (where
  PyTorch has no fast bf16 product for the CPU its portable one runs, which is why bf16 can be slower there);
* peak memory of evaluation with long memories: torch's CPU allocator keeps no statistics, so a fresh subprocess
  per setting reads its own resident set from `/proc/self/status` (Linux): `VmRSS` with the model built, then,
  after filling the memory, it returns freed heap to the system (`malloc_trim`), restarts the peak
  (`/proc/self/clear_refs`) and evaluates two segments; the row is the peak (`VmHWM`) above the model.

With `--device cuda` the models, the peers, `torch.mm` and the timing (`torch.cuda.synchronize()` around every
timed call) run on the GPU; the rows of CPU-only code (our C++ kernels, oneDNN, `/proc`) are left out, each with
its reason printed under the table.
"""
import argparse
import ctypes
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark_peers import HuggingFaceXL, XTransformersXL, check_same_outputs  # noqa: E402
from labml_txl.fast import dispatch, native, prepacked_linear  # noqa: E402
from labml_txl.attention.masks import decoder_causal_mask  # noqa: E402
from labml_txl.fast.dispatch import Plan, RelativeTerms  # noqa: E402
from labml_txl.xl.generation import generate  # noqa: E402
from labml_txl.fast.native import few_rows_linear as native_few_rows  # noqa: E402
from labml_txl.train.configs import fused_adam  # noqa: E402
from labml_txl.xl import MemTransformerLM  # noqa: E402

# Compile in this process: no pool of compile workers left running beside the timed rounds
torch._inductor.config.compile_threads = 1


@dataclass(frozen=True)
class BenchConfig:
    """The model and data sizes of one benchmark."""
    n_token: int = 256
    n_layer: int = 4
    d_model: int = 256
    n_head: int = 4
    d_head: int = 64
    d_inner: int = 1024
    tgt_len: int = 128
    mem_len: int = 128
    batch: int = 8
    dropout: float = 0.1
    dropatt: float = 0.0
    # Timed calls per contender (after two warm-up calls that also fill the memories)
    repeats: int = 10
    # Side of the square products that measure the machine's float32 GEMM speed
    matmul_n: int = 2048
    # Generation, batch 1: a prompt of `gen_context` tokens, then `gen_tokens` greedy tokens, each seeing the last
    # `gen_context` positions; timed calls per contender
    gen_context: int = 256
    gen_tokens: int = 200
    gen_repeats: int = 5

    def tokens(self) -> int:
        return self.tgt_len * self.batch


FULL = BenchConfig()
QUICK = BenchConfig(n_token=32, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=16, mem_len=16,
                    batch=2, repeats=3, matmul_n=256, gen_context=16, gen_tokens=8, gen_repeats=3)

HF, XT = 'HF TransfoXL', 'x-transformers'
# Issue 17's targets for this benchmark in float32 on the 2-core CPU: the fast path's tokens/s over each peer's
TARGETS = {('train', HF): 2.3, ('train', XT): 1.7, ('eval', HF): 4.0, ('eval', XT): 3.5,
           ('generate', HF): 5.0, ('generate', XT): 3.0}
# The gloss of the training targets: about this share of the machine's float32 GEMM peak (oneDNN)
TARGET_PEAK_SHARE = 0.40


# -- contenders --

def make_xl(cfg: BenchConfig, fast: bool = True, seed: int = 0, device: str = 'cpu', **overrides
            ) -> MemTransformerLM:
    """This package's `MemTransformerLM` of the benchmark's size (the same weights for the same seed) on `device`."""
    torch.manual_seed(seed)
    kwargs = dict(n_token=cfg.n_token, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model,
                  d_head=cfg.d_head, d_inner=cfg.d_inner, dropout=cfg.dropout, dropatt=cfg.dropatt,
                  tgt_len=cfg.tgt_len, mem_len=cfg.mem_len)
    kwargs.update(overrides)
    return MemTransformerLM(**kwargs, impl='auto' if fast else 'reference').to(device)


class LabmlNNXL(nn.Module):
    """labml_nn's `TransformerXL` with an embedding and a generator, as its `experiment.py` builds it."""

    def __init__(self, cfg: BenchConfig, seed: int = 0):
        super().__init__()
        from labml import tracker
        if not hasattr(tracker, 'debug'):
            # labml 0.5.3 has no `tracker.debug`, which labml_nn's attention calls
            tracker.debug = lambda *args, **kwargs: None
        from labml_nn.transformers.feed_forward import FeedForward
        from labml_nn.transformers.xl import TransformerXL, TransformerXLLayer
        from labml_nn.transformers.xl.relative_mha import RelativeMultiHeadAttention
        torch.manual_seed(seed)
        layer = TransformerXLLayer(d_model=cfg.d_model,
                                   self_attn=RelativeMultiHeadAttention(cfg.n_head, cfg.d_model, cfg.dropatt),
                                   feed_forward=FeedForward(cfg.d_model, cfg.d_inner, cfg.dropout),
                                   dropout_prob=cfg.dropout)
        self.mem_len = cfg.mem_len
        self.src_embed = nn.Embedding(cfg.n_token, cfg.d_model)
        self.transformer = TransformerXL(layer, cfg.n_layer)
        self.generator = nn.Linear(cfg.d_model, cfg.n_token)

    def forward(self, data: torch.Tensor, target: torch.Tensor, *mems: torch.Tensor) -> List[torch.Tensor]:
        """The same calling convention as `MemTransformerLM`: `[loss, *new_mems]`."""
        mems = list(mems)
        qlen, mlen = data.shape[0], (mems[0].shape[0] if mems else 0)
        # True where query $i$ may see key $j$: all of the memory, the segment up to $i$
        mask = torch.tril(torch.ones(qlen, mlen + qlen, dtype=torch.bool, device=data.device),
                          diagonal=mlen)[:, :, None]
        hidden, new = self.transformer(self.src_embed(data), mems, mask)
        loss = F.cross_entropy(self.generator(hidden).flatten(0, 1), target.flatten(), reduction='none')
        if mems:
            new = [torch.cat([m, n], 0) for m, n in zip(mems, new)]
        return [loss.view_as(target)] + [m[-self.mem_len:] for m in new]


class Stream:
    """One contender reading consecutive segments with its memories: each call is one training step (forward,
    backward, the trainer's Adam) or one evaluation segment (no gradient)."""

    def __init__(self, model: nn.Module, cfg: BenchConfig, train: bool, autocast: Optional[torch.dtype] = None,
                 call: Optional[Callable] = None, seed: int = 1):
        self.model, self.cfg, self.train, self.autocast = model, cfg, train, autocast
        # Once, outside the timed calls (the module tree's `train()` took about 0.2 ms here)
        model.train(train)
        self.call = model if call is None else call
        # The trainer's Adam (`labml_txl.train.configs.fused_adam`), the same for every contender
        self.optimizer = fused_adam(model.parameters(), lr=1e-4) if train else None
        generator = torch.Generator().manual_seed(seed)
        self.data = torch.randint(cfg.n_token, (cfg.tgt_len * 8 + 1, cfg.batch), generator=generator).to(
            next(model.parameters()).device)
        self.position, self.mems = 0, []

    def _segment(self):
        if self.position + self.cfg.tgt_len + 1 > self.data.shape[0]:
            self.position = 0
        start, end = self.position, self.position + self.cfg.tgt_len
        self.position = end
        return self.data[start:end], self.data[start + 1:end + 1]

    def __call__(self) -> None:
        data, target = self._segment()
        with torch.set_grad_enabled(self.train), torch.autocast(data.device.type,
                                                                 dtype=self.autocast or torch.bfloat16,
                                                                 enabled=self.autocast is not None):
            loss, *mems = self.call(data, target, *self.mems)
            if self.train:
                loss.float().mean().backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        # As returned (already detached): the model recognises its own memories and reuses their keys and values
        self.mems = mems


def synchronizer(device: str) -> Callable[[], None]:
    """What waits for the work queued on `device`: `torch.cuda.synchronize` on CUDA, nothing on the CPU."""
    return torch.cuda.synchronize if device == 'cuda' else (lambda: None)


def interleaved(runners: Dict[str, Callable[[], None]], repeats: int, warmup: int = 2,
                sync: Callable[[], None] = lambda: None) -> Dict[str, float]:
    """Median seconds per call of each runner, timed round robin (one call of each per round), with `sync()` before
    and after each timed call (a GPU runs asynchronously). The order rotates by one every round: a call runs slower
    right after one that filled the caches with its own data (measured: about 2.5% for a training step), and no
    runner should always follow the same one."""
    for _ in range(warmup):
        for run in runners.values():
            run()
    names = list(runners)
    times = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            sync()
            start = time.perf_counter()
            runners[name]()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def matmul_runner(n: int, device: str = 'cpu') -> Callable[[], None]:
    """A float32 `n x n x n` `torch.mm` (FLOPs: `2 n^3`): MKL's sgemm on the CPU, cuBLAS on CUDA."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return lambda: torch.mm(a, b)


def onednn_gemm_runner(n: int) -> Callable[[], None]:
    """A float32 `n x n x n` product through oneDNN's linear with the weight prepacked once
    (`labml_txl.fast.prepacked_linear`, what the fast path's evaluation runs): the fastest float32 GEMM PyTorch has on
    the CPU, the machine's peak for this benchmark."""
    x, weight = torch.randn(n, n), torch.randn(n, n)
    return lambda: prepacked_linear.prepacked_linear(x, weight)


def linear_runner(cfg: BenchConfig, dtype: torch.dtype, device: str = 'cpu') -> Callable[[], None]:
    """The feed-forward layer's first product of a segment, `[tgt_len * batch, d_model] x [d_model, d_inner]`, in
    `dtype` (what autocast makes of it in bf16)."""
    x = torch.randn(cfg.tokens(), cfg.d_model, device=device, dtype=dtype)
    weight = torch.randn(cfg.d_inner, cfg.d_model, device=device, dtype=dtype)
    return lambda: F.linear(x, weight)


def products_runner(cfg, softmax: Optional[List[Tuple[int, int, int]]] = None,
                    masked: Optional[torch.Tensor] = None) -> Callable[[], None]:
    r"""
    Only the products of one evaluation segment of the fast path, at its shapes and with its kernels, with a full
    memory whose keys and values are kept: per layer $[W_q; W_k; W_v]$ of the segment, the attention (what
    `dispatch.attend` runs for it: our kernel where it is available), $W_o$ and the two feed-forward layers (what
    `dispatch.linear` runs: oneDNN with prepacked weights, the ReLU applied by the product); then the softmax layer's
    products, `softmax` as `(rows, in_features, out_features)` (default: one layer over the vocabulary).
    Nothing else (no layer norm, residual, copy or memory update outside these kernels).
    An implementation that computes these products with these kernels on this machine evaluates no faster than this:
    its tokens/s bound the fast path's.

    Args:
        cfg: the sizes (`BenchConfig`'s fields `n_layer`, `d_model`, `n_head`, `d_head`, `d_inner`, `tgt_len`,
            `mem_len`, `batch`, `n_token`).
        masked: the attention's mask `[tgt_len, tgt_len + mem_len]` (default: causal over all keys).
    """
    q, m, b, d, h, dh = cfg.tgt_len, cfg.mem_len, cfg.batch, cfg.d_model, cfg.n_head, cfg.d_head
    k, rows = q + m, q * b
    softmax = [(rows, d, cfg.n_token)] if softmax is None else softmax
    masked = decoder_causal_mask(q, k) if masked is None else masked
    x, x_inner = torch.randn(rows, d), torch.randn(rows, cfg.d_inner)
    heads_q, heads_kv = torch.randn(b, h, q, dh), torch.randn(b, h, k, dh)
    terms = RelativeTerms(torch.randn(h, k, dh), torch.randn(h, dh), torch.randn(h, dh))

    def weight(*shape):
        return nn.Parameter(torch.randn(*shape), requires_grad=False)

    w_qkv, w_o, w_1, b_1, w_2, b_2 = (weight(*shape) for shape in ((3 * h * dh, d), (d, h * dh), (cfg.d_inner, d),
                                                                   (cfg.d_inner,), (d, cfg.d_inner), (d,)))
    outputs = [(torch.randn(n, n_in), weight(n_out, n_in), weight(n_out)) for n, n_in, n_out in softmax]

    def segment():
        with torch.no_grad():
            plan = Plan.now(x.device)
            for _ in range(cfg.n_layer):
                dispatch.linear(plan, x, w_qkv)
                dispatch.attend(plan, heads_q, heads_kv, heads_kv, scale=dh ** -0.5, masked=masked, terms=terms)
                dispatch.linear(plan, x, w_o)
                dispatch.linear(plan, x, w_1, b_1, relu=True)
                dispatch.linear(plan, x_inner, w_2, b_2)
            for inputs, w_out, b_out in outputs:
                dispatch.linear(plan, inputs, w_out, b_out)
    return segment


WITHOUT_KERNELS = 'fast without our kernels'


def without_native_kernels(model: nn.Module) -> Callable:
    """`model`'s call with `labml_txl.fast.native`'s kernels disabled."""
    def call(*args):
        with native.disabled():
            return model(*args)
    return call


# -- FLOPs --

def forward_flops(cfg: BenchConfig) -> int:
    r"""
    Matmul FLOPs ($2mnk$ per product) of one forward segment of the fast path, with a full memory:
    $W_q$ of the segment, $W_k$, $W_v$ of memory and segment, $W_{k,R}$ of the table, $(Q+u)K^\top$,
    $(Q+v)R^\top$ (one padded entry), $PV$, $W_o$, the feed-forward network and the softmax layer.
    """
    q, k, b, d, hd = cfg.tgt_len, cfg.tgt_len + cfg.mem_len, cfg.batch, cfg.d_model, cfg.n_head * cfg.d_head
    per_layer = (2 * q * b * d * hd + 2 * k * b * d * 2 * hd + 2 * k * d * hd
                 + 2 * b * q * k * hd + 2 * b * q * (k + 1) * hd + 2 * b * q * k * hd
                 + 2 * q * b * hd * d + 2 * 2 * q * b * d * cfg.d_inner)
    return cfg.n_layer * per_layer + 2 * q * b * d * cfg.n_token


def train_step_flops(cfg: BenchConfig) -> int:
    """Forward and backward: the backward computes two products per forward product, so 3x the forward."""
    return 3 * forward_flops(cfg)


# -- the measurements --

CPU_ONLY = {
    WITHOUT_KERNELS: 'our C++ kernels run on the CPU only (the fast path on CUDA never uses them)',
    'products alone': "it times oneDNN's prepacked products and our attention kernel, which run on the CPU only",
    'oneDNN': "oneDNN's prepacked linear serves the CPU only: the FLOP/s share is of torch.mm (cuBLAS) alone",
    "a step's products": 'our few-rows kernel and oneDNN serve the CPU only',
    'eval peak memory': 'peak memory is read from /proc/self/status (the resident set of a CPU process), not the GPU',
}


def build_peers(cfg: BenchConfig, device: str, notes: List[str]) -> Dict[str, nn.Module]:
    """
    Hugging Face's TransfoXL holding the weights of `make_xl(cfg)`, its log-probabilities checked equal to ours
    (`check_same_outputs`, before any timing), and x-transformers of the same size, on `device`. A peer whose
    package is missing is left out; `notes` gets a line for each peer (the check, or why it is left out).
    """
    peers = {}
    try:
        hf = HuggingFaceXL(make_xl(cfg)).to(device)
    except ImportError as error:
        notes.append(f'{HF}: not measured, its package is missing ({error})')
    else:
        worst = check_same_outputs(make_xl(cfg, device=device), hf, cfg.n_token, cfg.tgt_len, cfg.batch)
        notes.append(f'{HF}: our weights; its log-probabilities differ from ours by at most {worst:.1e} '
                     f'(checked before timing)')
        peers[HF] = hf
    try:
        peers[XT] = XTransformersXL(cfg).to(device)
    except ImportError as error:
        notes.append(f'{XT}: not measured, its package is missing ({error})')
    else:
        notes.append(f"{XT}: the same size with XL memories, but not the same attention (T5's bucketed relative bias "
                     f"in place of the position terms with u, v and the sinusoid table) nor the same weights: only "
                     f"its speed compares")
    return peers


def measure_speed(cfg: BenchConfig, compile_model: bool = True, labml_nn: bool = True, peers: bool = True,
                  device: str = 'cpu', notes: Optional[List[str]] = None) -> Dict[str, Dict[str, float]]:
    """
    Tokens/s of training and evaluation for each contender, and FLOP/s of the square GEMMs and of the feed-forward
    product in float32 and bf16, interleaved: the eager contenders and the products in one group, then (with
    `compile_model`) the fast path against itself compiled in a second group, so that compilation and its worker
    processes never overlap the first group's rounds. On CUDA the CPU-only contenders (`CPU_ONLY`) are left out.
    `notes` (if given) gets a line for each peer, and one where oneDNN's products are not usable.
    """
    notes = [] if notes is None else notes
    cpu = device == 'cpu'
    contenders = {'fast': make_xl(cfg, device=device), 'plain': make_xl(cfg, fast=False, device=device)}
    if labml_nn:
        contenders['labml_nn'] = LabmlNNXL(cfg).to(device)
    contenders['bf16 autocast'] = make_xl(cfg, device=device)
    if peers:
        contenders.update(build_peers(cfg, device, notes))
    if cpu and not prepacked_linear.available():
        notes.append("oneDNN's prepacked linear is not usable in this PyTorch: the FLOP/s share is of torch.mm alone")
    results = {}
    for train in (True, False):
        mode = 'train' if train else 'eval'
        runners = {name: Stream(model, cfg, train, autocast=torch.bfloat16 if name == 'bf16 autocast' else None)
                   for name, model in contenders.items()}
        if train:
            runners['torch.mm'] = matmul_runner(cfg.matmul_n, device)
            if cpu and prepacked_linear.available():
                runners['oneDNN'] = onednn_gemm_runner(cfg.matmul_n)
        else:
            runners['linear float32'] = linear_runner(cfg, torch.float32, device)
            runners['linear bfloat16'] = linear_runner(cfg, torch.bfloat16, device)
            if cpu:
                runners['products alone'] = products_runner(cfg)
        if cpu:
            # The fast path with PyTorch's attention, dropout and layer norms in place of our kernels
            model = make_xl(cfg, fast=True)
            runners[WITHOUT_KERNELS] = Stream(model, cfg, train, call=without_native_kernels(model))
        seconds = interleaved(runners, cfg.repeats, sync=synchronizer(device))
        if compile_model:
            model = make_xl(cfg, fast=True, device=device)
            compiled = {'fast (compile group)': Stream(make_xl(cfg, fast=True, device=device), cfg, train),
                        'fast + compile': Stream(model, cfg, train, call=torch.compile(model, dynamic=False))}
            seconds.update(interleaved(compiled, cfg.repeats, warmup=3, sync=synchronizer(device)))
        for name, s in seconds.items():
            if name in ('torch.mm', 'oneDNN'):
                results.setdefault('matmul', {})[name] = 2 * cfg.matmul_n ** 3 / s
            elif name.startswith('linear '):
                results.setdefault('linear', {})[name.split()[1]] = 2 * cfg.tokens() * cfg.d_model * cfg.d_inner / s
            else:
                results.setdefault(name, {})[mode] = cfg.tokens() / s
    return results


def measure_generation(cfg: BenchConfig, peers: bool = True, device: str = 'cpu',
                       notes: Optional[List[str]] = None) -> Dict[str, Dict[str, float]]:
    """
    Tokens/s of batch-1 greedy generation, `{contender: {'generate': tokens/s}}`: a prompt of `gen_context` tokens,
    then `gen_tokens` tokens, each seeing the last `gen_context` positions (the memory). The fast path through
    `labml_txl.xl.generation.generate` with `top_k=1`, each peer through its own `generate` (`benchmark_peers.py`) with
    a memory, or a window, of `gen_context`. A call is the whole generation, prompt included; the rate is `gen_tokens` over its time. Hugging
    Face's TransfoXL holds our weights, so its tokens should be ours: `notes` (if given) says in how many it agrees.
    """
    notes = [] if notes is None else notes
    model = make_xl(cfg, device=device, mem_len=cfg.gen_context).eval()
    prompt = torch.randint(cfg.n_token, (cfg.gen_context, 1), generator=torch.Generator().manual_seed(5)).to(device)
    runners = {'fast': lambda: generate(model, prompt, cfg.gen_tokens, context=cfg.gen_context, top_k=1)}
    if peers:
        # The same peers as for training (the notes of `build_peers` say which and why), with memories of gen_context
        for name, peer in build_peers(replace(cfg, mem_len=cfg.gen_context, tgt_len=cfg.gen_context), device,
                                      []).items():
            peer.eval()
            runners[name] = lambda peer=peer: peer.generate(prompt, cfg.gen_tokens)
    # One call of each first gives the tokens, and is the warm-up
    tokens = {name: run() for name, run in runners.items()}
    if HF in tokens:
        # (its `generate` starts the memories as `mem_len` zero vectors, ours start empty: the tests check its tokens
        # against ours from the same zero memories)
        same = int((tokens[HF] == tokens['fast']).sum())
        notes.append(f"generation: {HF}'s `generate` starts from zero memories, ours from none; its greedy tokens "
                     f"equal ours in {same} of {cfg.gen_tokens}")
    seconds = interleaved(runners, cfg.gen_repeats, warmup=0, sync=synchronizer(device))
    return {name: {'generate': cfg.gen_tokens / s} for name, s in seconds.items()}


# Rows per product at which the few-rows kernel is measured against the libraries (batched generation's sequences)
FEW_ROWS = (1, 2, 4, 8, 16, 32)


def measure_few_rows(cfg: BenchConfig, repeats: int = 30) -> Dict[int, Dict[str, float]]:
    """
    Median seconds of the products of one one-token step of the fast model with `rows` sequences (per layer
    $[W_q; W_k; W_v]$, $W_o$ and the two feed-forward layers, then the softmax layer; a weight of its own for each, so
    they come from the caches as in a step), `{rows: {product: seconds}}`, by our few-rows kernel (where
    `dispatch.linear` gives it at most `MOST_ROWS` rows), oneDNN's prepacked product and `F.linear`, interleaved.
    """
    h, dh, d = cfg.n_head, cfg.d_head, cfg.d_model
    shapes = [(3 * h * dh, d), (d, h * dh), (cfg.d_inner, d), (d, cfg.d_inner)] * cfg.n_layer + [(cfg.n_token, d)]
    weights = [nn.Parameter(torch.randn(*shape), requires_grad=False) for shape in shapes]
    products = {'F.linear': F.linear}
    if prepacked_linear.available():
        products['oneDNN'] = prepacked_linear.prepacked_linear
    if native_few_rows.kernel_available():
        products['few rows'] = native_few_rows.few_rows_linear
    results = {}
    for rows in FEW_ROWS:
        inputs = [torch.randn(rows, weight.shape[1]) for weight in weights]

        def step(product: Callable) -> Callable[[], None]:
            def call():
                with torch.no_grad():
                    for x, weight in zip(inputs, weights):
                        product(x, weight)
            return call
        results[rows] = interleaved({name: step(product) for name, product in products.items()}, repeats)
    return results


def few_rows_rows(results: Dict[int, Dict[str, float]]) -> List[List[str]]:
    """Rows `[what, the kernel's time, libraries' time over the kernel's]` of `measure_few_rows`."""
    out = []
    for rows, seconds in results.items():
        if 'few rows' not in seconds:
            continue
        kernel = seconds['few rows']
        others = [name for name in ('oneDNN', 'F.linear') if name in seconds]
        served = '' if rows <= native_few_rows.MOST_ROWS else '; beyond MOST_ROWS: the dispatcher runs oneDNN'
        out.append([f"a step's products, rows={rows}: few-rows kernel vs "
                    + ' / '.join(f'{name} ({seconds[name] * 1e3:.2f} ms)' for name in others) + served,
                    f'{kernel * 1e3:.2f} ms', ' / '.join(f'{seconds[name] / kernel:.2f}x' for name in others)])
    return out


def measure_table9(cfg: BenchConfig, lengths: List[int], repeats: int = 15, device: str = 'cpu'
                   ) -> List[Dict[str, float]]:
    """
    Seconds per token of evaluation (batch 1) at each attention length $L$:

    * `xl_segment`: Transformer-XL evaluating segments of `tgt_len` tokens over a memory of $L$ with
      `same_length` (every query sees $L$ keys), as the paper evaluates;
    * `xl_token`: Transformer-XL evaluating one token at a time over a memory of $L$ (generation);
    * `vanilla`: the same model without memory recomputing the window of the last $L$ tokens for every token.
    """
    # One model per stream: each keeps the keys and values of its own memory from one call to the next
    xl, generator, vanilla_model = (make_xl(cfg, fast=True, device=device, dropout=0.0, same_length=True).eval()
                                    for _ in range(3))
    data = torch.randint(cfg.n_token, (max(lengths) + 2 * cfg.tgt_len + 2, 1),
                         generator=torch.Generator().manual_seed(3)).to(device)
    rows = []

    def stream(model: MemTransformerLM, qlen: int, length: int) -> Callable[[], None]:
        """Evaluate `qlen` tokens per call, the memory running on (it stays at `length` positions)."""
        model.reset_length(qlen, 0, length)
        state = {'position': length, 'mems': model.log_probs(data[:length], None)[1]}

        def step():
            start = state['position'] if state['position'] + qlen <= data.shape[0] else 0
            _, state['mems'] = model.log_probs(data[start:start + qlen], state['mems'])
            state['position'] = start + qlen
        return step

    with torch.no_grad():
        for length in lengths:
            tgt = min(cfg.tgt_len, length)
            vanilla_model.same_length = False
            vanilla_model.reset_length(length, 0, 0)

            def vanilla():
                hidden, _ = vanilla_model.forward_hidden(data[:length], None)
                vanilla_model.hidden_to_log_probs(hidden[-1:])

            seconds = interleaved({'xl_segment': stream(xl, tgt, length), 'xl_token': stream(generator, 1, length),
                                   'vanilla': vanilla}, repeats, warmup=2, sync=synchronizer(device))
            rows.append({'length': length, 'xl_segment': seconds['xl_segment'] / tgt,
                         'xl_token': seconds['xl_token'], 'vanilla': seconds['vanilla']})
    return rows


# The memory mechanisms of `labml_txl/memories/` against Transformer-XL's memory, the same model otherwise: the
# compressed memory keeps as many rows a query sees, the memory tokens (RMT) `MECHANISM_TOKENS` of them, the kNN memory
# (one layer) retrieves `MECHANISM_NEIGHBOURS` of a store of `KNN_STORE` times the memory
MECHANISM_TOKENS = 16
MECHANISM_NEIGHBOURS = 32
KNN_STORE = 4


def mechanism_models(cfg: BenchConfig, device: str) -> Dict[str, MemTransformerLM]:
    """One model per mechanism, the same weights where they share them (seed 0)."""
    half = cfg.mem_len // 2
    rate = min(4, half)
    return {
        f"Transformer-XL's memory ({cfg.mem_len})": make_xl(cfg, device=device),
        f'compressed memory ({half} + {half}, conv, rate {rate})': make_xl(cfg, device=device, mem_len=half,
                                                                           cmem_len=half, compression_rate=rate),
        f'memory tokens ({MECHANISM_TOKENS}, no XL memory)': make_xl(cfg, device=device, mem_len=0,
                                                                   n_mem_tokens=MECHANISM_TOKENS),
        f'memory tokens ({MECHANISM_TOKENS}) + XL memory ({cfg.mem_len})': make_xl(
            cfg, device=device, n_mem_tokens=MECHANISM_TOKENS),
        f'kNN memory ({MECHANISM_NEIGHBOURS} of {KNN_STORE * cfg.mem_len}, one layer) + XL memory ({cfg.mem_len})':
            make_xl(cfg, device=device, knn_mem_size=KNN_STORE * cfg.mem_len, knn_k=MECHANISM_NEIGHBOURS),
    }


def with_aux_losses(model: MemTransformerLM) -> Callable:
    """`model`'s call as the trainer makes it: its mechanisms' auxiliary losses (the compressed memory's
    reconstruction loss) added to the loss it back-propagates, weight 1."""
    def call(data, target, *mems):
        loss, aux, *mems = model(data, target, *mems, return_aux_losses=True)
        return [loss + sum(aux.values(), loss.new_zeros(()))] + mems
    return call


def measure_mechanisms(cfg: BenchConfig, device: str = 'cpu') -> Dict[str, Dict[str, float]]:
    """Training and evaluation tokens/s of each mechanism (`mechanism_models`), interleaved per mode."""
    sync = synchronizer(device)
    models = mechanism_models(cfg, device)
    speed = {name: {} for name in models}
    for mode, train in (('train', True), ('eval', False)):
        runners = {name: Stream(model, cfg, train=train, call=with_aux_losses(model) if train else None)
                   for name, model in models.items()}
        for name, seconds in interleaved(runners, cfg.repeats, sync=sync).items():
            speed[name][mode] = cfg.tokens() / seconds
    return speed


def mechanism_rows(speed: Dict[str, Dict[str, float]]) -> List[List[str]]:
    """A row per mechanism and mode: tokens/s, and the ratio to Transformer-XL's memory (the first)."""
    baseline = next(iter(speed.values()))
    return [[f'{mode} tok/s, {name}', f'{row[mode]:,.0f}', f'{row[mode] / baseline[mode]:.2f}x vs XL memory']
            for mode in ('train', 'eval') for name, row in speed.items()]


def resident_kib(field: str = 'VmRSS') -> int:
    """`VmRSS` (resident now) or `VmHWM` (its peak) of this process, in KiB, from `/proc/self/status`."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise RuntimeError(f'{field} is not in /proc/self/status')


def settle_and_reset_peak() -> None:
    """Give freed heap back to the system (so it is not reused unseen) and restart the peak (`VmHWM`)."""
    ctypes.CDLL('libc.so.6').malloc_trim(0)
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')


def _memory_child(cfg: BenchConfig, mem_len: int, fast: bool) -> Dict[str, float]:
    """
    In a fresh process: resident memory of evaluating segments of `tgt_len` over a full memory of `mem_len`.
    `model_mib` is the process with the model built; `eval_peak_mib` the peak above it while evaluating two
    segments once the memory is full (so it holds the memories, `mems_mib`, and the segment's working memory).
    """
    model = make_xl(cfg, fast=fast, dropout=0.0).eval()
    model.reset_length(cfg.tgt_len, 0, mem_len)
    n_fill = math.ceil(mem_len / cfg.tgt_len)
    data = torch.randint(cfg.n_token, ((n_fill + 2) * cfg.tgt_len, cfg.batch))
    settle_and_reset_peak()
    model_kib = resident_kib()
    with torch.no_grad():
        mems = None
        for s in range(n_fill):
            _, mems = model.log_probs(data[s * cfg.tgt_len:(s + 1) * cfg.tgt_len], mems)
        settle_and_reset_peak()
        for s in range(n_fill, n_fill + 2):
            _, mems = model.log_probs(data[s * cfg.tgt_len:(s + 1) * cfg.tgt_len], mems)
    peak_kib = resident_kib('VmHWM')
    mems_mib = sum(m.numel() * m.element_size() for m in mems) / 2 ** 20
    return {'model_mib': model_kib / 1024, 'eval_peak_mib': (peak_kib - model_kib) / 1024, 'mems_mib': mems_mib}


def measure_memory(cfg: BenchConfig, mem_lens: List[int]) -> List[Dict[str, float]]:
    """`_memory_child` in a subprocess per memory length and path (fast and plain)."""
    rows = []
    for mem_len in mem_lens:
        row = {'mem_len': mem_len}
        for fast in (True, False):
            out = subprocess.run([sys.executable, __file__, '--memory-child', json.dumps(
                {'cfg': asdict(cfg), 'mem_len': mem_len, 'fast': fast})], capture_output=True, text=True, check=True)
            row['fast' if fast else 'plain'] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
    return rows


# -- the table --

def speed_rows(speed: Dict[str, Dict[str, float]], cfg: BenchConfig) -> List[List[str]]:
    """Rows `[what, value, ratio]` of the speed results (`measure_speed`'s, with `measure_generation`'s)."""
    fast = speed['fast']
    rows = []
    for mode in ('train', 'eval', 'generate'):
        if mode not in fast:
            continue
        what = (f'batch 1, context {cfg.gen_context}, {cfg.gen_tokens} greedy tokens' if mode == 'generate'
                else f'batch {cfg.batch}, {cfg.tgt_len} tokens over a memory of {cfg.mem_len}')
        rows.append([f'{mode}: fast tokens/s ({what})', f"{fast[mode]:,.0f}", ''])
        for peer in ('plain', 'labml_nn', HF, XT, WITHOUT_KERNELS, 'fast + compile', 'bf16 autocast'):
            if mode in speed.get(peer, {}):
                other = speed[peer][mode]
                if peer in ('fast + compile', 'bf16 autocast'):
                    # Against the fast path of its own group of rounds
                    base = speed['fast (compile group)'][mode] if peer == 'fast + compile' else fast[mode]
                    rows.append([f'{mode}: {peer} vs fast ({other:,.0f} tokens/s)', '', f'{other / base:.2f}x'])
                else:
                    same = '; same size, not the same attention' if peer == XT else ''
                    rows.append([f'{mode}: fast vs {peer} ({other:,.0f} tokens/s{same})', '',
                                 f'{fast[mode] / other:.2f}x'])
    if 'products alone' in speed:
        bound, plain = speed['products alone']['eval'], speed['plain']['eval']
        rows.append([f"eval: the fast path's products alone ({bound:,.0f} tokens/s, an upper bound) vs plain", '',
                     f'{bound / plain:.2f}x'])
    if 'linear' in speed:
        bf16, fp32 = speed['linear']['bfloat16'], speed['linear']['float32']
        rows.append([f"bf16 product vs float32 at the feed-forward's shape ({cfg.tokens()} x {cfg.d_model} x "
                     f"{cfg.d_inner}; {bf16 / 1e9:.1f} vs {fp32 / 1e9:.1f} GFLOP/s)", '', f'{bf16 / fp32:.2f}x'])
    matmul = speed['matmul']
    for name in ('fast', 'fast + compile'):
        if 'train' not in speed.get(name, {}):
            continue
        achieved = train_step_flops(cfg) * speed[name]['train'] / cfg.tokens()
        if 'oneDNN' in matmul:
            rows.append([f"train step matmul FLOP/s ({name}), of the float32 peak: oneDNN's prepacked GEMM "
                         f"{matmul['oneDNN'] / 1e9:.0f} GFLOP/s", f'{achieved / 1e9:.0f} GFLOP/s',
                         f"{achieved / matmul['oneDNN']:.0%}"])
        rows.append([f"train step matmul FLOP/s ({name}), of torch.mm {matmul['torch.mm'] / 1e9:.0f} GFLOP/s",
                     f'{achieved / 1e9:.0f} GFLOP/s', f"{achieved / matmul['torch.mm']:.0%}"])
    return rows


def peak_gemm(speed: Dict[str, Dict[str, float]]) -> Tuple[str, float]:
    """The run's float32 GEMM peak and its name: oneDNN's prepacked product where it ran (the fastest path PyTorch
    has on the CPU), else `torch.mm`."""
    name = 'oneDNN' if 'oneDNN' in speed['matmul'] else 'torch.mm'
    return name, speed['matmul'][name]


def target_rows(speed: Dict[str, Dict[str, float]], cfg: BenchConfig) -> List[List[str]]:
    """Rows `[target, this run, met]` of issue 17's targets (`TARGETS`, `TARGET_PEAK_SHARE`) that this run measured."""
    fast = speed['fast']
    rows = []
    for (mode, peer), target in TARGETS.items():
        if mode in speed.get(peer, {}) and mode in fast:
            ratio = fast[mode] / speed[peer][mode]
            rows.append([f'{mode}: fast >= {target}x {peer}', f'{ratio:.2f}x', 'yes' if ratio >= target else 'no'])
    peak_name, peak = peak_gemm(speed)
    share = train_step_flops(cfg) * fast['train'] / cfg.tokens() / peak
    rows.append([f"train step: about {TARGET_PEAK_SHARE:.0%} of the float32 peak ({peak_name}; the issue's gloss of "
                 f"the training targets)", f'{share:.0%}', 'yes' if share >= TARGET_PEAK_SHARE else 'no'])
    return rows


def table9_rows(rows: List[Dict[str, float]]) -> List[List[str]]:
    out = []
    for r in rows:
        out.append([f"Table 9, L={r['length']}: vanilla window vs XL segments "
                    f"(XL {r['xl_segment'] * 1e3:.2f} ms/token, "
                    f"vanilla {r['vanilla'] * 1e3:.1f} ms/token)", '', f"{r['vanilla'] / r['xl_segment']:.0f}x"])
        out.append([f"Table 9, L={r['length']}: vanilla window vs XL one token at a time "
                    f"(XL {r['xl_token'] * 1e3:.2f} ms/token)", '', f"{r['vanilla'] / r['xl_token']:.1f}x"])
    return out


def memory_rows(rows: List[Dict]) -> List[List[str]]:
    return [[f"eval peak memory above the model, mem_len={r['mem_len']} (memories {r['fast']['mems_mib']:.0f} MiB; "
             f"plain path {r['plain']['eval_peak_mib']:.0f} MiB)", f"{r['fast']['eval_peak_mib']:.0f} MiB",
             f"{r['fast']['eval_peak_mib'] / max(r['plain']['eval_peak_mib'], 1e-9):.2f}x"] for r in rows]


def dispatch_summary(cfg: BenchConfig, device: str = 'cpu') -> str:
    """What the dispatcher chooses for one training and one evaluation segment of the fast model on `device`, and
    why it refuses the paths before its choice."""
    model = make_xl(cfg, device=device)
    data = torch.randint(0, cfg.n_token, (cfg.tgt_len, cfg.batch), device=device)
    lines = []
    for mode in ('train', 'eval'):
        model.train(mode == 'train')
        with torch.set_grad_enabled(mode == 'train'), dispatch.recording() as choices:
            loss, *_ = model(data, data)
            if mode == 'train':
                loss.mean().backward()
        lines.append(f'dispatch in {mode} (calls per segment):')
        lines += ['  ' + line.strip() for line in dispatch.summary(choices).splitlines()]
    return '\n'.join(lines)


def format_table(rows: List[List[str]], header: Tuple[str, str, str] = ('measurement', 'value', 'ratio')) -> str:
    lines = ['| {} | {} | {} |'.format(*header), '| --- | ---: | ---: |']
    lines += [f'| {a} | {b} | {c} |' for a, b, c in rows]
    return '\n'.join(lines)


def run(cfg: BenchConfig, lengths: List[int], mem_lens: List[int], compile_model: bool = True,
        labml_nn: bool = True, peers: bool = True, device: str = 'cpu') -> str:
    """All measurements; returns the markdown tables (measurements, then issue 17's targets on the CPU) and the
    notes: the peers' checks and what was not measured, and why."""
    notes = []
    speed = measure_speed(cfg, compile_model=compile_model, labml_nn=labml_nn, peers=peers, device=device,
                          notes=notes)
    for name, row in measure_generation(cfg, peers=peers, device=device, notes=notes).items():
        speed.setdefault(name, {}).update(row)
    rows = speed_rows(speed, cfg) + table9_rows(measure_table9(cfg, lengths, device=device))
    rows += mechanism_rows(measure_mechanisms(cfg, device=device))
    if device == 'cpu':
        rows += few_rows_rows(measure_few_rows(cfg)) + memory_rows(measure_memory(cfg, mem_lens))
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            notes.append("bf16: PyTorch has no fast bf16 product on this CPU (oneDNN's needs AVX512BW/VL/DQ or "
                         "AVX-NE-CONVERT: torch.ops.mkldnn._is_mkldnn_bf16_supported() is False), so bf16 matmuls run "
                         "its portable kernel (the row 'bf16 product vs float32')")
    else:
        notes += [f'{name}: not measured on {device}: {why}' for name, why in CPU_ONLY.items()]
    out = [format_table(rows)]
    if device == 'cpu':
        out.append(format_table(target_rows(speed, cfg),
                                header=('target (issue 17: float32, the 2-core CPU)', 'this run', 'met')))
    else:
        out.append(f"Issue 17's targets are set for the CPU; not judged on {device}.")
    return '\n\n'.join(out + ['\n'.join(f'* {note}' for note in notes)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1].lstrip('# '))
    parser.add_argument('--quick', action='store_true', help='tiny sizes, a smoke run')
    parser.add_argument('--no-compile', action='store_true', help='leave out the torch.compile contender')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu',
                        help='where the models run (cuda: a GPU; rows of CPU-only code are left out, with the reason)')
    parser.add_argument('--config', choices=('both', 'small', 'wt103'), default='both',
                        help="small: the table above (4 layers, d_model 256); wt103: the published WikiText-103 "
                             "model's shapes against Hugging Face's (benchmark_wt103.py, on the CPU); both: one, "
                             "then the other")
    parser.add_argument('--memory-child', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        spec = json.loads(args.memory_child)
        print(json.dumps(_memory_child(BenchConfig(**spec['cfg']), spec['mem_len'], spec['fast'])))
        return
    if args.device == 'cuda' and not torch.cuda.is_available():
        print(f'--device cuda: CUDA is not available to this torch {torch.__version__} '
              f'(torch.cuda.is_available() is False: no CUDA build or no GPU visible); nothing was measured',
              file=sys.stderr)
        sys.exit(2)
    start = time.perf_counter()
    if args.config != 'wt103':
        run_small(args)
    if args.config != 'small':
        if args.device == 'cpu':
            # (here, not at the top: it imports this module's helpers)
            import benchmark_wt103
            print('\n' + benchmark_wt103.run(benchmark_wt103.QUICK if args.quick else benchmark_wt103.FULL))
        else:
            print(f'\nThe WikiText-103 shapes: not measured on {args.device} (their rows read /proc and time our CPU '
                  f'kernels)')
    print(f'\n({time.perf_counter() - start:.0f} s)')


def run_small(args: argparse.Namespace) -> None:
    """The small configuration's tables, printed."""
    cfg = QUICK if args.quick else FULL
    lengths = [16, 32] if args.quick else [128, 256, 512, 800]
    mem_lens = [32, 64] if args.quick else [512, 1024, 2048]
    where = (f'{torch.get_num_threads()} CPU threads' if args.device == 'cpu'
             else torch.cuda.get_device_name())
    print(f'torch {torch.__version__}, {args.device} ({where}), float32; {cfg}')
    print(dispatch_summary(cfg, args.device))
    print(run(cfg, lengths, mem_lens, compile_model=not args.quick and not args.no_compile, device=args.device))


if __name__ == '__main__':
    main()
