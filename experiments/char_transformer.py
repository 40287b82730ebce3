"""
# A small character-level Transformer on Tiny Shakespeare

`TransformerConfigs` builds a causal encoder over the bundled corpus; this trains it for a bounded time on the
CPU and prints the training and validation loss (nats per character). `glu_variants.py` reuses it. Any config
item can be overridden on the command line:

    python experiments/char_transformer.py transformer.ffn.glu_variant=SwiGLU steps=500 time_limit=300
"""
import math
import sys
import time

import torch
from labml import experiment, monit, tracker
from labml.configs import option
from torch import nn

from labml_txl.attention_mask import subsequent_mask
from labml_txl.cli import parse_overrides
from labml_txl.config_validation import ValidatedConfigs
from labml_txl.configs import TransformerConfigs
from labml_txl.data import load_tiny_shakespeare


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
    seq_len: int = 64
    batch_size: int = 32
    steps: int = 2000
    learning_rate: float = 1e-3
    eval_every: int = 100
    eval_batches: int = 20
    # Stop training after this many seconds, whatever `steps` says
    time_limit: float = 120.0
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


DEFAULT_OVERRIDES = {'transformer.d_model': 128, 'transformer.n_heads': 4, 'transformer.n_layers': 3,
                     'transformer.ffn.d_ff': 512, 'transformer.dropout': 0.0}


def run(overrides: dict, name: str = 'char_transformer', corpus: Corpus = None) -> float:
    """Train with `overrides` on top of `DEFAULT_OVERRIDES` and return the final validation loss."""
    corpus = corpus or Corpus()
    conf = CharTransformerConfigs()
    experiment.create(name=name, comment=', '.join(f'{k}={v}' for k, v in overrides.items()))
    conf.n_tokens = len(corpus.chars)
    experiment.configs(conf, {**DEFAULT_OVERRIDES, **overrides})
    torch.manual_seed(conf.seed)
    generator = torch.Generator().manual_seed(conf.seed)
    model = conf.model
    optimizer = torch.optim.Adam(model.parameters(), lr=conf.learning_rate)

    def validate() -> float:
        model.eval()
        valid_generator = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            losses = [loss_of(model, *corpus.batch(corpus.valid, conf.seq_len, conf.batch_size, valid_generator))
                      for _ in range(conf.eval_batches)]
        model.train()
        return torch.stack(losses).mean().item()

    started = time.time()
    with experiment.start():
        for step in monit.loop(conf.steps):
            loss = loss_of(model, *corpus.batch(corpus.train, conf.seq_len, conf.batch_size, generator))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            tracker.save({'loss.train': loss.item()})
            if (step + 1) % conf.eval_every == 0:
                tracker.save({'loss.valid': validate()})
            if time.time() - started > conf.time_limit:
                break
        valid = validate()
        tracker.save({'loss.valid': valid})
    print(f'\nTrained {step + 1} steps in {time.time() - started:.0f} s: '
          f'last training loss {loss.item():.3f}, validation loss {valid:.3f} nats/char '
          f'({valid / math.log(2):.3f} bits/char)')
    return valid


if __name__ == '__main__':
    run(parse_overrides(sys.argv[1:]))
