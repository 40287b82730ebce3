"""Training and evaluation of Transformer-XL on labml."""
