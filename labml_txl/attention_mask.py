r"""
# Attention masks

Masks given to this package's attention modules are boolean `[seq_q, seq_k, batch]`, True where query $i$
may attend to key $j$, as in labml_nn. Either end axis may be 1 to broadcast: `[seq_q, seq_k, 1]` is the same
mask for every sequence (a causal mask), `[1, seq_k, batch]` is the same for every query (key padding).
"""
from typing import Optional

import torch


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


def to_batch_head_mask(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """`[seq_q, seq_k, batch]` to the `[batch, 1, seq_q, seq_k]` layout of scores with a head axis."""
    if mask is None:
        return None
    return mask.permute(2, 0, 1).unsqueeze(1)
