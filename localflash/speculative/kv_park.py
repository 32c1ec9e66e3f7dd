"""Idle slots' KV parked in host memory while other slots decode (unified pool, attention-only targets).

In a unified KV pool llama.cpp's attention for every decoded row spans all used cells (up to the
highest used cell, masked per sequence), so the finished conversations that idle slots keep for
their next turn (:mod:`.kv_pool`) make every running slot's decode slower (measured in-process on
an idle 2-core machine, Qwen2.5-Coder-1.5B Q4_K_M, n_ctx 8192: one sequence of 1,500 tokens decoding
beside 3 idle caches of 1,500 tokens each took 121.5 ms a token, 100.3 ms with those caches gone).
Split streams (llama-server's ``-np``) do not pay it.

So while some slot has a request going, an idle slot's target sequence is copied out to host
memory (``llama_state_seq_get_data``) and its cells are freed; the slot keeps its token list, so
routing (``LLM.slot_for``) still sends the conversation's next turn there. When a request is
admitted to a parked slot and its prompt shares the cache's first MIN_REUSE_TOKENS tokens (a short
prompt: all but its last), the sequence is put back (``llama_state_seq_set_data``: the same K/V
rows, in whatever cells are free) before the usual prefix reuse cuts it to the shared prefix;
a restore that fails (no room, a bad blob) forgets the cache and the prompt is prefilled whole,
counted as an eviction. So does one that would take more cells than the request reserves (the prompt
shares only the cache's start) where they are not free: other conversations are not evicted, nor the
request kept waiting, to put back cells the prefix reuse would cut at once (``KvPool.make_room``). A parked cache holds no pool cells (``KvPool.held``); admission reserves
the cells its restore takes (:meth:`KvPark.restore_cells`). Parked blobs are held to at most the
pool's own cells' worth of host memory (:attr:`KvPark.budget`, in tokens): beyond it the least
recently used are dropped, counted as evictions (``KvPool.evictions``).

The attention spans the cells up to the highest used one (llama.cpp ``get_n_kv``), so parking shortens it
where the idle caches lie above the running slots' cells; llama.cpp puts a restored cache and new rows
in the lowest free cells (``find_slot`` starts from 0 while enough cells below its head are free), so
the running slots gather low. A running slot whose cache was never parked stays where it is.

Only the target's context, only a unified pool, only attention caches: a recurrent or hybrid
target (``ctx.recurrent``) keeps today's behaviour (its state's checkpoints are per sequence and
its cells are few). Drafters' own contexts are left alone. Only a KV cache in host memory
(:func:`kv_in_host_memory`: a CPU build, or no layer offloaded): there a park is a memory copy and
the gain was measured (``benchmarks/speed/kv_park_gain.py``); a GPU's cache would cross PCIe both
ways, and an RPC server's the network, at a cost not measured yet.
"""

from __future__ import annotations

from localflash.llama.runtime import gpu_offload_supported

# a smaller cache widens attention by little and is cheap to prefill again: not worth two copies of its rows
MIN_PARK_TOKENS = 64
# a parked cache is put back when a prompt shares its first this many tokens (or the prompt's all but last, if shorter):
# the copy back costs far less than a prefill of the shared prefix (host memory: a memcpy of the rows)
MIN_REUSE_TOKENS = 16


def kv_in_host_memory(target) -> bool:
    """Whether the target's KV cache is in host memory: no layer offloaded, only CPU devices named, or no GPU here."""
    o = getattr(target, "options", None)
    if o is None:
        return False
    if o.n_gpu_layers == 0:
        return True
    if o.devices is not None:  # (RPC0, CUDA0, ...: layers and their KV elsewhere)
        return all(d.upper().startswith("CPU") for d in o.devices)
    return not gpu_offload_supported()


class Parked:
    """One slot's target sequence in host memory: ``n`` tokens' cells as llama.cpp wrote them."""

    __slots__ = ("n", "data")

    def __init__(self, n: int, data):
        self.n, self.data = n, data


class KvPark:
    """The parked caches of one :class:`~localflash.speculative.slots.SlotPool`."""

    def __init__(self, pool):
        self.pool = pool
        self.on = bool(pool.unified) and not pool.recurrent and kv_in_host_memory(pool.target)
        self.blobs: dict[int, Parked] = {}  # slot index -> its parked sequence
        self.budget = pool.kv.capacity  # parked tokens at most: host memory at most the pool's own KV bytes
        self.pending = False  # a request ended since the last park: an idle slot may hold cells to park
        self.parks = self.restores = self.failed = 0

    def parked(self, slot) -> bool:
        return slot.index in self.blobs

    def restore_cells(self, slot, prompt) -> int:
        """Cells ``slot``'s parked cache takes back when ``prompt`` is admitted (0: none, or it would not be reused)."""
        blob = self.blobs.get(slot.index)
        return blob.n if blob is not None and self._reused(slot, prompt) else 0

    @staticmethod
    def _reused(slot, prompt) -> bool:
        """Whether ``prompt`` starts with the slot's first MIN_REUSE_TOKENS cached tokens (a shorter prompt: all its
        tokens but the last, which is decoded whatever is cached). Else the cache is not put back: the prompt replaces
        it, whatever few tokens the prefix reuse would have kept. A short prompt that repeats or continues the
        parked conversation is reused like a long one (the same question asked again, a system prompt and a
        short user turn)."""
        n = min(MIN_REUSE_TOKENS, len(prompt) - 1)
        return n > 0 and slot.tokens[:n] == prompt[:n]

    # -- the pool's thread ------------------------------------------------------------
    def park_idle(self) -> None:
        """Park every idle slot's cache of at least MIN_PARK_TOKENS (called at a step's start, some slot running)."""
        self.pending = False
        for s in self.pool.slots:
            if s.request is None and s.index not in self.blobs and len(s.tokens) >= MIN_PARK_TOKENS:
                self._park(s)
        self._cap()

    def _park(self, s) -> None:
        view = s.ctx
        if view.pos_max() != len(s.tokens) - 1:
            return  # its cells are not exactly its tokens' (never expected): leave it as it is
        data = view.save_state()
        if data is None:
            return  # it stays in the pool
        view.clear()  # (the sequence's cells only; its drafter and token list stay)
        self.blobs[s.index] = Parked(len(s.tokens), data)
        self.parks += 1

    def _cap(self) -> None:
        """Drop the least recently used parked caches while they hold more than ``budget`` tokens."""
        held = sum(b.n for b in self.blobs.values())
        if held <= self.budget:
            return
        kv = self.pool.kv
        for i in sorted(self.blobs, key=lambda i: kv.used_at[i]):
            if held <= self.budget:
                break
            s = self.pool.slots[i]
            n = self.blobs[i].n
            self.forget(s)
            self.pool.kv.evicted(n)
            held -= n

    def restore(self, slot, req) -> None:
        """Before ``slot``'s request is admitted: put its parked cache back, or forget it (then the prompt is prefilled)."""
        from localflash.speculative.loop import Engine

        blob = self.blobs.pop(slot.index, None)
        if blob is None:
            return
        if blob.n != len(slot.tokens) or not self._reused(slot, req.prompt):
            Engine.reset(slot)  # stale (its tokens changed) or not reused: the prompt replaces it
            return
        if not slot.ctx.load_state(blob.data) or slot.ctx.pos_max() != blob.n - 1:
            self.failed += 1
            Engine.reset(slot)
            self.pool.kv.evicted(blob.n, req)
            return
        self.restores += 1

    def forget(self, slot) -> None:
        """Drop ``slot``'s parked cache, and with it the slot's token list and drafter state (``Engine.reset``)."""
        from localflash.speculative.loop import Engine

        if self.blobs.pop(slot.index, None) is not None:
            Engine.reset(slot)

    def describe(self) -> dict:
        return {"parked": len(self.blobs), "parked_tokens": sum(b.n for b in self.blobs.values()), "parks": self.parks,
                "restores": self.restores, "restore_failures": self.failed}
