"""The paths that moved on 2026-12-04 and 2026-12-07 import for one release, each warning with the new path, and give
the new module itself (so a class imported from either path is the same class)."""
import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from labml_txl.moved_paths import MOVED

PACKAGE = pathlib.Path(__file__).parents[1] / 'labml_txl'
ROOT = PACKAGE.parent


def _forget(name: str):
    for key in [key for key in sys.modules if key == name or key.startswith(name + '.')]:
        del sys.modules[key]


@pytest.fixture
def fresh(request):
    """The old path not yet imported in this process, before and after the test."""
    _forget(request.param)
    yield request.param
    _forget(request.param)


@pytest.mark.parametrize('fresh', sorted(MOVED), indirect=True)
def test_an_old_path_warns_with_the_new_one_and_gives_the_new_module(fresh):
    new = MOVED[fresh]
    with pytest.warns(DeprecationWarning, match=re.escape(f'{fresh} moved to {new}')):
        module = importlib.import_module(fresh)
    assert module is importlib.import_module(new)


@pytest.mark.parametrize('fresh', ['labml_txl.mha'], indirect=True)
def test_the_warning_names_the_line_that_imported_the_old_path(fresh):
    with pytest.warns(DeprecationWarning) as caught:
        from labml_txl.mha import MultiHeadAttention
    from labml_txl.transformer.mha import MultiHeadAttention as moved
    assert MultiHeadAttention is moved
    assert [w.filename for w in caught if w.category is DeprecationWarning] == [__file__]


def test_every_shim_is_listed_and_every_listed_path_has_its_shim():
    shims = {'.'.join(path.relative_to(ROOT).with_suffix('').parts).removesuffix('.__init__')
             for path in PACKAGE.rglob('*.py') if 'redirect(globals())' in path.read_text(encoding='utf-8')}
    assert shims == set(MOVED)


@pytest.mark.parametrize('fresh', ['labml_txl.native'], indirect=True)
def test_a_moved_package_gives_its_submodules_once(fresh):
    with pytest.warns(DeprecationWarning):
        from labml_txl.native import attention
    import labml_txl.fast.native.attention
    assert attention is labml_txl.fast.native.attention
    assert sys.modules['labml_txl.native.decoder_layer'] is sys.modules['labml_txl.fast.native.decoder_layer']


def test_an_old_path_runs_as_a_script():
    out = subprocess.run([sys.executable, '-W', 'always::DeprecationWarning', '-m', 'labml_txl.xl.tf_checkpoint',
                          '--help'], capture_output=True, text=True, timeout=120, cwd=ROOT)
    new = subprocess.run([sys.executable, '-m', 'labml_txl.xl.formats.tf_checkpoint', '--help'],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and new.returncode == 0, out.stderr[-2000:]
    assert out.stdout == new.stdout and 'usage' in out.stdout
    assert 'labml_txl.xl.tf_checkpoint moved to labml_txl.xl.formats.tf_checkpoint' in out.stderr


def test_the_readme_lists_every_moved_path():
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = readme.split('## What changed', 1)[1].split('\n## ', 1)[0]
    for old, new in MOVED.items():
        assert f'`{old}` → `{new}`' in section, old
