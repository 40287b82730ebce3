"""docs/options.md is generated from the registered options and must not go stale."""
from labml_txl.configs import options_doc
from labml_txl.configs import TransformerConfigs


def test_options_doc_is_up_to_date():
    assert options_doc.main(['--check']) == 0, 'docs/options.md is stale: run `python -m labml_txl.configs.options_doc`'


def test_options_doc_lists_every_registered_option():
    text = options_doc.generate()
    conf = TransformerConfigs()
    for key, functions in conf._Configs__options.items():
        assert f'### `{key}`' in text
        for name in functions:
            assert f'- `{name}`:' in text, (key, name)
    for variant in ('GLU', 'Bilinear', 'ReGLU', 'GEGLU', 'SwiGLU'):
        assert f'- `{variant}`: `is_gated` = `True`' in text
