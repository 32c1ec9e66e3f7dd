"""The ``localflash`` command line: one module per command, over the public API (:mod:`localflash.api`).

:mod:`.app` holds the Typer app and the entry point; importing a command module
registers its command on the app, in the order ``--help`` lists them.
"""

from localflash.cli.app import app, main
from localflash.cli import run, chat, bench, serve, plan, models, pull, convert, train, rpc_server  # noqa: F401,E402 (each registers its command)

__all__ = ["app", "main"]
