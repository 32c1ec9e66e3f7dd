"""What one configuration (context, KV type, placement of the target's blocks) costs on every GPU and the host.

- **weights** per device by llama.cpp's placement rule: the token embedding stays
  on the host, block ``i`` goes to the first GPU whose cumulative ``tensor_split``
  share exceeds ``(i - i_gpu_start) / act_gpu_layers``, and the output layer
  counts as block ``n_layer_all`` (so it lands on the last GPU). A tied LM head is
  loaded a second time there. Expert tensors named by a buffer override stay on
  the host;
- KV cache, recurrent state and compute buffers by :mod:`localflash.plan.costs`;
- the drafter's weights, its own (capped) KV cache and compute buffer, on the
  card that holds the target's output layer; with parallel slots (``Wishes.n_seq`` > 1) as
  ``open_engine`` builds them (:meth:`Pricer.drafter_layout`): DFlash and a draft model on one
  context of N sequences, each the slot's share of the context (KV for all N, one compute
  buffer with every slot's output rows), EAGLE-3 a context a slot; for MTP drafting (``Wishes.mtp``)
  the target's own nextn block, the MTP context's KV cache at the full context
  and its one-block compute buffer (``localflash.plan.mtp``); a fixed **runtime overhead** per GPU
  (CUDA context, cuBLAS workspace, memory pool) and a **safety margin** left free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from localflash.archs import BLOCK_ROOM, EAGLE3_ENCODE_ROWS
from localflash.formats.gguf_meta import ModelMeta
from localflash.plan.costs import (
    EXPERT_PATTERN,
    PIPELINE_COPIES,
    compute_bytes,
    kv_bytes_per_layer,
    pad_ctx,
    recurrent_bytes_per_layer,
)
from localflash.plan.devices import Gpu, HostMemory
from localflash.plan.mtp import mtp_cost
from localflash.plan.types import DeviceUse, Wishes


@dataclass(frozen=True)
class Placement:
    """Where the target's blocks go: ``slots[g]`` block slots on GPU ``gpus[g]`` (output slot included)."""

    gpus: tuple[int, ...]  # indices into the planner's GPU list
    slots: tuple[int, ...]
    n_gpu_layers: int
    host_expert_layers: int = 0  # experts of blocks 0..n-1 stay on the host
    split_mode: str = "layer"
    host_output: bool = False  # the output layer stays on the host (its last device is remote: logits never cross the wire)


@dataclass(frozen=True)
class DrafterLayout:
    """The drafter contexts a run makes: ``contexts`` of ``seqs`` sequences of ``positions`` each, ``outputs`` rows a decode."""

    contexts: int
    seqs: int
    positions: int
    outputs: int

    @property
    def cells(self) -> int:
        return self.seqs * self.positions


@dataclass(frozen=True)
class Config:
    n_ctx: int
    kv: str
    placement: Placement


class Pricer:
    """Prices a target (+ drafter) for one ``Config`` on a list of GPUs and the host."""

    def __init__(self, target: ModelMeta, drafter: ModelMeta | None, gpus: list[Gpu], host: HostMemory, wishes: Wishes):
        self.mtp = wishes.mtp and target.n_layer_nextn > 0 and drafter is None
        if self.mtp:
            target = replace(target, load_mtp=True)
        self.t, self.d, self.gpus, self.host, self.w = target, drafter, gpus, host, wishes
        rs = wishes.n_draft if wishes.n_rs_seq is None else wishes.n_rs_seq
        self.n_rs_seq = rs if target.is_hybrid else 0
        self.n_outputs = min(max(1, wishes.n_seq) * (wishes.n_draft + 1), wishes.n_batch)
        self.layer_bytes = target.layer_bytes
        self.expert_bytes = target.expert_bytes
        self.rs = recurrent_bytes_per_layer(target, self.n_rs_seq, wishes.n_seq)
        self.biggest_matmul = [0] * target.n_layer_all  # per block: largest 2-D/3-D weight, and largest expert weight
        self.biggest_expert = [0] * target.n_layer_all
        for tensor in target.tensors:
            if len(tensor.shape) >= 2 and tensor.layer is not None and target.loaded(tensor):
                il = tensor.layer
                self.biggest_matmul[il] = max(self.biggest_matmul[il], tensor.n_bytes)
                if re.search(EXPERT_PATTERN, tensor.name):
                    self.biggest_expert[il] = max(self.biggest_expert[il], tensor.n_bytes)
        self._memo: dict = {}

    def _cached(self, key, fn):
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def kv(self, meta: ModelMeta, n_ctx: int, kv: str) -> dict[int, int]:
        return self._cached(("kv", id(meta), n_ctx, kv), lambda: kv_bytes_per_layer(meta, n_ctx, kv, self.w.n_ubatch))

    def compute(self, meta: ModelMeta, layers: list[int], output: bool, n_ctx: int, kv: str, cuda: bool,
                n_outputs: int, copies: int = 1) -> int:
        key = ("compute", id(meta), tuple(layers), output, n_ctx, kv, cuda, n_outputs, copies)
        return self._cached(key, lambda: compute_bytes(meta, layers, output, n_ctx=n_ctx, n_ubatch=self.w.n_ubatch,
                                                       n_outputs=n_outputs, kv=kv, cuda=cuda, copies=copies))

    def drafter_ctx(self, n_ctx: int) -> int:
        cap = self.w.drafter_ctx_cap
        return min(n_ctx, cap) if cap else n_ctx

    def drafter_layout(self, n_ctx: int) -> DrafterLayout:
        """The drafter file's contexts, as ``open_engine`` makes them for ``Wishes.n_seq`` slots.

        One slot: one context of the (capped) drafter context. N slots: each slot drafts within its
        share of the target's context (``n_ctx / N``, capped too); DFlash (+ its block's room) and a
        draft model put the N shares on one unified context (``SLOT_SHARED_DRAFTERS``; a DFlash decode
        outputs every slot's block, a draft-model decode one row a slot), EAGLE-3 makes a context a slot.
        """
        n, d = max(1, self.w.n_seq), self.d
        if n == 1:
            return DrafterLayout(1, 1, self.drafter_ctx(n_ctx), d.block_size or 1)
        share = min(self.drafter_ctx(n_ctx), pad_ctx(n_ctx) // n)
        if d.is_eagle3:
            return DrafterLayout(n, 1, share + self.w.n_draft + 1, 1)
        if d.is_dflash:
            return DrafterLayout(1, n, share + BLOCK_ROOM, min(512, d.block_size * n))
        return DrafterLayout(1, n, share, n)

    def mtp_cells(self, n_ctx: int) -> int:
        """Positions of the MTP context: the target's context, or N slots' shares of it on one context."""
        n = max(1, self.w.n_seq)
        return n_ctx if n == 1 else pad_ctx(n_ctx) // n * n

    def slot_devices(self, p: Placement) -> list[int | None]:
        """Device (position in ``p.gpus``) of every block slot, ``None`` for the host; last slot = output."""
        n_slots = self.t.n_layer_all + 1
        start = n_slots - p.n_gpu_layers
        out: list[int | None] = [None] * n_slots
        bounds = []
        acc = 0
        for s in p.slots:
            acc += s
            bounds.append(acc)
        for il in range(start, n_slots):
            rel = il - start
            out[il] = next((g for g, b in enumerate(bounds) if b > rel), len(bounds) - 1)
        if p.host_output:
            out[-1] = None
        return out

    def price(self, c: Config) -> tuple[list[DeviceUse], DeviceUse]:
        t, w, p = self.t, self.w, c.placement
        gpu_rows = [DeviceUse(f"{self.gpus[g].label} {self.gpus[g].name}", self.gpus[g].index,
                              self.gpus[g].free - w.margin, overhead=w.overhead, remote=self.gpus[g].endpoint) for g in p.gpus]
        host = DeviceUse("host RAM", None, self.host.available - w.margin)
        where = self.slot_devices(p)
        layer_bytes = self.layer_bytes
        expert_bytes = self.expert_bytes
        kv = self.kv(t, c.n_ctx, c.kv)
        rs = self.rs
        tensor_split = p.split_mode == "tensor" and len(p.gpus) > 1
        host.target_weights += t.input_bytes
        for il in range(t.n_layer_all):
            dev = where[il]
            state = kv.get(il, 0) + rs.get(il, 0)
            if dev is None:
                host.target_weights += layer_bytes[il]
                host.target_kv += state
                continue
            on_host = expert_bytes[il] if il < p.host_expert_layers else 0
            host.target_weights += on_host
            if tensor_split:
                for g, row in enumerate(gpu_rows):
                    share = p.slots[g] / sum(p.slots)
                    row.target_weights += int((layer_bytes[il] - on_host) * share)
                    row.target_kv += int(state * share)
            else:
                gpu_rows[dev].target_weights += layer_bytes[il] - on_host
                gpu_rows[dev].target_kv += state
        out_dev = where[t.n_layer_all]
        if out_dev is None:
            host.target_weights += t.output_bytes
        else:
            gpu_rows[out_dev].target_weights += t.output_bytes + t.tied_head_bytes

        T = min(pad_ctx(c.n_ctx), w.n_ubatch)
        pipeline = (len(p.gpus) > 1 and p.split_mode == "layer" and p.n_gpu_layers == t.n_layer_all + 1
                    and not p.host_expert_layers)
        copies = PIPELINE_COPIES if pipeline else 1
        for g, row in enumerate(gpu_rows):
            layers = [il for il in range(t.n_layer_all) if where[il] == g or (tensor_split and where[il] is not None)]
            row.target_compute = self.compute(t, layers, out_dev == g or tensor_split, c.n_ctx, c.kv, True,
                                              self.n_outputs, copies)
            if T >= 32 and g == 0 and self.gpus[p.gpus[0]].endpoint is None:  # no op offload to an RPC device
                row.target_compute += self._host_weight_copy(p, where)
        host_layers = [il for il in range(t.n_layer_all) if where[il] is None]
        if host_layers or out_dev is None:
            host.target_compute = self.compute(t, host_layers, out_dev is None, c.n_ctx, c.kv, False, self.n_outputs)
        if gpu_rows:
            host.target_compute += 2 * t.n_embd * T * 4  # token embedding rows gathered on the host
        taps = len(self.d.target_layers) if self.d is not None and (self.d.is_dflash or self.d.is_eagle3) else 0
        host.overhead = t.output_vocab * self.n_outputs * 4 + taps * t.n_embd * w.n_batch * 4

        if self.d is not None:
            self._price_drafter(c, gpu_rows[out_dev] if out_dev is not None else host, host)
        if self.mtp:
            self._add_mtp(c, gpu_rows, host, where)
        return gpu_rows, host

    def _add_mtp(self, c: Config, gpu_rows: list[DeviceUse], host: DeviceUse, where: list[int | None]) -> None:
        """Move the nextn weights into the drafter column and add the MTP context's KV, compute and outputs."""
        m = mtp_cost(self.t, where, self.mtp_cells(c.n_ctx), self.w.drafter_kv or c.kv, self.w.n_ubatch, self.w.n_batch, max(1, self.w.n_seq))
        for dev, n_bytes in m.nextn_weights.items():
            row = host if dev is None else gpu_rows[dev]
            row.target_weights -= n_bytes
            row.drafter_weights += n_bytes
        row = host if m.device is None else gpu_rows[m.device]
        row.drafter_kv += m.kv
        row.drafter_compute += m.compute
        host.overhead += m.host_outputs

    def _host_weight_copy(self, p: Placement, where: list[int | None]) -> int:
        """op_offload: large-batch matmuls of host-resident weights run on GPU 0 from a copy in its compute buffer."""
        on_host = [self.biggest_matmul[il] for il in range(self.t.n_layer_all) if where[il] is None]
        experts = self.biggest_expert[: p.host_expert_layers]
        return max(on_host + experts, default=0)

    def drafter_kv(self, c: Config) -> str:
        """The drafter's cache type: as asked, else the cheaper of f16 and the target's type.

        On CUDA a quantized cache also needs f16 copies of one layer's K and V in the compute
        buffer, so for a drafter with few cached layers (DFlash) f16 is often the cheaper one."""
        if self.w.drafter_kv:
            return self.w.drafter_kv
        options = {kv: self._drafter_cost(c, kv, cuda=bool(c.placement.gpus)) for kv in dict.fromkeys(("f16", c.kv))}
        return min(options, key=lambda kv: sum(options[kv]))

    def _drafter_cost(self, c: Config, kv: str, cuda: bool) -> tuple[int, int]:
        d, lay = self.d, self.drafter_layout(c.n_ctx)
        cache = lay.contexts * sum(self.kv(d, lay.cells, kv).values())
        compute = lay.contexts * self.compute(d, list(range(d.n_layer)), True, lay.cells, kv, cuda, lay.outputs)
        return cache, compute

    def _price_drafter(self, c: Config, row: DeviceUse, host: DeviceUse) -> None:
        d = self.d
        on_gpu = row is not host
        row.drafter_weights = sum(d.layer_bytes) + d.output_bytes + (d.tied_head_bytes if on_gpu else 0)
        host.drafter_weights += d.input_bytes
        row.drafter_kv, row.drafter_compute = self._drafter_cost(c, self.drafter_kv(c), cuda=on_gpu)
        lay = self.drafter_layout(c.n_ctx)
        if d.is_eagle3:  # the encoder outputs every row: logits and g buffers sized by its chunk
            host.overhead += lay.contexts * (d.n_vocab + d.n_embd) * EAGLE3_ENCODE_ROWS * 4
        else:
            host.overhead += d.output_vocab * lay.outputs * 4
        if d.selector_top_k:  # DFlash2: one lattice row per batch position
            host.overhead += d.n_embd * self.w.n_batch * 4
        if d.is_dspark:
            # the Markov head: the corrected logits, chained position by position, then copied back to block order
            # (two more logits-sized tensors a decode), and a confidence row of n_embd per output row
            row.drafter_compute += lay.contexts * 2 * d.output_vocab * lay.outputs * 4
            host.overhead += d.n_embd * lay.outputs * 4

    def fits(self, c: Config) -> bool:
        rows, host = self.price(c)
        return all(r.free >= 0 for r in rows) and host.free >= 0

    def headroom(self, c: Config) -> int:
        rows, host = self.price(c)
        return min([r.free for r in rows] + [host.free])
