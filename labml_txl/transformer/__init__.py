"""The vanilla Transformer's modules under labml_nn's names: multi-head attention, the feed-forward network, the
encoder and decoder layers and stacks, norms, and interoperability with `torch.nn.Transformer`."""
