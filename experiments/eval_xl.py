"""
Evaluate a trained Transformer-XL run, or a published model, as the paper does: with other segment and memory
lengths.

    python experiments/eval_xl.py RUN_UUID [split=test] [tgt_len=80] [mem_len=2100] [clamp_len=820] [same_length=True]
    python experiments/eval_xl.py RUN_UUID paper=True     # the test_* settings of the run's preset (presets.md)
    python experiments/eval_xl.py pretrained=PATH [vocab=PATH] [corpus_name=wt103 data_path=PATH] [paper=True] ...

Memories let a model trained on short segments attend much further back at evaluation (the paper evaluates
enwik8 with a memory of 2,100 after training with 512). Prints the loss per token and bits per character
(character corpora) or perplexity (word corpora).

`pretrained=PATH` is a Hugging Face TransfoXL folder (`MemTransformerLM.from_pretrained`; docs/pretrained.md). Its
vocabulary is the folder's `vocab.pkl`, or `vocab=PATH` (Hugging Face's `vocab.pkl`, or the authors' `cache.pkl` /
`cache.pt`). The text is `corpus_name` read from `data_path` and mapped into the model's vocabulary, or, without
`data_path`, the splits of the authors' cache. `paper=True` takes the paper's test settings of the published model of
`corpus_name` (tgt_len, mem_len, clamp_len, same_length, batch_size) and prints the score the paper reports.
A run's `paper=True` takes its `test_*` items, which a preset sets (or the run's own overrides); on a run with neither
it is an error naming them, not an evaluation with lengths nobody chose.
"""
import sys
from typing import Any, Dict, List, Optional

from labml_txl.cli import parse_overrides, run_script
from labml_txl.xl.formats.published import evaluation_corpus, paper_settings, read_vocabulary, vocabulary_path
from labml_txl.configs.settings import Settings
from labml_txl.errors import require_positive_int
from labml_txl.train.configs import check_max_eval_steps
from labml_txl.train.runs import find_run, load_overrides, load_trained_run
from labml_txl.train.script_settings import EvalXLSettings, read_settings
from labml_txl.train.trainer import mean_loss_over_stream, quality
from labml_txl.xl import MemTransformerLM

SETTINGS = Settings(EvalXLSettings)
# The settings that only a published model takes
PRETRAINED_SETTINGS = ('pretrained', 'vocab', 'corpus_name', 'data_path')
SPLITS = ('train', 'valid', 'test')
# The items `paper=True` reads from a run
PAPER_ITEMS = ('test_tgt_len', 'test_mem_len', 'test_clamp_len', 'test_same_length')


def _read(settings: Dict[str, Any], pretrained: bool) -> EvalXLSettings:
    given = read_settings(EvalXLSettings, settings)
    if not pretrained:
        for_published = sorted(set(settings) & set(PRETRAINED_SETTINGS))
        if for_published:
            raise ValueError(f"{', '.join(for_published)}: only for a published model (pretrained=PATH); a run "
                             f"evaluates on its own corpus")
    if given.split not in SPLITS:
        raise ValueError(f"split={given.split!r} is not accepted: {', '.join(SPLITS)}")
    if given.batch_size is not None:
        require_positive_int('batch_size', given.batch_size)
    check_max_eval_steps(given.max_eval_steps)
    return given


def evaluate(model: MemTransformerLM, corpus, split: str, tgt_len: int, mem_len: int, clamp_len: int,
             same_length: bool, batch_size: int, max_steps: int = 0,
             **memory_sizes: Optional[int]) -> Dict[str, float]:
    """The mean loss of `model` over `split` of `corpus` with these lengths (`memory_sizes`: the sizes of its memory
    mechanisms that evaluation may change, where given, e.g. `cmem_len`, `knn_mem_size`), and bits per character or
    perplexity."""
    model.eval()
    model.reset_length(tgt_len, model.ext_len, mem_len, same_length=same_length, clamp_len=clamp_len, **memory_sizes)
    iterator = corpus.get_iterator(split, batch_size, tgt_len, ext_len=model.ext_len)
    loss = mean_loss_over_stream(model, iterator, max_steps)
    return {'loss': loss, **quality(loss, corpus.level)}


def _check_paper_settings(run_uuid: str, conf) -> None:
    """`paper=True` reads the run's `test_*` items: a preset's, or the run's own overrides; else nobody chose them."""
    if conf.preset != 'none' or set(PAPER_ITEMS) & set(load_overrides(find_run(run_uuid))):
        return
    trained = ' '.join(f'{k}={getattr(conf, k)}' for k in ('tgt_len', 'mem_len', 'clamp_len', 'same_length'))
    raise ValueError(f"paper=True takes the paper's test settings ({', '.join(PAPER_ITEMS)}) from the run's preset, "
                     f"and run {run_uuid} has no preset and did not set them: give the lengths to evaluate with "
                     f"(tgt_len=... mem_len=... clamp_len=... same_length=...; it trained with {trained})")


def evaluate_run(run_uuid: str, settings: Dict[str, Any]) -> Dict[str, float]:
    given = _read(settings, pretrained=False)
    conf, step = load_trained_run(run_uuid)
    paper = given.paper
    if paper:
        _check_paper_settings(run_uuid, conf)

    def length(name: str):
        value = getattr(given, name)
        return value if value is not None else getattr(conf, f'test_{name}' if paper else name)

    lengths = {name: length(name) for name in ('tgt_len', 'mem_len', 'clamp_len', 'same_length')}
    result = evaluate(conf.model, conf.corpus, given.split, **lengths,
                      batch_size=given.batch_size if given.batch_size is not None else 10,
                      max_steps=max(given.max_eval_steps, 0))
    print(f"run {run_uuid} (step {step}), {given.split} split, {_lengths(lengths)}: {_scores(result)}")
    return result


def evaluate_pretrained(settings: Dict[str, Any]) -> Dict[str, float]:
    given = _read(settings, pretrained=True)
    model = MemTransformerLM.from_pretrained(given.pretrained)
    vocabulary, cache = read_vocabulary(vocabulary_path(given.pretrained, given.vocab))
    if len(vocabulary) != model.n_token:
        raise ValueError(f"the vocabulary has {len(vocabulary):,} symbols and the model {model.n_token:,}: give the "
                         f"model's own vocabulary with vocab=PATH")
    corpus = evaluation_corpus(vocabulary, cache, given.corpus_name, given.data_path)
    paper = paper_settings(given.corpus_name or corpus.name) if given.paper else None
    model_lengths = dict(tgt_len=model.tgt_len or 128, mem_len=model.mem_len, clamp_len=model.clamp_len,
                         same_length=model.same_length)

    def length(name: str):
        value = getattr(given, name)
        return value if value is not None else getattr(paper, name) if paper else model_lengths[name]

    lengths = {name: length(name) for name in model_lengths}
    batch_size = given.batch_size if given.batch_size is not None else paper.batch_size if paper else 10
    result = evaluate(model, corpus, given.split, **lengths, batch_size=batch_size,
                      max_steps=max(given.max_eval_steps, 0))
    reported = f'; the paper reports {paper.reported}' if paper else ''
    print(f"{given.pretrained} on {corpus.name}, {given.split} split, {_lengths(lengths)}: {_scores(result)}"
          f"{reported}")
    return result


def _lengths(lengths: Dict[str, Any]) -> str:
    return ' '.join(f'{k}={v}' for k, v in lengths.items())


def _scores(result: Dict[str, float]) -> str:
    return ', '.join(f'{k} {v:.4f}' for k, v in result.items())


def main(argv: List[str]) -> int:
    def action(args: List[str]):
        if args and '=' not in args[0] and not args[0].startswith('-'):
            return evaluate_run(args[0], parse_overrides(args[1:], SETTINGS))
        settings = parse_overrides(args, SETTINGS)
        if 'pretrained' not in settings:
            raise ValueError("give a RUN_UUID, or pretrained=PATH for a published model (see --help)")
        return evaluate_pretrained(settings)

    return run_script(action, argv, __doc__, needs_argument=True, settings=SETTINGS)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
