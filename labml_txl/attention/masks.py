r"""
# Attention masks

Masks given to this package's public attention modules are boolean `[seq_q, seq_k, batch]`, True where query $i$
may attend to key $j$, as in labml_nn. Either end axis may be 1 to broadcast: `[seq_q, seq_k, 1]` is the same
mask for every sequence (a causal mask), `[1, seq_k, batch]` is the same for every query (key padding).

Inside, the attention core (`fast/dispatch.py`, `reference.py`) and `xl/` keep the original Transformer-XL's
convention: **True where a key is masked**. `masked_keys` is the one conversion from the public convention; the
decoder masks below are made in the inner one, as `MemTransformerLM` gives them to its layers.
"""
import functools
from typing import Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary


def subsequent_mask(seq_len: int, device=None) -> torch.Tensor:
    """
    The causal mask: position $i$ may attend to $j \\le i$.

    Shape:
        returns `[seq_len, seq_len, 1]`.
    """
    return torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)).unsqueeze(-1)


def check_mask(mask: Optional[torch.Tensor], seq_q: int, seq_k: int, batch: int, name: str = 'mask') -> None:
    """Raise `ValueError`, naming the shape and what is accepted, unless `mask` fits these sizes."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a boolean tensor [seq_q, seq_k, batch], got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} has dtype {mask.dtype}; it must be torch.bool, True where attention is allowed")
    shape = tuple(mask.shape)
    fits = (len(shape) == 3 and shape[0] in (1, seq_q) and shape[1] == seq_k and shape[2] in (1, batch))
    if not fits:
        raise ValueError(f"{name} of shape {list(shape)} is not accepted: expected [seq_q, seq_k, batch] = "
                         f"[{seq_q} or 1, {seq_k}, {batch} or 1] for queries of length {seq_q}, "
                         f"keys of length {seq_k} and batch size {batch}")


def masked_keys(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A public mask (True where attention is allowed) in the inner convention: True where a key is masked."""
    return None if mask is None else ~mask


def heads_mask(masked: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A mask `[seq_q, seq_k]` or `[seq_q, seq_k, batch or 1]` in the layout of head-major scores,
    `[seq_q, seq_k]` or `[batch or 1, 1, seq_q, seq_k]` (a view)."""
    if masked is None or masked.dim() == 2:
        return masked
    if masked.shape[2] == 1:
        return masked[:, :, 0]
    return masked.permute(2, 0, 1)[:, None]


def decoder_causal_mask(qlen: int, klen: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """`[qlen, klen]`, True for key $j$ of query $i$ where $j > (k - q) + i$: the keys after the query's own
    position, when the queries are the last `qlen` of the `klen` positions."""
    return torch.ones(qlen, klen, dtype=torch.bool, device=device).triu_(1 + klen - qlen)


def decoder_window_mask(qlen: int, klen: int, window: int, device: Optional[torch.device] = None) -> torch.Tensor:
    r"""`[qlen, klen]`, True where key $j$ is not among the `window` keys up to query $i$'s own position $m + i$:
    $j > m + i$ or $j \le m + i - \mathit{window}$. `window >= klen` is `decoder_causal_mask`; `window = mem_len`
    is `MemTransformerLM`'s mask with `same_length` (every query sees `mem_len` keys)."""
    mask = decoder_causal_mask(qlen, klen, device)
    if window < klen:
        # $j - i \le m - \mathit{window}$
        mask |= torch.ones(qlen, klen, dtype=torch.bool, device=device).tril_(klen - qlen - window)
    return mask


# The masks `decoder_key_window` compares with, made once per shape
_cached_decoder_window_mask = functools.lru_cache(maxsize=16)(decoder_window_mask)


# What `decoder_key_window` found for a mask, kept per tensor (the one a view was taken of) while it is unchanged
_key_windows = WeakIdKeyDictionary()


def decoder_key_window(masked: Optional[torch.Tensor], qlen: int, klen: int) -> Optional[int]:
    """The `window` for which `masked` (`[qlen, klen]`) is exactly `decoder_window_mask(qlen, klen, window)` (`klen`
    for the causal mask), or None when it is no such mask. The answer is kept for the mask's tensor while its
    version counter is unchanged (a model's masks are cached per shape, and each layer asks again)."""
    if masked is None or masked.shape != (qlen, klen) or masked.dtype != torch.bool or qlen == 0:
        return None
    base = masked if masked._base is None else masked._base
    key = (base._version, masked.storage_offset(), tuple(masked.shape), masked.stride())
    kept = _key_windows.get(base)
    if kept is not None and kept[0] == key:
        return kept[1]
    # The last query's keys are the `window` last ones
    window = klen - int(masked[-1].sum())
    if window == 0 or not torch.equal(masked, _cached_decoder_window_mask(qlen, klen, window, masked.device)):
        window = None
    _key_windows[base] = (key, window)
    return window

