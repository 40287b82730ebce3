"""Kernels of our own in C++, compiled on first use for the machine they run on (`build.py`), each with the
PyTorch path it replaces as the fallback."""
from .build import DISABLE_VARIABLE, disabled, load_kernel, native_kernels_enabled
from .attention import applies, causal_relative_attention, kernel_available

__all__ = ['DISABLE_VARIABLE', 'disabled', 'load_kernel', 'native_kernels_enabled', 'applies',
           'causal_relative_attention', 'kernel_available']
