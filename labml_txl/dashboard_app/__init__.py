"""The old path of `labml_txl.dashboard`, kept for one release (`labml_txl/moved_paths.py`)."""
from labml_txl.moved_paths import redirect

redirect(globals())
