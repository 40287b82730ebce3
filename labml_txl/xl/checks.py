"""
# Eager checks of the Transformer-XL's arguments

Each raises an exception that names the argument, the value it got and what is accepted, at the point of
entry (constructor, `reset_length`, `forward`), before any work is done.
"""
from typing import Sequence

import torch

from ..errors import require_bool, require_positive_int


def check_cutoffs(cutoffs: Sequence[int], n_token: int) -> list:
    """`cutoffs` as a list, or `ValueError` unless they are strictly increasing integers in `(0, n_token)`."""
    if isinstance(cutoffs, (str, bytes)) or not isinstance(cutoffs, Sequence):
        raise TypeError(f"cutoffs={cutoffs!r} is not accepted: cutoffs must be a list of integers")
    cutoffs = list(cutoffs)
    for c in cutoffs:
        if isinstance(c, bool) or not isinstance(c, int):
            raise TypeError(f"cutoffs={cutoffs!r} is not accepted: every cutoff must be an integer, got {c!r}")
    increasing = all(a < b for a, b in zip(cutoffs, cutoffs[1:]))
    inside = all(0 < c < n_token for c in cutoffs)
    if not (increasing and inside):
        raise ValueError(f"cutoffs={cutoffs!r} is not accepted: cutoffs must be strictly increasing integers "
                         f"above 0 and below n_token={n_token} (the last cluster ends at n_token)")
    return cutoffs


def check_adaptive(n_token: int, d_embed: int, d_proj: int, cutoffs: Sequence[int], div_val: int) -> list:
    """The arguments shared by the adaptive embedding and softmax, checked; returns `cutoffs + [n_token]`."""
    for name, value in (('n_token', n_token), ('d_embed', d_embed), ('d_proj', d_proj), ('div_val', div_val)):
        require_positive_int(name, value)
    return check_cutoffs(cutoffs, n_token) + [n_token]


def cluster_embedding_sizes(d_embed: int, div_val: int, n_clusters: int) -> list:
    r"""$d_i = d_{embed} / \mathit{div\_val}^i$ for each cluster $i$ of the adaptive embedding and softmax, or a
    `ValueError` when one would get no features."""
    sizes = [d_embed // (div_val ** i) for i in range(n_clusters)]
    if sizes[-1] < 1:
        raise ValueError(f"div_val={div_val} is not accepted with d_embed={d_embed} and {n_clusters - 1} cutoffs: "
                         f"cluster {sizes.index(0)} would get d_embed // div_val**{sizes.index(0)} = 0 features; "
                         f"accepted: d_embed >= div_val**{n_clusters - 1}")
    return sizes


def check_tokens(name: str, tokens: torch.Tensor, n_token: int, check_values: bool = True) -> None:
    """`TypeError` / `ValueError` / `IndexError` unless `tokens` is a 2-D tensor of ids in `[0, n_token)`, of dtype
    `torch.long` or `torch.int32` (what an embedding takes: uint8 and bool ids are refused, not read as indices).
    `check_values=False` leaves out the range check, which reads the values (a host synchronisation, a graph break
    under `torch.compile`): a compiled model should be checked once eagerly on data of the same source."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a LongTensor [seq_len, batch] of token ids, got {type(tokens).__name__}")
    if tokens.dtype not in (torch.long, torch.int32):
        raise TypeError(f"{name} has dtype {tokens.dtype}; token ids must be an integer tensor of dtype torch.long "
                        f"(or torch.int32): use {name}.long()")
    if tokens.dim() != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"{name} of shape {list(tokens.shape)} is not accepted: expected a non-empty "
                         f"[seq_len, batch] tensor of token ids")
    if not check_values:
        return
    outside = (tokens < 0) | (tokens >= n_token)
    if bool(outside.any()):
        bad = tokens[outside]
        raise IndexError(f"{name} holds token ids outside [0, n_token={n_token}): e.g. {bad[0].item()} "
                         f"(min {tokens.min().item()}, max {tokens.max().item()}); accepted ids are "
                         f"0 .. {n_token - 1}")


def check_lengths(tgt_len, ext_len, mem_len, *, allow_none_tgt: bool = False) -> None:
    """`ValueError` unless `tgt_len >= 1`, `ext_len >= 0` and `mem_len >= 0` (integers)."""
    if not (allow_none_tgt and tgt_len is None):
        require_positive_int('tgt_len', tgt_len)
    require_positive_int('ext_len', ext_len, allow_zero=True)
    require_positive_int('mem_len', mem_len, allow_zero=True)


def check_same_length(same_length: bool, mem_len: int) -> None:
    if same_length and mem_len == 0:
        raise ValueError("same_length=True is not accepted with mem_len=0: every query attends to exactly "
                         "mem_len keys, so mem_len must be at least 1 (or same_length False)")


def check_clamp_len(clamp_len: int) -> None:
    if isinstance(clamp_len, bool) or not isinstance(clamp_len, int):
        raise ValueError(f"clamp_len={clamp_len!r} is not accepted: an integer (<= 0 for no clipping)")


def require_token_tensor(name: str, value, device: torch.device) -> None:
    """
    A `TypeError` unless the token ids `value` (the argument `name`) are a `torch.Tensor`, naming the type given,
    the type taken, and the conversion.

    Ids that are not a tensor (a numpy array, a list) are refused, not converted: torch's own modules refuse them
    (`nn.Embedding` takes only tensors), and a conversion here would choose for the caller what only the caller
    knows: the device (a numpy array is on the host, the model may be on a GPU: a copy at every call of a
    generation loop), and the dtype (numpy's default integer is int32 on Windows and int64 elsewhere; a float array
    holds no ids). Everything the model returns (losses, memories) is a tensor; one `torch.as_tensor` by the caller
    keeps the whole loop in tensors.
    """
    if isinstance(value, torch.Tensor):
        return
    kind = type(value)
    given = kind.__qualname__ if kind.__module__ == 'builtins' else f'{kind.__module__}.{kind.__qualname__}'
    raise TypeError(f"{name} must be a torch.Tensor [seq_len, batch] of token ids (torch.long or torch.int32), got "
                    f"{given}: convert it with torch.as_tensor({name}, device={str(device)!r})")


def check_forward_flags(return_aux_losses, return_reconstruction_loss, carry_gradient, has_compressed_memory: bool
                        ) -> None:
    """An exception unless `forward`'s flags are booleans that fit together and fit the model."""
    require_bool('return_aux_losses', return_aux_losses)
    require_bool('return_reconstruction_loss', return_reconstruction_loss)
    require_bool('carry_gradient', carry_gradient)
    if return_reconstruction_loss and not has_compressed_memory:
        raise ValueError("return_reconstruction_loss=True is not accepted with cmem_len=0: the loss trains the "
                         "compression of a compressed memory, and this model has none (set cmem_len > 0)")
    if return_reconstruction_loss and return_aux_losses:
        raise ValueError("return_aux_losses=True and return_reconstruction_loss=True are not accepted together: "
                         "the auxiliary losses hold the reconstruction loss (as 'reconstruction')")


def check_target_shape(target: torch.Tensor, data: torch.Tensor) -> None:
    """A `ValueError` unless `target` is `[tgt_len, bsz]` with `tgt_len <= qlen` for `data` `[qlen, bsz]`, saying so
    where it looks transposed."""
    if target.shape[1] != data.shape[1] or target.shape[0] > data.shape[0]:
        transposed = target.shape[0] == data.shape[1] and target.shape[1] <= data.shape[0]
        hint = (' It looks transposed: both are [seq_len, batch], not [batch, seq_len].' if transposed else '')
        raise ValueError(f"target of shape {list(target.shape)} is not accepted with data of shape "
                         f"{list(data.shape)}: expected [tgt_len, {data.shape[1]}] with "
                         f"1 <= tgt_len <= {data.shape[0]} (the last tgt_len inputs are scored).{hint}")
