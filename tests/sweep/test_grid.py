"""A sweep's grid: lists separated by commas outside brackets and quotes, read as settings are, and their product."""
import pytest

from labml_txl.sweep.grid import alternatives, grid_points, parse_grid


@pytest.mark.parametrize('text, parts', [
    ('relative,rotary,alibi', ['relative', 'rotary', 'alibi']),
    ('[20000,40000]', ['[20000,40000]']),
    ('[10],[20, 30]', ['[10]', '[20, 30]']),
    ("'a,b',c", ["'a,b'", 'c']),
    ('64', ['64']),
])
def test_alternatives_split_at_top_level_commas_only(text, parts):
    assert alternatives(text) == parts


def test_the_grid_is_the_product_in_the_order_given_with_values_read_as_settings():
    grid = parse_grid(['attention=relative,alibi', 'mem_len=0,64', 'max_step=500', 'pre_lnorm=true',
                       'cutoffs=[2,4]'])
    assert grid == {'attention': ['relative', 'alibi'], 'mem_len': [0, 64], 'max_step': [500], 'pre_lnorm': [True],
                    'cutoffs': [[2, 4]]}
    points = grid_points(grid)
    assert [(p['attention'], p['mem_len']) for p in points] == [('relative', 0), ('relative', 64), ('alibi', 0),
                                                                ('alibi', 64)]
    assert all(p['max_step'] == 500 and p['cutoffs'] == [2, 4] and p['pre_lnorm'] is True for p in points)


@pytest.mark.parametrize('argv, message', [
    (['mem_len=0,'], 'an empty value between commas'),
    (['cutoffs=[1,2'], 'a bracket or quote is not closed'),
    (['cutoffs=1]'], "a closing ']' without its opening bracket"),
    (['a=1', 'a=2'], 'a is given twice'),
    (['--mem_len', '0,64'], "argument '--mem_len' is not accepted"),
])
def test_a_malformed_grid_is_refused_naming_what_is_wrong(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(argv)
