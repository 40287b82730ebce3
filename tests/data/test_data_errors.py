"""Bad input fails at once with the file's path and what was expected."""
import pytest

from labml_txl.data import DataFileFormatError, EmptyDataFileError, MissingDataFileError, get_corpus, load_text8


def write_wikitext(folder, train=' a b\n', valid=' a\n', test=' b\n', name='wiki.{}.tokens'):
    for split, text in (('train', train), ('valid', valid), ('test', test)):
        data = text if isinstance(text, bytes) else text.encode('utf-8')
        (folder / name.format(split)).write_bytes(data)


@pytest.mark.parametrize('name, expected', [('enwik8', 'enwik8.zip'), ('text8', 'text8.zip'),
                                            ('wt103', 'wiki.train.tokens'), ('wt2', 'wiki.train.tokens'),
                                            ('ptb', 'ptb.train.txt'),
                                            ('lm1b', 'training-monolingual.tokenized.shuffled')])
def test_missing_data_file(tmp_path, name, expected):
    (tmp_path / 'README').write_text('hello')
    with pytest.raises(MissingDataFileError, match='not found: expected') as e:
        get_corpus(name, tmp_path)
    assert str(tmp_path) in str(e.value) and expected in str(e.value) and 'README' in str(e.value)


def test_missing_test_file_is_named(tmp_path):
    write_wikitext(tmp_path)
    (tmp_path / 'wiki.test.tokens').unlink()
    with pytest.raises(MissingDataFileError, match=r'WikiText-103 test file not found.*wiki\.test\.tokens'):
        get_corpus('wt103', tmp_path)


@pytest.mark.parametrize('name', ['wt103', 'ptb'])
def test_empty_data_file(tmp_path, name):
    pattern = 'wiki.{}.tokens' if name == 'wt103' else 'ptb.{}.txt'
    write_wikitext(tmp_path, valid='', name=pattern)
    with pytest.raises(EmptyDataFileError, match='is empty') as e:
        get_corpus(name, tmp_path, cache=False)
    assert str(tmp_path / pattern.format('valid')) in str(e.value)


def test_empty_single_file_corpora(tmp_path):
    (tmp_path / 'enwik8').write_bytes(b'')
    with pytest.raises(EmptyDataFileError, match=r'enwik8 data file .*enwik8 is empty \(0 bytes\)'):
        get_corpus('enwik8', tmp_path)
    (tmp_path / 'play.txt').write_text('')
    with pytest.raises(EmptyDataFileError, match='play.txt is empty'):
        get_corpus('tiny_shakespeare', tmp_path / 'play.txt')


def test_non_utf8_word_file_names_the_line(tmp_path):
    write_wikitext(tmp_path, train=b' a b\n c \xff d\n')
    with pytest.raises(DataFileFormatError, match=r'wiki\.train\.tokens is not UTF-8 text: line 2 has byte 0xff'):
        get_corpus('wt103', tmp_path, cache=False)


def test_non_utf8_character_files(tmp_path):
    (tmp_path / 'text8').write_bytes(b'ab cd \xc3 ef')
    with pytest.raises(DataFileFormatError, match=r'text8 .* is not UTF-8 text: byte 0xc3 at offset 6 \(line 1\)'):
        load_text8(tmp_path, train_size=6, valid_size=2, test_size=2)
    (tmp_path / 'play.txt').write_bytes(b'To be\nor not \x80 to be')
    with pytest.raises(DataFileFormatError, match=r'play\.txt is not UTF-8 text: .* \(line 2\)'):
        get_corpus('tiny_shakespeare', tmp_path / 'play.txt')


def test_not_a_zip_archive(tmp_path):
    (tmp_path / 'enwik8.zip').write_bytes(b'this is not a zip file')
    with pytest.raises(DataFileFormatError, match=r'enwik8\.zip is not a zip archive.*holds \'enwik8\''):
        get_corpus('enwik8', tmp_path)


def test_unknown_corpus_name():
    with pytest.raises(ValueError) as e:
        get_corpus('enwiki8', '/data')
    message = str(e.value)
    assert "'enwiki8'" in message and "closest is 'enwik8'" in message
    for name in ('tiny_shakespeare', 'enwik8', 'text8', 'wt103', 'wt2', 'ptb', 'lm1b'):
        assert repr(name) in message


def test_path_is_required_except_for_the_bundled_corpus():
    with pytest.raises(ValueError, match=r"get_corpus\('ptb'\) needs path"):
        get_corpus('ptb')
