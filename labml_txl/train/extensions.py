"""
# Modules of the user's own that a run needs: `imports=`

A memory mechanism or a positional scheme defined outside the package registers itself when its module is imported
(`docs/memories.md`, `docs/attention.md`), and its settings are items of the configs only from then on. A script takes
such modules as `imports=my_memories` (several separated by commas), imports them before it builds its configs, and
keeps the setting with the run, so that a resume, `eval_xl.py` and `generate_xl.py` of the run import them too.
"""
import importlib
import os
import sys
from typing import Any, Dict, List

from ..cli import list_setting


def import_extensions(overrides: Dict[str, Any]) -> List[str]:
    """
    Import the modules `overrides['imports']` names (none where it is not given), from the working directory first
    (as `python -m` finds them) and then `sys.path`; returns their names. An `ImportError` names a module that is not
    found, the folders searched and how to make it found; an exception the module raises while it runs is its own.
    """
    given = overrides.get('imports', [])
    names = [] if given in ([], '', None) else list_setting('imports', given, str)
    folder = os.getcwd()
    for name in names:
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise
            raise ImportError(f"imports={given!r}: the module {name!r} is not found in the working directory "
                              f"{folder} or on sys.path: run from the folder that holds {name.replace('.', '/')}.py, "
                              f"or add its folder to PYTHONPATH") from None
        finally:
            if added:
                sys.path.remove(folder)
    return names
