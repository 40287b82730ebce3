"""
# Stopping a training on Ctrl-C or SIGTERM without losing it

Within `StopSignals`, SIGINT (Ctrl-C) and SIGTERM (a `kill`, a scheduler's pre-emption, `torchrun` ending its
workers) only ask the training loop to stop: the step in progress finishes (with its validation, where one is
due), a checkpoint of that step is written, and the loop raises `TrainingInterrupted`, whose message says how to
resume. A second SIGINT stops at once (`KeyboardInterrupt`), losing the steps since the last checkpoint; a second
SIGTERM changes nothing (`torchrun` sends one to workers that already got the terminal's SIGINT).
"""
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
    `with` block; outside the main thread, where Python cannot catch signals, it does nothing."""

    def __init__(self):
        self.received: Optional[int] = None
        self._previous = {}

    def __enter__(self) -> 'StopSignals':
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signal_number: int, frame) -> None:
        if self.received is None:
            self.received = signal_number
            print(f'\nlabml_txl: {signal.Signals(signal_number).name} received: stopping after this step with a '
                  f'checkpoint (Ctrl-C again stops at once, losing the steps since the last checkpoint)',
                  file=sys.stderr, flush=True)
        elif signal_number == signal.SIGINT:
            raise KeyboardInterrupt
