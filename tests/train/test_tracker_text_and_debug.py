"""labml 0.4's `tracker.set_text` and `tracker.debug` (`labml_txl.train.tracker_text_and_debug`), called directly:
labml itself is left unchanged here."""
import pytest
import torch
from labml import tracker
from labml.internal.tracker import tracker_singleton

from labml_txl.train.tracker_text_and_debug import TextIndicator, debug, set_text


def test_labml_refuses_a_text_that_set_text_declares(labml_experiment):
    with pytest.raises(ValueError):  # labml 0.5.3 alone: no indicator of its kinds takes a string
        tracker.add('compat_undeclared_text', 'It is')
    set_text('compat_sampled')
    with tracker.namespace('sample'):  # as labml_nn's trainer adds its samples
        tracker.add({'compat_sampled': 'It is the'})
    tracker.add('compat_sampled', 'It is a')
    indicator = tracker_singleton().indicators['compat_sampled']
    assert isinstance(indicator, TextIndicator) and indicator.values == ['It is the', 'It is a']
    tracker.save()  # the writers take numbers only; saving clears the texts as it clears every indicator
    assert indicator.values == []
    with pytest.raises(TypeError, match="'compat_sampled' was declared with tracker.set_text and takes strings; it "
                                        "got a float"):
        tracker.add('compat_sampled', 1.5)


def test_a_text_pattern_and_printing(labml_experiment, capsys):
    set_text('compat_texts.*', is_print=True)
    tracker.add('compat_texts.first', 'hello there')
    assert tracker_singleton().indicators['compat_texts.first'].values == ['hello there']
    assert 'hello there' in capsys.readouterr().out


@pytest.mark.parametrize('args, message', [(('',), 'non-empty string'), ((None,), 'non-empty string'),
                                           (('x', 'yes'), 'is_print must be a bool')])
def test_set_text_refuses_bad_arguments(args, message):
    with pytest.raises(TypeError, match=message):
        set_text(*args)


def test_debug_collects_only_while_switched_on():
    attn = torch.ones(2, 2, requires_grad=True) * 2
    debug('compat_attn', attn)
    assert debug('compat_attn') == []  # off by default: labml_nn's attention calls it at every forward pass
    debug(True)
    debug('compat_attn', attn)
    debug('compat_attn', 3)
    values = debug('compat_attn')
    assert len(values) == 2 and torch.equal(values[0], attn) and not values[0].requires_grad and values[1] == 3
    debug(False)
    debug('compat_attn', attn)
    assert len(debug('compat_attn')) == 2
    debug(True)  # a fresh collection
    assert debug('compat_attn') == []
    debug(False)


@pytest.mark.parametrize('args', [(), (1,), (1, 2), ('a', 2, 3)])
def test_debug_refuses_other_calls(args):
    with pytest.raises(TypeError, match=r'call debug\(True\) or debug\(False\), debug\(name\) or debug\(name, value\)'):
        debug(*args)
