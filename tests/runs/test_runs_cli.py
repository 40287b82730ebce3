"""
`python -m labml_txl.runs list | show | compare | plot` on real runs (`conftest.py`): what each prints is checked
against the files labml and the trainer wrote, read here independently.
"""
import json
import re
import shutil
import subprocess
import sys

import matplotlib.image
import pytest
import yaml

from labml_txl.runs import __main__ as runs_cli
from labml_txl.runs import find_runs, plot_runs, run_labels

# The items of TrainXLConfigs whose computed values are objects (labml writes their strings)
OBJECT_ITEMS = {'model', 'optimizer', 'scheduler', 'corpus'}


def cli(capsys, runs, *args):
    """`(exit code, stdout, stderr)` of the command line on the project of `runs`."""
    code = runs_cli.main(['--project', str(runs.root), *args])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(text):
    """The cells of each line of a table under its rule, split on runs of two spaces or more."""
    lines = text.strip('\n').split('\n')
    rule = next(i for i, line in enumerate(lines) if line.startswith('--'))
    headers = re.split(r'\s{2,}', lines[rule - 1].strip())
    rows = [re.split(r'\s{2,}', line.strip()) for line in lines[rule + 1:] if line.strip()]
    return headers, rows


def logged(path, key):
    """`{step: value}` of `key` in the run's log.jsonl, read without the package's reader (these runs were never
    resumed, so every step is written once)."""
    points = {}
    for line in (path / 'log.jsonl').read_text().splitlines():
        for step, values in json.loads(line)['track'].get(key, []):
            points[step] = sum(values) / len(values)
    return points


def last_logged(path, key):
    """`(step, value)` of the highest step of `key` in the run's log.jsonl."""
    points = logged(path, key)
    step = max(points)
    return step, points[step]


def configs_yaml(path):
    return yaml.safe_load((path / 'configs.yaml').read_text())


def test_list_shows_every_run_with_its_last_step_and_losses(capsys, runs):
    code, out, err = cli(capsys, runs, 'list', '--full')
    assert code == 0, err
    headers, rows = table_rows(out)
    assert headers == ['uuid', 'name', 'status', 'step', 'loss.train', 'loss.valid', 'age', 'comment']
    # first started first
    assert [row[0] for row in rows] == list(runs.uuid.values())
    for key, uuid in runs.uuid.items():
        row = dict(zip(headers, next(r for r in rows if r[0] == uuid)))
        trainer = runs.trainer[key]
        step, loss = last_logged(runs.path[key], 'loss.train')
        valid_step, valid = last_logged(runs.path[key], 'loss.valid')
        assert row['step'] == str(step) == '19'
        assert row['loss.train'] == f'{loss:.4f}'
        assert row['loss.valid'] == f'{valid:.4f}' == f'{trainer.last_valid:.4f}'
        assert row['status'] == 'completed'
        assert row['name'] == ('other_xl' if key == 'other' else 'train_xl')
        assert row['comment'] == yaml.safe_load((runs.path[key] / 'run.yaml').read_text())['comment']
        assert re.fullmatch(r'\d+ (s|min)', row['age'])
        # the record holds the trainer's last validation loss exactly
        record = find_runs([uuid], runs.root)[0]
        assert record.last('loss.valid') == trainer.last_valid and record.last_step('loss.valid') == valid_step


def test_list_shows_short_uuids_unless_full(capsys, runs):
    code, out, _ = cli(capsys, runs, 'list')
    shown = [row[0] for row in table_rows(out)[1]]
    assert all(8 <= len(s) < 32 for s in shown)
    assert [next(u for u in runs.uuid.values() if u.startswith(s)) for s in shown] == list(runs.uuid.values())


def test_list_takes_a_sweep_and_a_name(capsys, runs):
    _, out, _ = cli(capsys, runs, 'list', '--full', '--sweep', 'demo')
    assert [row[0] for row in table_rows(out)[1]] == [runs.uuid['alibi16'], runs.uuid['relative16']]
    _, out, _ = cli(capsys, runs, 'list', '--full', '--name', 'other_xl')
    assert [row[0] for row in table_rows(out)[1]] == [runs.uuid['other']]
    code, out, _ = cli(capsys, runs, 'list', '--sweep', 'no-such-sweep')
    assert code == 0 and out.strip() == 'no runs'


def _show_configs(out):
    """`{key: (marked, text)}` of the configs section of `show`."""
    section = out.split('configs (* overridden):\n', 1)[1].split('\n\n', 1)[0]
    items = {}
    for line in section.split('\n'):
        match = re.fullmatch(r'([* ]) (\S+)\s+= (.*)', line)
        if match:
            items[match[2]] = (match[1] == '*', match[3])
    return items


def test_show_marks_the_items_configs_yaml_says_were_overridden(capsys, runs):
    path = runs.path['alibi0']
    code, out, err = cli(capsys, runs, 'show', runs.uuid['alibi0'][:8])
    assert code == 0, err
    assert f'folder:   {path}' in out and 'status:   completed' in out
    assert 'name:     train_xl' in out
    shown = _show_configs(out)
    written = configs_yaml(path)
    computed = {key for key, item in written.items() if item['order'] != -1}
    assert set(shown) == computed
    assert {key for key, (marked, _) in shown.items() if marked} == \
        {key for key in computed if written[key]['is_explicitly_specified']} >= {'attention', 'mem_len', 'n_layer'}
    assert shown['attention'] == (True, 'alibi') and shown['mem_len'] == (True, '0')
    assert shown['attn_type'] == (False, '5')
    assert shown['model'] == (False, 'MemTransformerLM(…)')
    # the items never computed are named, not shown as values
    assert 'not computed: ' in out and 'device' not in shown
    # the last value of each metric, at its step
    metrics = out.split('metrics (last value, at step):\n', 1)[1]
    step, loss = last_logged(path, 'loss.train')
    assert re.search(rf'loss\.train\s+{re.escape(f"{loss:.6g}")}\s+{step}\n', metrics)


def test_compare_shows_only_the_items_that_differ(capsys, runs):
    keys = ['alibi16', 'relative16', 'alibi0']
    code, out, err = cli(capsys, runs, 'compare', *(runs.uuid[k] for k in keys), '--full')
    assert code == 0, err
    headers, rows = table_rows(out.rsplit('\n', 2)[0])
    written = [configs_yaml(runs.path[k]) for k in keys]
    differing = {key for key in written[0]
                 if len({json.dumps(w[key]['computed']) for w in written}) > 1 and key not in OBJECT_ITEMS}
    assert differing >= {'attention', 'mem_len', 'attn_type'}
    assert headers == ['uuid'] + sorted(differing) + ['step', 'loss.train', 'loss.valid', 'min loss.valid']
    by_uuid = {row[0]: dict(zip(headers, row)) for row in rows}
    assert [row[0] for row in rows] == [runs.uuid[k] for k in keys]
    assert by_uuid[runs.uuid['relative16']]['attention'] == 'relative*'
    assert by_uuid[runs.uuid['alibi0']]['mem_len'] == '0*'
    assert by_uuid[runs.uuid['alibi0']]['attn_type'] == '5'
    for key in keys:
        row, trainer = by_uuid[runs.uuid[key]], runs.trainer[key]
        assert row['loss.valid'] == f'{trainer.last_valid:.4f}'
        assert row['min loss.valid'] == f'{min(logged(runs.path[key], "loss.valid").values()):.4f}'
        assert row['loss.train'] == f'{last_logged(runs.path[key], "loss.train")[1]:.4f}'
    assert f'{len(differing)} config items differ' in out


def test_compare_names_every_missing_uuid_with_the_closest_known(capsys, runs):
    real = runs.uuid['alibi16']
    typo = real[:8] + ('0' if real[8] != '0' else '1')
    code, out, err = cli(capsys, runs, 'compare', real, typo, 'nothing-like-it')
    assert code == 2 and out == ''
    assert err.startswith('error: unknown run UUIDs: ')
    assert f"'{typo}' (closest: {real}" in err and "'nothing-like-it'" in err
    assert str(runs.experiments) in err


def test_compare_refuses_runs_of_different_scripts(capsys, runs):
    code, _, err = cli(capsys, runs, 'compare', runs.uuid['alibi16'], runs.uuid['other'], runs.uuid['alibi0'])
    assert code == 2 and err.startswith('error: the runs are of different scripts')
    assert f"train_xl (train_xl.py): {runs.uuid['alibi16']}, {runs.uuid['alibi0']}" in err
    assert f"other_xl (train_xl.py): {runs.uuid['other']}" in err
    code, out, err = cli(capsys, runs, 'compare', runs.uuid['alibi16'], runs.uuid['other'], '--any-script')
    assert code == 0, err
    assert 'no config item differs between these runs' in out


def test_compare_needs_two_runs(capsys, runs):
    code, _, err = cli(capsys, runs, 'compare', runs.uuid['alibi16'])
    assert code == 2 and 'two runs or more' in err


def test_a_prefix_two_runs_start_with_is_refused_naming_both(capsys, runs, tmp_path):
    for new in ('abc1', 'abc2'):
        copy = tmp_path / 'logs' / 'train_xl' / new
        shutil.copytree(runs.path['alibi16'], copy)
        info = yaml.safe_load((copy / 'run.yaml').read_text())
        (copy / 'run.yaml').write_text(yaml.safe_dump({**info, 'uuid': new}))
    code = runs_cli.main(['show', 'abc', '--project', str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and "more than one run starts with 'abc' (the start of abc1, abc2)" in err
    assert runs_cli.main(['show', 'abc2', '--project', str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith('run abc2\n')


def test_plot_writes_a_png_labelled_by_the_settings_that_differ(capsys, runs, tmp_path):
    keys = ['alibi16', 'relative16', 'alibi0']
    records = find_runs([runs.uuid[k] for k in keys], runs.root)
    plot = plot_runs(records, out=tmp_path / 'curves.png')
    assert plot.labels == run_labels(records) == \
        ['attention=alibi mem_len=16', 'attention=relative mem_len=16', 'attention=alibi mem_len=0']
    assert plot.metrics == ['loss.train', 'loss.valid']
    image = matplotlib.image.imread(plot.path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    # the command line's default path lies under the project, and it prints it
    code, out, err = cli(capsys, runs, 'plot', *(runs.uuid[k][:8] for k in keys), '--metric', 'loss.valid')
    assert code == 0, err
    path = runs.experiments / 'plots' / f"loss.valid-{'-'.join(runs.uuid[k][:8] for k in keys)}.png"
    assert out.strip() == str(path)
    assert matplotlib.image.imread(path).ndim == 3


def test_plot_of_a_metric_no_run_has_names_the_metrics_they_have(capsys, runs, tmp_path):
    out_file = tmp_path / 'never.png'
    code, out, err = cli(capsys, runs, 'plot', runs.uuid['alibi16'], '--metric', 'loss.vaild', '--out', str(out_file))
    assert code == 2 and out == ''
    assert err.startswith("error: no run has the metric 'loss.vaild': the runs have ")
    assert 'loss.train' in err and 'loss.valid' in err
    assert not out_file.exists()


@pytest.mark.parametrize('given, written', [('curves', 'curves.png'), ('folder', 'folder/{default}'),
                                             ('curves.pdf', 'curves.pdf'), ('curves.SVG', 'curves.SVG')])
def test_plot_writes_the_file_it_prints(capsys, runs, tmp_path, given, written):
    """A name without a suffix gets `.png` (matplotlib adds it, and the path printed must be the file written), a
    folder gets the default name, and another suffix names the image's format."""
    (tmp_path / 'folder').mkdir()
    uuids = [runs.uuid['alibi16'][:8], runs.uuid['alibi0'][:8]]
    code, out, err = cli(capsys, runs, 'plot', *uuids, '--out', str(tmp_path / given))
    assert code == 0, err
    expected = tmp_path / written.format(default=f"loss.train_loss.valid-{'-'.join(uuids)}.png")
    assert out.strip() == str(expected)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob('*') if p.is_file()) == \
        [expected.relative_to(tmp_path)]
    # the file is the image its suffix names, read back by its own format's signature
    signatures = {'.png': b'\x89PNG', '.pdf': b'%PDF', '.svg': b'<?xml'}
    assert expected.read_bytes().startswith(signatures[expected.suffix.lower()])


@pytest.mark.parametrize('given, message', [
    ('curves.txt', "cannot write a plot to '{path}': .txt is no image format; give a name ending in .png, or "
                   "another of "),
    ('a_file/curves.png', "cannot write the plot to '{path}': "),
])
def test_plot_where_it_cannot_write_is_refused_naming_the_file(capsys, runs, tmp_path, given, message):
    (tmp_path / 'a_file').write_text('a file where the plot\'s folder would be')
    code, out, err = cli(capsys, runs, 'plot', runs.uuid['alibi16'], '--out', str(tmp_path / given))
    assert code == 2 and out == ''
    assert err.startswith('error: ' + message.format(path=tmp_path / given)), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a_file']


def test_plot_without_matplotlib_says_how_to_install_it(capsys, runs, monkeypatch):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # what `import matplotlib` raises ImportError for
    code, out, err = cli(capsys, runs, 'plot', runs.uuid['alibi16'])
    assert code == 2 and out == ''
    assert err == "error: plotting needs matplotlib: pip install matplotlib (or -e '.[experiments]')\n"


def test_the_module_reads_the_working_directory_project(runs):
    """`python -m labml_txl.runs` in a fresh process, in the project's folder, with no --project."""
    done = subprocess.run([sys.executable, '-m', 'labml_txl.runs', 'list', '--full'], cwd=runs.root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [row[0] for row in table_rows(done.stdout)[1]] == list(runs.uuid.values())


@pytest.mark.parametrize('command', ['list', 'show', 'compare', 'plot'])
def test_every_command_has_help(capsys, command):
    with pytest.raises(SystemExit) as exited:
        runs_cli.main([command, '--help'])
    assert exited.value.code == 0
    assert f'usage: python -m labml_txl.runs {command}' in capsys.readouterr().out
