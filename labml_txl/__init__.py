"""labml_txl: Transformer-XL and Transformer configurations in the style of labml."""
