"""A file store for labml_app: its models and indexes as files under one data directory.

labml_app keeps everything through labml_db, whose `Model` and `Index` classes write through the drivers
given to `Model.set_db_drivers` / `Index.set_db_drivers`. labml_app wires MongoDB drivers in
`labml_app.db.init_mongo_db`; `init_file_db(data_dir)` wires labml_db's file drivers instead:

    DATA_DIR/models/<ModelName>/<ModelName>:<uuid>.pkl    one pickle per model instance (runs, metrics, ...)
    DATA_DIR/indexes/<IndexName>.json                      one JSON object per index (run uuid -> model key)

Models are pickled, as labml_app's own Mongo driver does (series hold numpy values). Every write goes to a
temporary file that then replaces the old one, so a killed server never leaves half a file behind.
Nothing is ever removed except by the app's own delete actions (e.g. deleting a run in the UI).

A file damaged by something else (a copy cut short, a disk filled up, an edit by hand) is named, never a bare parse
error: `init_file_db` reads every index file before the app starts and refuses a damaged one (`ValueError`, so the
dashboard does not start), and a model or index that fails to load later raises `DamagedStoreFile`, whose one-line
message (the dashboard's answer to that request, `request_checks`) says which file and why. `read_json_file` is
that reading for any JSON file of the store (the project follower's `project_runs.json` too, with its own advice).

One server at a time uses a store: each keeps its indexes in memory and writes them whole, so two would drop each
other's runs from `RunIndex.json`. `lock_store` takes `DATA_DIR/dashboard.lock` (`labml_txl.file_lock`, released
when the server's process ends in any way) and refuses a second server, naming the first.
"""
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Type, Union

from labml_db import Index, Model
from labml_db.driver.file import FileDbDriver
from labml_db.index_driver.file import FileIndexDbDriver
from labml_db.serializer.json import JsonSerializer
from labml_db.serializer.pickle import PickleSerializer

from ..file_lock import FileLock


def write_atomically(path: Path, data: Union[str, bytes]) -> None:
    """Write `data` to `path` through a temporary file in the same folder and `os.replace`."""
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=str(path.parent))
    try:
        with os.fdopen(fd, 'wb' if isinstance(data, bytes) else 'w') as f:
            f.write(data)
        os.replace(tmp, str(path))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# What to do about a damaged model or index file
RESTORE_OR_MOVE_OUT = 'restore it from a copy, or move it out of the store (what it held is then no longer shown)'


class DamagedStoreFile(ValueError):
    """A file of the store that cannot be read back: its path, why (`why`), and what to do, on one line."""

    def __init__(self, path: Path, why: str, what_to_do: str = RESTORE_OR_MOVE_OUT):
        self.path = path
        self.why = ' '.join(why.split())
        super().__init__(f'the store file {str(path)!r} is damaged ({self.why}); {what_to_do}')


class AtomicFileDbDriver(FileDbDriver):
    """labml_db's `FileDbDriver`, writing each model through a temporary file; a model that cannot be read back is a
    `DamagedStoreFile` naming its file."""

    def _path_of(self, key: str) -> Path:
        return self._db_path / f'{key}.{self._serializer.file_extension}'

    def load_dict(self, key: str):
        try:
            return super().load_dict(key)
        except (OSError, MemoryError):
            raise
        except Exception as e:
            # `pickle`'s errors on a cut or altered file: `UnpicklingError`, `EOFError`, `ValueError`, ...
            raise DamagedStoreFile(self._path_of(key), f'not a {self._serializer.file_extension} file this store '
                                                      f'wrote: {type(e).__name__}: {e}') from e

    def save_dict(self, key: str, data) -> None:
        write_atomically(self._path_of(key), self._serializer.to_string(data))

    def delete(self, key: str) -> None:
        path = self._path_of(key)
        if path.exists():
            path.unlink()


class AtomicFileIndexDbDriver(FileIndexDbDriver):
    """labml_db's `FileIndexDbDriver`, writing the index through a temporary file; adds `get_all`. An index that
    cannot be read back is a `DamagedStoreFile` naming its file."""

    def _load_cache(self) -> None:
        if self._cache is not None:
            return
        self._cache = read_index(self._index_path)

    def _save_cache(self) -> None:
        write_atomically(self._index_path, self._serializer.to_string(self._cache))

    def get_all(self):
        self._load_cache()
        return list(self._cache.values())


def read_json_file(path: Path, what_to_do: str = RESTORE_OR_MOVE_OUT,
                   parse: Callable[[str], Any] = json.loads) -> Any:
    """
    What the JSON file `path` of the store holds, or a `DamagedStoreFile` saying what is wrong with it and
    `what_to_do` (a missing file is the `FileNotFoundError` of reading it).

    Args:
        path: the file.
        what_to_do: the end of the error's message.
        parse: JSON text to what the file holds (labml_db's serializer decodes its keys too).
    """
    try:
        text = path.read_text(encoding='utf-8')
    except UnicodeDecodeError as e:
        raise DamagedStoreFile(path, f'not UTF-8 text: {e}', what_to_do) from e
    try:
        return parse(text)
    except (ValueError, RecursionError) as e:
        raise DamagedStoreFile(path, f'not JSON: {e}' if isinstance(e, json.JSONDecodeError) else
                               f'not JSON: {type(e).__name__}: {e}', what_to_do) from e


def read_index(path: Path) -> dict:
    """The index in the file `path` (`{}` when there is none), or a `DamagedStoreFile` saying what is wrong with it."""
    try:
        data = read_json_file(path, parse=JsonSerializer().from_string)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise DamagedStoreFile(path, f'a JSON {type(data).__name__}, where an index is a JSON object')
    return data


def check_data_dir(data_dir: Union[str, Path]) -> Path:
    """Return `data_dir` resolved, created if missing; raise `ValueError` if it cannot hold the store."""
    path = Path(data_dir).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise ValueError(f'data_dir: {str(path)!r} exists and is not a directory; '
                         f'give a directory (it is created when missing)')
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f'data_dir: cannot create {str(path)!r}: {e}') from e
    if not os.access(str(path), os.W_OK):
        raise ValueError(f'data_dir: {str(path)!r} is not writable')
    return path


LOCK_FILE = 'dashboard.lock'


def lock_store(data_dir: Path) -> FileLock:
    """The held lock of the store `data_dir`, or a `ValueError` naming the process of the dashboard that has it."""
    lock = FileLock(Path(data_dir) / LOCK_FILE)
    if not lock.acquire():
        raise ValueError(f"data_dir: {str(data_dir)!r} is the store of another dashboard (process "
                         f"{lock.holder() or 'unknown'}); one dashboard at a time uses a store: stop that one, "
                         f"open its page, or give --data-dir another folder")
    return lock


def init_file_db(data_dir: Union[str, Path], models: Iterable[Type[Model]],
                 indexes: Iterable[Type[Index]]) -> Path:
    """Point labml_db's `Model` and `Index` classes at files under `data_dir`; return the resolved dir. A damaged
    index file is a `DamagedStoreFile` (a `ValueError`) naming it: the dashboard refuses to start on it."""
    root = check_data_dir(data_dir)
    indexes = list(indexes)
    # Every index read once now: a damaged one stops the start, naming its file (`DamagedStoreFile`)
    for index in indexes:
        read_index(root / 'indexes' / f'{index.__name__}.json')
    Model.set_db_drivers([AtomicFileDbDriver(PickleSerializer(), m, root / 'models' / m.__name__)
                          for m in models])
    Index.set_db_drivers([AtomicFileIndexDbDriver(JsonSerializer(), i, root / 'indexes' / f'{i.__name__}.json')
                          for i in indexes])
    return root
