"""Typed errors: one clear line for the user, an optional hint, caught at the CLI edge."""


class LocalflashError(Exception):
    """A problem the user can act on. ``str(err)`` is the one-line message."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class RollbackError(LocalflashError):
    """The runtime could not remove rejected positions; continuing would corrupt the state."""
