"""Cutting a context's cache back without ever leaving a wrong state.

Attention KV caches hold one row per position and can drop any tail.
Recurrent (Gated-DeltaNet, Mamba) memory holds one state per sequence; with
``n_rs_seq`` > 0 llama.cpp also keeps the states after each of the last
decode's final tokens, so a cut strictly inside that decode is exact. Any
other cut can return success and still leave a stale state
(``src/llama-memory-recurrent.cpp`` seq_rm, ``tests/test-recurrent-state-rollback.cpp``).
Those go through a checkpoint of the recurrent state
(``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``)
that is restored before the lost tokens are decoded again — the only path for
archs llama.cpp gives no snapshots (``llm_arch_supports_rs_rollback``: not qwen3next).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from localflash.archs import SNAPSHOT_ARCHS
from localflash.errors import RollbackError
from localflash.llama.bindings import lib


# Every decode writes 1 + n_rs_seq copies of the recurrent state (Qwen3.6-27B: ~150 MiB each) and keeps
# them resident, so the snapshot depth, and with it the draft length on such a target, is bounded.
MAX_SNAPSHOTS = 32


def check_snapshot_depth(arch: str, max_draft: int, n_ubatch: int) -> None:
    """Refuse a draft length that the target's recurrent-state snapshots cannot roll back."""
    if arch not in SNAPSHOT_ARCHS or max_draft <= 0:
        return
    limit = min(MAX_SNAPSHOTS, n_ubatch - 2)  # llama.cpp: n_ubatch must exceed n_rs_seq + 1
    if max_draft > limit:
        raise RollbackError(
            f"--draft-max {max_draft}: a {arch} target can roll back at most {limit} drafted tokens "
            f"(one recurrent-state snapshot per token, each a full copy of the state)",
            hint=f"use --draft-max {limit} or less",
        )


@dataclass
class StateCheckpoint:
    """A sequence's recurrent state after its first ``n`` tokens (bytes from llama.cpp, host memory)."""

    n: int
    data: object  # ctypes uint8 array


class RecurrentCache:
    """Cache-cut semantics of one sequence (``self.seq``) of a context.

    :class:`~localflash.llama.runtime.Context` is sequence 0 of its own context; a
    :class:`~localflash.llama.sequences.SeqView` is another sequence of a shared one,
    with its own end, snapshots pending and checkpoints.
    """

    def _init_rollback(self, mtp: bool = False, n_ubatch: int = 512) -> None:
        L = lib()
        # an MTP context on a hybrid model runs only the dense nextn block, on a plain KV cache
        hybrid = L.llama_model_is_recurrent(self.model.ptr) or L.llama_model_is_hybrid(self.model.ptr)
        self.recurrent = bool(hybrid) and not mtp
        self.n_rs_seq = int(L.llama_n_rs_seq(self.ptr)) if self.recurrent else 0  # after llama.cpp's clamp
        if self.n_rs_seq and n_ubatch <= self.n_rs_seq + 1:  # llama.cpp would abort in its first decode
            raise RollbackError(
                f"{self.model.path.name}: {self.n_rs_seq} recurrent-state snapshots need a micro-batch of more than "
                f"{self.n_rs_seq + 1} tokens, not {n_ubatch}",
                hint="lower --draft-max",
            )
        self.end = 0  # positions 0..end-1 are in the cache
        self._last_start = 0  # the last decode wrote positions _last_start..end-1
        self._rolled = False  # a snapshot rollback is pending (single-use until the next decode)
        self._checkpoints: list[StateCheckpoint] = []  # kept states (prompt boundaries), oldest first
        self._scratch: StateCheckpoint | None = None  # the one taken before a verify / calibration pass
        self.max_checkpoints = 3
        self.counts = {"snapshot": 0, "restore": 0}  # snapshot rollbacks and checkpoint restores so far

    def _cleared(self) -> None:
        self.end = self._last_start = 0
        self._rolled = False
        self._checkpoints, self._scratch = [], None

    def _decoded(self, start_pos: int, n: int) -> None:
        self._last_start, self.end, self._rolled = start_pos, start_pos + n, False

    def describe_rollback(self) -> str:
        return {
            "kv": "kv (attention cache: any cut)",
            "snapshot": f"snapshot (n_rs_seq = {self.n_rs_seq} recurrent-state snapshots; other cuts restore a checkpoint)",
            "replay": f"replay ({self.model.arch} keeps no snapshots: checkpoint before each verify, restore + replay a miss)",
        }[self.rollback_path]

    @property
    def rollback_path(self) -> str:
        """How this cache goes back: ``kv`` (any cut), ``snapshot`` (n_rs_seq states), ``replay`` (checkpoint + replay)."""
        return "kv" if not self.recurrent else "snapshot" if self.n_rs_seq else "replay"

    def rollback_ok(self, p0: int) -> bool:
        """Whether ``seq_rm(p0)`` leaves a correct state.

        Attention caches can drop any tail. Recurrent memory keeps per-token
        snapshots of the last decode only: a cut is right when it lies strictly
        inside that decode (one of its tokens kept), at most ``n_rs_seq`` back,
        and no other rollback is pending. Otherwise llama.cpp may return true and
        silently restore a stale state (``llama-memory-recurrent.cpp`` seq_rm).
        """
        if p0 >= self.end or p0 <= 0 or not self.recurrent:
            return True
        return not self._rolled and self._last_start < p0 and self.end - p0 <= self.n_rs_seq

    def seq_rm(self, p0: int, p1: int = -1, checked: bool = False) -> None:
        """Remove positions ``p0..`` from the cache; raise rather than make a wrong state.

        Only tail cuts exist here (``p1`` must be -1). A cut that :meth:`rollback_ok`
        refuses raises :class:`RollbackError`; callers that can recover use :meth:`rewind`
        (``checked``: the caller has just asked :meth:`rollback_ok`).
        """
        if p1 != -1:
            raise ValueError("only tail cuts (p1 = -1) are supported")
        if p0 < 0:
            p0 = 0
        if p0 >= self.end and self.recurrent:  # attention caches are always asked: a drafter may fill them
            return  # through its own batches (EAGLE-3), which ``end`` does not see
        if self.recurrent and not checked and not self.rollback_ok(p0):  # (an attention cache can drop any tail)
            raise RollbackError(
                f"{self.model.path.name}: cutting the cache back to position {p0} would restore a stale recurrent state "
                f"(the last decode wrote {self._last_start}..{self.end - 1}; snapshots: {self.n_rs_seq})",
                hint="this is a localflash bug: such cuts must go through a checkpoint (Context.rewind)",
            )
        if not lib().llama_memory_seq_rm(self.mem, self.seq, p0, -1):
            raise RollbackError(
                f"{self.model.path.name}: the cache could not drop positions from {p0}",
                hint="hybrid/recurrent models need n_rs_seq >= the draft length",
            )
        if self.recurrent and p0 > 0:
            self._rolled = True
            self.counts["snapshot"] += 1
        if p0 < self.end:
            self.end = p0
        if p0 < self._last_start:
            self._last_start = p0
        if (self._checkpoints and self._checkpoints[-1].n > p0) or (self._scratch is not None and self._scratch.n > p0):
            self._drop_checkpoints_after(p0)

    def seq_copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Put the cells of sequence ``src`` at positions ``p0..p1-1`` (-1: open) in sequence ``dst`` too.

        In a unified KV cache a cell may belong to several sequences: nothing is copied, the cells
        gain an id. Attention caches only (a recurrent state would be copied whole).
        """
        lib().llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_drop(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Take sequence ``seq`` off its cells at positions ``p0..p1-1``; a cell left in no sequence is freed.

        Unlike :meth:`seq_rm` (sequence 0's tail cut, with the recurrent-state checks) any sequence,
        any range; attention caches only.
        """
        if not lib().llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise RollbackError(f"{self.model.path.name}: the cache could not drop sequence {seq} at {p0}..{p1}")

    def rewind(self, p0: int) -> int:
        """Make the cache end at ``p0`` or earlier, always correctly; return where it ends.

        A valid cut (see :meth:`rollback_ok`) ends it at ``p0``; otherwise the newest
        recurrent-state checkpoint at or before ``p0`` is restored, or the cache is
        emptied. The caller decodes the positions between the result and ``p0`` again.
        """
        if not self.recurrent:
            self.seq_rm(p0)
            return max(p0, 0)
        if p0 >= self.end:
            return self.end
        if self.rollback_ok(p0):
            self.seq_rm(p0, -1, True)
            return p0 if p0 > 0 else 0
        candidates = [c for c in self._checkpoints + [self._scratch] if c is not None and c.n <= p0]
        if not candidates:
            self.seq_rm(0)
            return 0
        self.restore(max(candidates, key=lambda c: c.n))
        return self.end

    def checkpoint(self, transient: bool = False) -> "StateCheckpoint | None":
        """Save the recurrent state at the cache's end (llama.cpp ``PARTIAL_ONLY``: no KV rows).

        Kept checkpoints (at most ``max_checkpoints``) serve later requests that reuse a
        prefix; a ``transient`` one (the only one of its kind) serves the next verify cut.
        Attention-only caches need none and get None.
        """
        if not self.recurrent or self.end == 0:
            return None
        L = lib()
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = L.llama_state_seq_get_size_ext(self.ptr, self.seq, flags)
        data = (ctypes.c_uint8 * size)()
        if size == 0 or L.llama_state_seq_get_data_ext(self.ptr, data, size, self.seq, flags) != size:
            raise RollbackError(f"{self.model.path.name}: llama.cpp could not save the recurrent state at position {self.end}")
        cp = StateCheckpoint(self.end, data)
        if transient:
            self._scratch = cp
        else:
            self._checkpoints = [c for c in self._checkpoints if c.n != cp.n][-(self.max_checkpoints - 1) :] + [cp]
        return cp

    def restore(self, cp: "StateCheckpoint") -> None:
        """Put the recurrent state back to ``cp`` and drop every KV row from ``cp.n`` on."""
        L = lib()
        if cp.n > self.end:
            raise RollbackError(f"{self.model.path.name}: checkpoint at {cp.n} lies past the cache's end {self.end}")
        got = L.llama_state_seq_set_data_ext(self.ptr, cp.data, len(cp.data), self.seq, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        # the recurrent cell now sits at cp.n - 1, so the hybrid seq_rm below only drops attention rows
        if got == 0 or not L.llama_memory_seq_rm(self.mem, self.seq, cp.n, -1):
            self.clear()
            raise RollbackError(
                f"{self.model.path.name}: the recurrent-state checkpoint at position {cp.n} could not be restored",
                hint="the cache was cleared; the next request prefills from the start",
            )
        self.end = self._last_start = cp.n
        self._rolled = False
        self.counts["restore"] += 1
        self._drop_checkpoints_after(cp.n)

    def _drop_checkpoints_after(self, n: int) -> None:
        if self._checkpoints and self._checkpoints[-1].n > n:  # kept in position order: each is taken at the end
            self._checkpoints = [c for c in self._checkpoints if c.n <= n]
        if self._scratch is not None and self._scratch.n > n:
            self._scratch = None
