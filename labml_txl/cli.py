"""
# `key=value` overrides from the command line

`python experiments/demo.py transformer.d_model=128 steps=200` gives labml the dictionary
`{'transformer.d_model': 128, 'steps': 200}`. The words `true`, `false`, `yes` and `no`, in any case, are
booleans; other values are read as Python literals where they parse (`128`, `0.5`, `None`, `[1, 2]`) and kept as
strings otherwise (`SwiGLU`). A `bool` config item also takes `1` and `0`, and nothing else
(`config_validation`), so `pre_lnorm=flase` is an error, not a true value.
"""
import ast
import sys
from typing import Any, Callable, Dict, List

BOOLEAN_WORDS = {'true': True, 'yes': True, 'false': False, 'no': False}


def parse_value(text: str) -> Any:
    word = text.strip().lower()
    if word in BOOLEAN_WORDS:
        return BOOLEAN_WORDS[word]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_overrides(argv: List[str]) -> Dict[str, Any]:
    """`['a=1', 'b.c=x']` to `{'a': 1, 'b.c': 'x'}`; anything not of the form `key=value` is an error."""
    overrides = {}
    for arg in argv:
        key, sep, value = arg.partition('=')
        if not sep or not key:
            raise SystemExit(f"argument {arg!r} is not accepted: give overrides as key=value, "
                             f"for example transformer.d_model=128")
        overrides[key] = parse_value(value)
    return overrides


def run_script(action: Callable[[List[str]], Any], argv: List[str], usage: str, needs_argument: bool = False) -> int:
    """
    Run `action(argv)` for an experiment script: `--help` prints `usage`; a user error (unknown key or option, a
    value of the wrong type, missing run or file, bad value, unreadable checkpoint, a run another process trains)
    prints `error: ...` and exits 2 instead of a traceback. A training stopped by SIGINT or SIGTERM prints how to
    resume and exits 128 + the signal's number; a Ctrl-C elsewhere exits 130 with one line.
    """
    from .config_validation import ConfigTypeError
    from .train.checkpoint import CheckpointError
    from .train.interruption import TrainingInterrupted
    from .train.runs import RunInUseError
    if any(a in ('-h', '--help') for a in argv) or (needs_argument and not argv):
        print(usage)
        return 2 if not argv and needs_argument else 0
    try:
        action(argv)
    except TrainingInterrupted as stopped:
        # On a line of its own, after the progress line labml's screen leaves open
        print(f'\n{stopped}', file=sys.stderr)
        return stopped.exit_code
    except KeyboardInterrupt:
        print('\nInterrupted (Ctrl-C)', file=sys.stderr)
        return 130
    except (LookupError, ValueError, OSError, CheckpointError, ConfigTypeError, RunInUseError) as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    return 0
