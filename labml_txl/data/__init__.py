"""
# Corpora

Tiny Shakespeare (public domain, 1,115,394 characters) ships inside the package, gzip-compressed, as the
default corpus of the demo and the examples.
"""
import gzip
from pathlib import Path

TINY_SHAKESPEARE_PATH = Path(__file__).resolve().parent / 'tiny_shakespeare.txt.gz'


def load_tiny_shakespeare() -> str:
    """The bundled Tiny Shakespeare text."""
    with gzip.open(TINY_SHAKESPEARE_PATH, 'rt', encoding='utf-8') as f:
        return f.read()
