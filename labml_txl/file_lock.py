"""
# Locks that die with their process

`FileLock` is an exclusive advisory lock (`flock`) on a file. The operating system releases it when the process
that holds it ends, however it ends (SIGKILL, a closed terminal, the OOM killer), so no lock outlives its holder and
none is ever stale. The file records the holder's process id, for the message of whoever finds it taken. It guards
a kernel's build (`fast/native/kernel_cache.py`), a training run (`train/runs.py`) and a dashboard's store
(`dashboard.py`).

Where `fcntl` is missing (not POSIX), every `acquire` succeeds: the lock then guards nothing.
"""
import os
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:
    fcntl = None


class FileLock:
    """An exclusive lock on `path` (created if missing), held from `acquire` until `release` or the process's end.

    Args:
        path: the lock file; its folder must exist.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = None

    def acquire(self) -> bool:
        """Take the lock if no other process holds it; returns whether it is now held (by this process)."""
        if self._file is not None:
            return True
        file = open(self.path, 'a+')
        if fcntl is not None:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                return False
        file.truncate(0)
        file.write(f'{os.getpid()}\n')
        file.flush()
        self._file = file
        return True

    def holder(self) -> Optional[str]:
        """The process id the lock file records (the holder's, while it is held), or None."""
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def release(self) -> None:
        if self._file is not None:
            if fcntl is not None:
                fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> 'FileLock':
        return self

    def __exit__(self, *exc) -> None:
        self.release()
