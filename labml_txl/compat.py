"""
# labml 0.4's checkpoint and tracker calls, put back on labml 0.5 (an explicit opt-in)

labml 0.5 removed `experiment.add_pytorch_models`, `experiment.save_checkpoint` and `experiment.load`, and 0.5.3
has no `tracker.set_text` or `tracker.debug`; labml_nn 0.5.1's experiment scripts still call them, so they stop at
the first. A script runs again with one line before it calls labml:

```python
import labml_txl.compat
```

which adds to the `labml` modules:

| name | does |
| --- | --- |
| `experiment.add_pytorch_models({'model': m})` (or `model=m`) | registers models with the current run |
| `experiment.save_checkpoint()` | saves their state dicts into the run's `checkpoints/<global step>/` |
| `experiment.load(run_uuid, checkpoint=None)` | the next `start()` loads them from that run's newest (or given) one |
| `experiment.start()` | labml's, loading first what `load` chose; `with start():` saves the models when it completes |
| `tracker.set_text(name, is_print=False)` | declares a text indicator, so `tracker.add(name, text)` is accepted |
| `tracker.debug(...)` | collects values for inspection while switched on (`debug(True)`) |

The checkpoints are this package's (`labml_txl.train.checkpoint`); what each call does, and where it differs from
labml 0.4, is in `labml_txl.train.run_models` and `labml_txl.train.tracker_text_and_debug`.

Only this import changes labml; `import labml_txl` never does. A name labml already has is left as it is: with a
labml that still keeps models itself (0.4), the four experiment calls stay labml's own.
"""
import labml.experiment
import labml.tracker

from .train import run_models, tracker_text_and_debug

_EXPERIMENT_CALLS = ('add_pytorch_models', 'save_checkpoint', 'load')


def _install() -> None:
    if not any(hasattr(labml.experiment, name) for name in _EXPERIMENT_CALLS):
        for name in _EXPERIMENT_CALLS:
            setattr(labml.experiment, name, getattr(run_models, name))
        # `start` loads what `load` chose; `experiment.record` calls it too
        labml.experiment.start = run_models.start
    for name in ('set_text', 'debug'):
        if not hasattr(labml.tracker, name):
            setattr(labml.tracker, name, getattr(tracker_text_and_debug, name))


_install()
