r"""
# Hugging Face TransfoXL folders

Hugging Face's `TransfoXLLMHeadModel` (transformers 4.44.2, `transformers.models.deprecated.transfo_xl`; removed in
5.x) writes a model with `save_pretrained` as a folder:

| file | holds |
| --- | --- |
| `config.json` | `model_type: "transfo-xl"` and the `TransfoXLConfig`: `vocab_size`, `cutoffs`, `div_val`, ... |
| `model.safetensors` | the weights; or `pytorch_model.bin`, a `torch.save` file; either may be in shards |

Its modules are the original PyTorch code's, so the names map one to one: ours plus `transformer.`, except the
softmax `crit.*`, kept as is. A tensor that has several names may be stored under any of them: Hugging Face's
safetensors hold the softmax weights tied to the embedding (`crit.out_layers.N.weight`, `crit.out_projs.N`) only
under the embedding's name, its `pytorch_model.bin` under every name; the biases $u$, $v$ shared by all layers
(`untie_r=False`) are `transformer.r_w_bias` and also each layer's `transformer.layers.N.dec_attn.r_w_bias`.

One thing differs: **the order of the tail clusters in the head of the adaptive softmax**. The head scores the
shortlist and one entry per tail cluster, `cluster_weight` `[n_clusters, d_embed]` (and `cluster_bias`). The PyTorch
original reads tail cluster $i$ (counting from 1) from the head's column $-i$, so row $n_{clusters} - i$ of
`cluster_weight`; Hugging Face (like the authors' TensorFlow code) reads column `shortlist + i - 1`, so row $i - 1$.
Converting reverses the rows of `cluster_weight` and `cluster_bias`, which is exact; copied as they are, the hidden
states agree but the log-probabilities of a model with two or more tail clusters do not.

Nothing is unpickled but plain data: safetensors, or `torch.load(weights_only=True)`. A weight file that is cut
short, damaged, or a pickle that asks for code is a `PublishedFileError` naming the file, on one line (the scripts
print it as their `error:` line). `save_pretrained` writes into a temporary folder beside the target and moves the
files in only once all are written, so a failed save (a full disk) leaves the folder as it was, or no folder.
"""
import json
import os
import re
import shutil
import uuid
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Tuple, Type, TypeVar

import safetensors
import safetensors.torch
import torch
from torch import nn

from ...json_file import read_json_object

HF_MODEL_TYPE = 'transfo-xl'
HF_ARCHITECTURE = 'TransfoXLLMHeadModel'
CONFIG_FILE = 'config.json'
SAFETENSORS_FILE = 'model.safetensors'
BIN_FILE = 'pytorch_model.bin'
# In the order Hugging Face looks for them
WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_FILE + '.index.json', BIN_FILE, BIN_FILE + '.index.json')

# Keys of config.json that a folder must have: the shapes of the weights
REQUIRED_KEYS = ('cutoffs', 'd_model', 'd_embed', 'n_head', 'd_head', 'd_inner', 'div_val', 'n_layer')
# `TransfoXLConfig`'s defaults (transformers 4.44.2) for the keys a config.json may leave out, as Hugging Face reads it
HF_DEFAULTS = dict(pre_lnorm=False, mem_len=1600, clamp_len=1000, same_length=True, proj_share_all_but_first=True,
                   attn_type=0, sample_softmax=-1, dropout=0.1, dropatt=0.0, untie_r=True, layer_norm_epsilon=1e-5)
# The $\epsilon$ of every layer norm here (`norms.make_norm`), Hugging Face's default
LAYER_NORM_EPS = 1e-5
# Constructor arguments every loaded model gets unless `overrides` say otherwise, beside those read from config.json:
# the published models were trained with the original code, so they compute as it does
LOAD_DEFAULTS: Dict[str, object] = {'original_numerics': True}
# Rows of the head's cluster entries, in Hugging Face's order in the file and the original's in the model
CLUSTER_ROWS = ('crit.cluster_weight', 'crit.cluster_bias')

Model = TypeVar('Model', bound=nn.Module)


class PublishedFileError(ValueError):
    """A weight file of a Hugging Face folder that cannot be read: truncated, damaged, or a pickle that asks for
    code. The message names the file, what is wrong and what is read; a `ValueError`, so the scripts print it as one
    `error:` line (`cli.run_script`) instead of a traceback."""


def _one_line(error, limit: int = 200) -> str:
    """The gist of a library's error message on one line: its first sentence, without terminal colour codes (torch's
    and safetensors' messages run over several lines of advice that does not apply here)."""
    text = re.sub(r'\x1b\[[0-9;]*m', '', str(error))
    text = ' '.join(text.split())
    sentence = re.split(r'(?<=[a-z0-9)\]])\. ', text, maxsplit=1)[0].rstrip('.')
    return sentence if len(sentence) <= limit else sentence[:limit - 3] + '...'


# -- config.json --

def _listed(names: List[str], limit: int = 12) -> str:
    shown = ', '.join(names[:limit])
    return shown + (f' and {len(names) - limit} more' if len(names) > limit else '')


def read_config(folder: Path) -> dict:
    """The parsed `config.json` of `folder`, or an exception saying what the folder lacks."""
    if not folder.is_dir():
        what = 'is a file, not a folder' if folder.exists() else 'does not exist'
        raise FileNotFoundError(f"{str(folder)!r} {what}: expected a folder as Hugging Face's save_pretrained "
                                f"writes it ({CONFIG_FILE} with {SAFETENSORS_FILE} or {BIN_FILE})")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no {CONFIG_FILE}: expected a folder as Hugging Face's "
                                f"save_pretrained writes it ({CONFIG_FILE} with {SAFETENSORS_FILE} or {BIN_FILE}); "
                                f"it holds {_listed(sorted(p.name for p in folder.iterdir()))}")
    config = read_json_object(path, 'the JSON object of a TransfoXLConfig, as Hugging Face writes it')
    # Configs written before transformers had `model_type` leave it out
    model_type = config.get('model_type', HF_MODEL_TYPE)
    if model_type != HF_MODEL_TYPE:
        raise ValueError(f"{path} is of model_type={model_type!r}: only {HF_MODEL_TYPE!r} (Hugging Face's "
                         f"TransfoXL) is accepted")
    return config


def constructor_arguments(config: dict, source: str) -> dict:
    """`MemTransformerLM`'s keyword arguments for a TransfoXLConfig (`source` names its file in messages)."""
    missing = [k for k in REQUIRED_KEYS if k not in config]
    if 'vocab_size' not in config and 'n_token' not in config:
        missing.insert(0, 'vocab_size')
    if missing:
        raise ValueError(f"{source} lacks {missing}: a TransfoXLConfig gives the shapes of the weights with "
                         f"vocab_size (or n_token), {', '.join(REQUIRED_KEYS)}")
    config = {**HF_DEFAULTS, **config}
    refusals = []
    if config['attn_type'] != 0:
        refusals.append(f"attn_type={config['attn_type']!r} (Hugging Face's TransfoXL builds only 0, the "
                        f"relative attention of the paper)")
    if not isinstance(config['sample_softmax'], int) or config['sample_softmax'] > 0:
        refusals.append(f"sample_softmax={config['sample_softmax']!r} (Hugging Face's TransfoXL has no sampled "
                        f"softmax: an integer <= 0)")
    if config['layer_norm_epsilon'] != LAYER_NORM_EPS:
        refusals.append(f"layer_norm_epsilon={config['layer_norm_epsilon']!r} (the layer norms here use "
                        f"{LAYER_NORM_EPS})")
    if refusals:
        raise ValueError(f"{source} is not accepted: {'; '.join(refusals)}")
    cutoffs = config['cutoffs']
    tie_projs = config.get('tie_projs')
    if tie_projs is None and isinstance(cutoffs, list):
        # What `TransfoXLConfig` makes of `proj_share_all_but_first`
        tie_projs = [False] + [config['proj_share_all_but_first']] * len(cutoffs)
    return dict(
        # `n_token` is `TransfoXLConfig`'s other name of `vocab_size`, and wins where both are given, as there
        n_token=config.get('n_token', config.get('vocab_size')), n_layer=config['n_layer'], n_head=config['n_head'],
        d_model=config['d_model'], d_head=config['d_head'], d_inner=config['d_inner'], dropout=config['dropout'],
        dropatt=config['dropatt'],
        # transformers reads `tie_word_embeddings` (default True); configs of the original's era say `tie_weight`
        tie_weight=config.get('tie_word_embeddings', config.get('tie_weight', True)),
        d_embed=config['d_embed'], div_val=config['div_val'], tie_projs=tie_projs, pre_lnorm=config['pre_lnorm'],
        # `tgt_len` is not Hugging Face's (it ignores it, as `ext_len`); configs of the original's era have it
        tgt_len=config.get('tgt_len'), mem_len=config['mem_len'], cutoffs=cutoffs,
        same_length=config['same_length'], attn_type=0, clamp_len=config['clamp_len'],
        sample_softmax=config['sample_softmax'], untie_r=config['untie_r'])


def hf_config(model: nn.Module) -> dict:
    """The TransfoXLConfig of `model` as Hugging Face's config.json has it, or a `ValueError` naming what Hugging
    Face's TransfoXL cannot represent."""
    layer = model.layers[0]
    refusals = []
    if model.attn_type != 0:
        refusals.append(f"attn_type={model.attn_type} (Hugging Face's TransfoXL has only 0, the paper's relative "
                        f"attention)")
    if model.norm != 'layer_norm':
        refusals.append(f"norm={model.norm!r} (Hugging Face's layers normalise with LayerNorm)")
    if model.sample_softmax > 0:
        refusals.append(f"sample_softmax={model.sample_softmax} (Hugging Face's TransfoXL has only the adaptive "
                        f"softmax, no full-vocabulary out_layer)")
    if model.ext_len != 0:
        refusals.append(f"ext_len={model.ext_len} (Hugging Face's TransfoXL has no extended context: "
                        f"model.reset_length(tgt_len, 0, mem_len) first)")
    for mechanism in model.memories_on():
        if mechanism is not model.xl_memory:
            refusals.append(f"{mechanism.size}={getattr(mechanism, mechanism.size)} (Hugging Face's TransfoXL has no "
                            f"{mechanism.title.removeprefix('the ')})")
    if refusals:
        raise ValueError(f"this model cannot be saved in Hugging Face's TransfoXL format: {'; '.join(refusals)}")
    crit, word_emb = model.crit, model.word_emb
    # Which weights are shared is read from the modules: the softmax's that are the embedding's
    tie_weight = crit.out_layers[0].weight is word_emb.emb_layers[0].weight
    # Cluster $i$'s projection tied to the embedding's $P_i$ (to $P_0$, the only one, with div_val 1)
    tie_projs = [len(word_emb.emb_projs) > 0 and proj is word_emb.emb_projs[0 if model.div_val == 1 else i]
                 for i, proj in enumerate(crit.out_projs)]
    dtype = word_emb.emb_layers[0].weight.dtype
    config = dict(
        architectures=[HF_ARCHITECTURE], model_type=HF_MODEL_TYPE, vocab_size=model.n_token,
        cutoffs=list(model.cutoffs), d_model=model.d_model, d_embed=model.d_embed, n_head=model.n_head,
        d_head=model.d_head, d_inner=layer.pos_ff.d_inner, div_val=model.div_val, pre_lnorm=layer.dec_attn.pre_lnorm,
        n_layer=model.n_layer, mem_len=model.mem_len, clamp_len=model.clamp_len, same_length=model.same_length,
        # One per cluster; without projections (div_val 1, d_embed == d_model) there is nothing to tie
        tie_projs=tie_projs or [False] * (len(model.cutoffs) + 1),
        attn_type=0, sample_softmax=-1, adaptive=True, dropout=model.drop.p, dropatt=layer.dec_attn.dropatt.p,
        untie_r=model.untie_r, layer_norm_epsilon=LAYER_NORM_EPS, tie_word_embeddings=tie_weight,
        torch_dtype=str(dtype).replace('torch.', ''))
    if model.tgt_len is not None:
        config['tgt_len'] = model.tgt_len
    return config


# -- weight names --

def hf_names(model: nn.Module) -> List[Tuple[torch.Tensor, List[str]]]:
    """Every tensor of `model`'s `state_dict` once, with all the names it may have in a Hugging Face file, the one
    Hugging Face saves it under first."""
    groups: Dict[int, Tuple[torch.Tensor, List[str]]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        hf = name if name.startswith('crit.') else 'transformer.' + name
        groups.setdefault(id(tensor), (tensor, []))[1].append(hf)
    if model.attn_type == 0 and not model.untie_r:
        # Hugging Face's layers hold the shared $u$, $v$ too, under their own names
        for bias in ('r_w_bias', 'r_r_bias'):
            groups[id(getattr(model, bias))][1].extend(f'transformer.layers.{i}.dec_attn.{bias}'
                                                       for i in range(model.n_layer))
    # The input embedding's name before the softmax's, as Hugging Face keeps it
    return [(tensor, sorted(names, key=lambda n: n.startswith('crit.'))) for tensor, names in groups.values()]


def to_original_order(hf_name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of a Hugging Face file in our model's order; the same function takes ours back (a reversal)."""
    # Tail cluster $i$ is row $i - 1$ there, row $n_{clusters} - i$ here (see the module docstring)
    return tensor.flip(0) if hf_name in CLUSTER_ROWS else tensor


# -- the weight files --

class WeightFiles:
    """The weights of a folder by name: their shapes without reading them (safetensors' header, or a memory-mapped
    `torch.load(weights_only=True)`), then each tensor on request."""

    def __init__(self, folder: Path):
        found = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
        if not found:
            held = _listed(sorted(p.name for p in folder.iterdir()))
            raise FileNotFoundError(f"{str(folder)!r} has {CONFIG_FILE} but no weights: expected one of "
                                    f"{', '.join(WEIGHT_FILES)}; it holds {held}")
        path = found[0]
        self.source = str(path)
        files = [path]
        if path.name.endswith('.index.json'):
            files = sorted({folder / shard for shard in self._shards(path)})
        self._readers: Dict[str, Callable[[], torch.Tensor]] = {}
        self.shapes: Dict[str, Tuple[int, ...]] = {}
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(f"{path} names the shard {file.name}, which {str(folder)!r} lacks")
            if file.name.endswith('.safetensors'):
                self._open_safetensors(file)
            else:
                self._open_bin(file)

    @staticmethod
    def _shards(index: Path) -> List[str]:
        try:
            weight_map = json.loads(index.read_text(encoding='utf-8'))['weight_map']
            return [str(shard) for shard in weight_map.values()]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index} is not a shard index: expected JSON with a 'weight_map' of weight names to "
                             f"files") from e

    @staticmethod
    def _damaged(file: Path, error: BaseException, what: str) -> PublishedFileError:
        # What torch's message says beneath its advice on `weights_only` (which does not apply to a damaged file)
        unpickler = re.search(r'WeightsUnpickler error:\s*(.*?)\s*(?:\n\s*\n|$)', str(error), re.S)
        with open(file, 'rb') as f:
            zip_start = f.read(4) == b'PK\x03\x04'
            size = f.seek(0, os.SEEK_END)
        if zip_start and not zipfile.is_zipfile(file):
            # torch's own reading of such a file fails with an unrelated OSError (EINVAL)
            detail = 'a zip archive without its end: the central directory is missing'
        else:
            detail = f'torch.load: {_one_line(unpickler.group(1))}' if unpickler else _one_line(error)
        return PublishedFileError(f"{file} is truncated or damaged ({detail}; {size:,} "
                                  f"bytes): expected {what} as Hugging Face's save_pretrained writes it; copy or "
                                  f"download the file again")

    def _open_safetensors(self, file: Path) -> None:
        what = 'a safetensors file of the weights'
        try:
            # (the header is read and checked against the file's length here: a file cut short fails now)
            handle = safetensors.safe_open(str(file), framework='pt')
            names = list(handle.keys())
            for name in names:
                self.shapes[name] = tuple(handle.get_slice(name).get_shape())
        except (safetensors.SafetensorError, ValueError) as e:
            raise self._damaged(file, e, what) from e

        def read(name: str) -> torch.Tensor:
            try:
                return handle.get_tensor(name)
            except (safetensors.SafetensorError, ValueError) as e:
                raise self._damaged(file, e, what) from e

        for name in names:
            self._readers[name] = lambda name=name: read(name)

    def _open_bin(self, file: Path) -> None:
        try:
            # Memory-mapped where the file is of torch's zip format (the legacy format cannot be)
            state = torch.load(file, map_location='cpu', weights_only=True, mmap=zipfile.is_zipfile(file))
        except (PermissionError, FileNotFoundError, IsADirectoryError):
            # (the file cannot be opened: Python's message names it and says why)
            raise
        except Exception as e:
            # torch's refusal names the global as `GLOBAL module.name`, amid several lines of advice
            asked = re.search(r'Unsupported global: GLOBAL (\S+)', str(e))
            if asked:
                raise PublishedFileError(
                    f"{file} asks for {asked.group(1)}, which is refused: it is read with "
                    f"torch.load(weights_only=True), which accepts tensors and plain data, never code a pickle "
                    f"names") from e
            raise self._damaged(file, e, 'a torch.save file of the weights (a dict of names to tensors)') from e
        if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                  for k, v in state.items()):
            raise ValueError(f"{file} holds a {type(state).__name__}, not a state_dict: expected a dict of weight "
                             f"names to tensors")
        for name, tensor in state.items():
            self.shapes[name] = tuple(tensor.shape)
            self._readers[name] = lambda tensor=tensor: tensor

    def tensor(self, name: str) -> torch.Tensor:
        return self._readers[name]()


def match_weights(model: nn.Module, weights: WeightFiles) -> List[Tuple[torch.Tensor, List[str]]]:
    """For each tensor of `model`, the names it has in `weights`; or one `ValueError` naming every weight that is
    missing, unexpected or of the wrong shape, before any value is read."""
    groups = hf_names(model)
    matched, missing, wrong_shapes = [], [], []
    for tensor, names in groups:
        present = [n for n in names if n in weights.shapes]
        # Buffers (the sinusoids' frequencies) are computed, so a file may leave them out
        if not present and isinstance(tensor, nn.Parameter):
            missing.append(names[0])
        for name in present:
            if weights.shapes[name] != tuple(tensor.shape):
                wrong_shapes.append(f"{name} is {list(weights.shapes[name])} in the file but {list(tensor.shape)} "
                                    f"in the model")
        matched.append((tensor, present))
    known = {name for _, names in groups for name in names}
    unexpected = sorted(set(weights.shapes) - known)
    problems = wrong_shapes[:]
    if missing:
        problems.append(f"missing from the file: {_listed(missing)}")
    if unexpected:
        problems.append(f"in the file but not in the model: {_listed(unexpected)}")
    if problems:
        raise ValueError(f"{weights.source} does not fit the model its config describes: {'; '.join(problems)}")
    return matched


# -- the two directions --

def load_pretrained(model_class: Type[Model], path, **overrides) -> Model:
    """A `model_class` (`MemTransformerLM`) built from the config of a Hugging Face TransfoXL folder (the keyword
    arguments `overrides` replace what the config says), with its weights, in evaluation mode (as Hugging Face's
    `from_pretrained` returns it)."""
    folder = Path(path)
    config = read_config(folder)
    arguments = {**constructor_arguments(config, str(folder / CONFIG_FILE)), **LOAD_DEFAULTS, **overrides}
    weights = WeightFiles(folder)
    try:
        model = model_class(**arguments)
    except (ValueError, TypeError) as e:
        given = f" with the overrides {sorted(overrides)}" if overrides else ''
        raise type(e)(f"{folder / CONFIG_FILE}{given}: {e}") from e
    matched = match_weights(model, weights)
    with torch.no_grad():
        for tensor, names in matched:
            if not names:
                continue
            value = weights.tensor(names[0])
            for alias in names[1:]:
                if not torch.equal(weights.tensor(alias), value):
                    raise ValueError(f"{weights.source} holds different values under {names[0]} and {alias}, "
                                     f"which the config ties (one tensor in the model)")
            tensor.copy_(to_original_order(names[0], value))
    return model.eval()


def save_pretrained(model: nn.Module, path) -> None:
    """Write `model` into the folder `path` as Hugging Face's `save_pretrained` does: `config.json` and
    `model.safetensors`, which `TransfoXLLMHeadModel.from_pretrained` (transformers 4.44) reads.

    Both are written into a temporary folder beside `path` first and moved in once written, so that a failed write
    (a full disk) leaves `path` as it was, or does not make it: an `OSError` names the folder, the file, the system's
    reason (with its `errno`) and what is left."""
    config = hf_config(model)
    tensors = {}
    for tensor, names in hf_names(model):
        value = tensors[names[0]] = to_original_order(names[0], tensor.detach()).cpu().contiguous()
        # Hugging Face ties the softmax to the embedding again after loading (`tie_weights`), but the shared biases
        # $u$, $v$ its layers hold come apart from `transformer.r_w_bias` when loaded from safetensors (measured with
        # 4.44.2): each layer's name gets a copy (safetensors stores no tensor twice)
        for alias in names[1:]:
            if alias.endswith(('.r_w_bias', '.r_r_bias')):
                tensors[alias] = value.clone()
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{str(folder)!r} is a file: save_pretrained writes a folder")
    existed = folder.is_dir()
    # The folders above it that are made for it, outermost first: removed again if the save fails
    made = [p for p in reversed(folder.parents) if not p.exists()]
    # Beside the target, so that the moves below are renames within one file system
    temporary = folder.parent / f'.{folder.name}.{uuid.uuid4().hex[:8]}.partial'
    step, moved = 'making the folder', []
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        temporary.mkdir()
        step = f'writing {SAFETENSORS_FILE}'
        safetensors.torch.save_file(tensors, str(temporary / SAFETENSORS_FILE), metadata={'format': 'pt'})
        step = f'writing {CONFIG_FILE}'
        (temporary / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + '\n', encoding='utf-8')
        step = 'moving the written files into it'
        if existed:
            # Into the existing folder, file by file (its other files, a vocab.pkl, stay): renames, which need no
            # space, so once both files are written nothing is left to fail but in exceptional cases
            for name in (SAFETENSORS_FILE, CONFIG_FILE):
                os.replace(temporary / name, folder / name)
                moved.append(name)
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            os.replace(temporary, folder)
    except (OSError, safetensors.SafetensorError) as e:
        shutil.rmtree(temporary, ignore_errors=True)
        for parent in reversed(made):
            try:
                parent.rmdir()
            except OSError:
                break
        if not existed:
            left = 'no folder is left'
        elif moved:
            left = f"its {', '.join(moved)} is the new model's, the rest the earlier save's: save it again"
        else:
            left = 'the folder is left as it was'
        raise _save_error(folder, step, left, e) from e


def _save_error(folder: Path, step: str, left: str, error: BaseException) -> OSError:
    """An `OSError` naming the folder, what a failed save was doing (`step`) and what it left (`left`), with the
    system's reason and its `errno` (safetensors reports the OS error inside its own message:
    `IoError(Os { code: 28, ... })`)."""
    code = error.errno if isinstance(error, OSError) else None
    reason = error.strerror if isinstance(error, OSError) and error.strerror else None
    found = re.search(r'code: (\d+).*?message: "([^"]*)"', str(error))
    if found and code is None:
        code, reason = int(found.group(1)), found.group(2)
    reason = reason or _one_line(error)
    if code is not None:
        reason += f' (errno {code})'
    saved = OSError(f"{folder} was not saved: {step} failed: {reason}; {left}")
    saved.errno = code
    return saved
