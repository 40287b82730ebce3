"""
# Stopping a training on Ctrl-C or SIGTERM without losing it

Within `StopSignals`, SIGINT (Ctrl-C) and SIGTERM (a `kill`, a scheduler's pre-emption, `torchrun` ending its
workers) only ask the training loop to stop: the step in progress finishes (with its validation, where one is
due), a checkpoint of that step is written, and the loop raises `TrainingInterrupted`, whose message says how to
resume. A second signal changes nothing, whenever it comes (Ctrl-C pressed twice, `torchrun`'s SIGTERM to workers
that already got the terminal's SIGINT): the step still finishes, its checkpoint is written whole, and the same line
is printed. Raised from a signal handler, an exception would land wherever the process happens to be: in the
checkpoint's writing, in labml's end of the run, in the report of the stop itself, or in a `__del__`, where Python
prints its traceback and goes on. Only SIGKILL stops at once (losing the steps since the last checkpoint).

The stop outlives the training loop: `ScriptSignals`, around a whole script (`cli.run_script`), takes it over when the
loop's `StopSignals` ends, so a signal that comes while the script reports the stop and exits is absorbed too.
Outside a training loop a script's Ctrl-C is Python's (`KeyboardInterrupt`, one line from `run_script`) and its SIGTERM
the default one.
"""
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """Training stopped by a signal after saving the checkpoint of `step` in `checkpoint`; `resume_command`, set
    by whoever knows the run, is printed with it."""

    def __init__(self, signal_number: int, step: int, checkpoint: Optional[Path]):
        super().__init__(signal_number, step, checkpoint)
        self.signal_number, self.step, self.checkpoint = signal_number, step, checkpoint
        self.resume_command: Optional[str] = None

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process ended by it (130 for SIGINT)."""
        return 128 + self.signal_number

    def __str__(self) -> str:
        name = signal.Signals(self.signal_number).name
        saved = f'saved the checkpoint {self.checkpoint}' if self.checkpoint else 'saved no checkpoint (none asked)'
        resume = f'; resume with: {self.resume_command}' if self.resume_command else ''
        return f'Stopped by {name} at step {self.step} and {saved}{resume}'


class StopSignals:
    """SIGINT and SIGTERM become a request to stop (`received`, the first signal's number) for the length of a
    `with` block; outside the main thread, where Python cannot catch signals, it does nothing. Nested in a
    `StopSignals` (a `ScriptSignals`), it hands a stop it received on to it as it ends."""

    def __init__(self):
        self.received: Optional[int] = None
        self._previous = {}

    def __enter__(self) -> 'StopSignals':
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        outer = getattr(self._previous.get(signal.SIGINT), '__self__', None)
        if isinstance(outer, StopSignals) and outer.received is None:
            outer.received = self.received
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signal_number: int, frame) -> None:
        if self.received is None:
            self.received = signal_number
            print(f'\nlabml_txl: {signal.Signals(signal_number).name} received: stopping after this step with a '
                  f'checkpoint (another signal changes nothing; kill -9 stops at once, losing the steps since the '
                  f'last checkpoint)', file=sys.stderr, flush=True)


class ScriptSignals(StopSignals):
    """Around a whole script: before a training loop has stopped on a signal, Ctrl-C raises `KeyboardInterrupt` and
    SIGTERM ends the process, as Python's own handlers do; after, every signal is absorbed while the script reports the
    stop and returns."""

    def _handle(self, signal_number: int, frame) -> None:
        if self.received is not None:
            return
        if signal_number == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signal_number, signal.SIG_DFL)
        os.kill(os.getpid(), signal_number)
