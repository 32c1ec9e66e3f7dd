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


def layers_view(addresses: tuple[int, ...], n_rows: int, width: int) -> np.ndarray | None:
    """A read-only ``[n_rows, len(addresses), width]`` view of layers whose ``[n_rows, width]`` floats start at
    ``addresses``, equally spaced and apart (llama.cpp's output buffer lays captured layers out so); None otherwise.
    Row ``i`` holds every layer's row ``i`` side by side: what a DFlash batch row takes, in one copy."""
    span = n_rows * width * 4
    step = addresses[1] - addresses[0] if len(addresses) > 1 else span
    if step < span or any(b - a != step for a, b in zip(addresses, addresses[1:])):
        return None
    base = np.frombuffer((ctypes.c_float * ((step * (len(addresses) - 1) + span) // 4)).from_address(addresses[0]), np.float32)
    return np.lib.stride_tricks.as_strided(base, shape=(n_rows, len(addresses), width), strides=(width * 4, step, 4), writeable=False)


def float_view(ptr, shape: tuple[int, ...]) -> np.ndarray:
    """A ``shape`` view of the floats at ``ptr`` (a ``POINTER(c_float)``), cached by address and shape."""
    key = (ctypes.cast(ptr, ctypes.c_void_p).value, shape)
    view = _views.get(key)
    if view is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        view = _views[key] = np.ctypeslib.as_array(ptr, shape=shape)
    return view
