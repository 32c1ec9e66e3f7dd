"""llama.cpp's grammar sampler (GBNF) over a model's vocabulary, and llama-cpp-python's JSON-schema → GBNF converter.

A :class:`GrammarState` is one ``llama_sampler_init_grammar`` sampler: its parse stacks say which
tokens may come next. It is used by hand, never inside a chain: :meth:`~GrammarState.mask` runs the
grammar's ``apply`` on a whole row (the disallowed tokens' logits become ``-inf``),
:meth:`~GrammarState.allowed` and :meth:`~GrammarState.allows` on a few candidates only,
:meth:`~GrammarState.accept` advances the stacks by one token and :meth:`~GrammarState.clone` copies
them (``llama_sampler_clone``), for a draft checked ahead of the committed state.

llama.cpp aborts the process when a token the stacks reject is accepted (an empty stack after the
piece, or an end-of-generation token before the grammar may end), so :meth:`accept` is only ever
called on a token :meth:`allows` (or a masked row) let through; :attr:`calls` counts the C calls.
"""

from __future__ import annotations

import ctypes
import json

import numpy as np

from localflash.errors import GrammarError
from localflash.llama.bindings import lib, recent_log

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)  # llama_token_data


def schema_to_gbnf(schema: dict | bool, param: str = "json_schema") -> str:
    """GBNF text of a JSON schema (llama-cpp-python's converter); a schema it cannot take raises GrammarError naming ``param``."""
    lib()  # the converter lives in llama_cpp's package
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"{param} must be a JSON schema object, got {type(schema).__name__}", param=param)
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # noqa: BLE001 (the converter raises bare ValueError/KeyError/AssertionError...)
        raise GrammarError(f"{param} could not be converted to a grammar: {type(e).__name__}: {e}", param=param) from None


class GrammarState:
    """The parse state of one GBNF grammar over ``model``'s vocabulary (see the module docstring)."""

    def __init__(self, model, text: str, root: str = "root", param: str = "grammar", _ptr=None):
        self.model = model
        self.text = text
        self.calls = 0  # C calls into the grammar (apply, accept, clone), for host-cost counts
        if _ptr is None:
            if not isinstance(text, str) or not text.strip():
                raise GrammarError(f"{param} must be a non-empty GBNF string", param=param)
            n_log = len(recent_log())
            _ptr = lib().llama_sampler_init_grammar(model.vocab, text.encode("utf-8"), root.encode("utf-8"))
            if not _ptr:
                said = [line.strip() for line in recent_log()[n_log:] if "grammar" in line.lower() or "pars" in line.lower()]
                why = f": {said[-1]}" if said else ""
                raise GrammarError(f"{param} is not a valid GBNF grammar{why}", param=param,
                                   hint="see llama.cpp's grammars/README.md; the start rule is `root ::= ...`")
        self.ptr = _ptr
        self._one = np.zeros(1, TOKEN_DATA)
        self._small = np.zeros(64, TOKEN_DATA)
        self._full: np.ndarray | None = None

    def _apply(self, buf: np.ndarray, n: int) -> None:
        L = lib()
        arr = L.llama_token_data_array(ctypes.cast(buf.ctypes.data, L.llama_token_data_p), n, -1, False)
        L.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        self.calls += 1

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""
        one = self._one
        one["id"][0], one["logit"][0] = token, 0.0
        self._apply(one, 1)
        return bool(np.isfinite(one["logit"][0]))

    def allowed(self, ids) -> np.ndarray:
        """Which of the tokens ``ids`` the grammar allows next (a bool mask), in one apply."""
        n = len(ids)
        if n > len(self._small):
            self._small = np.zeros(n, TOKEN_DATA)
        buf = self._small
        buf["id"][:n], buf["logit"][:n] = ids, 0.0
        self._apply(buf, n)
        return np.isfinite(buf["logit"][:n])

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of the row with every token the grammar rejects at ``-inf``."""
        n = logits.shape[0]
        if self._full is None or len(self._full) != n:
            self._full = np.zeros(n, TOKEN_DATA)
            self._full["id"] = np.arange(n, dtype=np.int32)
        buf = self._full
        buf["logit"] = logits
        self._apply(buf, n)
        return np.ascontiguousarray(buf["logit"])

    def accept(self, token: int) -> None:
        """Advance by ``token``, which must be allowed (llama.cpp aborts on a rejected one)."""
        lib().llama_sampler_accept(self.ptr, token)
        self.calls += 1

    def clone(self) -> "GrammarState":
        self.calls += 1
        return GrammarState(self.model, self.text, _ptr=lib().llama_sampler_clone(self.ptr))

    def close(self) -> None:
        if self.ptr:
            lib().llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass
