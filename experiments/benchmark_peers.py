r"""
# The implementations a user would pick instead, for `benchmark.py`

* **Hugging Face's TransfoXL** (transformers 4.44.2, `transformers.models.deprecated.transfo_xl`): the same model,
  with this package's weights (`MemTransformerLM.save_pretrained`, read by its own `from_pretrained`). Before any
  timing, `check_same_outputs` asserts that it computes the same log-probabilities over segments with memories.
* **x-transformers** (`TransformerWrapper` with a `Decoder`): a Transformer of the same size (layers, width, heads,
  feed-forward width, vocabulary) with Transformer-XL's memories (`max_mem_len`, `mems`) and T5's relative position
  bias (`rel_pos_bias`), its option nearest to relative attention. Not the same attention (no $u$, $v$, no sinusoid
  table) nor the same weights, so only its speed is compared.

Each peer runs through its own public calls, as its users run it:

* training and evaluation: Hugging Face's forward with `labels` and `mems` (its loss, not its log-probabilities), and
  x-transformers' forward with the `mems` and `return_mems` it documents for Transformer-XL's recurrence, each wrapped
  to the calling convention of `MemTransformerLM`, `model(data, target, *mems) -> [loss, *mems]` with `[len, batch]`
  tensors, so the benchmark's `Stream` drives all of them alike. Hugging Face shifts `labels` inside: of a segment of
  `tgt_len` tokens it scores the last `tgt_len - 1` (the first token's target is the previous segment's last);
* generation (`generate(prompt, n_tokens)`): Hugging Face's `generate` (greedy, its memories carried between steps as
  its past) and x-transformers' `AutoregressiveWrapper.generate(..., cache_kv=True)` (greedy: temperature 0) over a
  window of `gen_context` positions, its kept keys and values trimmed to the window.

`step_log_probs(tokens, mems)` gives the log-probabilities of a segment with memories, for the checks before timing
(`check_same_outputs`), not for timing.

transformers 4.44.2's `TransfoXLModel.forward` calls `torch.arange(...).type_as(dtype=...)`, which current torch
refuses; `hf_on_current_torch` lets `Tensor.type_as` take `dtype=` while a Hugging Face call runs (that one line's
meaning), and nothing else.
"""
import contextlib
import tempfile
from typing import List, Tuple

import torch
from torch import nn
from torch.nn import functional as F


@contextlib.contextmanager
def hf_on_current_torch():
    type_as = torch.Tensor.type_as

    def type_as_or_dtype(self, other=None, *, dtype=None):
        return self.to(dtype) if dtype is not None else type_as(self, other)

    torch.Tensor.type_as = type_as_or_dtype
    try:
        yield
    finally:
        torch.Tensor.type_as = type_as


class HuggingFaceXL(nn.Module):
    """Hugging Face's `TransfoXLLMHeadModel` holding the weights of `model` (a `MemTransformerLM`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        from transformers.models.deprecated.transfo_xl import TransfoXLLMHeadModel
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            self.hf = TransfoXLLMHeadModel.from_pretrained(folder)
        self.n_layer, self.d_model = model.n_layer, model.d_model

    def _empty_mems(self, tokens: torch.Tensor) -> List[torch.Tensor]:
        # Hugging Face's own start is `mem_len` zero vectors (`init_mems`); ours, and the original's, is none
        return [torch.empty(0, tokens.shape[1], self.d_model, device=tokens.device) for _ in range(self.n_layer)]

    def forward(self, data: torch.Tensor, target: torch.Tensor, *mems: torch.Tensor) -> List[torch.Tensor]:
        """Hugging Face's losses `[tgt_len - 1, batch]` of `data` with `labels=data` (shifted inside: `target` is
        `data` one on, the same targets but the last) and its new memories."""
        mems = list(mems) or self._empty_mems(data)
        with hf_on_current_torch():
            out = self.hf(data.t(), mems=mems, labels=data.t())
        return [out.losses.t()] + list(out.mems)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n_tokens: int) -> torch.Tensor:
        """`n_tokens` greedy tokens `[n_tokens, batch]` after `prompt` `[len, batch]`, by Hugging Face's `generate`
        (no end-of-sequence token: every call generates `n_tokens`)."""
        with hf_on_current_torch():
            out = self.hf.generate(prompt.t(), max_new_tokens=n_tokens, do_sample=False, num_beams=1,
                                   eos_token_id=None, pad_token_id=0)
        return out[:, prompt.shape[0]:].t()

    def step_log_probs(self, tokens: torch.Tensor, mems) -> Tuple[torch.Tensor, list]:
        """Log-probabilities `[len, batch, n_token]` of `tokens` `[len, batch]` and the new memories."""
        mems = mems or self._empty_mems(tokens)
        with hf_on_current_torch():
            out = self.hf(tokens.t(), mems=mems)
        return out.prediction_scores.transpose(0, 1), list(out.mems)


class XTransformersXL(nn.Module):
    """x-transformers' decoder of the size of `cfg`, with memories of `cfg.mem_len` and T5's relative bias, over
    segments of `cfg.tgt_len` (its `max_seq_len`: the window `generate` sees)."""

    def __init__(self, cfg, seed: int = 0):
        super().__init__()
        from x_transformers import Decoder, TransformerWrapper
        torch.manual_seed(seed)
        self.model = TransformerWrapper(
            num_tokens=cfg.n_token, max_seq_len=cfg.tgt_len, max_mem_len=cfg.mem_len, use_abs_pos_emb=False,
            emb_dropout=cfg.dropout,
            attn_layers=Decoder(dim=cfg.d_model, depth=cfg.n_layer, heads=cfg.n_head, attn_dim_head=cfg.d_head,
                                ff_mult=cfg.d_inner // cfg.d_model, rel_pos_bias=True, attn_dropout=cfg.dropatt,
                                ff_dropout=cfg.dropout))

    def forward(self, data: torch.Tensor, target: torch.Tensor, *mems: torch.Tensor) -> List[torch.Tensor]:
        logits, new_mems = self.model(data.t(), mems=list(mems) or None, return_mems=True)
        loss = F.cross_entropy(logits.transpose(1, 2), target.t(), reduction='none').t()
        return [loss] + list(new_mems)

    def step_log_probs(self, tokens: torch.Tensor, mems) -> Tuple[torch.Tensor, list]:
        logits, new_mems = self.model(tokens.t(), mems=mems or None, return_mems=True)
        return torch.log_softmax(logits, -1).transpose(0, 1), list(new_mems)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n_tokens: int) -> torch.Tensor:
        """`n_tokens` greedy tokens `[n_tokens, batch]` after `prompt` `[len, batch]`, by x-transformers'
        `AutoregressiveWrapper.generate` with its kept keys and values (`cache_kv=True`), over its window of
        `max_seq_len` positions."""
        from x_transformers import AutoregressiveWrapper
        # (its `generate` puts the network back in the wrapper's mode afterwards: the wrapper takes this one's)
        wrapper = AutoregressiveWrapper(self.model).train(self.training)
        return wrapper.generate(prompt.t(), n_tokens, temperature=0., cache_kv=True).t()


def check_same_outputs(ours: nn.Module, hf: HuggingFaceXL, n_token: int, tgt_len: int, batch: int,
                       segments: int = 3, atol: float = 1e-4) -> float:
    """The largest difference of the log-probabilities of `ours` and Hugging Face's over `segments` segments with
    memories (both in evaluation mode, no gradient); an `AssertionError` above `atol`."""
    data = torch.randint(n_token, (segments, tgt_len, batch), generator=torch.Generator().manual_seed(11))
    data = data.to(next(ours.parameters()).device)
    ours_mems, hf_mems, worst = None, None, 0.0
    was_training = ours.training, hf.training
    ours.eval(), hf.eval()
    with torch.no_grad():
        for segment in data:
            a, ours_mems = ours.log_probs(segment, ours_mems)
            b, hf_mems = hf.step_log_probs(segment, hf_mems)
            worst = max(worst, (a - b).abs().max().item())
    ours.train(was_training[0]), hf.train(was_training[1])
    assert worst <= atol, f"Hugging Face's TransfoXL with our weights differs by {worst:.3g} (> {atol}): not timed"
    return worst
