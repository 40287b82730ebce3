"""
# Encoder-decoder on a sequence-reversal task

The full `EncoderDecoder` of `TransformerConfigs`: the encoder reads a sequence of random digits, the decoder
writes it reversed, one token at a time. Training uses teacher forcing; accuracy is measured by greedy decoding
and counts a sequence as right only when every token is (exact match).

    python experiments/reverse.py               # trains until exact match > 99% on held-out sequences
    python experiments/reverse.py seq_len=12 transformer.n_layers=3

`--help` lists every setting.
"""
import sys
import time

import torch
from labml import monit, tracker
from labml.configs import option
from torch import nn

from labml_txl.attention.masks import subsequent_mask
from labml_txl.cli import parse_overrides, run_script
from labml_txl.configs.validation import ValidatedConfigs
from labml_txl.configs import TransformerConfigs
from labml_txl.configs.settings import Settings
from labml_txl.train.run_start import create_run, next_commands, script_path, started_run

# Token 0 starts the decoder's input; digits are tokens 1 .. n_digits
START = 0


class ReverseConfigs(ValidatedConfigs):
    """Configurations of the reversal task."""
    transformer: TransformerConfigs
    # Distinct digits (tokens 1 .. n_digits)
    n_digits: int = 10
    # Digits per sequence
    seq_len: int = 10
    # Sequences per batch
    batch_size: int = 64
    # Learning rate of Adam
    lr: float = 1e-3
    # Training steps at most
    max_step: int = 3000
    # Measure held-out accuracy every this many steps
    eval_interval: int = 100
    # Held-out sequences
    eval_size: int = 1000
    # Stop once held-out exact-match accuracy reaches this
    target_accuracy: float = 0.995
    # Random seed of the weights and the sequences
    seed: int = 0


@option(ReverseConfigs.transformer)
def _transformer(c: ReverseConfigs):
    """An encoder-decoder over the digits and the start token"""
    conf = TransformerConfigs()
    conf.n_src_vocab = conf.n_tgt_vocab = c.n_digits + 1
    return conf


# A small model suffices; command-line overrides replace any of these
DEFAULT_OVERRIDES = {'transformer.d_model': 64, 'transformer.n_heads': 4, 'transformer.n_layers': 2,
                     'transformer.ffn.d_ff': 128, 'transformer.dropout': 0.0}
SETTINGS = Settings(ReverseConfigs, DEFAULT_OVERRIDES)


def sample(conf: ReverseConfigs, batch_size: int, generator: torch.Generator):
    """Sources `[seq_len, batch]` of digits and their reversals as targets."""
    src = torch.randint(1, conf.n_digits + 1, (conf.seq_len, batch_size), generator=generator)
    return src, src.flip(0)


def teacher_forced_logits(conf: ReverseConfigs, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Logits for each target token given the source and the target tokens before it."""
    t = conf.transformer
    decoder_input = torch.cat([torch.full_like(tgt[:1], START), tgt[:-1]])
    out = t.encoder_decoder(src, decoder_input, None, subsequent_mask(len(tgt)))
    return t.generator(out)


@torch.no_grad()
def greedy_decode(conf: ReverseConfigs, src: torch.Tensor) -> torch.Tensor:
    """Decode `seq_len` tokens, each the most likely given those before it."""
    t = conf.transformer
    memory = t.encoder_decoder.encode(src)
    decoded = torch.full_like(src[:1], START)
    for i in range(len(src)):
        out = t.encoder_decoder.decode(memory, None, decoded, subsequent_mask(i + 1))
        next_token = t.generator(out[-1]).argmax(dim=-1)
        decoded = torch.cat([decoded, next_token[None]])
    return decoded[1:]


def exact_match(conf: ReverseConfigs, src: torch.Tensor, tgt: torch.Tensor) -> float:
    model = conf.transformer.encoder_decoder
    model.eval()
    accuracy = (greedy_decode(conf, src) == tgt).all(dim=0).float().mean().item()
    model.train()
    return accuracy


def run(overrides: dict, screen: bool = True) -> float:
    """Train with `overrides` and return the held-out exact-match accuracy reached."""
    conf = ReverseConfigs()
    create_run('reverse', conf, {**DEFAULT_OVERRIDES, **overrides}, screen=screen, script=__file__,
               script_defaults=DEFAULT_OVERRIDES)
    torch.manual_seed(conf.seed)
    generator = torch.Generator().manual_seed(conf.seed)
    held_out = sample(conf, conf.eval_size, torch.Generator().manual_seed(conf.seed + 1))
    model = conf.transformer.encoder_decoder
    optimizer = torch.optim.Adam(model.parameters(), lr=conf.lr)
    accuracy, started = 0.0, time.time()
    with started_run() as run_path:
        for step in monit.loop(conf.max_step):
            src, tgt = sample(conf, conf.batch_size, generator)
            logits = teacher_forced_logits(conf, src, tgt)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            tracker.save({'loss.train': loss.item()})
            if (step + 1) % conf.eval_interval == 0:
                accuracy = exact_match(conf, *held_out)
                tracker.save({'accuracy.valid': accuracy})
                if accuracy >= conf.target_accuracy:
                    break
    print(f'\nExact-match accuracy on {conf.eval_size} held-out sequences: {accuracy:.2%} '
          f'after {step + 1} steps ({time.time() - started:.0f} s)')
    print('\n'.join(next_commands(run_path.name, run_path, script_path(__file__), resumable=False)))
    return accuracy


if __name__ == '__main__':
    sys.exit(run_script(lambda args: run(parse_overrides(args, SETTINGS)), sys.argv[1:], __doc__,
                        settings=SETTINGS))
