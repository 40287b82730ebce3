r"""
# The authors' TensorFlow checkpoints

The authors published the TensorFlow checkpoints of their best models (`tf/sota/download.sh` of the original
repository: `model.ckpt-0.*` for enwik8, text8 and WikiText-103, `model.ckpt-1191000.*` for One Billion Words),
written by their `tf/model.py`. This module reads such a checkpoint into a `MemTransformerLM`:

```
python -m labml_txl.xl.formats.tf_checkpoint pretrained_xl/tf_wt103/model/model.ckpt-0 --out wt103 --config eval.json
```

TensorFlow reads the file; it is an optional extra (`pip install -e '.[tf]'`) imported only here, when a
checkpoint is read.

## Variables

`tf/model.py` names its variables by scope. Dense kernels are `[in, out]`, the transpose of a `torch.nn.Linear`
weight; the projections `proj_W` and `proj` are `[d_i, d_model]`, the transpose of ours:

| TensorFlow variable | shape | here |
| --- | --- | --- |
| `transformer/adaptive_embed/lookup_table` (`div_val` 1) | `[n_token, d_embed]` | `word_emb.emb_layers.0.weight` |
| `transformer/adaptive_embed/proj_W` (`div_val` 1, $d_{embed} \ne d_{model}$) | `[d_embed, d_model]` | `word_emb.emb_projs.0`, transposed |
| `transformer/adaptive_embed/cutoff_{i}/lookup_table` | `[c_{i+1} - c_i, d_i]` | `word_emb.emb_layers.{i}.weight` |
| `transformer/adaptive_embed/cutoff_{i}/proj_W` | `[d_i, d_model]` | `word_emb.emb_projs.{i}`, transposed (the identity where the authors' `proj_same_dim=False` left it out) |
| `transformer/r_w_bias`, `r_r_bias` | `[n_head, d_head]` | `r_w_bias`, `r_r_bias` |
| the same with `untie_r` | `[n_layer, n_head, d_head]` | row $N$ to `layers.{N}.dec_attn.r_w_bias`, `r_r_bias` |
| `transformer/layer_{N}/rel_attn/qkv/kernel` | `[d_model, 3 n_head d_head]` | `layers.{N}.dec_attn.qkv_net.weight`, transposed |
| `transformer/layer_{N}/rel_attn/r/kernel`, `o/kernel` | | `r_net.weight`, `o_net.weight`, transposed |
| `transformer/layer_{N}/rel_attn/LayerNorm/gamma`, `beta` | `[d_model]` | `dec_attn.layer_norm.weight`, `bias` |
| `transformer/layer_{N}/ff/layer_1/kernel`, `bias` | `[d_model, d_inner]` | `pos_ff.CoreNet.0.weight` (transposed), `bias` |
| `transformer/layer_{N}/ff/layer_2/kernel`, `bias` | `[d_inner, d_model]` | `pos_ff.CoreNet.3.weight` (transposed), `bias` |
| `transformer/layer_{N}/ff/LayerNorm/gamma`, `beta` | `[d_model]` | `pos_ff.layer_norm.weight`, `bias` |
| `transformer/adaptive_softmax/bias` (no cutoffs) | `[n_token]` | `crit.out_layers.0.bias` |
| `transformer/adaptive_softmax/cutoff_{i}/b` | `[c_{i+1} - c_i]` | `crit.out_layers.{i}.bias` (rows $[c_i, c_{i+1})$ of `crit.out_layers.0.bias` with `div_val` 1) |
| `transformer/adaptive_softmax/cutoff_{i}/proj` | `[d_i, d_model]` | `crit.out_projs.{i}`, transposed; absent where the softmax shares the embedding's projection (`proj_share_all_but_first`) |
| `transformer/adaptive_softmax/cutoff_0/cluster_W`, `cluster_b` | `[n_clusters, d_embed]` | `crit.cluster_weight`, `cluster_bias`, **rows reversed** |

The softmax has no weights of its own: `tf/model.py` always scores with the embedding tables (`tie_weight`).
Variables below a converted one (the optimizer's `.../Adam`, `.../Adam_1`) and those outside `transformer/`
(`global_step`, ...) are left out; any other `transformer/` variable is an error, never dropped in silence.

## The order of the tail clusters in the head

The head's softmax scores the shortlist and one entry per tail cluster, whose weights are the rows of
`cluster_W`. `tf/model.py` (and Hugging Face's port) reads tail cluster $i$ (counting from 1) from the head's
column $c_1 + i - 1$, so from row $i - 1$ of `cluster_W`; the PyTorch original (and `ProjectedAdaptiveLogSoftmax`
here) from column $-i$, so from row $n_{clusters} - i$. The same model therefore needs the rows in reverse order:

$$\text{cluster\_weight}[n_{clusters} - i] = \text{cluster\_W}[i - 1]$$

With a single tail cluster the two orders agree, which is why only three or more clusters show the difference.

## The architecture comes from the checkpoint

Every size is read from the shapes of the variables (`read_architecture`): `n_token`, `cutoffs`, `d_embed` and
`div_val` from the embedding tables (and with `div_val` 1 the cutoffs from the softmax biases), `n_layer` from the
`layer_{N}` scopes, `n_head` and `d_head` from `r_w_bias` (`untie_r` from its rank), `d_model` and `d_inner` from
the first feed-forward kernel, `tie_projs` from which softmax projections are absent. What a checkpoint does not
hold, the evaluation settings (`tgt_len`, `mem_len`, `clamp_len`, `same_length`, ...), comes from `config`, a
dictionary of `MemTransformerLM`'s keywords; a size it also gives must agree with the checkpoint.
"""
import argparse
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from ...errors import closest
from ..mem_transformer import MemTransformerLM

SCOPE = 'transformer/'
EMBED = SCOPE + 'adaptive_embed/'
SOFTMAX = SCOPE + 'adaptive_softmax/'
INSTALL_HINT = "pip install 'labml_txl[tf]' (in a clone: pip install -e '.[tf]')"

# What `tf/model.py` always is: relative attention after the residual (post-LN), tied input and output weights
FIXED = {'attn_type': 0, 'pre_lnorm': False, 'tie_weight': True, 'sample_softmax': -1, 'norm': 'layer_norm'}
ARCHITECTURE = ('n_token', 'n_layer', 'n_head', 'd_model', 'd_head', 'd_inner', 'd_embed', 'div_val', 'cutoffs',
                'tie_projs', 'untie_r')
# A published checkpoint is for evaluation: no dropout unless the config asks for it
EVALUATION_DEFAULTS = {'dropout': 0.0, 'dropatt': 0.0}
_LAYER_SCOPE = re.compile(re.escape(SCOPE) + r'layer_(\d+)/')


class TFCheckpointError(ValueError):
    """A checkpoint that is not one of the authors' `tf/model.py`, or that does not fit the config."""


def _import_tensorflow():
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(f"Reading a TensorFlow checkpoint needs TensorFlow, an optional extra of labml_txl: "
                          f"{INSTALL_HINT}") from e
    return tf


def _listed(names, limit: int = 12) -> str:
    names = sorted(names)
    more = f' and {len(names) - limit} more' if len(names) > limit else ''
    return (', '.join(names[:limit]) + more) if names else 'none'


def checkpoint_prefix(path) -> str:
    """
    The prefix of a TensorFlow checkpoint (`.../model.ckpt-0`, the path before `.index` and `.data-*`) from the
    prefix itself, one of its files, or the folder that holds it with its `checkpoint` file.
    """
    path = Path(path)
    if path.is_dir():
        latest = _import_tensorflow().train.latest_checkpoint(str(path))
        if latest is None:
            raise TFCheckpointError(f"{path} is a folder whose TensorFlow `checkpoint` file is missing or names no "
                                    f"checkpoint there: give the checkpoint's prefix, the path before .index "
                                    f"(e.g. {path / 'model.ckpt-0'})")
        return latest
    prefix = re.sub(r'\.(index|meta|data-\d+-of-\d+)$', '', str(path))
    if not Path(prefix + '.index').is_file():
        raise TFCheckpointError(f"{path} is not accepted: there is no {prefix}.index; expected the prefix of a "
                                f"TensorFlow checkpoint, the path before .index and .data-00000-of-00001 "
                                f"(e.g. pretrained_xl/tf_wt103/model/model.ckpt-0), one of its files, or its folder")
    return prefix


def read_variable_shapes(prefix: str) -> Dict[str, Tuple[int, ...]]:
    """`{name: shape}` of every variable of the checkpoint at `prefix`."""
    return _variable_shapes(_import_tensorflow().train.load_checkpoint(prefix))


def _variable_shapes(reader) -> Dict[str, Tuple[int, ...]]:
    return {name: tuple(shape) for name, shape in reader.get_variable_to_shape_map().items()}


def _not_the_authors(shapes: Mapping[str, Tuple[int, ...]], what: str) -> TFCheckpointError:
    return TFCheckpointError(f"the checkpoint has no {what}, so it is not a Transformer-XL checkpoint of the "
                             f"authors' tf/model.py; its variables under {SCOPE}: "
                             f"{_listed(n for n in shapes if n.startswith(SCOPE))}")


def _shape(shapes: Mapping[str, Tuple[int, ...]], name: str, rank: int, what: str) -> Tuple[int, ...]:
    """The shape of variable `name` (`what`), which must be there with `rank` dimensions."""
    if name not in shapes:
        raise _not_the_authors(shapes, f"variable {name} ({what})")
    if len(shapes[name]) != rank:
        raise TFCheckpointError(f"variable {name} has shape {list(shapes[name])} in the checkpoint; tf/model.py "
                                f"makes it of {rank} dimensions ({what})")
    return shapes[name]


def _clusters(shapes: Mapping[str, Tuple[int, ...]], scope: str, leaf: str) -> List[Tuple[int, ...]]:
    """Shapes of `{scope}cutoff_{i}/{leaf}` for i = 0, 1, ... while they exist."""
    found = []
    while f'{scope}cutoff_{len(found)}/{leaf}' in shapes:
        found.append(shapes[f'{scope}cutoff_{len(found)}/{leaf}'])
    return found


def softmax_has_projections(arguments: Mapping[str, object]) -> bool:
    r"""Whether the adaptive softmax projects the hidden states per cluster (`crit.out_projs`): always with
    `div_val > 1`, with one table only when $d_{embed} \ne d_{model}$."""
    return arguments['div_val'] > 1 or arguments['d_embed'] != arguments['d_model']


def read_architecture(shapes: Mapping[str, Tuple[int, ...]]) -> Tuple[Dict[str, object], Dict[str, str]]:
    """
    The `MemTransformerLM` keywords that a checkpoint of `tf/model.py` fixes, read from its variables' shapes,
    and for each the variable it was read from (for error messages).

    Args:
        shapes: `{name: shape}` of the checkpoint's variables (`read_variable_shapes`).
    """
    arch, source = dict(FIXED), {}

    # $u$: `[n_head, d_head]`, or `[n_layer, n_head, d_head]` with `untie_r`
    r_w_bias = SCOPE + 'r_w_bias'
    if r_w_bias not in shapes or len(shapes[r_w_bias]) not in (2, 3):
        _shape(shapes, r_w_bias, 2, 'u: [n_head, d_head], or [n_layer, n_head, d_head] with untie_r')
    arch['untie_r'] = len(shapes[r_w_bias]) == 3
    arch['n_head'], arch['d_head'] = shapes[r_w_bias][-2:]
    source.update(untie_r=r_w_bias, n_head=r_w_bias, d_head=r_w_bias)

    layers = {int(m.group(1)) for m in map(_LAYER_SCOPE.match, shapes) if m}
    missing = sorted(set(range(max(layers, default=-1) + 1)) - layers) or ([] if layers else [0])
    if missing:
        raise _not_the_authors(shapes, f"variable under {SCOPE}layer_{missing[0]}/ (layers found: "
                                       f"{sorted(layers) or 'none'})")
    arch['n_layer'] = len(layers)
    source['n_layer'] = f'{SCOPE}layer_*/'
    if arch['untie_r'] and shapes[r_w_bias][0] != arch['n_layer']:
        raise TFCheckpointError(f"variable {r_w_bias} has shape {list(shapes[r_w_bias])} in the checkpoint, "
                                f"[n_layer, n_head, d_head], but the checkpoint has {arch['n_layer']} layers "
                                f"({SCOPE}layer_0/ to layer_{arch['n_layer'] - 1}/)")

    ff_1 = SCOPE + 'layer_0/ff/layer_1/kernel'
    arch['d_model'], arch['d_inner'] = _shape(shapes, ff_1, 2, 'the first feed-forward kernel, [d_model, d_inner]')
    source.update(d_model=ff_1, d_inner=ff_1)

    if EMBED + 'lookup_table' in shapes:
        # One table (`div_val` 1): the clusters, if any, show only in the softmax biases
        table = EMBED + 'lookup_table'
        arch['div_val'] = 1
        arch['n_token'], arch['d_embed'] = _shape(shapes, table, 2, 'the embeddings, [n_token, d_embed]')
        source.update(div_val=table, n_token=table, d_embed=table)
        if SOFTMAX + 'bias' in shapes:
            sizes, source['cutoffs'] = [arch['n_token']], SOFTMAX + 'bias'
        else:
            sizes, source['cutoffs'] = [s[0] for s in _clusters(shapes, SOFTMAX, 'b')], f'{SOFTMAX}cutoff_*/b'
            if not sizes:
                raise _not_the_authors(shapes, f"softmax bias ({SOFTMAX}bias, or {SOFTMAX}cutoff_{{i}}/b per "
                                               f"cluster)")
    else:
        # A table per cluster (`div_val` > 1): $d_i = d_{embed} / \mathit{div\_val}^i$
        tables = _clusters(shapes, EMBED, 'lookup_table')
        if len(tables) < 2:
            raise _not_the_authors(shapes, f"embeddings ({EMBED}lookup_table, or {EMBED}cutoff_{{i}}/lookup_table "
                                           f"for two or more clusters)")
        sizes = [rows for rows, _ in tables]
        arch['n_token'], arch['d_embed'] = sum(sizes), tables[0][1]
        arch['div_val'] = tables[0][1] // tables[1][1]
        for i, (rows, d_i) in enumerate(tables):
            if d_i != arch['d_embed'] // arch['div_val'] ** i:
                raise TFCheckpointError(
                    f"variable {EMBED}cutoff_{i}/lookup_table has shape {[rows, d_i]} in the checkpoint; with "
                    f"d_embed={arch['d_embed']} and div_val={arch['div_val']} (from cutoff_0 and cutoff_1) "
                    f"tf/model.py makes it [{rows}, {arch['d_embed'] // arch['div_val'] ** i}]")
        tables_name = f'{EMBED}cutoff_*/lookup_table'
        source.update(div_val=tables_name, n_token=tables_name, d_embed=tables_name, cutoffs=tables_name)
    # The cluster boundaries: running totals of the cluster sizes, the last (n_token) left out
    arch['cutoffs'] = [int(c) for c in np.cumsum(sizes)[:-1]]

    # The softmax shares the embedding's projection of cluster i where it has none of its own (`tie_projs[i]`);
    # without cutoffs it always does. Where neither has one (the identity) sharing changes nothing.
    has_projections = softmax_has_projections(arch)
    if not arch['cutoffs']:
        arch['tie_projs'] = [has_projections]
    else:
        arch['tie_projs'] = [has_projections and f'{SOFTMAX}cutoff_{i}/proj' not in shapes
                             for i in range(len(arch['cutoffs']) + 1)]
    source['tie_projs'] = f'{SOFTMAX}cutoff_*/proj'
    return arch, source


def model_arguments(arch: Mapping[str, object], source: Mapping[str, str],
                    config: Optional[Mapping[str, object]]) -> Dict[str, object]:
    """
    Every keyword of `MemTransformerLM`: the architecture read from the checkpoint (`read_architecture`), the
    settings of `config`, the constructor's defaults for the rest. A size that `config` also gives must agree with
    the checkpoint; the choices that `tf/model.py` fixes (`FIXED`) may only be given at their value.
    """
    signature = inspect.signature(MemTransformerLM.__init__).parameters
    accepted = [name for name in signature if name != 'self']
    arguments = {name: signature[name].default for name in accepted
                 if signature[name].default is not inspect.Parameter.empty}
    arguments.update(EVALUATION_DEFAULTS)
    arguments.update(arch)
    for key, value in dict(config or {}).items():
        if key not in accepted:
            raise TFCheckpointError(f"config key {key!r} is not accepted: the keys are MemTransformerLM's "
                                    f"keywords.{closest(key, accepted)}")
        if key in FIXED and value != FIXED[key]:
            raise TFCheckpointError(f"config {key}={value!r} is not accepted: the authors' tf/model.py has only "
                                    f"{key}={FIXED[key]!r}")
        if key in ARCHITECTURE and (list(value) if isinstance(value, (list, tuple)) else value) != arch[key]:
            raise TFCheckpointError(f"config {key}={value!r} disagrees with the checkpoint, which has "
                                    f"{key}={arch[key]!r} (read from {source[key]})")
        arguments[key] = value
    return arguments


@dataclass(frozen=True)
class Placement:
    """Where a TensorFlow variable goes: parameter `name`, transposed or with its rows reversed; of a variable
    stacked over layers only row `layer`; into rows `[rows[0], rows[1])` of the parameter only."""
    tf_name: str
    name: str
    transposed: bool = False
    rows_reversed: bool = False
    layer: Optional[int] = None
    rows: Optional[Tuple[int, int]] = None


def placements(arguments: Mapping[str, object]) -> List[Placement]:
    """Every variable of `tf/model.py` for a model of these keywords, and where it goes here (the table above)."""
    n_layer, cutoffs, div_val = arguments['n_layer'], arguments['cutoffs'], arguments['div_val']
    bounds = [0] + list(cutoffs) + [arguments['n_token']]
    found = []
    if div_val == 1:
        found.append(Placement(EMBED + 'lookup_table', 'word_emb.emb_layers.0.weight'))
        if arguments['d_embed'] != arguments['d_model']:
            found.append(Placement(EMBED + 'proj_W', 'word_emb.emb_projs.0', transposed=True))
    else:
        for i in range(len(bounds) - 1):
            found.append(Placement(f'{EMBED}cutoff_{i}/lookup_table', f'word_emb.emb_layers.{i}.weight'))
            found.append(Placement(f'{EMBED}cutoff_{i}/proj_W', f'word_emb.emb_projs.{i}', transposed=True))

    for bias in ('r_w_bias', 'r_r_bias'):
        if arguments['untie_r']:
            found += [Placement(SCOPE + bias, f'layers.{n}.dec_attn.{bias}', layer=n) for n in range(n_layer)]
        else:
            found.append(Placement(SCOPE + bias, bias))
    for n in range(n_layer):
        tf_layer, layer = f'{SCOPE}layer_{n}/', f'layers.{n}.'
        found += [
            Placement(tf_layer + 'rel_attn/qkv/kernel', layer + 'dec_attn.qkv_net.weight', transposed=True),
            Placement(tf_layer + 'rel_attn/r/kernel', layer + 'dec_attn.r_net.weight', transposed=True),
            Placement(tf_layer + 'rel_attn/o/kernel', layer + 'dec_attn.o_net.weight', transposed=True),
            Placement(tf_layer + 'rel_attn/LayerNorm/gamma', layer + 'dec_attn.layer_norm.weight'),
            Placement(tf_layer + 'rel_attn/LayerNorm/beta', layer + 'dec_attn.layer_norm.bias'),
            Placement(tf_layer + 'ff/layer_1/kernel', layer + 'pos_ff.CoreNet.0.weight', transposed=True),
            Placement(tf_layer + 'ff/layer_1/bias', layer + 'pos_ff.CoreNet.0.bias'),
            Placement(tf_layer + 'ff/layer_2/kernel', layer + 'pos_ff.CoreNet.3.weight', transposed=True),
            Placement(tf_layer + 'ff/layer_2/bias', layer + 'pos_ff.CoreNet.3.bias'),
            Placement(tf_layer + 'ff/LayerNorm/gamma', layer + 'pos_ff.layer_norm.weight'),
            Placement(tf_layer + 'ff/LayerNorm/beta', layer + 'pos_ff.layer_norm.bias'),
        ]

    if not cutoffs:
        found.append(Placement(SOFTMAX + 'bias', 'crit.out_layers.0.bias'))
        return found
    for i in range(len(bounds) - 1):
        if div_val == 1:
            found.append(Placement(f'{SOFTMAX}cutoff_{i}/b', 'crit.out_layers.0.bias', rows=(bounds[i], bounds[i + 1])))
        else:
            found.append(Placement(f'{SOFTMAX}cutoff_{i}/b', f'crit.out_layers.{i}.bias'))
        if softmax_has_projections(arguments) and not arguments['tie_projs'][i]:
            found.append(Placement(f'{SOFTMAX}cutoff_{i}/proj', f'crit.out_projs.{i}', transposed=True))
    # Tail cluster i: TF's row i - 1, the original's row n_clusters - i (see the module docstring)
    found.append(Placement(SOFTMAX + 'cutoff_0/cluster_W', 'crit.cluster_weight', rows_reversed=True))
    found.append(Placement(SOFTMAX + 'cutoff_0/cluster_b', 'crit.cluster_bias', rows_reversed=True))
    return found


def _target(params: Mapping[str, torch.Tensor], placement: Placement) -> torch.Tensor:
    target = params[placement.name]
    return target[placement.rows[0]:placement.rows[1]] if placement.rows else target


def _tf_shape(target: torch.Tensor, placement: Placement, n_layer: int) -> Tuple[int, ...]:
    """The shape the TensorFlow variable must have to fill `target`."""
    shape = tuple(target.shape)[::-1] if placement.transposed else tuple(target.shape)
    return (n_layer,) + shape if placement.layer is not None else shape


def _is_identity(placement: Placement, shapes: Mapping[str, Tuple[int, ...]], target: torch.Tensor) -> bool:
    """An embedding projection that `tf/model.py` leaves out (`proj_same_dim=False`) where its cluster already
    has `d_model` features: the identity."""
    return (placement.tf_name.startswith(EMBED) and placement.tf_name.endswith('/proj_W')
            and placement.tf_name not in shapes and target.shape[0] == target.shape[1])


def _check_variables(prefix: str, shapes: Mapping[str, Tuple[int, ...]], params: Mapping[str, torch.Tensor],
                     wanted: Sequence[Placement], arguments: Mapping[str, object]) -> None:
    """Every variable of `wanted` there, of its shape, and no other `transformer/` variable; or one error that
    names each that is not."""
    problems = []
    for placement in wanted:
        target = _target(params, placement)
        expected = _tf_shape(target, placement, arguments['n_layer'])
        if placement.tf_name not in shapes:
            if not _is_identity(placement, shapes, target):
                problems.append(f"{placement.tf_name} is missing (expected shape {list(expected)} for "
                                f"{placement.name})")
        elif shapes[placement.tf_name] != expected:
            problems.append(f"{placement.tf_name} has shape {list(shapes[placement.tf_name])} in the checkpoint, "
                            f"expected {list(expected)} for {placement.name}"
                            f"{' (transposed)' if placement.transposed else ''}")
    used = {placement.tf_name for placement in wanted}
    # The optimizer's slots sit below the variable they belong to (`.../kernel/Adam`)
    unknown = [name for name in shapes if name.startswith(SCOPE) and name not in used
               and not any(name.startswith(u + '/') for u in used)]
    if unknown:
        problems.append(f"variables that tf/model.py does not make for this architecture: {_listed(unknown)}")
    if problems:
        architecture = {key: arguments[key] for key in ARCHITECTURE}
        raise TFCheckpointError(f"the checkpoint {prefix} does not fit a Transformer-XL of {architecture}:\n  "
                                + '\n  '.join(problems))


def load_tf_weights(model: MemTransformerLM, prefix: str, arguments: Mapping[str, object]) -> MemTransformerLM:
    """
    Fills `model`, built from `arguments` (`model_arguments`), with the variables of the checkpoint at `prefix`;
    checks them all before it reads any. Returns `model`.
    """
    reader = _import_tensorflow().train.load_checkpoint(prefix)
    shapes = _variable_shapes(reader)
    # Every name, the tied ones too (the tied softmax projections are the embedding's)
    params = dict(model.state_dict(keep_vars=True))
    wanted = placements(arguments)
    _check_variables(prefix, shapes, params, wanted, arguments)

    written = set()
    with torch.no_grad():
        for placement in wanted:
            target = _target(params, placement)
            if placement.tf_name not in shapes:
                target.copy_(torch.eye(target.shape[0]))
            else:
                value = reader.get_tensor(placement.tf_name)
                if placement.layer is not None:
                    value = value[placement.layer]
                if placement.transposed:
                    value = value.T
                if placement.rows_reversed:
                    value = value[::-1]
                target.copy_(torch.from_numpy(np.ascontiguousarray(value)))
            written.add(placement.name)
    left = [name for name, _ in model.named_parameters() if name not in written]
    if left:
        raise RuntimeError(f"no TensorFlow variable fills {_listed(left)}: MemTransformerLM has parameters that "
                           f"tf_checkpoint.placements does not know")
    return model


def _read(checkpoint, config: Optional[Mapping[str, object]]) -> Tuple[str, Dict[str, object]]:
    """The checkpoint's prefix and the model's keywords: the shapes only, no weights read."""
    prefix = checkpoint_prefix(checkpoint)
    return prefix, model_arguments(*read_architecture(read_variable_shapes(prefix)), config)


def convert_tf_checkpoint(checkpoint, config: Optional[Mapping[str, object]] = None) -> MemTransformerLM:
    """
    A `MemTransformerLM` with the weights of one of the authors' TensorFlow checkpoints, in eval mode.

    Args:
        checkpoint: the checkpoint's prefix (`.../model.ckpt-0`), one of its files, or its folder.
        config: `MemTransformerLM` keywords for what the checkpoint does not hold (`tgt_len`, `mem_len`,
            `clamp_len`, `same_length`, ...; `dropout` and `dropatt` default to 0). The sizes come from the
            checkpoint; any that `config` gives must agree.

    Raises:
        TFCheckpointError: the checkpoint lacks a variable, has one of another shape (both shapes named) or
            one that `tf/model.py` does not make, or `config` disagrees with it.
        ImportError: TensorFlow is not installed (the `tf` extra).
    """
    prefix, arguments = _read(checkpoint, config)
    return load_tf_weights(MemTransformerLM(**arguments), prefix, arguments).eval()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog='python -m labml_txl.xl.formats.tf_checkpoint',
        description="Convert one of the Transformer-XL authors' TensorFlow checkpoints (tf/sota/download.sh) into "
                    "a Hugging Face TransfoXL folder (config.json and model.safetensors), which "
                    "MemTransformerLM.from_pretrained and eval_xl.py pretrained=FOLDER read. Needs the tf extra: "
                    f"{INSTALL_HINT}.")
    parser.add_argument('checkpoint', help="the checkpoint's prefix (e.g. pretrained_xl/tf_wt103/model/"
                                           "model.ckpt-0), one of its files, or its folder")
    parser.add_argument('--out', required=True, type=Path,
                        help='the folder to write; created, and refused if it holds a config.json or '
                             'model.safetensors already')
    parser.add_argument('--config', type=Path,
                        help='a JSON file of MemTransformerLM keywords for what the checkpoint does not hold, '
                             'e.g. {"tgt_len": 128, "mem_len": 1600, "clamp_len": 1000, "same_length": true} '
                             "(the WikiText-103 evaluation of tf/sota/wt103.sh); the sizes are read from the "
                             "checkpoint, and any the file gives must agree")
    args = parser.parse_args(argv)
    # TensorFlow's C++ start-up messages stay out of this program's output
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    config = {}
    if args.config is not None:
        try:
            config = json.loads(args.config.read_text(encoding='utf-8'))
        except (OSError, json.JSONDecodeError) as e:
            parser.error(f"--config {args.config} is not a readable JSON file: {e}")
        if not isinstance(config, dict):
            parser.error(f"--config {args.config} holds a JSON {type(config).__name__}; expected an object of "
                         f"MemTransformerLM keywords")
    taken = [name for name in ('config.json', 'model.safetensors') if (args.out / name).exists()]
    if taken or (args.out.exists() and not args.out.is_dir()):
        parser.error(f"--out {args.out} is not accepted: {'it holds ' + ' and '.join(taken) if taken else 'a file'}; "
                     f"give a new or an empty folder")

    try:
        # Everything is checked before the weights are read
        prefix, arguments = _read(args.checkpoint, config)
        model = load_tf_weights(MemTransformerLM(**arguments), prefix, arguments)
        # Hugging Face's TransfoXL folder (`hf_format.py`), which `MemTransformerLM.from_pretrained` reads
        model.save_pretrained(args.out)
    except (TFCheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    architecture = {key: arguments[key] for key in ARCHITECTURE}
    print(f"wrote {args.out / 'config.json'} and {args.out / 'model.safetensors'}: {architecture}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
