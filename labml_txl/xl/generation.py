r"""
# Sampling from Transformer-XL with memories

Generation feeds the prompt once, then one token at a time: each step computes only the new position, attending
to the cached memories of the positions before it (Transformer-XL's evaluation speed-up, the paper's Table 9),
so nothing is recomputed. The memory holds the last `context` positions, the context every new token sees.

A model with a memory mechanism written once per segment (the Recurrent Memory Transformer's memory tokens,
`memories/recurrent.py`; the kNN memory's store, `memories/knn.py`) is sampled segment by segment as it was trained:
each new token is computed with the current segment's tokens so far over the state before that segment, and
a segment of `tgt_len` tokens, once complete, gives the state of the next (a token's output does not depend on what
is written after the segment: the write memory it cannot see, the keys its segment adds to the store).

The next token is drawn from $p(w) \propto \exp(\log p(w) / T)$ at temperature $T$, restricted to the `top_k`
most likely tokens and to the smallest set whose probabilities add up to `top_p` (nucleus sampling).
"""
from typing import Optional

import torch

from ..errors import require_positive_int
from . import MemTransformerLM
from .checks import require_token_tensor


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """A `ValueError` naming the first of `temperature`, `top_k` and `top_p` that is not accepted, and what is."""
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} is not accepted: it must be above 0 (use top_k=1 for greedy)")
    require_positive_int('top_k', top_k, allow_zero=True)
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} is not accepted: it must be in (0, 1]")


def filter_distribution(log_probs: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                        top_p: float = 1.0) -> torch.Tensor:
    r"""
    Log-probabilities at `temperature`, with everything outside the `top_k` tokens and the `top_p` nucleus set
    to $-\infty$, renormalised.

    Shape:
        `log_probs` `[..., n_token]`; returns the same shape.
    """
    check_sampling(temperature, top_k, top_p)
    # $(\log p(w) - \max_v \log p(v)) / T$: the same distribution as $\log p(w) / T$ (a softmax does not change
    # when every score moves by one number), and at a tiny $T$ the most likely token's score stays 0 where
    # $\log p(w) / T$ would be $-\infty$ for every token (no distribution at all); it tends to greedy decoding
    scores = (log_probs - log_probs.max(dim=-1, keepdim=True).values) / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float('-inf'))
    if top_p < 1:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Keep a token when the probability of the tokens before it is below top_p: the smallest such set
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float('-inf'))
    return torch.log_softmax(scores, dim=-1)


@torch.no_grad()
def generate(model: MemTransformerLM, prompt: torch.Tensor, n_tokens: int, *, context: Optional[int] = None,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """
    Sample `n_tokens` tokens after `prompt`, one at a time, reusing the memories.

    Args:
        model: a Transformer-XL (put in eval mode; its lengths are restored afterwards).
        prompt: token ids `[prompt_len, batch]`, at least one token.
        n_tokens: how many tokens to sample.
        context: how many past positions each new token attends to (the memory length while sampling);
            defaults to the model's `tgt_len + mem_len`, the context it was trained with.
        temperature, top_k, top_p: see `filter_distribution`.
        generator: the random source, for repeatable samples.

    Shape:
        returns `[n_tokens, batch]`.

    `prompt` is a tensor, as the model takes: a numpy array or a list is a `TypeError` saying how to convert it
    (`xl.checks.require_token_tensor` says why it is not converted here).
    """
    require_token_tensor('prompt', prompt, model.word_emb.emb_layers[0].weight.device)
    if prompt.dim() != 2 or prompt.shape[0] < 1:
        raise ValueError(f"prompt of shape {list(prompt.shape)} is not accepted: expected [prompt_len >= 1, batch]")
    require_positive_int('n_tokens', n_tokens)
    context = (model.tgt_len or 0) + model.mem_len if context is None else context
    require_positive_int('context', context)
    saved = (model.tgt_len, model.ext_len, model.mem_len)
    was_training = model.training
    by_segments = model.written_per_segment()
    if by_segments and not model.tgt_len:
        raise ValueError("a model whose memory is written once per segment (memory tokens, a kNN store) is sampled "
                         "segment by segment, of its tgt_len tokens, and this one has none: "
                         "model.reset_length(tgt_len, 0, mem_len) first")
    segment_len = model.tgt_len
    try:
        model.reset_length(segment_len if by_segments else 1, 0, context)
    except ValueError as error:
        raise ValueError(f"context={context} is not accepted for this model: while it samples, its memory holds the "
                         f"last `context` positions (mem_len=context), and {error}") from error
    model.eval()

    def sample(log_probs: torch.Tensor) -> torch.Tensor:
        distribution = filter_distribution(log_probs[-1].float(), temperature, top_k, top_p)
        return torch.multinomial(distribution.exp(), 1, generator=generator).squeeze(-1)

    try:
        if by_segments:
            return _sample_by_segments(model, prompt, n_tokens, segment_len, sample)
        # The prompt in one pass; its last position gives the first distribution
        log_probs, mems = model.log_probs(prompt, None)
        tokens = []
        for _ in range(n_tokens):
            token = sample(log_probs)
            tokens.append(token)
            # Only the new position is computed; the past is in `mems`
            log_probs, mems = model.log_probs(token[None], mems)
        return torch.stack(tokens)
    finally:
        model.reset_length(*saved)
        model.train(was_training)


def _sample_by_segments(model: MemTransformerLM, prompt: torch.Tensor, n_tokens: int, segment_len: int,
                        sample) -> torch.Tensor:
    """`n_tokens` tokens after `prompt`, each computed with the current segment's tokens over the state before that
    segment; a complete segment of `segment_len` tokens gives the next segment's state (see the module docstring)."""
    text, start, state = prompt, 0, None
    for _ in range(n_tokens):
        # The segments before the last (complete or not) are done: their state is the next one's
        while text.shape[0] - start > segment_len:
            _, state = model.log_probs(text[start:start + segment_len], state)
            start += segment_len
        log_probs, _ = model.log_probs(text[start:], state)
        text = torch.cat([text, sample(log_probs)[None]])
    return text[prompt.shape[0]:]
