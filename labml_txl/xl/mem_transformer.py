r"""
# Transformer-XL language model with segment-level recurrence

From *Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context* (Dai et al., 2019).
A text is read in segments of `tgt_len` tokens. Each layer $n$ attends over its own segment *and* a memory of
up to `mem_len` hidden states of the layer below from earlier segments, kept without gradient:

$$\tilde{h}^{n-1}_{\tau+1} = [\mathop{SG}(m^{n-1}_{\tau}) \circ h^{n-1}_{\tau+1}], \qquad
  h^n_{\tau+1} = \mathop{Layer}^n(\text{queries } h^{n-1}_{\tau+1}, \text{keys and values } \tilde{h}^{n-1}_{\tau+1})$$

so information flows $N \times$ `mem_len` tokens back through $N$ layers, and evaluation reuses the memory
instead of recomputing a sliding window. Relative positions (`attn_type` 0) make this possible: a cached
state carries no absolute position that would clash with the next segment's.

## Memories

`model(data, target, *mems)` returns `[loss, *new_mems]`: `n_layer + 1` tensors `[mlen, bsz, d_model]`,
the inputs of every layer (the dropped-out word embeddings first, then each layer's output; the last
layer's output is cached too, as in the original, though no layer reads it). After a segment of `qlen`
inputs over a memory of `mlen`, the concatenation `[memory, segment]` is cut to
`[beg, end)` with the original's rule

$$\mathit{end} = \mathit{qlen} + \max(0, \mathit{mlen} - \mathit{ext\_len}), \qquad
  \mathit{beg} = \max(0, \mathit{end} - \mathit{mem\_len})$$

(the original's comment means `mlen + max(0, qlen - ext_len)`; its call swaps the two lengths. Both agree
whenever `mlen >= ext_len`, so with `ext_len == 0` always; they differ on a first segment with `ext_len > 0`,
where the original keeps the whole segment. The rule is kept so that its numbers reproduce.)

Memories never exceed `mem_len`, are detached (no autograd graph) and are only read: no later segment changes
a returned tensor in place. In no-grad evaluation, those that keep rows of the memory before are views of append
buffers (`append_buffer.py`) that later segments write after, never into. With `same_length`, every query attends
to the same number (`mem_len`) of keys, as the paper's evaluation does.

## Positions by attention type

The original's types 0 to 3 take their position tables from the model (`model_positions.py`: sinusoids of the
distances for 0, learned relative tables for 1, absolute embeddings added to the layer inputs for 2 and 3); every
other scheme keeps its positions in its attention (`positions/`).

## Memory mechanisms

Transformer-XL's memory is the first of the memory mechanisms (`labml_txl/memories/`, `docs/memories.md`); every
registered one is built when its size setting is above 0 (the compressed memory with `cmem_len > 0`, the Recurrent
Memory Transformer's memory tokens with `n_mem_tokens > 0`, the Memorizing Transformer's kNN memory with
`knn_mem_size > 0`, ...), and the recurrence carries them through the same segment step. What a mechanism joins
before the memory each layer attends over as one longer memory, `[compressed memory, memory, segment]`, what it places
around the segment (memory tokens) the layers compute with it, under every attention type, and a layer's second
attention (the kNN memory's retrieval) is combined with the layer's own before its output projection; its state
follows the memories in the list a segment takes and returns (`memories/state.py`).
"""
from dataclasses import astuple
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..attention.masks import decoder_window_mask
from ..errors import require_bool
from ..fast import dispatch
from ..fast.dispatch import Plan, check_impl
from ..fast.dropout import Dropout
from ..memories.carried import BuiltMechanisms, SegmentStates
from ..memories.mechanism import MemoryMechanism, ModelSizes, Segment
from ..memories.state import StateLayout
from ..positions import registry
from ..positions.scheme import SchemeSettings
from . import fused_step
from .adaptive_embedding import AdaptiveEmbedding
from .attention import KeysValues
from .arguments import check_model_arguments
from .checks import (check_clamp_len, check_forward_flags, check_lengths, check_same_length, check_target_shape,
                     check_tokens, require_token_tensor)
from .formats import hf as hf_format
from .init import init_weights
from .layers import DecoderLayer
from .output_head import OutputHead
from .memory import ModelMemory, held_rows
from .model_positions import model_positions



class MemTransformerLM(nn.Module):
    """
    The Transformer-XL language model: the original's constructor, calling convention and parameter names.

    Args:
        n_token: vocabulary size.
        n_layer: number of layers.
        n_head: number of attention heads.
        d_model: features of the hidden states.
        d_head: features per head.
        d_inner: hidden features of the feed-forward networks.
        dropout: dropout on embeddings, positions, attention outputs, feed-forward networks and the last layer.
        dropatt: dropout on the attention weights.
        tie_weight: share the output layers' weights with the input embeddings.
        d_embed: features of the (first cluster of the) embeddings; `d_model` when None.
        div_val: the adaptive embedding/softmax divides the features by this from one cluster to the next.
        tie_projs: per cluster (`len(cutoffs) + 1` booleans), share the softmax projection with the
            embedding projection; the default `[False]` ties none.
        pre_lnorm: layer normalisation before attention and feed-forward (pre-LN) instead of after.
        tgt_len, ext_len, mem_len: segment length, extended context and memory length
            (`ext_len`/`mem_len` None mean 0; `tgt_len` may be None for `attn_type` 0 and 2).
        cutoffs: cluster boundaries of the adaptive embedding and softmax; `[]` for a plain softmax.
        adapt_inp: kept for the original's signature (it did not use it).
        same_length: every query attends to the same number of keys (`mem_len`).
        attn_type: the positional scheme (`labml_txl/positions/registry.py`), by its integer or its name:
            0 `'relative'` (the paper), 1 `'learnable'` (learned relative), 2 `'absolute'` (sinusoidal),
            3 `'absolute_deeper'` (learned absolute); (new) 4 `'rotary'`, 5 `'alibi'`, 6 `'t5_bias'`, and any
            scheme registered by name only, whose positions are its attention's (`clamp_len` does not apply to
            them: T5's buckets stop at `t5_max_distance` of their own). Kept as `model.attn_type`, the integer
            where the scheme has one.
        clamp_len: clip distances (types 0, 2) or the learned table (type 1) at this length; `<= 0` for none.
        sample_softmax: `> 0` trains with a sampled softmax over that many (times 2) log-uniform draws
            (and evaluates with the full softmax of `out_layer`); `<= 0` uses the adaptive softmax `crit`.
        untie_r: (new) per-layer $u$, $v$ biases for `attn_type` 0, stored as `layers.N.dec_attn.r_w_bias`
            and `r_r_bias`, as the authors' TensorFlow code and their published WikiText-103 model have them.
        init, init_range, init_std, proj_init_std: (new) the original's initialisation (`xl.init.init_weights`),
            applied in the constructor.
        original_numerics: (new) every numerical choice of the original where this package differs by default
            (the published checkpoints load with it on): the scaled scores of `attn_type` 0 rounded to float32 before
            the softmax (a change in float64 only), and with `pre_lnorm` the queries of types 2 and 3 from the
            un-normalised input. Only for the original's types 0-3; not its in-place addition of positions to the
            cached memories of types 2 and 3 (an aliasing bug, not a choice of numerics). Off by default.
        norm: (new) `'layer_norm'` (the original's) or `'rms_norm'` (RMSNorm, Zhang & Sennrich, 2019) in every
            layer (`labml_txl/transformer/norms.py`); either is kept as `layer_norm`, RMSNorm without a bias.
        rotary_fraction: (new) the fraction of each head's features that `attn_type` 4 rotates, in (0, 1].
        t5_num_buckets, t5_max_distance: (new) the causal distance buckets of `attn_type` 6 (`positions/t5_bias.py`).
        impl: (new) how to compute: `'auto'` (the default) lets `labml_txl.fast.dispatch` pick, per call, the fastest
            implementation that serves it (each refused path with a reason, `dispatch.recording()`); `'reference'`
            runs the readable specification, the original's computation, nothing kept across calls. The two agree to
            float rounding and draw the same dropout masks. Also an attribute (`model.impl = 'reference'`): it
            chooses how to compute, not what, so configs and checkpoints do not carry it.
        **memory_settings: (new) the settings of every registered memory mechanism (`memories.registry.settings()`,
            `docs/memories.md`), checked whether it is on or not: the compressed memory's `cmem_len`,
            `compression_rate`, `compression`; the memory tokens' `n_mem_tokens`, `bptt_segments`; the kNN memory's
            `knn_mem_size`, `knn_k`, `knn_layers`, `knn_index`; each off at its default. A mechanism's state follows
            the memories in the list of memories.

    Shape:
        `data` `[qlen, bsz]` token ids; `target` `[tgt_len, bsz]` with `tgt_len <= qlen` (the last `tgt_len`
        inputs are scored); memories `n_layer + 1` tensors `[mlen, bsz, d_model]`; loss `[tgt_len, bsz]`,
        in position order.
    """

    def __init__(self, n_token: int, n_layer: int, n_head: int, d_model: int, d_head: int, d_inner: int,
                 dropout: float, dropatt: float, tie_weight: bool = True, d_embed: Optional[int] = None,
                 div_val: int = 1, tie_projs: Sequence[bool] = (False,), pre_lnorm: bool = False,
                 tgt_len: Optional[int] = None, ext_len: Optional[int] = None, mem_len: Optional[int] = None,
                 cutoffs: Sequence[int] = (), adapt_inp: bool = False, same_length: bool = False,
                 attn_type: int = 0, clamp_len: int = -1, sample_softmax: int = -1, *,
                 untie_r: bool = False, init: str = 'normal', init_range: float = 0.1, init_std: float = 0.02,
                 proj_init_std: float = 0.01, original_numerics: bool = False, norm: str = 'layer_norm',
                 rotary_fraction: float = 1.0, t5_num_buckets: int = 32, t5_max_distance: int = 128,
                 impl: str = 'auto', **memory_settings: Any):
        super().__init__()
        checked = check_model_arguments(
            n_token=n_token, n_layer=n_layer, n_head=n_head, d_model=d_model, d_head=d_head, d_inner=d_inner,
            dropout=dropout, dropatt=dropatt, tie_weight=tie_weight, d_embed=d_embed, div_val=div_val,
            tie_projs=tie_projs, pre_lnorm=pre_lnorm, tgt_len=tgt_len, ext_len=ext_len, mem_len=mem_len,
            cutoffs=cutoffs, adapt_inp=adapt_inp, same_length=same_length, attn_type=attn_type, clamp_len=clamp_len,
            sample_softmax=sample_softmax, untie_r=untie_r, init=init, init_range=init_range, init_std=init_std,
            proj_init_std=proj_init_std, original_numerics=original_numerics, norm=norm,
            rotary_fraction=rotary_fraction, t5_num_buckets=t5_num_buckets, t5_max_distance=t5_max_distance,
            memory_settings=memory_settings)
        scheme, attn_type, d_embed, cutoffs, tie_projs, ext_len, mem_len, memory_settings = astuple(checked)
        # What every layer's scheme reads: a causal decoder's, with the layers' own u, v with `untie_r`
        settings = SchemeSettings(bidirectional=False, rotary_fraction=rotary_fraction, t5_num_buckets=t5_num_buckets,
                                  t5_max_distance=t5_max_distance, own_biases=untie_r)
        self.n_token, self.d_embed, self.d_model, self.n_head, self.d_head = n_token, d_embed, d_model, n_head, d_head
        self.n_layer, self.cutoffs, self.div_val, self.tie_weight = n_layer, cutoffs, div_val, tie_weight
        self.adapt_inp, self.untie_r, self.norm, self.original_numerics = adapt_inp, untie_r, norm, original_numerics
        self.tgt_len, self.mem_len, self.ext_len, self.attn_type = tgt_len, mem_len, ext_len, attn_type
        self.same_length, self.clamp_len, self.sample_softmax = same_length, clamp_len, sample_softmax
        self.word_emb = AdaptiveEmbedding(n_token, d_embed, d_model, cutoffs, div_val=div_val)
        self.drop = Dropout(dropout)
        self.layers = nn.ModuleList(DecoderLayer(n_head, d_model, d_head, d_inner, dropout, dropatt=dropatt,
                                                 pre_lnorm=pre_lnorm, positions=registry.build(scheme, settings),
                                                 original_numerics=original_numerics, norm=norm)
                                    for _ in range(n_layer))
        # The adaptive softmax `crit`, or the sampled softmax's `out_layer` (`output_head.py`)
        self._head = OutputHead(self, n_token, d_embed, d_model, cutoffs, div_val, tie_weight, tie_projs,
                                sample_softmax)
        # Every memory mechanism that is on, at its attribute (`memories/carried.py`)
        self._mechanisms = BuiltMechanisms(self, ModelSizes(n_layer, d_model, n_head, d_head), mem_len, memory_settings)
        # Length of the learned tables of attention types 1 and 3
        self.max_klen = (tgt_len or 0) + ext_len + mem_len + self._mechanisms.added_rows(mem_len)
        # The position tables of the original's types, on the model (`model_positions.py`)
        self._model_positions = model_positions(attn_type)
        self._model_positions.add_parameters(self)
        init_weights(self, init=init, init_range=init_range, init_std=init_std, proj_init_std=proj_init_std)
        # What evaluation keeps between calls: positions, masks, kept keys and values, buffers (`memory.py`)
        self._memory = ModelMemory()
        self.impl = impl

    @property
    def impl(self) -> str:
        """`'auto'` or `'reference'` (see the class docstring)."""
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        self._impl = check_impl(value)
        self._drop_caches()

    def memories_on(self) -> List[MemoryMechanism]:
        """The mechanisms the recurrence carries now, in the registry's order."""
        return self._mechanisms.on(self.mem_len)

    def written_per_segment(self) -> bool:
        """Whether a mechanism on changes its state once per segment (memory tokens, a kNN store), so a segment's
        tokens are computed in one call, over the state before it."""
        return any(mechanism.written_per_segment for mechanism in self.memories_on())

    def gradient_segments(self) -> int:
        """Through how many segments training back-propagates into the mechanisms' states (`bptt_segments`)."""
        return max([mechanism.gradient_segments() for mechanism in self.memories_on()], default=1)

    def aux_loss_series(self) -> Dict[str, str]:
        """The auxiliary losses of the mechanisms on, by name, and the series each is tracked as (`'ar_loss'`)."""
        return {name: series for mechanism in self.memories_on() for name, series in mechanism.losses.items()}

    @property
    def cmem_len(self) -> int:
        """The compressed memory's length (0 for none)."""
        return 0 if self.compressed_memory is None else self.compressed_memory.cmem_len

    def _apply(self, fn, *args, **kwargs):
        # A new dtype or device: the cached positions and masks are of the old ones
        self._drop_caches()
        return super()._apply(fn, *args, **kwargs)

    def _drop_caches(self) -> None:
        """Forget the cached positions and masks, the kept keys and values and the memories' buffers."""
        self._memory.clear()

    def reset_length(self, tgt_len: int, ext_len: int, mem_len: int, *, same_length: Optional[bool] = None,
                     clamp_len: Optional[int] = None, **memory_sizes: Any) -> None:
        """
        Change the segment, extended-context and memory lengths (e.g. a longer memory for evaluation); `tgt_len`
        may be None as in the constructor. `same_length`, `clamp_len` and the sizes a built memory mechanism lets
        evaluation change (`cmem_len` of a model with a compressed memory), where given, change those too (the
        paper's evaluation sets the first four). Each is checked as the constructor checks it, before anything
        changes.
        """
        same_length = self.same_length if same_length is None else same_length
        clamp_len = self.clamp_len if clamp_len is None else clamp_len
        memory_sizes = {name: value for name, value in memory_sizes.items() if value is not None}
        check_lengths(tgt_len, ext_len, mem_len, allow_none_tgt=not self._model_positions.sized_by_lengths)
        require_bool('same_length', same_length)
        check_same_length(same_length, mem_len)
        check_clamp_len(clamp_len)
        resets = self._mechanisms.resets(memory_sizes, mem_len)
        # Masks with `same_length` depend on `mem_len`: start the caches afresh
        self._drop_caches()
        self.tgt_len = tgt_len
        self.mem_len = mem_len
        self.ext_len = ext_len
        self.same_length = same_length
        self.clamp_len = clamp_len
        for mechanism, sizes in resets.items():
            mechanism.reset(sizes)

    def init_mems(self, bsz: Optional[int] = None) -> Optional[List[torch.Tensor]]:
        """Empty memories (`n_layer + 1` tensors, `[0, bsz, d_model]`, or `[0]` as the original when `bsz`
        is not given, then every other mechanism's state, e.g. `n_layer` compressed memories where `cmem_len > 0`),
        or None when no mechanism keeps a state (`mem_len` 0 and no other on)."""
        layout = StateLayout(self.memories_on())
        return layout.initial(bsz, self.word_emb.emb_layers[0].weight) if layout.length else None

    # -- Hugging Face's TransfoXL folders (`hf_format.py`) --

    @classmethod
    def from_pretrained(cls, path, **overrides) -> 'MemTransformerLM':
        """A model from a folder as Hugging Face's `TransfoXLLMHeadModel.save_pretrained` writes it (transformers
        4.44), read without executing pickled code; `overrides` (constructor keywords, e.g. `mem_len=1600`) replace
        the config's. In evaluation mode and float32, as Hugging Face returns it; what is refused, before any weight
        is read: `hf_format.load_pretrained`."""
        return hf_format.load_pretrained(cls, path, **overrides)

    def save_pretrained(self, path) -> None:
        """Write this model into the folder `path` as Hugging Face's TransfoXL (`config.json`, `model.safetensors`,
        which transformers 4.44 reads); a `ValueError` names what Hugging Face cannot represent, and a failed write
        leaves the folder as it was (`hf_format.save_pretrained`)."""
        hf_format.save_pretrained(self, path)

    # -- checks at the point of entry --

    def _check_inputs(self, plan: Plan, data: torch.Tensor, mems) -> Optional[List[torch.Tensor]]:
        """The states as a list (a new stream's where none were given), or an exception naming what is wrong."""
        check_tokens('data', data, self.n_token, check_values=not plan.compiling)
        if mems is None or len(mems) == 0:
            return self.init_mems(data.shape[1])
        self.check_mems(mems, data.shape[1], plan.autocast)
        return list(mems)

    def check_mems(self, mems: Sequence[torch.Tensor], bsz: int, autocast: Optional[torch.dtype] = None) -> None:
        """
        A `ValueError` or `TypeError` naming what is wrong with `mems` as the states of a batch of `bsz` for this
        model as it is set now (`StateLayout.check`): their number, or a tensor's dtype, device, features or batch.

        Args:
            mems: the flat list of states, as `forward` takes them.
            bsz: the batch size of the data they go with.
            autocast: the dtype of the autocast region the forward runs in, if any.
        """
        weight = self.word_emb.emb_layers[0].weight
        # Hidden states are of the parameters' dtype, or of autocast's where it runs (a projected embedding)
        dtypes = {weight.dtype} | ({autocast} if autocast is not None else set())
        StateLayout(self.memories_on()).check(list(mems), bsz, weight, dtypes)

    # -- the model --

    def _attn_mask(self, qlen: int, mlen: int, device: torch.device) -> torch.Tensor:
        """`[qlen, klen, 1]`, True where query $i$ may not see key $j$."""
        klen = mlen + qlen
        # The future, $j > m + i$; with `same_length` also the keys more than `mem_len` before the query, so every
        # query sees the same number (the original's `triu(1 + mlen) + tril(-mask_shift_len)`, whose
        # `mlen + mask_shift_len` keys a query sees are `min(mem_len, klen)`)
        return decoder_window_mask(qlen, klen, self._attention_window(klen), device)[:, :, None]

    def _attention_window(self, klen: int) -> int:
        """How many keys up to its own position a query sees, of `klen`: all, or `mem_len` with `same_length` (and the
        rows the mechanisms add, e.g. `cmem_len` more with a compressed memory)."""
        return min(self.mem_len + self._mechanisms.added_rows(self.mem_len), klen) if self.same_length else klen

    def _forward(self, plan: Plan, dec_inp: torch.Tensor, all_mems: Optional[List[torch.Tensor]],
                 losses: bool = False, carry_gradient: bool = False
                 ) -> Tuple[torch.Tensor, List[torch.Tensor], Dict[str, torch.Tensor]]:
        """The last layer's output `[qlen, bsz, d_model]` at the segment's tokens, the flat state for the next segment
        (`memories/state.py`; keeping its graph where a mechanism's does and `carry_gradient`) and, with `losses`,
        every mechanism's auxiliary losses of the segment by name (else none)."""
        states = SegmentStates(self.memories_on(), all_mems, self.xl_memory)
        # Transformer-XL's memories $m^{n-1}$, where it is on
        mems, mlen = states.memories, states.mlen
        # What each layer attends to before its segment, oldest first: the rows the other mechanisms join, then
        # $\mathop{SG}(m^{n-1})$ (with the compressed memory $[\mathop{SG}(cm^{n-1}) \circ \mathop{SG}(m^{n-1})]$),
        # `alen` rows
        attended = states.attended(self.n_layer)
        alen = 0 if attended is None else attended[0].shape[0]
        # $h^0$, the word embeddings, with the rows mechanisms place around them (the Recurrent Memory Transformer's
        # read and write memory tokens): `qlen` rows in all, the segment's tokens at `tokens`
        core_out, tokens, placed = states.first_layer_rows(self.word_emb(dec_inp))
        core_out = self.drop(core_out)
        qlen = core_out.shape[0]
        klen = alen + qlen
        mask = self._memory.shaped(plan, ('mask', qlen, alen, self.mem_len, self.same_length, core_out.device),
                                   lambda: self._attn_mask(qlen, alen, core_out.device))
        # What the original's types read of positions in every layer (the sinusoids of types 0 and 2,
        # `[klen, 1, d_model]`)
        added = self._mechanisms.added_rows(self.mem_len)
        longest = added + self.mem_len + max(qlen, self.tgt_len or 0)
        pos_emb = self._model_positions.shared(self, plan, klen, longest, core_out)
        pos_emb = None if pos_emb is None else self.drop(pos_emb)
        # The keys and values of each memory, kept from the segment before where this call keeps them (`kv_memo.py`:
        # without gradients, for the types whose memory is projected as it is, all but 2 and 3; not where a mechanism
        # joins rows before the memory, which it joins anew at every segment)
        keep_kv = self._memory.keeps_keys_values(plan, exact=self._model_positions.projects_memory_as_is
                                                 and self.mem_len > 0 and added == 0)
        mems_kv = self._memory.kept_keys_values(self.layers, mems if mlen > 0 and keep_kv else None)
        # Each layer's second attention, where a mechanism adds one (the kNN memory's retrieval); and whether the
        # layers' keys and values are wanted: kept for the next segment, or read by a mechanism
        branches = states.attention_branches(self.n_layer)
        want_kv = keep_kv or states.reads_keys_values()
        window, parts = self._attention_window(klen), self._memory.layer_parts(self.layers)
        if dispatch.decoder_layers(plan, core_out, klen, window, parts, [alen == 0 or kv is not None
                                                                          for kv in mems_kv],
                                   [branch is not None for branch in branches]) == 'fused':
            hids, keys_values = self._fused_layers(plan, core_out, klen, window, parts, mems_kv, pos_emb)
        else:
            hids, keys_values = [core_out], []
            for i, layer in enumerate(self.layers):
                # $h^n = \mathop{Layer}^n(h^{n-1}, [\mathop{SG}(m^{n-1}) \circ h^{n-1}])$
                layer_in, mems_i, position_args = self._model_positions.layer_inputs(
                    self, i, hids[-1], attended[i] if alen > 0 else None, alen, klen, pos_emb)
                out = layer(layer_in, *position_args, dec_attn_mask=mask, mems=mems_i, mems_kv=mems_kv[i],
                            plan=plan, return_kv=want_kv, branch=branches[i])
                if want_kv:
                    out, kv = out
                    keys_values.append(kv)
                hids.append(out)
        outputs = hids[-1]
        if placed:
            # (the rows at the segment's tokens: those of the placed rows are the mechanisms')
            hids = [h[tokens] for h in hids]
        if not states.states:
            return self.drop(hids[-1]), [], {}
        beg, end = self._mem_bounds(dec_inp.shape[0], mlen)
        segment = Segment(plan, self.layers, hids, None if mems is None else [held_rows(m) for m in mems],
                          states.evicted(beg), end, self._memory, keys_values if want_kv else [], outputs=outputs,
                          placed=placed, carry_gradient=carry_gradient, tokens=tokens, keeps_keys_values=keep_kv)
        return (self.drop(hids[-1]),) + states.after(segment, losses)

    def _fused_layers(self, plan: Plan, core_out: torch.Tensor, klen: int, window: int,
                      parts: List[fused_step.LayerParts], mems_kv: List[Optional[torch.Tensor]],
                      pos_emb: Optional[torch.Tensor]) -> Tuple[List[torch.Tensor], List[KeysValues]]:
        """Every layer's input and the last layer's output, and every layer's `KeysValues`, by one call of our
        decoder-layer kernel (`fused_step.py`), each layer's position terms from its attention."""
        qlen, mlen = core_out.shape[0], klen - core_out.shape[0]
        terms = [layer.dec_attn.position_terms(plan, qlen, klen, core_out,
                                               *self._model_positions.layer_inputs(self, i, core_out, None, mlen, klen,
                                                                                   pos_emb)[2])
                 for i, layer in enumerate(self.layers)]
        outputs, keys_values = fused_step.run(core_out, window, parts, terms, mems_kv)
        return [core_out] + outputs, keys_values

    def _mem_bounds(self, qlen: int, mlen: int) -> Tuple[int, int]:
        """`[beg, end)` of `[memory, segment]` that becomes the next memory, by the original's rule (see the
        module docstring)."""
        end_idx = qlen + max(0, mlen - self.ext_len)
        return max(0, end_idx - self.mem_len), end_idx

    def forward(self, data: torch.Tensor, target: torch.Tensor, *mems: torch.Tensor,
                return_aux_losses: bool = False, return_reconstruction_loss: bool = False,
                carry_gradient: bool = False) -> List[Any]:
        """
        The original's calling convention: `[loss, *new_mems]`, loss `[tgt_len, bsz]` in position order, `new_mems`
        every state (`memories/state.py`; empty where none is kept). The loss is the sampled softmax's in training
        with `sample_softmax > 0`, else the full (adaptive) softmax's negative log-likelihood. `data` and `target`
        are tensors (`checks.require_token_tensor` says why a list is refused).

        With `return_aux_losses`, `[loss, aux_losses, *new_mems]`: the mechanisms' auxiliary losses, a scalar by name
        (`MemoryMechanism.losses`), which training weighs by name. With `return_reconstruction_loss` (a compressed
        memory only), `[loss, reconstruction_loss, *new_mems]`: its `'reconstruction'` loss of the memories this
        segment compresses (`memories/compressed.py`). With `carry_gradient`, the states trained through the
        recurrence (memory tokens) keep their graph, for training's window of `gradient_segments()` segments.
        """
        device = self.word_emb.emb_layers[0].weight.device
        require_token_tensor('data', data, device)
        require_token_tensor('target', target, device)
        check_forward_flags(return_aux_losses, return_reconstruction_loss, carry_gradient,
                            self.compressed_memory is not None)
        plan = Plan.now(data.device, self.impl)
        mems = self._check_inputs(plan, data, mems)
        check_tokens('target', target, self.n_token, check_values=not plan.compiling)
        check_target_shape(target, data)
        tgt_len = target.shape[0]
        hidden, new_mems, aux_losses = self._forward(plan, data, mems, return_aux_losses or return_reconstruction_loss,
                                                     carry_gradient)
        loss = self._head.loss(hidden[-tgt_len:], target, plan)
        if return_aux_losses:
            return [loss, aux_losses] + new_mems
        if return_reconstruction_loss:
            return [loss, aux_losses['reconstruction']] + new_mems
        return [loss] + new_mems

    # -- the clean API for new code --

    def forward_hidden(self, data: torch.Tensor, mems: Optional[Sequence[torch.Tensor]] = None
                       ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """
        Hidden states of the last layer and the states for the next segment (`data` a tensor, as for `forward`).

        Shape:
            `data` `[qlen, bsz]`; `mems` as returned before (None or `[]` for a new stream); returns
            `hidden` `[qlen, bsz, d_model]` and `n_layer + 1` memories (none when `mem_len` is 0), then every other
            mechanism's state.
        """
        require_token_tensor('data', data, self.word_emb.emb_layers[0].weight.device)
        plan = Plan.now(data.device, self.impl)
        mems = self._check_inputs(plan, data, mems)
        hidden, new_mems, _ = self._forward(plan, data, mems)
        return hidden, new_mems

    def hidden_to_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary log-probabilities `[..., n_token]` of hidden states `[..., d_model]`
        (the adaptive softmax's when `sample_softmax <= 0`, else the full softmax of `out_layer`)."""
        return self._head.log_probs(hidden, Plan.now(hidden.device, self.impl))

    def log_probs(self, data: torch.Tensor, mems: Optional[Sequence[torch.Tensor]] = None
                  ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """
        $\\log p(x_{t+1} = w \\mid x_{\\le t})$ for every position and word, and the new memories: for
        evaluation and generation. `log_probs[t, b, target[t, b]] == -loss[t, b]`.

        Shape:
            `data` `[qlen, bsz]`; returns `[qlen, bsz, n_token]` and the memories (see `forward_hidden`).
        """
        hidden, new_mems = self.forward_hidden(data, mems)
        return self.hidden_to_log_probs(hidden), new_mems

    def logits(self, data: torch.Tensor, mems: Optional[Sequence[torch.Tensor]] = None
               ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """
        Unnormalised scores whose softmax is the model's next-word distribution, `[qlen, bsz, n_token]`,
        and the new memories. The plain softmax's logits; with clusters (the adaptive softmax has no single
        logit per word) they are the log-probabilities, which have the same softmax.
        """
        hidden, new_mems = self.forward_hidden(data, mems)
        return self._head.logits(hidden, Plan.now(hidden.device, self.impl)), new_mems
