"""Training DFlash drafters: the only part of localflash that imports torch.

``data`` (target responses and features, NumPy only), ``anchors``, ``loss``,
``model`` (the PyTorch drafter), ``trainer``, ``export`` (to GGUF) and
``evaluate`` (τ with the real engine). Import the submodules you need; this
package itself stays light so ``--help`` never loads torch.
"""

from __future__ import annotations

from localflash.errors import LocalflashError


def require_torch():
    """Import torch, or fail with one line saying how to get it."""
    try:
        import torch
    except ImportError as e:
        raise LocalflashError(
            f"training a drafter needs PyTorch ({e})",
            hint="pip install 'localflash[train]' (or `make install`, which installs the CPU build)",
        ) from e
    return torch
