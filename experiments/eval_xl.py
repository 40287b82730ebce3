"""
Evaluate a trained Transformer-XL run, or a published model, as the paper does: with other segment and memory
lengths.

    python experiments/eval_xl.py RUN_UUID [split=test] [tgt_len=80] [mem_len=2100] [clamp_len=820] [same_length=True]
    python experiments/eval_xl.py RUN_UUID paper=True     # the preset's test_* settings (presets.md)
    python experiments/eval_xl.py pretrained=PATH [vocab=PATH] [corpus_name=wt103 data_path=PATH] [paper=True] ...

Memories let a model trained on short segments attend much further back at evaluation (the paper evaluates
enwik8 with a memory of 2,100 after training with 512). Prints the loss per token and bits per character
(character corpora) or perplexity (word corpora).

`pretrained=PATH` is a Hugging Face TransfoXL folder (`MemTransformerLM.from_pretrained`; docs/pretrained.md). Its
vocabulary is the folder's `vocab.pkl`, or `vocab=PATH` (Hugging Face's `vocab.pkl`, or the authors' `cache.pkl` /
`cache.pt`). The text is `corpus_name` read from `data_path` and mapped into the model's vocabulary, or, without
`data_path`, the splits of the authors' cache. `paper=True` takes the paper's test settings of the published model of
`corpus_name` (tgt_len, mem_len, clamp_len, same_length, batch_size) and prints the score the paper reports.
"""
import sys
from typing import Any, Dict, List

from labml_txl.cli import parse_overrides, run_script
from labml_txl.published_models import evaluation_corpus, paper_settings, read_vocabulary, vocabulary_path
from labml_txl.train.runs import load_trained_run
from labml_txl.train.trainer import mean_loss_over_stream, quality
from labml_txl.xl import MemTransformerLM

SETTINGS = ('split', 'tgt_len', 'mem_len', 'clamp_len', 'same_length', 'batch_size', 'max_steps', 'paper')
PRETRAINED_SETTINGS = ('pretrained', 'vocab', 'corpus_name', 'data_path')


def _check_settings(settings: Dict[str, Any], accepted) -> None:
    unknown = sorted(set(settings) - set(accepted))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}: eval_xl.py accepts {', '.join(accepted)}")
    if not isinstance(settings.get('paper', False), bool):
        raise ValueError(f"paper={settings['paper']!r} is not accepted: True or False")


def evaluate(model: MemTransformerLM, corpus, split: str, tgt_len: int, mem_len: int, clamp_len: int,
             same_length: bool, batch_size: int, max_steps: int = 0) -> Dict[str, float]:
    """The mean loss of `model` over `split` of `corpus` with these lengths, and bits per character or perplexity."""
    model.eval()
    model.reset_length(tgt_len, model.ext_len, mem_len)
    model.clamp_len, model.same_length = clamp_len, same_length
    iterator = corpus.get_iterator(split, batch_size, tgt_len, ext_len=model.ext_len)
    loss = mean_loss_over_stream(model, iterator, max_steps)
    return {'loss': loss, **quality(loss, corpus.level)}


def evaluate_run(run_uuid: str, settings: Dict[str, Any]) -> Dict[str, float]:
    _check_settings(settings, SETTINGS)
    conf, step = load_trained_run(run_uuid)
    paper = settings.get('paper', False)
    lengths = dict(tgt_len=settings.get('tgt_len', conf.test_tgt_len if paper else conf.tgt_len),
                   mem_len=settings.get('mem_len', conf.test_mem_len if paper else conf.mem_len),
                   clamp_len=settings.get('clamp_len', conf.test_clamp_len if paper else conf.clamp_len),
                   same_length=settings.get('same_length', conf.test_same_length if paper else conf.same_length))
    split = settings.get('split', 'test')
    result = evaluate(conf.model, conf.corpus, split, **lengths, batch_size=settings.get('batch_size', 10),
                      max_steps=settings.get('max_steps', 0))
    print(f"run {run_uuid} (step {step}), {split} split, {_lengths(lengths)}: {_scores(result)}")
    return result


def evaluate_pretrained(settings: Dict[str, Any]) -> Dict[str, float]:
    _check_settings(settings, SETTINGS + PRETRAINED_SETTINGS)
    model = MemTransformerLM.from_pretrained(settings['pretrained'])
    vocabulary, cache = read_vocabulary(vocabulary_path(settings['pretrained'], settings.get('vocab')))
    if len(vocabulary) != model.n_token:
        raise ValueError(f"the vocabulary has {len(vocabulary):,} symbols and the model {model.n_token:,}: give the "
                         f"model's own vocabulary with vocab=PATH")
    corpus = evaluation_corpus(vocabulary, cache, settings.get('corpus_name'), settings.get('data_path'))
    paper = paper_settings(settings.get('corpus_name') or corpus.name) if settings.get('paper', False) else None
    lengths = dict(tgt_len=settings.get('tgt_len', paper.tgt_len if paper else model.tgt_len or 128),
                   mem_len=settings.get('mem_len', paper.mem_len if paper else model.mem_len),
                   clamp_len=settings.get('clamp_len', paper.clamp_len if paper else model.clamp_len),
                   same_length=settings.get('same_length', paper.same_length if paper else model.same_length))
    split = settings.get('split', 'test')
    result = evaluate(model, corpus, split, **lengths, batch_size=settings.get('batch_size', paper.batch_size
                                                                                if paper else 10),
                      max_steps=settings.get('max_steps', 0))
    reported = f'; the paper reports {paper.reported}' if paper else ''
    print(f"{settings['pretrained']} on {corpus.name}, {split} split, {_lengths(lengths)}: {_scores(result)}"
          f"{reported}")
    return result


def _lengths(lengths: Dict[str, Any]) -> str:
    return ' '.join(f'{k}={v}' for k, v in lengths.items())


def _scores(result: Dict[str, float]) -> str:
    return ', '.join(f'{k} {v:.4f}' for k, v in result.items())


def main(argv: List[str]) -> int:
    def action(args: List[str]):
        if args and '=' not in args[0]:
            return evaluate_run(args[0], parse_overrides(args[1:]))
        settings = parse_overrides(args)
        if 'pretrained' not in settings:
            raise ValueError("give a RUN_UUID, or pretrained=PATH for a published model (see --help)")
        return evaluate_pretrained(settings)

    return run_script(action, argv, __doc__, needs_argument=True)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
