"""
# Starting a run the same way in every script

Every experiment script makes its labml run through `create_run` and trains inside `started_run`:

* the run lies in the labml project of the working directory (`runs.use_working_directory_project`);
* its comment is what it is: the overrides whose values differ from the configs' defaults, as `key=value`
  (`attention=alibi mem_len=64`), so two runs of one script are told apart in `runs list` and on the dashboard;
* its tags say which sweep it belongs to, if any (`sweep:<id>`, given by `labml_txl.sweep` through the
  `LABML_TXL_SWEEP` environment variable); a resumed run keeps the tags it had (`keep_resumed_tags`), so a sweep's
  run resumed by hand stays the sweep's;
* its overrides are kept in `overrides.json` (so a resume or a sweep rebuilds the same configs);
* its metrics are kept in `log.jsonl` whether or not a dashboard is up (`metrics_file`);
* it reports live to the dashboard where one is configured (`live_report`): by `report_to_dashboard()`, by
  `labml_app_url` in the environment, or by `app_url` in `.labml.yaml`, each checked to answer before the run starts;
* it prints where it lies and the commands that watch, evaluate, resume and sample it (`next_commands`).
"""
import contextlib
import os
import sys
from urllib.parse import urlsplit
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set

from labml import experiment
from labml.configs import BaseConfigs
from labml.internal.experiment import experiment_singleton
from labml.internal.tracker import tracker_singleton

from ..configs.validation import default_of
from ..dashboard.server import connection_error
from ..runs.files import RunFileError, load_yaml_mapping
from .metrics_file import METRICS_FILE, MetricsFileWriter
from .runs import use_working_directory_project

# Set by `labml_txl.sweep` for the runs it starts
SWEEP_ENV = 'LABML_TXL_SWEEP'


def differing_overrides(conf: BaseConfigs, overrides: Dict[str, Any],
                        script_defaults: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The overrides whose values differ from the defaults (the script's own where it has one, else `conf`'s), in
    the order given."""
    script_defaults = script_defaults or {}
    return {key: value for key, value in overrides.items()
            if value != (script_defaults[key] if key in script_defaults else default_of(conf, key))}


def describe_overrides(overrides: Dict[str, Any]) -> str:
    """`{'attention': 'alibi', 'mem_len': 64}` as `attention=alibi mem_len=64`."""
    return ' '.join(f'{key}={value}' for key, value in overrides.items())


def sweep_tags() -> Set[str]:
    """`{'sweep:<id>'}` for a run a sweep started, else nothing."""
    sweep = os.environ.get(SWEEP_ENV, '').strip()
    return {f'sweep:{sweep}'} if sweep else set()


def keep_resumed_tags(run) -> None:
    """
    Give `run` (labml's, created and not yet started) the tags of the run it resumes as well: those of the
    `run.yaml` already in its folder, which labml rewrites at the start with the tags given to this start alone. A
    sweep's run resumed by hand (without `LABML_TXL_SWEEP`) would otherwise lose its `sweep:<id>`, and the sweep
    would train that point again. A new run's folder has no `run.yaml`: nothing changes.

    Args:
        run: `experiment_singleton().run` after `experiment.create`.
    """
    try:
        saved = load_yaml_mapping(run.info_path, missing_ok=True)
    except RunFileError as error:
        print(f"note: the run's earlier tags are lost: {error}", file=sys.stderr)
        return
    tags = saved.get('tags') if saved else None
    if isinstance(tags, list) and tags:
        run.tags = sorted(set(map(str, tags)) | sweep_tags())


def live_report(labml_options: Dict[str, Any]) -> Set[str]:
    """
    `{'app'}`, labml's writer that reports a run to a dashboard as it trains, where a dashboard's URL is configured
    (labml reads `app_url` of `.labml.yaml` or `lab.configure`, which `report_to_dashboard()` sets, else
    `labml_app_url` of the environment), else nothing. A `ValueError` naming the URL and where it was set when nothing
    answers there: labml would train, then retry for minutes at exit, and the dashboard would never hear of the run.
    A distributed run reports from rank 0 alone, the rank that writes its record (`log.jsonl`, checkpoints).
    """
    from labml.internal.lab import lab_singleton
    app = lab_singleton().app_configs
    if app is None or labml_options.get('distributed_rank', 0) != 0:
        return set()
    where, undo = (("app_url of .labml.yaml or report_to_dashboard()", "leave both out")
                   if lab_singleton().configs.get('app_url') else
                   ("labml_app_url in the environment", "unset labml_app_url"))
    url = urlsplit(app.url)
    error = connection_error(url.hostname, url.port or (443 if url.scheme == 'https' else 80))
    if error is not None:
        raise ValueError(f"the run would report live to {app.url.rstrip('?').removesuffix('track')} ({where}), but "
                         f"nothing answers there ({error.strerror or error}): start the dashboard first "
                         f"(python -m labml_txl.dashboard --port {url.port}), or {undo} to train without "
                         f"reporting live") from error
    return {'app'}


def create_run(name: str, conf: BaseConfigs, overrides: Dict[str, Any], uuid: Optional[str] = None,
               screen: bool = True, script: Optional[str] = None, script_defaults: Optional[Dict[str, Any]] = None,
               **labml_options) -> None:
    """
    `experiment.create` and `experiment.configs` for one script's run, as the module docstring says.

    Args:
        name: the run's name, the script's (`train_xl`).
        conf: the configs the run computes.
        overrides: the settings applied to `conf`: the script's defaults and the user's.
        uuid: the run's UUID (a resume, which keeps the run's tags, or one chosen for every rank of a
            distributed run), else a new one.
        screen: print the tracked values on the console.
        script: the script's path, labml's `python_file` of the run.
        script_defaults: the script's own defaults among `overrides` (a demo's model), left out of the comment
            where the user did not change them.
        labml_options: given to `experiment.create` as they are (a distributed run's rank).
    """
    use_working_directory_project()
    comment = describe_overrides(differing_overrides(conf, overrides, script_defaults))
    writers = ({'screen'} if screen else set()) | live_report(labml_options)
    experiment.create(name=name, uuid=uuid, comment=comment, writers=writers,
                      tags=sweep_tags() or None, python_file=script, **labml_options)
    keep_resumed_tags(experiment_singleton().run)
    experiment.configs(conf, overrides)


@contextlib.contextmanager
def started_run(global_step: int = 0, keep_metrics: bool = True) -> Iterator[Path]:
    """
    `experiment.start(global_step)` that keeps the run's metrics in its `log.jsonl` (unless `keep_metrics` is false:
    a distributed run's other ranks). Yields the run's folder.
    """
    run = experiment_singleton().run
    # A step set explicitly earlier in the process (`tracker.set_global_step`) would otherwise stand for every step
    # of this run: labml prefers it to the loop's count
    tracker_singleton().set_global_step(None)
    with experiment.start(global_step=global_step):
        writer = None
        if keep_metrics:
            writer = MetricsFileWriter(run.run_path / METRICS_FILE)
            tracker_singleton().add_writer(writer)
        try:
            yield run.run_path
        finally:
            if writer is not None:
                writer.flush()


def script_path(file: str) -> str:
    """A script's path as a user would type it: relative to the working directory where it lies below it."""
    path = Path(file).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _python() -> str:
    """The interpreter as a user would type it: as `script_path`, or `python` where it lies elsewhere."""
    typed = script_path(sys.executable)
    return typed if not Path(typed).is_absolute() else 'python'


def next_commands(run_uuid: str, run_path: Path, script: str, resumable: bool = True) -> List[str]:
    """
    Where a run lies and the commands that watch, compare, resume, evaluate and sample it, as lines to print.
    `resumable`: a Transformer-XL run of `train_xl.train`, which the other scripts of `script`'s folder resume,
    evaluate and sample.
    """
    python = _python()
    lines = [f'Run {run_uuid} is kept in {run_path}',
             f'  show:     {python} -m labml_txl.runs show {run_uuid}',
             f'  compare:  {python} -m labml_txl.runs compare {run_uuid} OTHER_UUID ...',
             f'  watch:    {python} -m labml_txl.dashboard   (every run of this project, at http://127.0.0.1:5005)']
    if resumable:
        experiments = Path(script).parent
        lines += [f'  resume:   {python} {script} resume={run_uuid} [max_step=...]',
                  f'  evaluate: {python} {experiments / "eval_xl.py"} {run_uuid} split=test',
                  f'  sample:   {python} {experiments / "generate_xl.py"} {run_uuid}']
    return lines
