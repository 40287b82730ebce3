"""Positional schemes: the sinusoids and rotations (`encoding.py`), and each scheme whose positions live in the
attention, written once and served to both `TransformerConfigs` and Transformer-XL."""
