r"""
# The Memorizing Transformer's kNN memory

*Memorizing Transformers* (Wu et al., ICLR 2022) give one layer near the top of the stack an external memory: a FIFO
store of the keys and values that layer's attention computed for earlier segments, `knn_mem_size` of them per layer
and batch column, kept without gradient. Each query of the layer attends twice: over its local context, as every
layer does (here Transformer-XL's attention over its memory and segment, with the layer's positional scheme), and
over its top-`knn_k` stored keys per head with its own softmax and no positions (`retrieval.py`),

$$v_{c,i} = \mathop{Attn}_{\text{local}}(q_i), \qquad
  v_{m,i} = \mathop{softmax}_j\bigl(s_h\, \hat{q}_i^\top \hat{k}_{m,j}\bigr)\, V_m,$$

and a learned gate per head mixes the two before the output projection:

$$v_i = g_h\, v_{m,i} + (1 - g_h)\, v_{c,i}, \qquad g_h = \sigma(b_h).$$

Keys and queries of the retrieval are normalised (the paper's remedy for the staleness of keys stored by earlier
parameters); the scale $s_h$ is learned per head, started at $\sqrt{d_{head}}$, where a normalised product of
unit-variance vectors has the spread that $q^\top k / \sqrt{d_{head}}$ has (the paper says the keys and queries are
normalised and leaves the scale unstated). $b_h$ starts at 0, $g_h = 1/2$. The local attention is the layer's own,
unchanged: with the gate closed ($g_h = 0$) the layer is Transformer-XL's.

After a segment, its keys and values at the layer (those of the rows Transformer-XL's memory would keep: not the
`ext_len` rows the next segment reads again, not the rows other mechanisms place around the segment) are appended to
the store, which keeps its last `knn_mem_size`: a query retrieves among earlier segments only, as the paper's does,
so sampling goes by segments (`xl/generation.py`). Before the first segment, and after a new stream starts (a new
pass over the data, the memories' reset), the store is empty and the layer's attention is the local one alone. Our
corpora are single streams that mark no document boundary, so nothing else clears it.

`knn_layers` lists the layers by index (negative from the top, as Python's); empty, the default, is one layer at
$\lfloor 3N/4 \rfloor - 1$ (the 9th of 12), near the top as the paper places its one.
"""
from functools import partial
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn

from ..errors import require_one_of, require_positive_int
from .mechanism import AttentionBranch, MemoryMechanism, ModelSizes, Segment, Setting, State
from .retrieval import INDEXES, attend_to_nearest


def default_knn_layer(n_layer: int) -> int:
    r"""The layer of `knn_layers=[]`: $\max(0, \lfloor 3N/4 \rfloor - 1)$."""
    return max(0, 3 * n_layer // 4 - 1)


def knn_layer_indices(knn_layers: Sequence[int], n_layer: int) -> List[int]:
    """The kNN layers of `knn_layers` as indices `0 .. n_layer - 1`, in order, or a `ValueError` naming what is
    wrong."""
    if not isinstance(knn_layers, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in knn_layers):
        raise ValueError(f"knn_layers={knn_layers!r} is not accepted: a list of layer indices (negative from the top), "
                         f"or [] for one near the top")
    if not knn_layers:
        return [default_knn_layer(n_layer)]
    wrong = [i for i in knn_layers if not -n_layer <= i < n_layer]
    if wrong:
        raise ValueError(f"knn_layers={list(knn_layers)!r} is not accepted with n_layer={n_layer}: {wrong} are not "
                         f"layers; indices {-n_layer} to {n_layer - 1}")
    indices = [i % n_layer for i in knn_layers]
    if len(set(indices)) != len(indices):
        raise ValueError(f"knn_layers={list(knn_layers)!r} is not accepted: it names a layer twice")
    return sorted(indices)


class KnnMemory(MemoryMechanism):
    """
    The Memorizing Transformer's kNN memory (see the module docstring); on with `knn_mem_size > 0`.

    Args:
        sizes: the model's sizes.
        settings: `knn_mem_size` (the keys and values each kNN layer stores per batch column), `knn_k` (how many of
            them each query attends over, per head), `knn_layers` (which layers) and `knn_index` (how the nearest are
            found, `retrieval.INDEXES`).

    Shape:
        the states `'keys'` (normalised) and `'values'` are one tensor per kNN layer, `[length, bsz, n_head, d_head]`,
        `length <= knn_mem_size`, oldest first.
    """
    size = 'knn_mem_size'
    settings = {
        'knn_mem_size': Setting(int, 0, "kNN memory (the Memorizing Transformer): the past keys and values each kNN "
                                        "layer stores per sequence, first in first out (0: none)"),
        'knn_k': Setting(int, 32, "kNN memory: how many stored keys each query attends over, per head"),
        'knn_layers': Setting(list, [], "kNN memory: the layers that keep a store, by index (negative from the "
                                        "top); [] for one near the top, 3 * n_layer // 4 - 1"),
        'knn_index': Setting(str, 'torch', "kNN memory: how the nearest keys are found, 'torch' (exact) or 'faiss' "
                                           "(faiss-cpu's exact index, the faiss extra)"),
    }
    attribute = 'knn_memory'
    title = 'the kNN memory'
    reads_keys_values = True
    written_per_segment = True

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any], mem_len: int) -> None:
        require_positive_int('knn_mem_size', settings['knn_mem_size'], allow_zero=True)
        require_positive_int('knn_k', settings['knn_k'])
        require_one_of('knn_index', settings['knn_index'], INDEXES)
        # (the layers are checked against `n_layer` where the model is built)
        knn_layer_indices(settings['knn_layers'], 1 << 30)
        if settings['knn_mem_size'] > 0 and settings['knn_index'] == 'faiss':
            _require_faiss()

    def __init__(self, sizes: ModelSizes, settings: Mapping[str, Any]):
        super().__init__(sizes, settings)
        require_positive_int('knn_mem_size', self.knn_mem_size)
        self.layer_indices = knn_layer_indices(self.knn_layers, sizes.n_layer)
        n = len(self.layer_indices)
        # $b_h$ of each kNN layer: $g_h = \sigma(b_h) = 1/2$ to start
        self.gate = nn.Parameter(torch.zeros(n, sizes.n_head))
        # $s_h$ of each kNN layer, $\sqrt{d_{head}}$ to start
        self.scale = nn.Parameter(torch.full((n, sizes.n_head), sizes.d_head ** 0.5))

    def state_layout(self) -> Dict[str, int]:
        return {'keys': len(self.layer_indices), 'values': len(self.layer_indices)}

    def state_features(self, name: str) -> tuple:
        return self.sizes.n_head, self.sizes.d_head

    def describe_state(self, name: str) -> str:
        return (f"{len(self.layer_indices)} tensors of stored {name} [length, bsz, n_head, d_head] (one per layer of "
                f"knn_layers)")

    def state_title(self, name: str) -> str:
        return f'stored {name} of the kNN memory'

    def attention_branch(self, state: State, layer: int) -> Optional[AttentionBranch]:
        """Layer `layer`'s retrieval over its store, gated with its local attention; None for a layer without a store
        and for an empty store."""
        if layer not in self.layer_indices:
            return None
        j = self.layer_indices.index(layer)
        keys, values = state['keys'][j], state['values'][j]
        if keys.dim() != 4 or keys.shape[0] == 0:
            return None
        # `[length, bsz, n_head, d_head]` as `[bsz, n_head, length, d_head]`
        return partial(self._gated, keys.permute(1, 2, 0, 3), values.permute(1, 2, 0, 3), j)

    def _gated(self, keys: torch.Tensor, values: torch.Tensor, j: int, queries: torch.Tensor,
               local: torch.Tensor) -> torch.Tensor:
        r"""$v_i = g_h v_{m,i} + (1 - g_h) v_{c,i}$, from the queries `[bsz, n_head, qlen, d_head]` and the local
        attention's heads concatenated, `[qlen, bsz, n_head * d_head]` (returned so)."""
        retrieved = attend_to_nearest(queries, keys.to(queries.dtype), values.to(queries.dtype),
                                      self.scale[j].to(queries.dtype), self.knn_k, self.knn_index)
        # `[bsz, n_head, qlen, d_head]` as the local attention's `[qlen, bsz, n_head, d_head]`
        retrieved = retrieved.permute(2, 0, 1, 3)
        gate = torch.sigmoid(self.gate[j]).to(local.dtype)[:, None]
        local = local.unflatten(-1, (self.sizes.n_head, self.sizes.d_head))
        return (gate * retrieved + (1 - gate) * local).flatten(-2)

    def next_state(self, state: State, segment: Segment) -> State:
        r"""Each store with the segment's keys $\hat{k}$ (normalised) and values appended, its last `knn_mem_size`
        kept; detached."""
        kept = segment.kept_rows()
        keys, values = [], []
        with torch.no_grad():
            for j, layer in enumerate(self.layer_indices):
                # `[2, bsz, n_head, rows, d_head]` of the segment's rows, as `[rows, bsz, n_head, d_head]`
                new_keys, new_values = segment.keys_values[layer].segment[:, :, :, kept].permute(0, 3, 1, 2, 4)
                new_keys = torch.nn.functional.normalize(new_keys, dim=-1)
                keys.append(_appended(state['keys'][j], new_keys, self.knn_mem_size))
                values.append(_appended(state['values'][j], new_values, self.knn_mem_size))
        return {'keys': keys, 'values': values}

    def check_reset(self, sizes: Mapping[str, Any], mem_len: int) -> None:
        """`knn_mem_size` (a larger store for evaluation, at least 1) and `knn_k` may change."""
        super().check_reset({name: value for name, value in sizes.items()
                             if name not in ('knn_mem_size', 'knn_k')}, mem_len)
        require_positive_int('knn_mem_size', sizes.get('knn_mem_size', self.knn_mem_size))
        require_positive_int('knn_k', sizes.get('knn_k', self.knn_k))

    def reset(self, sizes: Mapping[str, Any]) -> None:
        self.knn_mem_size = sizes.get('knn_mem_size', self.knn_mem_size)
        self.knn_k = sizes.get('knn_k', self.knn_k)


def _appended(store: torch.Tensor, rows: torch.Tensor, size: int) -> torch.Tensor:
    """The last `size` rows of `[store, rows]`."""
    joined = rows if store.dim() != 4 or store.shape[0] == 0 else torch.cat([store, rows.to(store.dtype)])
    return joined[-size:].detach()


def _require_faiss() -> None:
    """An `ImportError` saying how to install faiss, where it is missing."""
    import importlib.util
    if importlib.util.find_spec('faiss') is None:
        raise ImportError("knn_index='faiss' needs faiss-cpu, which is not installed: `make test-faiss` installs "
                          "requirements/faiss.lock, or pip install -e '.[faiss]'; knn_index='torch' needs nothing")
