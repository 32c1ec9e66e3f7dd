"""The training loop: random anchors, position-weighted CE, AdamW with warmup + cosine.

Deterministic and resumable: the batch order of epoch ``e`` comes from
``(seed, e)`` and the anchors of step ``s`` from ``(seed, s)``, so a run
restarted from its checkpoint (written every ``ckpt_every`` steps and at the
end) continues exactly where it stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from localflash.errors import LocalflashError
from localflash.formats.dflash_gguf import DFlashSpec
from localflash.train.anchors import IGNORE, build_blocks, sample_anchors
from localflash.train.data import FeatureStore, Record
from localflash.train.loss import default_gamma, dflash_loss, position_weights
from localflash.train.model import DFlashDraft

CKPT_NAME = "checkpoint.pt"


@dataclass
class TrainConfig:
    anchors: int = 64  # blocks per sequence per step (the paper: 512)
    batch: int = 4  # sequences per step
    epochs: float = 3.0
    steps: int = 0  # > 0 overrides epochs
    lr: float = 6e-4
    warmup: float = 0.04
    weight_decay: float = 0.0
    clip: float = 1.0
    gamma: float = 0.0  # 0: the paper's value for the block size
    seed: int = 0
    ckpt_every: int = 50
    precision: str = "auto"  # auto | bf16 | fp32
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0


@dataclass
class StepStats:
    step: int
    loss: float
    tau: float
    acc1: float
    lr: float
    tokens_per_s: float
    seconds: float


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise LocalflashError("--device cuda but PyTorch sees no CUDA device")
    return torch.device(name)


def pick_precision(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for float32."""
    if name == "fp32":
        return None
    if name == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    fast = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)() or getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
    return torch.bfloat16 if fast else None


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    warm = max(1, round(cfg.warmup * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


class Trainer:
    """Trains ``model`` on ``store``; ``t2d`` maps target ids to draft-vocabulary rows (-1: none)."""

    def __init__(self, model: DFlashDraft, store: FeatureStore, records: list[Record], cfg: TrainConfig, work_dir: Path, t2d: np.ndarray | None = None):
        self.cfg = cfg
        self.device = pick_device(cfg.device)
        self.amp = pick_precision(cfg.precision, self.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.model = model.to(self.device)
        self.store = store
        self.records = [r for r in records if r.n_response >= 2]
        if not self.records:
            raise LocalflashError("no training sequence has two response tokens", hint="generate longer responses (--max-new-tokens)")
        self.spec: DFlashSpec = model.spec
        self.t2d = torch.as_tensor(t2d, dtype=torch.long) if t2d is not None else None
        self.weights = position_weights(self.spec.block_size, cfg.gamma or default_gamma(self.spec.block_size)).to(self.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.steps_per_epoch = math.ceil(len(self.records) / cfg.batch)
        self.total = cfg.steps or max(1, math.ceil(cfg.epochs * self.steps_per_epoch))
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.state = TrainState()
        self._order: dict[int, list[list[int]]] = {}

    # -- checkpoints -------------------------------------------------------------------------
    @property
    def ckpt_path(self) -> Path:
        return self.work_dir / CKPT_NAME

    def _identity(self) -> dict:
        vocab = int(torch.nonzero(self.t2d >= 0).sum()) if self.t2d is not None else 0  # which target ids
        return {"spec": asdict(self.spec), "records": len(self.records), "total": self.total, "vocab": vocab,
                "cfg": {k: v for k, v in asdict(self.cfg).items() if k not in ("ckpt_every", "device", "threads", "precision")}}

    def save(self) -> None:
        tmp = self.ckpt_path.with_suffix(".tmp")
        torch.save({"identity": self._identity(), "model": self.model.state_dict(), "opt": self.opt.state_dict(),
                    "state": asdict(self.state)}, tmp)
        tmp.replace(self.ckpt_path)

    def resume(self) -> bool:
        """Continue from the checkpoint in ``work_dir`` if it belongs to this run; True if it did."""
        if not self.ckpt_path.exists():
            return False
        ck = torch.load(self.ckpt_path, map_location=self.device, weights_only=False)
        if ck.get("identity") != self._identity():
            raise LocalflashError(
                f"{self.ckpt_path} belongs to a run with other settings",
                hint="use --fresh to start over, or another --work-dir",
            )
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.state = TrainState(**ck["state"])
        return True

    # -- batches -----------------------------------------------------------------------------
    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Batches of record indices: shuffled, length-sorted within windows (less padding)."""
        if epoch not in self._order:
            rng = np.random.default_rng((self.cfg.seed, epoch, 1))
            idx = rng.permutation(len(self.records))
            window = self.cfg.batch * 32
            batches = []
            for w in range(0, len(idx), window):
                chunk = sorted(idx[w : w + window], key=lambda i: len(self.records[i].tokens))
                batches += [list(chunk[b : b + self.cfg.batch]) for b in range(0, len(chunk), self.cfg.batch)]
            order = rng.permutation(len(batches))
            self._order = {epoch: [batches[i] for i in order]}
        return self._order[epoch]

    def make_batch(self, idx: list[int], step: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng((self.cfg.seed, step, 2))
        recs = [self.records[i] for i in idx]
        b = self.spec.block_size
        parts = []
        for r in recs:
            anchors = sample_anchors(rng, len(r.tokens), r.n_prompt, self.cfg.anchors)
            blocks, labels = build_blocks(r.tokens, r.n_prompt, anchors, b, self.spec.mask_token_id)
            parts.append((r, anchors, blocks, labels))
        s_max = max(r.n_feat for r in recs)
        n_max = max(len(p[1]) for p in parts)
        feats = np.zeros((len(recs), s_max, self.store.width), np.float32)
        anchors = np.zeros((len(recs), n_max), np.int64)
        blocks = np.full((len(recs), n_max, b), self.spec.mask_token_id, np.int64)
        labels = np.full((len(recs), n_max, b), IGNORE, np.int64)
        for j, (r, a, bl, lb) in enumerate(parts):
            feats[j, : r.n_feat] = self.store.features(r)
            anchors[j, : len(a)] = a
            blocks[j, : len(a)] = bl
            labels[j, : len(a)] = lb
        labels_t = torch.from_numpy(labels)
        if self.t2d is not None:
            labels_t = torch.where(labels_t >= 0, self.t2d[labels_t.clamp_min(0)], labels_t)
        dev = self.device
        return {"feats": torch.from_numpy(feats).to(dev), "anchors": torch.from_numpy(anchors).to(dev),
                "blocks": torch.from_numpy(blocks).to(dev), "labels": labels_t.to(dev), "n_block_tokens": int(sum(len(p[1]) for p in parts) * b)}

    def loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Position-weighted CE over the blocks that have labels (padding blocks skip the LM head)."""
        live = labels[..., 1] != IGNORE  # [Bt, N]
        h, lab = hidden[live], labels[live]  # [M, B, D], [M, B]
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            logits = self.model.logits(h[:, 1:])
        return dflash_loss(logits, lab[:, 1:], self.weights[1:])

    # -- the loop ----------------------------------------------------------------------------
    def train_step(self, batch: dict, lr: float) -> tuple[float, dict]:
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.model.train()
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            hidden = self.model(batch["feats"], batch["blocks"], batch["anchors"])
        loss, stats = self.loss(hidden, batch["labels"])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.opt.step()
        return float(loss.detach()), stats

    def run(self, on_step: Callable[[StepStats, int], None] | None = None, should_stop: Callable[[], bool] | None = None) -> TrainState:
        st = self.state
        while st.step < self.total:
            epoch, k = divmod(st.step, self.steps_per_epoch)
            batches = self.epoch_batches(epoch)
            if k >= len(batches):  # an epoch shorter than steps_per_epoch (cannot happen, kept safe)
                st.step += 1
                continue
            t0 = time.perf_counter()
            batch = self.make_batch(batches[k], st.step)
            lr = lr_at(st.step, self.total, self.cfg)
            loss, stats = self.train_step(batch, lr)
            dt = time.perf_counter() - t0
            st.seconds += dt
            rec = StepStats(st.step, loss, stats["tau"], float(stats["slot_acc"][0]),
                            lr, batch["n_block_tokens"] / dt, st.seconds)
            st.history.append(asdict(rec))
            st.step += 1
            if on_step:
                on_step(rec, self.total)
            if st.step % self.cfg.ckpt_every == 0 or st.step == self.total:
                self.save()
            if should_stop and should_stop():
                self.save()
                break
        return st

    @torch.no_grad()
    def evaluate(self, records: list[Record], max_batches: int = 8) -> dict:
        """Mean loss and block τ estimate on ``records`` (every valid anchor, fixed seed)."""
        self.model.eval()
        losses, taus = [], []
        recs = [r for r in records if r.n_response >= 2]
        saved = self.records
        self.records = recs
        try:
            for j in range(0, min(len(recs), max_batches * self.cfg.batch), self.cfg.batch):
                batch = self.make_batch(list(range(j, min(j + self.cfg.batch, len(recs)))), 10**9 + j)
                with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
                    hidden = self.model(batch["feats"], batch["blocks"], batch["anchors"])
                loss, stats = self.loss(hidden, batch["labels"])
                losses.append(float(loss))
                taus.append(stats["tau"])
        finally:
            self.records = saved
        return {"loss": float(np.mean(losses)) if losses else float("nan"), "tau": float(np.mean(taus)) if taus else float("nan")}
