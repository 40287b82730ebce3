"""
# Corpora and iterators

Tiny Shakespeare (public domain, 1,115,394 characters) ships inside the package, gzip-compressed, as the
default corpus of the demo and the examples. The corpora of the Transformer-XL paper (enwik8, text8,
WikiText-103, WikiText-2, Penn Treebank, One Billion Words) load from their published files on disk, with the
original's splits, vocabularies and iterators. See docs/data.md.

```python
corpus = get_corpus('enwik8', 'data/enwik8')      # the folder holding enwik8.zip
for data, target, seq_len in corpus.get_iterator('train', bsz=22, bptt=512):
    ...
```
"""
from .corpora import CORPORA, get_corpus
from .corpus import Corpus
from .enwik8 import load_enwik8
from .files import DataFileFormatError, EmptyDataFileError, MissingDataFileError
from .lm1b import load_lm1b
from .ordered_iterator import LMOrderedIterator
from .ptb import load_ptb
from .published_vocabulary import AuthorsCache, load_authors_cache, vocabulary_from_authors_cache, \
    vocabulary_from_hf_pickle
from .safe_pickle import ForbiddenGlobalError
from .shuffled_iterator import LMMultiFileIterator, LMShuffledIterator
from .text8 import load_text8
from .tiny_shakespeare import TINY_SHAKESPEARE_PATH, load_tiny_shakespeare, \
    load_tiny_shakespeare_corpus
from .vocabulary import Vocabulary
from .wikitext import load_wikitext, load_wt103, load_wt2

__all__ = [
    'CORPORA', 'get_corpus', 'Corpus', 'Vocabulary',
    'LMOrderedIterator', 'LMShuffledIterator', 'LMMultiFileIterator',
    'load_tiny_shakespeare', 'load_tiny_shakespeare_corpus', 'TINY_SHAKESPEARE_PATH',
    'load_enwik8', 'load_text8', 'load_wikitext', 'load_wt103', 'load_wt2', 'load_ptb', 'load_lm1b',
    'MissingDataFileError', 'EmptyDataFileError', 'DataFileFormatError',
    'vocabulary_from_hf_pickle', 'load_authors_cache', 'vocabulary_from_authors_cache', 'AuthorsCache',
    'ForbiddenGlobalError',
]
