"""Kernels of our own in C++, compiled on first use for the machine they run on (`build.py`), each with the
PyTorch path it replaces as the fallback; `labml_txl/fast/dispatch.py` decides which runs."""
from . import attention, decoder_layer, dropout, few_rows_linear, layer_norm
from .build import DISABLE_VARIABLE, disabled, load_kernel, native_kernels_enabled


def prepare_kernels() -> bool:
    """Build (or load from the cache) and check every kernel now, so that no compilation happens later inside a
    timed loop; returns whether all of them are available (False with `LABML_TXL_NATIVE=0`)."""
    return native_kernels_enabled() and all([attention.kernel_available(), layer_norm.kernel_available(),
                                             dropout.kernel_available(), few_rows_linear.kernel_available(),
                                             decoder_layer.kernel_available()])


__all__ = ['DISABLE_VARIABLE', 'disabled', 'load_kernel', 'native_kernels_enabled', 'prepare_kernels']
