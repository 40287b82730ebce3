"""
# A small character-level Transformer on Tiny Shakespeare

`TransformerConfigs` builds a causal encoder over the bundled corpus; this trains it for a bounded time on the
CPU and prints the training and validation loss (nats per character). `glu_variants.py` sweeps it. Any config
item can be overridden on the command line (`--help` lists them):

    python experiments/char_transformer.py transformer.ffn.glu_variant=SwiGLU max_step=500 time_limit=300
"""
import math
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
from labml_txl.data import load_tiny_shakespeare
from labml_txl.configs.settings import Settings
from labml_txl.train.run_start import create_run, next_commands, script_path, started_run


class CharTransformer(nn.Module):
    """Token embeddings with positions, a causal encoder, and logits over the characters."""

    def __init__(self, transformer: TransformerConfigs):
        super().__init__()
        self.src_embed = transformer.src_embed
        self.encoder = transformer.encoder
        self.generator = transformer.generator

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = subsequent_mask(tokens.shape[0], device=tokens.device)
        return self.generator(self.encoder(self.src_embed(tokens), mask))


class CharTransformerConfigs(ValidatedConfigs):
    """What the demo trains and for how long."""
    transformer: TransformerConfigs
    model: CharTransformer
    # Number of distinct characters, set from the corpus
    n_tokens: int
    # Characters per training window
    seq_len: int = 64
    # Windows per batch
    batch_size: int = 32
    # Training steps
    max_step: int = 2000
    # Learning rate of Adam
    lr: float = 1e-3
    # Evaluate on the validation split every this many steps
    eval_interval: int = 100
    # Validation batches per evaluation
    max_eval_steps: int = 20
    # Stop training after this many seconds, whatever `max_step` says
    time_limit: float = 120.0
    # Random seed of the weights and the batches
    seed: int = 0


@option(CharTransformerConfigs.transformer)
def _transformer(c: CharTransformerConfigs):
    """A Transformer over the corpus's characters"""
    conf = TransformerConfigs()
    conf.n_src_vocab = conf.n_tgt_vocab = c.n_tokens
    return conf


@option(CharTransformerConfigs.model)
def _model(c: CharTransformerConfigs):
    return CharTransformer(c.transformer)


class Corpus:
    """Tiny Shakespeare as character ids, 90% for training and 10% for validation."""

    def __init__(self):
        text = load_tiny_shakespeare()
        self.chars = sorted(set(text))
        index = {ch: i for i, ch in enumerate(self.chars)}
        data = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        split = int(len(data) * 0.9)
        self.train, self.valid = data[:split], data[split:]

    def batch(self, split: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator):
        """Random windows: inputs `[seq_len, batch]` and the next characters as targets."""
        starts = torch.randint(len(split) - seq_len - 1, (batch_size,), generator=generator)
        windows = torch.stack([split[s:s + seq_len + 1] for s in starts.tolist()], dim=1)
        return windows[:-1], windows[1:]


def loss_of(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# The script's small model; overrides replace any of these
DEFAULT_OVERRIDES = {'transformer.d_model': 128, 'transformer.n_heads': 4, 'transformer.n_layers': 3,
                     'transformer.ffn.d_ff': 512, 'transformer.dropout': 0.0}
SETTINGS = Settings(CharTransformerConfigs, DEFAULT_OVERRIDES)


def run(overrides: dict, name: str = 'char_transformer', corpus: Corpus = None, screen: bool = True) -> float:
    """Train with `overrides` on top of `DEFAULT_OVERRIDES` and return the final validation loss."""
    corpus = corpus or Corpus()
    conf = CharTransformerConfigs()
    conf.n_tokens = len(corpus.chars)
    create_run(name, conf, {**DEFAULT_OVERRIDES, **overrides}, screen=screen, script=__file__,
               script_defaults=DEFAULT_OVERRIDES)
    torch.manual_seed(conf.seed)
    generator = torch.Generator().manual_seed(conf.seed)
    model = conf.model
    optimizer = torch.optim.Adam(model.parameters(), lr=conf.lr)

    def validate() -> float:
        model.eval()
        valid_generator = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            losses = [loss_of(model, *corpus.batch(corpus.valid, conf.seq_len, conf.batch_size, valid_generator))
                      for _ in range(conf.max_eval_steps)]
        model.train()
        return torch.stack(losses).mean().item()

    started = time.time()
    with started_run() as run_path:
        for step in monit.loop(conf.max_step):
            loss = loss_of(model, *corpus.batch(corpus.train, conf.seq_len, conf.batch_size, generator))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            tracker.save({'loss.train': loss.item()})
            if (step + 1) % conf.eval_interval == 0:
                tracker.save({'loss.valid': validate()})
            if time.time() - started > conf.time_limit:
                break
        valid = validate()
        tracker.save(step, {'loss.valid': valid})
    print(f'\nTrained {step + 1} steps in {time.time() - started:.0f} s: '
          f'last training loss {loss.item():.3f}, validation loss {valid:.3f} nats/char '
          f'({valid / math.log(2):.3f} bits/char)')
    print('\n'.join(next_commands(run_path.name, run_path, script_path(__file__), resumable=False)))
    return valid


if __name__ == '__main__':
    sys.exit(run_script(lambda args: run(parse_overrides(args, SETTINGS)), sys.argv[1:], __doc__,
                        settings=SETTINGS))
