"""
# Reading data files

Every corpus reads its local files through these helpers, so a missing file, an empty file, a broken zip
archive or bytes that are not UTF-8 all fail the same way: at once, with the path and what was expected.

The original Transformer-XL `assert`s that a file exists and lets `UnicodeDecodeError` escape from deep inside
`encode_file`; here each of these is an exception whose message says which file and what was wrong with it.
"""
import zipfile
from pathlib import Path
from typing import Iterator, Sequence, Tuple, Union

PathLike = Union[str, Path]


class MissingDataFileError(FileNotFoundError):
    """A data file the corpus needs is not there."""


class EmptyDataFileError(ValueError):
    """A data file has no content."""


class DataFileFormatError(ValueError):
    """A data file is there but is not in the published format (not UTF-8, not a zip archive, too short...)."""


def folder_listing(directory: Path, limit: int = 12) -> str:
    """` (the folder holds: a, b, c)` to help a user see what they have instead."""
    if not directory.is_dir():
        return f' (the folder {directory} does not exist)'
    names = sorted(p.name for p in directory.iterdir())
    if not names:
        return f' (the folder {directory} is empty)'
    shown = ', '.join(names[:limit]) + (f', ... ({len(names) - limit} more)' if len(names) > limit else '')
    return f' (the folder {directory} holds: {shown})'


def find_file(directory: PathLike, candidates: Sequence[str], what: str) -> Path:
    """The first of `candidates` (paths relative to `directory`) that is a file.

    Raises `MissingDataFileError` naming every place that was looked at.
    """
    directory = Path(directory)
    for candidate in candidates:
        path = directory / candidate
        if path.is_file():
            return path
    tried = ', '.join(str(directory / c) for c in candidates)
    raise MissingDataFileError(f"{what} not found: expected one of {tried}{folder_listing(directory)}")


def require_file(path: PathLike, what: str) -> Path:
    """`path` as a `Path`; `MissingDataFileError` if it does not exist, `DataFileFormatError` if it is a folder,
    `EmptyDataFileError` if it is empty."""
    path = Path(path)
    if path.is_dir():
        raise DataFileFormatError(f"{what} {path} is a folder, not a file: give the path of the file itself"
                                  f"{folder_listing(path)}")
    if not path.is_file():
        raise MissingDataFileError(f"{what} not found: expected the file {path}{folder_listing(path.parent)}")
    if path.stat().st_size == 0:
        raise EmptyDataFileError(f"{what} {path} is empty (0 bytes): expected {what} in its published format")
    return path


def read_bytes(path: PathLike, what: str) -> bytes:
    """The whole content of a non-empty file."""
    path = require_file(path, what)
    return path.read_bytes()


def read_zip_member(path: PathLike, member: str, what: str) -> bytes:
    """The bytes of `member` inside the zip archive `path` (e.g. `enwik8` inside `enwik8.zip`)."""
    path = require_file(path, what)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if member not in names:
                raise DataFileFormatError(f"{what} {path} has no member {member!r}: it holds {names}")
            data = archive.read(member)
    except zipfile.BadZipFile as e:
        raise DataFileFormatError(f"{what} {path} is not a zip archive ({e}): expected the published "
                                  f"{path.name} that holds {member!r}") from None
    if not data:
        raise EmptyDataFileError(f"{what}: the member {member!r} of {path} is empty (0 bytes)")
    return data


def decode_utf8(data: bytes, path: PathLike, what: str) -> str:
    """`data` decoded as UTF-8, or `DataFileFormatError` naming the file, line and byte offset of the first bad byte."""
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as e:
        line = data.count(b'\n', 0, e.start) + 1
        raise DataFileFormatError(f"{what} {path} is not UTF-8 text: byte {data[e.start]:#04x} at offset {e.start} "
                                  f"(line {line}) cannot be decoded ({e.reason}); expected UTF-8 text") from None


def iter_text_lines(path: PathLike, what: str) -> Iterator[Tuple[int, str]]:
    """`(line_number, line)` for every line of a UTF-8 text file, `line_number` counted from 1.

    Lines are split at `\\n` (as the original's `for line in f` does for these files) and decoded one at a time, so a
    bad byte is reported with its exact line number.
    """
    path = require_file(path, what)
    with open(path, 'rb') as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode('utf-8')
            except UnicodeDecodeError as e:
                raise DataFileFormatError(f"{what} {path} is not UTF-8 text: line {number} has byte "
                                          f"{raw[e.start]:#04x} at column {e.start + 1} that cannot be decoded "
                                          f"({e.reason}); expected UTF-8 text") from None
