"""The attention core: the readable specification of the scores (`reference.py`), the same computation head-major for
speed (`composite.py`), and the one convention for masks (`masks.py`). Which of them, or a kernel, runs a call is
`labml_txl.fast.dispatch`'s choice."""
