r"""
# Transformer-XL at the published WikiText-103 model's shapes, against Hugging Face's TransfoXL with the same weights

    python experiments/benchmark_wt103.py            # this configuration alone (about 5 minutes on 2 cores)
    python experiments/benchmark_wt103.py --quick    # a smoke run on tiny sizes
    python experiments/benchmark.py                  # both configurations, this one after the small one

The question a user of the published model asks: can I evaluate and sample it on my machine, and how fast? The
model has `transfo-xl-wt103`'s shapes (18 layers, d_model 1024, 16 heads of 64, d_inner 4096, adaptive input and
softmax with cutoffs 20000, 40000, 200000 over 267,735 words, div_val 4, the projections of all clusters but the
first tied, $u$ and $v$ per layer) and random weights, which Hugging Face's `from_pretrained` reads from our
`save_pretrained`. Words are drawn by Zipf's law, $p(r) \propto 1 / r$ over the frequency-sorted vocabulary (as
WikiText's words roughly are), so that the adaptive softmax's clusters get the rows they get on text. Rows:

* evaluation at the paper's test settings (tgt_len 128, mem_len 1600, clamp_len 1000, same_length), batch 1, over
  a full memory: tokens/s of the fast path and of Hugging Face's forward with `labels`, interleaved (its losses
  checked equal to ours on the first segment, before timing); the tokens/s of the fast path's products alone
  (`benchmark.products_runner` with the adaptive softmax's products for the segment's words), which bound it; the
  peak resident memory of each, every one in a fresh process (`/proc/self/status`: `VmHWM` once the memory is full,
  over two more segments);
* sampling, batch 1: a prompt of 128 words, then 100 greedy words, by `labml_txl.xl.generation.generate` and by
  Hugging Face's `generate` (which starts from `mem_len` zero memories, as its users get it). The rate leaves the
  prompt out: `(n - 1)` words over the time of a call for `n` words less that of a call for one. The limit is what
  reading every weight once per word allows at the machine's memory bandwidth, measured in the same run (the
  faster of reading a 1 GiB tensor, `sum`, and copying it, both bytes counted);
* bf16 (where the CPU has fast bf16 products, `torch.ops.mkldnn._is_mkldnn_bf16_supported()`): the model's weights
  cast to bf16, evaluated and sampled as above, with the largest difference of its targets' log-probabilities from
  float32's on the same segment over the same kind of memory, and how many of its greedy words are float32's.
"""
import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark import HF, format_table, interleaved, products_runner, resident_kib, settle_and_reset_peak  # noqa: E402
from benchmark_peers import HuggingFaceXL  # noqa: E402
from labml_txl.attention.masks import decoder_window_mask  # noqa: E402
from labml_txl.fast import prepacked_linear  # noqa: E402
from labml_txl.xl import MemTransformerLM  # noqa: E402
from labml_txl.xl.generation import generate  # noqa: E402

BF16 = 'fast, bf16 weights'


@dataclass(frozen=True)
class WT103Config:
    """The published WikiText-103 model's shapes, the paper's test settings and the sampling run."""
    n_token: int = 267_735
    n_layer: int = 18
    d_model: int = 1024
    n_head: int = 16
    d_head: int = 64
    d_inner: int = 4096
    cutoffs: Sequence[int] = (20_000, 40_000, 200_000)
    div_val: int = 4
    # The paper's test settings (the original's `run_wt103_large.sh eval`)
    tgt_len: int = 128
    mem_len: int = 1600
    clamp_len: int = 1000
    batch: int = 1
    # Timed evaluation segments per contender (after the one that fills the memory and the checked one)
    repeats: int = 3
    # Sampling: a prompt of `prompt` words, then `words` greedy words; timed calls of each (Hugging Face's for
    # `words` words, some 100 times slower per word, is timed once)
    prompt: int = 128
    words: int = 100
    sample_repeats: int = 3
    # Bytes of the tensor that measures the memory bandwidth
    bandwidth_bytes: int = 2 ** 30


FULL = WT103Config()
QUICK = WT103Config(n_token=1000, n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=128, cutoffs=(200, 400, 800),
                    tgt_len=8, mem_len=24, clamp_len=20, repeats=2, prompt=8, words=6, sample_repeats=2,
                    bandwidth_bytes=2 ** 24)
# Issue 29's targets at these shapes, float32 on the 2-core CPU: the fast path over Hugging Face's, and its share of
# its products' bound (evaluation) or of the bandwidth limit (sampling)
TARGETS = {('eval', HF): 2.5, ('eval', 'products alone'): 0.8, ('sample', HF): 3.0, ('sample', 'bandwidth'): 0.6}


def make_model(cfg: WT103Config, seed: int = 0, impl: str = 'auto') -> MemTransformerLM:
    """The model at the paper's test settings, in evaluation mode (the same weights for the same seed), on the fast
    path or (`impl='reference'`) the plain one."""
    torch.manual_seed(seed)
    return MemTransformerLM(n_token=cfg.n_token, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model,
                            d_head=cfg.d_head, d_inner=cfg.d_inner, dropout=0.0, dropatt=0.0, div_val=cfg.div_val,
                            cutoffs=list(cfg.cutoffs), tie_projs=[False] + [True] * len(cfg.cutoffs), adapt_inp=True,
                            tgt_len=cfg.tgt_len, mem_len=cfg.mem_len, clamp_len=cfg.clamp_len, same_length=True,
                            untie_r=True, impl=impl).eval()


def hugging_face(model: MemTransformerLM) -> HuggingFaceXL:
    """Hugging Face's TransfoXL holding `model`'s weights and settings (its `config.json` carries `mem_len`,
    `clamp_len` and `same_length`)."""
    return HuggingFaceXL(model).eval()


def zipf_words(cfg: WT103Config, n: int, seed: int) -> torch.Tensor:
    """`[n, batch]` word ids drawn with $p(r) \\propto 1 / (r + 1)$ for id $r$ (ids sorted by frequency)."""
    weights = 1.0 / torch.arange(1, cfg.n_token + 1, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(weights, n * cfg.batch, replacement=True, generator=generator).view(n, cfg.batch)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of `model`'s parameters (a tied one counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


# -- evaluation --

class Evaluation:
    """One contender evaluating a stream of segments of `tgt_len` over a full memory: built with the memory
    filled by one call on the first `mem_len` words, then each call is the next segment. `losses` are the last
    call's, `[tgt_len, batch]` (Hugging Face's: of the first `tgt_len - 1` positions, as it shifts `labels` inside,
    in the order of its softmax's clusters)."""

    def __init__(self, call: Callable, words: torch.Tensor, cfg: WT103Config):
        self.call, self.words, self.cfg = call, words, cfg
        with torch.no_grad():
            _, *self.mems = call(words[:cfg.mem_len], words[1:cfg.mem_len + 1])
        self.position = cfg.mem_len

    def __call__(self) -> None:
        start, end = self.position, self.position + self.cfg.tgt_len
        if end + 1 > self.words.shape[0]:
            raise ValueError(f'{self.words.shape[0]} words are too few for another segment')
        with torch.no_grad():
            self.losses, *self.mems = self.call(self.words[start:end], self.words[start + 1:end + 1], *self.mems)
        self.position = end


def softmax_products(model: MemTransformerLM, target: torch.Tensor) -> List[tuple]:
    """`(rows, in_features, out_features)` of the adaptive softmax's products for the words `target`: the head
    over every row (its projection, the shortlist, the clusters' entries), and each tail cluster's projection and
    words over the rows whose word is in it (the fast path's `forward`, `adaptive softmax: target clusters`)."""
    crit, rows = model.crit, target.numel()
    d_head = crit.out_projs[0].shape[1]
    products = [(rows, crit.d_proj, d_head), (rows, d_head, crit.shortlist_size), (rows, d_head, crit.n_clusters)]
    for i in range(1, len(crit.cutoffs)):
        begin, end = crit.cutoff_ends[i], crit.cutoff_ends[i + 1]
        n = int(((target >= begin) & (target < end)).sum())
        if n:
            d_i = crit.out_projs[i].shape[1]
            products += [(n, crit.d_proj, d_i), (n, d_i, end - begin)]
    return products


def measure_evaluation(cfg: WT103Config, model: MemTransformerLM, hf: Optional[HuggingFaceXL],
                       bf16: Optional[MemTransformerLM], notes: List[str]) -> Dict[str, float]:
    """Tokens/s of each contender's evaluation segments (and of the products alone), interleaved; `notes` gets the
    check against Hugging Face (an `AssertionError` beyond its tolerance, before timing) and bf16's difference."""
    words = zipf_words(cfg, cfg.mem_len + (cfg.repeats + 3) * cfg.tgt_len + 1, seed=1)
    runners = {'fast': Evaluation(model, words, cfg)}
    if hf is not None:
        runners[HF] = Evaluation(hf, words, cfg)
    if bf16 is not None:
        runners[BF16] = Evaluation(bf16, words, cfg)
    # The first segment over the full memory, each contender's: the checks
    for run in runners.values():
        run()
    ours = runners['fast'].losses
    if hf is not None:
        # (its adaptive softmax gives the losses in cluster order, not position order: compared as sorted)
        worst = (ours[:-1].flatten().sort().values - runners[HF].losses.flatten().sort().values).abs().max().item()
        # The tolerance of the small configuration's check (`check_same_outputs`)
        assert worst <= 1e-4, f"Hugging Face's losses differ from ours by {worst:.3g}: not timed"
        notes.append(f"evaluation: {HF}'s losses equal ours to {worst:.1e} on the first segment over the full memory "
                     f"(checked before timing)")
    if bf16 is not None:
        worst = (runners[BF16].losses.float() - ours).abs().max().item()
        notes.append(f'evaluation: bf16 weights move the log-probabilities of the segment\'s words by at most '
                     f'{worst:.3f} from float32 (the same segment over the same kind of memory)')
    klen = cfg.tgt_len + cfg.mem_len
    target = words[cfg.mem_len + 1:cfg.mem_len + cfg.tgt_len + 1]
    runners['products alone'] = products_runner(
        cfg, softmax=softmax_products(model, target),
        masked=decoder_window_mask(cfg.tgt_len, klen, min(cfg.mem_len, klen), words.device))
    # (its weights are packed in its first call, as the fast path's were in the calls before)
    runners['products alone']()
    seconds = interleaved(runners, cfg.repeats, warmup=0)
    return {name: cfg.tgt_len * cfg.batch / s for name, s in seconds.items()}


# -- peak memory --

def _memory_child(cfg: WT103Config, contender: str) -> Dict[str, float]:
    """In a fresh process: the contender (`'fast'`, `'plain'` or Hugging Face's) built, its memory filled, then the
    peak resident set over two more segments, with freed heap given back and the peak restarted before them
    (`malloc_trim`, `clear_refs`)."""
    model = make_model(cfg, impl='reference' if contender == 'plain' else 'auto')
    if contender == HF:
        model = hugging_face(model)
    words = zipf_words(cfg, cfg.mem_len + 2 * cfg.tgt_len + 1, seed=1)
    run = Evaluation(model, words, cfg)
    settle_and_reset_peak()
    before = resident_kib() / 1024
    run(), run()
    out = {'resident_mib': before, 'peak_mib': resident_kib('VmHWM') / 1024}
    if contender == 'fast':
        # The weights oneDNN packed for the products (a copy each: `fast/prepacked_linear.py`), an opaque tensor
        # whose bytes are its elements'
        out['packed_mib'] = sum(packed.numel() * packed.element_size()
                                for _, packed in prepacked_linear._kept.values()) / 2 ** 20
    return out


def measure_memory(cfg: WT103Config, contenders: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """`_memory_child` of each contender in its own process."""
    out = {}
    for contender in contenders:
        result = subprocess.run([sys.executable, __file__, '--memory-child', json.dumps(
            {'cfg': asdict(cfg), 'contender': contender})], capture_output=True, text=True, check=True)
        out[contender] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


# -- sampling --

def bandwidth(n_bytes: int, repeats: int = 5) -> Dict[str, float]:
    """Bytes/s of reading (`sum`) and of copying (read and write counted) a float32 tensor of `n_bytes`."""
    x = torch.randn(n_bytes // 4)
    y = torch.empty_like(x)
    seconds = interleaved({'read': lambda: x.sum(), 'copy': lambda: y.copy_(x)}, repeats)
    return {'read': n_bytes / seconds['read'], 'copy': 2 * n_bytes / seconds['copy']}


def measure_sampling(cfg: WT103Config, model: MemTransformerLM, hf: Optional[HuggingFaceXL],
                     bf16: Optional[MemTransformerLM], notes: List[str]) -> Dict[str, float]:
    """Words/s of greedy sampling after the prompt, `(words - 1)` over the time of a call for `words` words less
    that of a call for one (medians of interleaved calls; Hugging Face's call for `words` words, about 100 times
    slower per word, timed once); `notes` gets how many of Hugging Face's and of bf16's words are float32's."""
    prompt = zipf_words(cfg, cfg.prompt, seed=2)
    models = {'fast': model, **({BF16: bf16} if bf16 is not None else {})}
    calls = {name: (lambda n, m=m: generate(m, prompt, n, top_k=1)) for name, m in models.items()}
    if hf is not None:
        calls[HF] = lambda n: hf.generate(prompt, n)
    # The first call of each gives its words; Hugging Face's is also its one timed call for `words` words
    words, seconds = {}, {}
    for name, call in calls.items():
        start = time.perf_counter()
        words[name] = call(cfg.words)
        seconds[f'{name}, {cfg.words}'] = time.perf_counter() - start
    for name in (HF, BF16):
        if name in words:
            same = int((words[name] == words['fast']).sum())
            origin = ' (from mem_len zero memories; ours from none)' if name == HF else ''
            notes.append(f'sampling: {same} of the {cfg.words} greedy words of {name}{origin} are float32 fast\'s')
    runners = {}
    for name, call in calls.items():
        if name != HF:
            runners[f'{name}, {cfg.words}'] = lambda call=call: call(cfg.words)
        runners[f'{name}, 1'] = lambda call=call: call(1)
    seconds.update(interleaved(runners, cfg.sample_repeats, warmup=0))
    return {name: (cfg.words - 1) / (seconds[f'{name}, {cfg.words}'] - seconds[f'{name}, 1']) for name in calls}


# -- the table --

def run(cfg: WT103Config, peers: bool = True) -> str:
    """Every measurement; returns the markdown tables (measurements, then issue 29's targets) and the notes."""
    notes, rows = [], []
    model = make_model(cfg)
    # (it saves `model`'s weights and reads them back, leaving `model` as it is)
    hf = hugging_face(model) if peers else None
    bf16 = None
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        bf16 = make_model(cfg).to(torch.bfloat16)
    else:
        notes.append('bf16: not measured, PyTorch has no fast bf16 product on this CPU '
                     '(torch.ops.mkldnn._is_mkldnn_bf16_supported() is False)')
    n_params = sum(p.numel() for p in model.parameters())
    evaluation = measure_evaluation(cfg, model, hf, bf16, notes)
    fast = evaluation['fast']
    what = (f'batch {cfg.batch}, {cfg.tgt_len} words over a memory of {cfg.mem_len}, clamp_len {cfg.clamp_len}, '
            f'same_length')
    rows.append([f'eval: fast words/s ({what})', f'{fast:,.1f}', ''])
    for name in (HF, 'products alone', BF16):
        if name in evaluation:
            ratio = evaluation[name] / fast if name == BF16 else fast / evaluation[name]
            vs = f'{name} vs fast' if name == BF16 else f'fast vs {name}'
            rows.append([f'eval: {vs} ({evaluation[name]:,.1f} words/s)', '',
                         f'{ratio:.0%}' if name == 'products alone' else f'{ratio:.2f}x'])
    memory = measure_memory(cfg, ['fast', 'plain'] + ([HF] if peers else []))
    for name, row in memory.items():
        ratio = f"{row['peak_mib'] / memory[HF]['peak_mib']:.2f}x" if name != HF and HF in memory else ''
        rows.append([f"eval: peak resident memory, {name} (resident {row['resident_mib']:,.0f} MiB before the two "
                     f"segments)", f"{row['peak_mib']:,.0f} MiB", ratio])
    # What the fast path keeps from one segment to the next, which the plain path and Hugging Face's recompute
    hd, mib = cfg.n_head * cfg.d_head, 4 / 2 ** 20
    notes.append(f"evaluation memory: the fast path keeps oneDNN's packed copies of the weights it multiplies "
                 f"({memory['fast']['packed_mib']:,.0f} MiB), the keys and values of the memory "
                 f"({cfg.n_layer * 2 * cfg.mem_len * cfg.batch * hd * mib:,.0f} MiB, in buffers with room to append) "
                 f"and W_kR R of each layer ({cfg.n_layer * (cfg.mem_len + cfg.tgt_len) * hd * mib:,.0f} MiB); "
                 f"the plain path keeps none of them")
    band = bandwidth(cfg.bandwidth_bytes)
    limit = max(band.values()) / weight_bytes(model)
    sampling = measure_sampling(cfg, model, hf, bf16, notes)
    rows.append([f"sample: fast words/s (batch 1, a prompt of {cfg.prompt}, then {cfg.words} greedy words; "
                 f"the prompt left out)", f"{sampling['fast']:,.2f}", ''])
    if HF in sampling:
        rows.append([f"sample: fast vs {HF}'s generate ({sampling[HF]:,.2f} words/s)", '',
                     f"{sampling['fast'] / sampling[HF]:.2f}x"])
    rows.append([f"sample: fast of the bandwidth limit: {weight_bytes(model) / 1e9:.2f} GB of weights per word at "
                 f"{max(band.values()) / 1e9:.1f} GB/s (read {band['read'] / 1e9:.1f}, copy {band['copy'] / 1e9:.1f})",
                 f'{limit:,.1f} words/s', f"{sampling['fast'] / limit:.0%}"])
    if BF16 in sampling:
        rows.append([f'sample: {BF16} vs fast ({sampling[BF16]:,.2f} words/s; the limit of its '
                     f'{weight_bytes(bf16) / 1e9:.2f} GB: {max(band.values()) / weight_bytes(bf16):,.1f})', '',
                     f"{sampling[BF16] / sampling['fast']:.2f}x"])
    targets = []
    judged = {('eval', HF): evaluation.get(HF), ('eval', 'products alone'): evaluation['products alone'],
              ('sample', HF): sampling.get(HF), ('sample', 'bandwidth'): limit}
    for (mode, other), target in TARGETS.items():
        if judged[mode, other] is None:
            continue
        ratio = (fast if mode == 'eval' else sampling['fast']) / judged[mode, other]
        share = other in ('products alone', 'bandwidth')
        shown = f'{ratio:.0%}' if share else f'{ratio:.2f}x'
        goal = f'>= {target:.0%} of {other}' if share else f'>= {target}x {other}'
        targets.append([f'{mode}: fast {goal}', shown, 'yes' if ratio >= target else 'no'])
    if HF in memory:
        targets.append([f'eval: peak memory <= {HF}\'s', f"{memory['fast']['peak_mib'] / memory[HF]['peak_mib']:.2f}x",
                        'yes' if memory['fast']['peak_mib'] <= memory[HF]['peak_mib'] else 'no'])
    head = (f'The published WikiText-103 shapes: {n_params / 1e6:.0f}M parameters ({weight_bytes(model) / 1e9:.2f} GB '
            f'in float32), random weights; {cfg}')
    return '\n\n'.join([head, format_table(rows), format_table(targets, header=(
        'target (issue 29: float32, the 2-core CPU)', 'this run', 'met')), '\n'.join(f'* {n}' for n in notes)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1].lstrip('# '))
    parser.add_argument('--quick', action='store_true', help='tiny sizes, a smoke run')
    parser.add_argument('--memory-child', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        spec = json.loads(args.memory_child)
        print(json.dumps(_memory_child(WT103Config(**spec['cfg']), spec['contender'])))
        return
    start = time.perf_counter()
    print(run(QUICK if args.quick else FULL))
    print(f'\n({time.perf_counter() - start:.0f} s)')


if __name__ == '__main__':
    main()
