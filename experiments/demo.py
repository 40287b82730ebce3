"""
The demo `make demo` runs: the labml dashboard, a small Transformer-XL trained on the bundled Tiny Shakespeare on
the CPU within a bounded time, its validation bits per character, a sample, and where to see the run.

    python experiments/demo.py [time_limit=480] [port=5005] [key=value ...]

Other `key=value` pairs override the training configs (listed below). The run lies in the labml project of the
working directory, like every run; the dashboard follows that project's runs, keeps running after the demo (its
address and process id are printed) and keeps its own store in `logs/dashboard`.
"""
import sys
import time
from pathlib import Path
from typing import List

from labml import lab

from labml_txl.fast import native
from labml_txl.cli import parse_overrides, run_script
from labml_txl.dashboard import DEFAULT_PORT, check_port, run_url, start_in_background
from labml_txl.configs.settings import Settings
from labml_txl.train.configs import TrainXLConfigs
from labml_txl.train.runs import use_working_directory_project

sys.path.insert(0, str(Path(__file__).resolve().parent))

import generate_xl  # noqa: E402
import train_xl  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# A small model that learns fast on two cores: no dropout (it underfits in minutes), pre-norm layers so that a
# high learning rate stays stable, warm-up and a cosine decay over 5,000 steps (about 6 minutes on this project's
# 2-core CPU; `time_limit` stops a slower machine earlier, with a higher final loss)
DEMO = {'n_layer': 4, 'd_model': 128, 'n_head': 4, 'd_head': 32, 'd_inner': 512, 'dropout': 0.0, 'dropatt': 0.0,
        'pre_lnorm': True, 'tgt_len': 64, 'mem_len': 64, 'batch_size': 16, 'lr': 0.006, 'warmup_step': 200,
        'max_step': 5000, 'eval_interval': 1000, 'checkpoint_interval': 1000, 'time_limit': 480.0}
SETTINGS = Settings(TrainXLConfigs, DEMO, extra={'port': ('int', DEFAULT_PORT, "the dashboard's port")})


def start_dashboard(port: int) -> str:
    """The dashboard on `port`, following the runs of the working directory's project, its store in
    `logs/dashboard` (started, or found running); a line to print."""
    use_working_directory_project()
    return start_in_background(port, REPO / 'logs' / 'dashboard', REPO / 'logs' / 'dashboard.log',
                               project=lab.get_path())


def demo(args: List[str]) -> None:
    overrides = parse_overrides(args, SETTINGS)
    port = check_port(overrides.pop('port', DEFAULT_PORT))
    dashboard = start_dashboard(port)
    # The evaluation kernels compiled first (once per machine, about a minute): the minutes below are training's
    native.prepare_kernels()
    started = time.time()
    trainer = train_xl.train({**DEMO, **overrides}, name='demo', script_defaults=DEMO)
    minutes = (time.time() - started) / 60
    valid = trainer.last_valid
    sample = generate_xl.sample_text(trainer.model, trainer.corpus, prompt='ROMEO:\n', n_tokens=400,
                                     temperature=0.8, top_p=0.95)
    from labml.internal.experiment import experiment_singleton
    run_uuid = experiment_singleton().run.uuid
    print('\n' + '=' * 80)
    print(f'Trained {trainer.step} steps in {minutes:.1f} minutes on {trainer.device}: '
          f'validation {valid / 0.6931471805599453:.3f} bits per character (loss {valid:.4f} nats)')
    print('-' * 80 + '\nA sample (temperature 0.8, top-p 0.95):\n')
    print(sample)
    print('-' * 80)
    print(f'Dashboard: {run_url(run_uuid, port)}  ({dashboard}; it shows a run a few seconds after its files)')


if __name__ == '__main__':
    sys.exit(run_script(demo, sys.argv[1:], __doc__, settings=SETTINGS))
