"""The encoded corpus is cached: a second load does not tokenize; a changed file or parameter encodes again."""
import os
import random

import pytest
import torch

from labml_txl.data import get_corpus, tokenization


@pytest.fixture
def calls(count_calls):
    """Counts the calls of every tokenizer the corpora use."""
    return count_calls(tokenization, ('tokenize_line', 'tokenize_chars', 'tokenize_bytes'))


def write_wikitext(folder, seed=0):
    rng = random.Random(seed)
    words = 'the cat sat on a mat <unk> , .'.split()
    for split, n in (('train', 50), ('valid', 10), ('test', 10)):
        lines = [' '.join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(n)]
        (folder / f'wiki.{split}.tokens').write_text('\n'.join(lines) + '\n', encoding='utf-8')


def same(a, b):
    return a.vocab == b.vocab and all(torch.equal(getattr(a, s), getattr(b, s)) and getattr(b, s).dtype == torch.long
                                      for s in ('train', 'valid', 'test'))


def test_second_load_reads_the_cache_beside_the_data(tmp_path, calls):
    write_wikitext(tmp_path)
    first = get_corpus('wt103', tmp_path)
    assert calls['tokenize_line'] == 50 + 50 + 10 + 10  # counted (train), then encoded (three files)
    assert len(list(tmp_path.glob('wt103-*.pt'))) == 1
    calls.clear()
    second = get_corpus('wt103', tmp_path)
    assert calls == {} and same(first, second)


def test_changed_source_file_or_parameters_encode_again(tmp_path, calls):
    write_wikitext(tmp_path)
    first = get_corpus('wt103', tmp_path, cache_dir=tmp_path / 'cache')
    valid = tmp_path / 'wiki.valid.tokens'
    stat = valid.stat()
    valid.write_text('the cat\n', encoding='utf-8')
    os.utime(valid, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10 ** 9))
    calls.clear()
    changed = get_corpus('wt103', tmp_path, cache_dir=tmp_path / 'cache')
    assert calls['tokenize_line'] > 0
    assert changed.vocab.decode(changed.valid) == ['the', 'cat', '<eos>'] and not same(first, changed)
    calls.clear()
    assert same(changed, get_corpus('wt103', tmp_path, cache_dir=tmp_path / 'cache')) and calls == {}
    small = get_corpus('wt103', tmp_path, cache_dir=tmp_path / 'cache', max_size=3)
    assert calls['tokenize_line'] > 0 and len(small.vocab) < len(changed.vocab)
    assert len(list((tmp_path / 'cache').glob('wt103-*.pt'))) == 2


def test_byte_corpus_cache_and_no_cache(tmp_path, calls):
    data = bytes(random.Random(0).randrange(256) for _ in range(300))
    (tmp_path / 'enwik8').write_bytes(data)
    kwargs = dict(train_size=200, valid_size=50, test_size=50)
    first = get_corpus('enwik8', tmp_path, **kwargs)
    assert calls['tokenize_bytes'] == 3
    calls.clear()
    assert same(first, get_corpus('enwik8', tmp_path, **kwargs)) and calls == {}
    uncached = get_corpus('enwik8', tmp_path, cache=False, keep_newlines=True, **kwargs)
    assert calls['tokenize_bytes'] == 3 and len(list(tmp_path.glob('enwik8-*.pt'))) == 1
    assert uncached.train.numel() == 200


def test_damaged_cache_is_replaced_with_a_warning(tmp_path, calls):
    write_wikitext(tmp_path)
    first = get_corpus('wt103', tmp_path)
    (cache,) = tmp_path.glob('wt103-*.pt')
    cache.write_bytes(b'not a torch file')
    with pytest.warns(UserWarning, match='unreadable corpus cache'):
        again = get_corpus('wt103', tmp_path)
    assert same(first, again)


def test_tiny_shakespeare_is_cached_only_in_a_given_folder(tmp_path, calls):
    first = get_corpus('tiny_shakespeare', cache_dir=tmp_path)
    assert calls['tokenize_chars'] == 3 and len(list(tmp_path.glob('tiny_shakespeare-*.pt'))) == 1
    calls.clear()
    assert same(first, get_corpus('tiny_shakespeare', cache_dir=tmp_path)) and calls == {}
