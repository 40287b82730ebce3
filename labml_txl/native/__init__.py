"""Kernels of our own in C++, compiled on first use for the machine they run on (`build.py`), each with the
PyTorch path it replaces as the fallback."""
from .build import DISABLE_VARIABLE, disabled, load_kernel, native_kernels_enabled
from .attention import causal_relative_attention, kernel_available, kernel_window
from .layer_norm import residual_layer_norm

__all__ = ['DISABLE_VARIABLE', 'disabled', 'load_kernel', 'native_kernels_enabled', 'causal_relative_attention',
           'kernel_available', 'kernel_window', 'residual_layer_norm']
