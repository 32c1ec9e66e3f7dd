"""What the planner is asked (``Wishes``) and what it answers (``Plan``: one ``DeviceUse`` row per device, the ``Change``s it made)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from localflash.plan.costs import MiB


@dataclass
class Wishes:
    """What the user asked for; ``None`` means "choose for me"."""

    ctx: int | None = None  # None: DEFAULT_CTX (capped at the training context); 0: the largest that fits
    kv: str | None = None  # None: f16, then q8_0, then q4_0 as needed
    n_draft: int = 8  # longest draft verified in one batch
    n_rs_seq: int | None = None  # recurrent-state snapshots of a hybrid target; None: n_draft (rollback of a full draft)
    mtp: bool = False  # draft with the target's own MTP block (load_mtp, an MTP context); ignored without nextn layers
    n_seq: int = 1  # parallel slots: recurrent state per sequence, verify outputs for every slot's rows
    n_batch: int = 512
    n_ubatch: int = 512
    drafter_ctx_cap: int | None = 32768  # None: inherit the target's context, as llama.cpp does
    drafter_kv: str | None = None  # None: whichever of f16 and the target's type costs less
    split: str = "layer"  # "layer", or "tensor" (experimental; only when asked)
    margin: int = 512 * MiB  # left free on every GPU (desktop, fragmentation)
    overhead: int = 512 * MiB  # CUDA context, cuBLAS workspace, memory pool per GPU
    min_ctx: int = 4096


DEFAULT_CTX = 32768


@dataclass
class DeviceUse:
    """One row of the plan table: what lands on one GPU (or on the host)."""

    name: str
    index: int | None  # GPU index; None for the host
    budget: int  # what the plan may use (free memory minus the margin)
    layers: str = ""
    target_weights: int = 0
    target_kv: int = 0  # KV cache plus recurrent state
    target_compute: int = 0
    drafter_weights: int = 0
    drafter_kv: int = 0
    drafter_compute: int = 0
    overhead: int = 0  # runtime overhead (GPU) or output buffers (host)
    remote: str | None = None  # an rpc-server's HOST:PORT (``index``: its device there)

    @property
    def used(self) -> int:
        return (self.target_weights + self.target_kv + self.target_compute + self.drafter_weights
                + self.drafter_kv + self.drafter_compute + self.overhead)

    @property
    def free(self) -> int:
        return self.budget - self.used


@dataclass
class Change:
    """A setting the planner chose differently from the wish or llama.cpp's default, and why."""

    setting: str
    value: object
    reason: str


@dataclass
class Plan:
    target: str
    drafter: str | None
    devices: list[DeviceUse]
    host: DeviceUse
    n_ctx: int
    type_k: str
    type_v: str
    n_batch: int
    n_ubatch: int
    n_outputs_max: int
    n_rs_seq: int
    flash_attn: bool
    n_gpu_layers: int
    split_mode: str
    main_gpu: int
    tensor_split: list[float] | None
    tensor_overrides: list[tuple[str, str]]
    drafter_device: int | None  # GPU index, or None for the host
    drafter_type_kv: str
    drafter_n_ctx: int
    drafter_n_gpu_layers: int
    slowdown: float  # expected decode time / decode time with everything on the GPU
    context_options: dict[str, int]  # largest context that fits with this placement, per KV type
    changes: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mtp: bool = False  # the target's MTP block is loaded and its context priced (drafter column)
    # with remote devices: the devices the target is placed on, in llama.cpp's order (Gpu.key: "rpc:HOST:PORT#0",
    # "gpu:0"), ``tensor_split`` indexed by position here; None: llama.cpp's default device list
    device_keys: list[str] | None = None
    traffic: dict | None = None  # remote devices: expected network bytes and round trips per verify pass (plan/remote.py)
    # parallel slots (Wishes.n_seq > 1): the drafter's contexts as priced, {"contexts", "seqs", "positions"} (positions
    # per sequence): one context of N sequences (DFlash, draft model, MTP) or N contexts of one (EAGLE-3); None otherwise
    drafter_slots: dict | None = None

    def drafter_slots_line(self) -> str:
        """The drafter's share of parallel slots, as priced: its contexts and their KV and compute ("" without slots)."""
        lay = self.drafter_slots
        if not lay:
            return ""
        rows = [*self.devices, self.host]
        kv = sum(r.drafter_kv for r in rows) / 2**20
        compute = sum(r.drafter_compute for r in rows) / 2**20
        if lay["contexts"] == 1:
            shape = f"one context of {lay['seqs']} sequences x {lay['positions']} positions"
        else:
            shape = f"{lay['contexts']} contexts (one a slot) of {lay['positions']} positions"
        return f"drafter for {max(lay['seqs'], lay['contexts'])} slots: {shape}; KV {kv:.0f} MiB, compute {compute:.0f} MiB in all"

    @property
    def gpu_total(self) -> int:
        return sum(d.used for d in self.devices)

    def to_json(self) -> str:
        d = asdict(self)
        for row in [*d["devices"], d["host"]]:
            row["used"] = DeviceUse(**row).used
        return json.dumps(d, indent=2)
