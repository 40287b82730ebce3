"""
# Cache of encoded corpora

The original Transformer-XL saves the whole `Corpus` object to `cache.pt` in the data folder and loads it on
every later run, whatever changed since. Here a corpus is cached as plain tensors and lists in a file named by
the corpus and a hash of its parameters, `<cache_dir>/<name>-<hash>.pt`, and the file also records each source
file's path, size and modification time: a cache is used only when all of them still match, so editing or
replacing a data file (or asking for other parameters) encodes the corpus again.

The file is written to a temporary name and renamed, so an interrupted run never leaves half a cache. A cache
that cannot be read or written is a warning, not an error: the corpus is then simply encoded.
"""
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch

FORMAT_VERSION = 1


def fingerprint(sources: Sequence[Path]) -> list:
    """`[path, size, mtime_ns]` of each source file."""
    out = []
    for path in sources:
        stat = Path(path).stat()
        out.append([str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns])
    return out


def cache_path(cache_dir: Union[str, Path], name: str, sources: Sequence[Path], params: dict) -> Path:
    """Where the cache of corpus `name` built from `sources` with `params` lives."""
    key = json.dumps({'format': FORMAT_VERSION, 'name': name, 'params': params,
                      'sources': [str(Path(p).resolve()) for p in sources]}, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode('utf-8')).hexdigest()[:16]
    return Path(cache_dir) / f'{name}-{digest}.pt'


def cached(name: str, sources: Sequence[Path], params: dict, build: Callable[[], dict],
           cache_dir: Optional[Union[str, Path]]) -> dict:
    """`build()`, or what an earlier `build()` with the same name, sources and params saved in `cache_dir`.

    Args:
        name: the corpus name, the start of the file name
        sources: the data files the result is built from
        params: everything else the result depends on (JSON-serializable)
        build: makes the result: a dict of tensors, lists, strings and numbers
        cache_dir: the folder of cache files; `None` does not cache
    """
    if cache_dir is None:
        return build()
    path = cache_path(cache_dir, name, sources, params)
    prints = fingerprint(sources)
    if path.is_file():
        try:
            saved = torch.load(path, map_location='cpu', weights_only=True)
            if saved.get('format') == FORMAT_VERSION and saved.get('sources') == prints:
                return saved['data']
        except Exception as e:  # a damaged or foreign file: encode again and replace it
            warnings.warn(f'Ignoring the unreadable corpus cache {path}: {e}')
    data = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f'{path.name}.{os.getpid()}.tmp')
        torch.save({'format': FORMAT_VERSION, 'name': name, 'params': params, 'sources': prints, 'data': data},
                   temporary)
        os.replace(temporary, path)
    except OSError as e:
        warnings.warn(f'Could not write the corpus cache {path} ({e}); the corpus will be encoded again next time')
    return data


def compact(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`ids` in the smallest integer type that holds `vocab_size` ids, to keep cache files small."""
    if vocab_size <= 256:
        return ids.to(torch.uint8)
    if vocab_size <= 2 ** 15:
        return ids.to(torch.int16)
    return ids.to(torch.int32)
