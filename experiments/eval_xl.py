"""
Evaluate a trained Transformer-XL run as the paper does: with other segment and memory lengths.

    python experiments/eval_xl.py RUN_UUID [split=test] [tgt_len=80] [mem_len=2100] [clamp_len=820] [same_length=True]
    python experiments/eval_xl.py RUN_UUID paper=True     # the preset's test_* settings (presets.md)

Memories let a model trained on short segments attend much further back at evaluation (the paper evaluates
enwik8 with a memory of 2,100 after training with 512). Prints the loss per token and bits per character
(character corpora) or perplexity (word corpora).
"""
import sys
from typing import Any, Dict, List

from labml_txl.cli import parse_overrides, run_script
from labml_txl.train.runs import load_trained_run
from labml_txl.train.trainer import mean_loss_over_stream, quality

SETTINGS = ('split', 'tgt_len', 'mem_len', 'clamp_len', 'same_length', 'batch_size', 'max_steps', 'paper')


def evaluate_run(run_uuid: str, settings: Dict[str, Any]) -> Dict[str, float]:
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}: eval_xl.py accepts {', '.join(SETTINGS)}")
    conf, step = load_trained_run(run_uuid)
    model = conf.model
    paper = settings.get('paper', False)
    tgt_len = settings.get('tgt_len', conf.test_tgt_len if paper else conf.tgt_len)
    mem_len = settings.get('mem_len', conf.test_mem_len if paper else conf.mem_len)
    clamp_len = settings.get('clamp_len', conf.test_clamp_len if paper else conf.clamp_len)
    same_length = settings.get('same_length', conf.test_same_length if paper else conf.same_length)
    split = settings.get('split', 'test')
    model.reset_length(tgt_len, conf.ext_len, mem_len)
    model.clamp_len, model.same_length = clamp_len, same_length
    iterator = conf.corpus.get_iterator(split, settings.get('batch_size', 10), tgt_len, ext_len=conf.ext_len)
    loss = mean_loss_over_stream(model, iterator, settings.get('max_steps', 0))
    result = {'loss': loss, **quality(loss, conf.corpus.level)}
    print(f"run {run_uuid} (step {step}), {split} split, tgt_len={tgt_len} mem_len={mem_len} "
          f"clamp_len={clamp_len} same_length={same_length}: "
          + ', '.join(f'{k} {v:.4f}' for k, v in result.items()))
    return result


def main(argv: List[str]) -> int:
    return run_script(lambda args: evaluate_run(args[0], parse_overrides(args[1:])), argv, __doc__,
                      needs_argument=True)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
