"""The ``localflash`` command line: one module per command, over the public API (:mod:`localflash.api`)."""

from localflash.cli.app import app, main

__all__ = ["app", "main"]
