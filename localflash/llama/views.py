"""NumPy views of llama.cpp's float buffers (logits, layer inputs, nextn rows), made once per buffer.

``np.ctypeslib.as_array`` builds a ctypes array type and an array interface on every call;
a cycle asks for the same few buffers (the verify rows, each tapped layer's inputs) again
and again, and llama.cpp reallocates them only when they grow. So a view is kept per
(address, shape) and handed out again while llama.cpp returns that same address.
"""

from __future__ import annotations

import ctypes

import numpy as np

_views: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
_MAX_VIEWS = 256  # distinct (buffer, shape) pairs kept; a full table is simply dropped


def address_view(address: int, shape: tuple[int, ...]) -> np.ndarray:
    """A ``shape`` view of the floats at ``address`` (an int), cached by address and shape."""
    view = _views.get((address, shape))
    if view is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        size = 1
        for d in shape:
            size *= d
        view = _views[(address, shape)] = np.frombuffer((ctypes.c_float * size).from_address(address), np.float32).reshape(shape)
    return view


def float_view(ptr, shape: tuple[int, ...]) -> np.ndarray:
    """A ``shape`` view of the floats at ``ptr`` (a ``POINTER(c_float)``), cached by address and shape."""
    key = (ctypes.cast(ptr, ctypes.c_void_p).value, shape)
    view = _views.get(key)
    if view is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        view = _views[key] = np.ctypeslib.as_array(ptr, shape=shape)
    return view
