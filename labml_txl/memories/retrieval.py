r"""
# Attention over each query's nearest stored keys

The Memorizing Transformer's memory branch (Wu et al., ICLR 2022): for each query $q_i$ of a head, the $k$ stored keys
with the largest inner product $\hat{q}_i^\top \hat{k}_j$ are retrieved, $K_m$ and $V_m$, and the query attends over
them alone, with its own softmax:

$$v_{m,i} = \mathop{softmax}_j\bigl(s\, \hat{q}_i^\top \hat{k}_{m,j}\bigr)\, V_m,$$

$\hat{x} = x / \lVert x \rVert$ (keys and queries normalised, as the paper does against the stored keys' staleness) and
$s$ a scale per head. The keys are stored normalised (`KnnMemory.next_state`).

Which keys are nearest is found by an index (`INDEXES`): `'torch'`, an exact scan by one product in torch (the
default), or `'faiss'`, faiss-cpu's exact inner-product search (`IndexFlatIP`, float32, its own threads), for stores
too large for one product of every query with every key. Either only chooses neighbours: the scores that weigh them
are computed here, in the query's dtype, from the gathered keys, so the gradient reaches the queries the same way.
"""
from typing import Dict

import torch

INDEXES: Dict[str, str] = {
    'torch': 'an exact scan in torch, one product of every query with every stored key',
    'faiss': "faiss-cpu's exact inner-product index (IndexFlatIP, float32), the faiss extra",
}


def nearest_keys(queries: torch.Tensor, keys: torch.Tensor, k: int, index: str) -> torch.Tensor:
    r"""
    The indices of each query's `k` stored keys of largest $q^\top k$, best first.

    Shape:
        `queries` `[bsz, n_head, qlen, d_head]`, `keys` `[bsz, n_head, length, d_head]` with `k <= length`; returns
        `[bsz, n_head, qlen, k]` (int64).
    """
    with torch.no_grad():
        if index == 'torch':
            return torch.einsum('bhqd,bhld->bhql', queries, keys).topk(k, dim=-1).indices
        return _faiss_nearest(queries, keys, k)


def _faiss_nearest(queries: torch.Tensor, keys: torch.Tensor, k: int) -> torch.Tensor:
    """`nearest_keys` by faiss: one exact inner-product index per batch column and head, built from the store as it
    is (so no key added or evicted is ever missing from, or left in, the index)."""
    import faiss
    import numpy as np
    bsz, n_head, qlen, d_head = queries.shape
    found = np.empty((bsz, n_head, qlen, k), dtype=np.int64)
    stored = keys.detach().float().cpu().numpy()
    asked = queries.detach().float().cpu().numpy()
    for b in range(bsz):
        for h in range(n_head):
            index = faiss.IndexFlatIP(d_head)
            index.add(np.ascontiguousarray(stored[b, h]))
            _, found[b, h] = index.search(np.ascontiguousarray(asked[b, h]), k)
    return torch.from_numpy(found).to(queries.device)


def attend_to_nearest(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: torch.Tensor, k: int,
                      index: str) -> torch.Tensor:
    r"""
    $v_{m,i} = \mathop{softmax}_j(s\, \hat{q}_i^\top \hat{k}_{m,j})\, V_m$ over the `k` nearest of the stored keys
    (all of them where `k` is at least their number).

    Args:
        queries: the layer's queries $q$ (not normalised).
        keys: the stored keys $\hat{k}$, normalised.
        values: the stored values.
        scale: $s$ per head.
        k: how many keys each query attends over.
        index: how the nearest are found (`INDEXES`).

    Shape:
        `queries` `[bsz, n_head, qlen, d_head]`; `keys`, `values` `[bsz, n_head, length, d_head]`; `scale`
        `[n_head]`; returns `[bsz, n_head, qlen, d_head]`.
    """
    # $\hat{q} = q / \lVert q \rVert$
    queries = torch.nn.functional.normalize(queries, dim=-1)
    k = min(k, keys.shape[2])
    # $K_m$, $V_m$: each query's neighbours, `[bsz, n_head, qlen, k, d_head]`
    nearest = nearest_keys(queries, keys, k, index)
    gather = nearest.flatten(2)[..., None].expand(-1, -1, -1, keys.shape[-1])
    neighbour_keys = keys.gather(2, gather).unflatten(2, nearest.shape[2:])
    neighbour_values = values.gather(2, gather).unflatten(2, nearest.shape[2:])
    # $s\, \hat{q}_i^\top \hat{k}_{m,j}$
    scores = torch.einsum('bhqd,bhqkd->bhqk', queries, neighbour_keys) * scale[:, None, None]
    # $\mathop{softmax}_j(\cdot)\, V_m$
    return torch.einsum('bhqk,bhqkd->bhqd', scores.softmax(dim=-1), neighbour_values)
