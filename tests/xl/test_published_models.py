"""
A published model evaluated and sampled as `eval_xl.py pretrained=...` and `generate_xl.py pretrained=...` do: a
Hugging Face TransfoXL folder with its `vocab.pkl`, on a WikiText-like corpus read from its files. The expectation is
independent: Hugging Face's own model and tokenizer vocabulary, the test file encoded line by line with that
vocabulary (as the original encodes WikiText), and the mean negative log-likelihood of the stream read in segments
with memories. The vocabulary's order differs from the one this package's loader counts, so the mapping between
them is exercised. Both models evaluate in float64: the same function (tests/tolerance.py's rule 1).
"""
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers.models.deprecated.transfo_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers.models.deprecated.transfo_xl.tokenization_transfo_xl import TransfoXLTokenizer

from labml_txl.data import Corpus, Vocabulary
from labml_txl.xl.formats.published import PAPER_SETTINGS, in_vocabulary, level_of, paper_settings
from labml_txl.xl import MemTransformerLM
from tolerance import SAME_FUNCTION

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'experiments'))

import eval_xl  # noqa: E402
import generate_xl  # noqa: E402

pytestmark = pytest.mark.filterwarnings('ignore:The output of TransfoXL will be updated:DeprecationWarning')

LINES = {
    'train': ["the king is dead", "long live the king", "", "the queen is in the garden", "a rose is a rose"],
    'valid': ["the rose is red", "long live the queen"],
    'test': ["the king is in the garden", "", "a queen is a queen", "the rose is dead", "long live the rose"],
}



@pytest.fixture
def loaded_in_float64(monkeypatch):
    """`MemTransformerLM.from_pretrained` (which `eval_xl` calls) returns the model in float64: it loads in the
    default dtype, float32."""
    from_pretrained = MemTransformerLM.from_pretrained.__func__
    monkeypatch.setattr(MemTransformerLM, 'from_pretrained',
                        classmethod(lambda cls, *args, **kwargs: from_pretrained(cls, *args, **kwargs).double()))


@pytest.fixture
def published(tmp_path):
    """A WikiText-2-like folder, and a Hugging Face folder of a random model whose vocabulary (`vocab.pkl`) is in
    alphabetical order (this package's loader orders by count)."""
    data = tmp_path / 'wikitext-2'
    data.mkdir()
    for split, lines in LINES.items():
        (data / f'wiki.{split}.tokens').write_text(''.join(f' {line} \n' for line in lines), encoding='utf-8')
    words = sorted({w for lines in LINES.values() for line in lines for w in line.split()})
    vocab_file = tmp_path / 'vocab.txt'
    vocab_file.write_text('\n'.join(['<eos>', '<unk>'] + words) + '\n', encoding='utf-8')
    tokenizer = TransfoXLTokenizer(vocab_file=str(vocab_file), clean_up_tokenization_spaces=False)
    torch.manual_seed(0)
    config = TransfoXLConfig(vocab_size=len(tokenizer.idx2sym), cutoffs=[4, 8], d_model=32, d_embed=32, n_head=2,
                             d_head=16, d_inner=64, div_val=2, n_layer=2, mem_len=6, clamp_len=-1,
                             same_length=False, dropout=0.0, dropatt=0.0)
    model = TransfoXLLMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    folder = tmp_path / 'model'
    model.save_pretrained(folder)
    tokenizer.save_vocabulary(str(folder))
    return data, folder, model, tokenizer


def hf_mean_loss(model, tokenizer, lines, tgt_len: int) -> float:
    """The test stream encoded line by line with the tokenizer's vocabulary (`<eos>` at every line end), read in
    segments of `tgt_len` with Hugging Face's memories (empty to start), the mean negative log-likelihood."""
    ids = torch.tensor([tokenizer.sym2idx[w] for line in lines for w in line.split() + ['<eos>']])
    mems = [torch.empty(0, 1, model.config.d_model, dtype=model.dtype) for _ in range(model.config.n_layer)]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, ids.numel() - 1, tgt_len):
            inputs = ids[start:min(start + tgt_len, ids.numel() - 1)]
            targets = ids[start + 1:start + 1 + inputs.numel()]
            result = model(inputs[None], mems=mems)
            mems = result.mems
            log_probs = result.prediction_scores[0]
            total -= log_probs.gather(1, targets[:, None]).sum().item()
            count += targets.numel()
    return total / count


def test_evaluating_a_published_model_equals_hugging_faces_loss(published, hf_in_float64, loaded_in_float64):
    data, folder, model, tokenizer = published
    result = eval_xl.evaluate_pretrained({'pretrained': str(folder), 'corpus_name': 'wt2', 'data_path': str(data),
                                          'split': 'test', 'tgt_len': 5, 'mem_len': 6, 'batch_size': 1})
    model.config.mem_len = 6
    expected = hf_mean_loss(model.double(), tokenizer, LINES['test'], tgt_len=5)
    # Both in float64 (a published model computes as the original, whose float32 rounding of the scores Hugging
    # Face's attention does too): the same function
    assert result['loss'] == pytest.approx(expected, rel=0, abs=SAME_FUNCTION * max(1.0, abs(expected)))
    assert result['ppl'] == math.exp(result['loss'])


def test_sampling_a_published_model_is_text_of_its_vocabulary(published):
    _, folder, _, tokenizer = published
    settings = {'pretrained': str(folder), 'prompt': 'the king is', 'n_tokens': 12, 'seed': 1}
    text = generate_xl.sample_pretrained(settings)
    assert text.startswith('the king is ') and len(text.split()) == 3 + 12
    assert all(word in tokenizer.sym2idx for word in text.split())
    assert generate_xl.sample_pretrained(settings) == text


def test_a_vocabulary_of_another_corpus_is_refused(published, tmp_path):
    data, folder, _, _ = published
    other = tmp_path / 'other'
    shutil.copytree(folder, other)
    for name in ('vocab.pkl',):
        (other / name).unlink()
    with pytest.raises(FileNotFoundError, match="has no vocab.pkl: give the model's vocabulary with vocab=PATH"):
        eval_xl.evaluate_pretrained({'pretrained': str(other), 'corpus_name': 'wt2', 'data_path': str(data)})
    model_vocabulary = Vocabulary(['<eos>', 'x', 'y'], special=['<eos>'])
    corpus = Corpus('wt2', Vocabulary(['<eos>', 'the', 'king']), torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]),
                    torch.tensor([2, 1, 0]), level='word')
    with pytest.raises(ValueError, match=r"lacks 2 symbols of the wt2 corpus \(e.g. 'the', 'king'\).*has no unknown "
                                         r"symbol: it is the vocabulary of another corpus"):
        in_vocabulary(corpus, model_vocabulary)


def test_symbols_map_by_name_text8s_space_included():
    """This package's text8 writes the space as ' ', the original's files as '_'."""
    model_vocabulary = Vocabulary(['_', 'b', 'a'])
    corpus = Corpus('text8', Vocabulary(['a', ' ', 'b']), torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2, 1]),
                    torch.tensor([2, 2, 1, 0]), level='char')
    mapped = in_vocabulary(corpus, model_vocabulary)
    assert mapped.valid.tolist() == [2, 0, 1, 0] and mapped.test.tolist() == [1, 1, 0, 2]
    assert level_of(model_vocabulary) == 'char'
    assert level_of(Vocabulary(['101', '32', '9'])) == 'byte' and level_of(Vocabulary(['the', 'a'])) == 'word'


def test_paper_settings_are_the_published_scripts():
    """The test settings of the authors' tf/sota scripts (tests/reference/xl/presets.md's large rows)."""
    assert {name: (s.tgt_len, s.mem_len, s.clamp_len, s.same_length) for name, s in PAPER_SETTINGS.items()} == {
        'wt103': (128, 1600, 1000, True), 'enwik8': (128, 3800, 1000, True), 'text8': (128, 3800, 1000, True),
        'lm1b': (32, 128, -1, True)}
    with pytest.raises(ValueError, match=r"corpus_name='ptb'.*'wt103', 'enwik8', 'text8' or 'lm1b'"):
        paper_settings('ptb')


def test_the_bundled_corpus_needs_no_data_path():
    # `eval_xl.py pretrained=F corpus_name=tiny_shakespeare` once answered "give corpus_name=NAME data_path=PATH"
    from labml_txl.data import get_corpus
    from labml_txl.xl.formats.published import evaluation_corpus
    bundled = get_corpus('tiny_shakespeare')
    corpus = evaluation_corpus(bundled.vocab, None, 'tiny_shakespeare')
    assert corpus.name == 'tiny_shakespeare' and torch.equal(corpus.test, bundled.test)
    with pytest.raises(ValueError, match=r"corpus_name=tiny_shakespeare alone for the bundled one"):
        evaluation_corpus(bundled.vocab, None, 'wt2')
