"""
# One command line for every experiment script

Every script in `experiments/` runs through `run_script` and takes its settings as `key=value`:
`python experiments/char_transformer.py transformer.d_model=128 max_step=200` gives labml the dictionary
`{'transformer.d_model': 128, 'max_step': 200}`. The words `true`, `false`, `yes` and `no`, in any case, are
booleans; other values are read as Python literals where they parse (`128`, `0.5`, `None`, `[1, 2]`) and kept as
strings otherwise (`SwiGLU`). A `bool` config item also takes `1` and `0`, and nothing else
(`configs/validation.py`), so `pre_lnorm=flase` is an error, not a true value.

`--help` lists every setting a script takes, from its configs (`settings.Settings`); an argument that is not
`key=value` (`--n_layer 2`) is refused with the `key=value` that the script takes instead.
"""
import ast
import sys
from typing import Any, Callable, Dict, List, Optional

from .configs.settings import Settings
from .errors import closest

BOOLEAN_WORDS = {'true': True, 'yes': True, 'false': False, 'no': False}


def parse_value(text: str) -> Any:
    word = text.strip().lower()
    if word in BOOLEAN_WORDS:
        return BOOLEAN_WORDS[word]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def list_setting(name: str, value: Any, kind: type) -> list:
    """The setting `name`'s `value` as a list of `kind`: a list, a single value, or a string separated by commas
    (`schemes=relative,rotary`); a `ValueError` saying what is accepted otherwise."""
    items = value.split(',') if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    try:
        items = [kind(item.strip()) if isinstance(item, str) else item for item in items]
    except ValueError:
        items = None
    if not items or not all(isinstance(item, kind) and not isinstance(item, bool) for item in items):
        raise ValueError(f"{name}={value!r} is not accepted: one or more {kind.__name__} values, as a list or "
                         f"separated by commas")
    return items


def parse_overrides(argv: List[str], settings: Optional[Settings] = None) -> Dict[str, Any]:
    """
    `['a=1', 'b.c=x']` to `{'a': 1, 'b.c': 'x'}`. Anything not of the form `key=value` is a `ValueError` that
    shows the `key=value` meant (`--n_layer 2` gives `n_layer=2`), with the closest key of `settings` where the
    key is not one of them.
    """
    overrides = {}
    for position, arg in enumerate(argv):
        key, sep, value = arg.partition('=')
        if not sep or not key:
            raise ValueError(f"argument {arg!r} is not accepted: {_meant(argv, position, settings)}")
        overrides[key] = parse_value(value)
    return overrides


def _meant(argv: List[str], position: int, settings: Optional[Settings]) -> str:
    """What to write instead of `argv[position]`, which is not `key=value`."""
    key = argv[position].lstrip('-').partition('=')[0].replace('-', '_')
    following = argv[position + 1] if position + 1 < len(argv) else ''
    value = following if following and '=' not in following else 'VALUE'
    keys = settings.keys() if settings is not None else []
    if keys and key not in keys:
        match = closest(key, keys).strip()
        return f"give settings as key=value ({match or 'no setting is named ' + repr(key) + '.'} `--help` lists them)"
    return f"give settings as key=value, here {key or 'KEY'}={value} (`--help` lists them)"


def run_script(action: Callable[[List[str]], Any], argv: List[str], usage: str, needs_argument: bool = False,
               settings: Optional[Settings] = None) -> int:
    """
    Run `action(argv)` for an experiment script: `--help` prints `usage` and every setting of `settings`; a user error (unknown key or option, a
    value of the wrong type, missing run or file, bad value, unreadable checkpoint, a run another process trains)
    prints `error: ...` and exits 2 instead of a traceback. A training stopped by SIGINT or SIGTERM prints how to
    resume and exits 128 + the signal's number, however many signals came (`interruption.ScriptSignals`); a Ctrl-C
    elsewhere exits 130 with one line. An `action` that returns an int returns it as the exit code.
    """
    from .train.interruption import ScriptSignals
    if any(a in ('-h', '--help') for a in argv) or (needs_argument and not argv):
        print(usage.strip('\n'))
        if settings is not None:
            print('\n' + settings.help())
        return 2 if not argv and needs_argument else 0
    with ScriptSignals():
        return _reported(action, argv)


def _reported(action: Callable[[List[str]], Any], argv: List[str]) -> int:
    """`action(argv)`'s exit code, its errors reported as `run_script` says."""
    from .configs.validation import ConfigTypeError
    from .train.checkpoint import CheckpointError
    from .train.interruption import TrainingInterrupted
    from .train.trainer import TrainingDiverged
    from .train.runs import RunInUseError
    try:
        result = action(argv)
    except TrainingInterrupted as stopped:
        # On a line of its own, after the progress line labml's screen leaves open
        print(f'\n{stopped}', file=sys.stderr)
        return stopped.exit_code
    except TrainingDiverged as diverged:
        # (the same)
        print(f'\nerror: {diverged}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('\nInterrupted (Ctrl-C)', file=sys.stderr)
        return 130
    except (LookupError, ValueError, OSError, CheckpointError, ConfigTypeError, RunInUseError) as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    # (an action may return its own exit code: a sweep with a failed run)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0
