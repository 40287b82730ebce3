"""Tests of the faithful Transformer-XL (`labml_txl.xl`) and the relative attention."""
