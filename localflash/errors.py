"""Typed errors: one clear line for the user, an optional hint, caught at the CLI edge."""


class LocalflashError(Exception):
    """A problem the user can act on. ``str(err)`` is the one-line message."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class RollbackError(LocalflashError):
    """The runtime could not remove rejected positions; continuing would corrupt the state."""


class EngineLost(LocalflashError):
    """The engine's process died (llama.cpp aborts on a lost RPC connection); the server answers 503."""


class ContextOverflow(LocalflashError):
    """A prompt that does not fit the context: ``prompt_tokens`` of ``n_ctx`` (the server answers 400)."""

    def __init__(self, prompt_tokens: int, n_ctx: int, message: str | None = None, hint: str | None = None):
        super().__init__(
            message or f"the prompt has {prompt_tokens} tokens but the context holds {n_ctx}",
            hint=hint or "raise -c/--ctx or shorten the prompt",
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class HubError(LocalflashError):
    """The hub could not give a model file: unreachable, refused, not there, or what came was wrong."""


class HubUnreachable(HubError):
    """No network, or HF_HUB_OFFLINE set, and the file is not in the cache."""


class HubAuthRequired(HubError):
    """A gated or private repo asked for a token (401/403)."""


class HubNotFound(HubError):
    """No such repo, revision, file or quant."""


class ChecksumMismatch(HubError):
    """A downloaded file's sha256 is not the one the hub publishes; the file was removed."""


class DiskFull(HubError):
    """Not enough free space for a download; what was written is kept to resume from."""


class GrammarError(LocalflashError):
    """A grammar or JSON schema llama.cpp cannot take; ``param`` names the request field (the server answers 400)."""

    def __init__(self, message: str, param: str = "grammar", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.param = param
