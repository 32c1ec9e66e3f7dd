"""``localflash train-drafter``: data, training, export and a τ check, in one resumable run.

1. the target answers the prompts (chat template, thinking on/off) through the
   real engine; the inputs of the tapped layers are kept (``data``);
2. a draft vocabulary (optional) and a mask token are chosen from that data;
3. the drafter trains (``trainer``), checkpointing as it goes;
4. it is exported to a quantized ``dflash`` GGUF (and an HF checkpoint on request);
5. τ is measured with the real engine on the held-out prompts, next to n-gram drafting.

Everything lands in ``--work-dir`` (default: the user cache), so running the
same command again resumes the step that was interrupted.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from localflash.formats.dflash_hf import build_target_layer_ids
from localflash.errors import LocalflashError
from localflash.registry.pairs import cache_dir
from localflash.formats.dflash_gguf import QUANTS, DFlashSpec, read_target
from localflash.train.data import GenConfig, build_dataset, load_prompts, split_holdout
from localflash.train.trainer import TrainConfig

CONTROL_TYPES = (3, 4)  # llama.cpp token types: CONTROL, USER_DEFINED


@dataclass
class PipelineConfig:
    target: Path
    prompts: list[Path]
    out: Path
    work_dir: Path | None = None
    thinking: bool = False
    max_prompts: int = 0
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024
    holdout_every: int = 40
    workers: int = 1
    threads: int = 0  # llama.cpp threads (generation and the τ check)
    layers: int = 5
    taps: int = 5
    block_size: int = 16
    draft_vocab: int = 0  # 0: the target's whole vocabulary (borrow its head)
    sliding_window: int = 0  # > 0: sliding layers (bidirectional in the block, as llama.cpp runs it)
    full_layers: int = 0  # with a sliding window: the last N layers attend the whole context (z-lab's layout)
    embedding_scale: float = 0.0  # > 0: scale the block embeddings (dflash.embedding_scale); small values learn faster
    train_head: bool = False  # with a reduced vocabulary: train the drafter's own head (initialised from the target's rows)
    mask_token: int = -1  # -1: the target's mask token, else an unused control token
    train: TrainConfig = field(default_factory=TrainConfig)
    quant: str = "Q8_0"
    hf_out: Path | None = None
    eval_tokens: int = 128
    eval_prompts: int = 0  # 0: every held-out prompt
    fresh: bool = False

    @property
    def dir(self) -> Path:
        return Path(self.work_dir) if self.work_dir else cache_dir() / "train" / self.out.stem


def target_shape(path: Path) -> dict:
    """Head counts, sizes and rope theta of the target (the drafter copies them)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def val(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return (max(v) if v else default) if isinstance(v, list) else v

    a = val("general.architecture")
    n_embd = int(val(f"{a}.embedding_length"))
    n_head = int(val(f"{a}.attention.head_count"))
    types = r.fields.get("tokenizer.ggml.token_type")
    specials = {int(val(f"tokenizer.ggml.{k}_token_id", -1)) for k in ("bos", "eos", "eot", "padding", "unknown", "eom")}
    return {
        "arch": a,
        "n_embd": n_embd,
        "n_layer": int(val(f"{a}.block_count")),
        "n_head": n_head,
        "n_head_kv": int(val(f"{a}.attention.head_count_kv", n_head)),
        "head_dim": int(val(f"{a}.attention.key_length", n_embd // n_head)),
        "n_ff": int(val(f"{a}.feed_forward_length")),
        "rope_theta": float(f"{float(val(f'{a}.rope.freq_base', 1e6)):.7g}"),
        "mask": int(val("tokenizer.ggml.mask_token_id", -1)),
        "token_types": np.asarray(types.contents(), np.int64) if types is not None else None,
        "specials": specials,
    }


def choose_mask_token(shape: dict, seen: np.ndarray) -> int:
    """The target's mask token, else the last control token that no training sequence uses."""
    if shape["mask"] >= 0:
        return shape["mask"]
    types = shape["token_types"]
    if types is not None:
        cand = [i for i in np.flatnonzero(np.isin(types, CONTROL_TYPES)) if seen[i] == 0 and i not in shape["specials"]]
        if cand:
            return int(cand[-1])
    unused = np.flatnonzero(seen == 0)
    if not len(unused):
        raise LocalflashError("every token id occurs in the data; name a mask token with --mask-token")
    return int(unused[-1])


def choose_draft_vocab(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent response tokens (ties by id), sorted by id: the ``d2t`` map."""
    order = np.lexsort((np.arange(len(counts)), -counts))
    return np.sort(order[:size]).astype(np.int64)


def run(cfg: PipelineConfig, console=None) -> dict:
    """The whole pipeline; returns the report it also writes to ``work_dir/report.json``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from localflash.train import require_torch

    torch = require_torch()
    from localflash.train.evaluate import measure_tau
    from localflash.train.export import export_gguf, export_hf
    from localflash.train.model import DFlashDraft, target_matrices
    from localflash.train.trainer import CKPT_NAME, Trainer

    con = console or Console(stderr=True)
    if cfg.quant.upper() not in QUANTS:
        raise LocalflashError(f"unknown --quant {cfg.quant!r}", hint=f"use one of {', '.join(QUANTS)}")
    if cfg.sliding_window and cfg.sliding_window < 2:
        raise LocalflashError(f"--sliding-window must be 0 (off) or at least 2, got {cfg.sliding_window}")
    if not 0 <= cfg.full_layers <= cfg.layers or (cfg.full_layers and not cfg.sliding_window):
        raise LocalflashError(f"--full-layers must be in 0..{cfg.layers} and needs --sliding-window, got {cfg.full_layers}",
                              hint="without --sliding-window every layer already attends the whole context")
    if cfg.train_head and not 0 < cfg.draft_vocab < 10**9:
        raise LocalflashError("--train-head needs --draft-vocab: the full-vocabulary head is the target's own, shared")
    if cfg.block_size < 2:
        raise LocalflashError(f"--block-size must be at least 2, got {cfg.block_size}")
    tinfo = read_target(cfg.target)
    from localflash.archs import LAYER_INPUT_ARCHS

    if tinfo.arch not in LAYER_INPUT_ARCHS:
        raise LocalflashError(f"target arch {tinfo.arch!r} cannot export layer inputs, which DFlash needs")
    shape = target_shape(cfg.target)
    if not 1 <= cfg.taps <= max(1, shape["n_layer"] - 3):
        raise LocalflashError(f"--taps must be in 1..{max(1, shape['n_layer'] - 3)} for a {shape['n_layer']}-layer target")
    hf_ids = build_target_layer_ids(shape["n_layer"], cfg.taps)
    layer_ids = [i + 1 for i in hf_ids]
    work = cfg.dir
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    def bar(*extra):
        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), *extra,
                        TimeElapsedColumn(), TimeRemainingColumn(), console=con, transient=False)

    # 1. data
    prompts = load_prompts(cfg.prompts, cfg.max_prompts or None)
    train_idx, held_idx = split_holdout(prompts, cfg.holdout_every)
    con.print(f"[bold]1/5 data[/]: {len(train_idx)} prompts for training, {len(held_idx)} held out; "
              f"taps {hf_ids} (layer inputs {layer_ids}) of {cfg.target.name}")
    gen = GenConfig(str(cfg.target), layer_ids, cfg.max_new_tokens, cfg.max_prompt_tokens, cfg.thinking, cfg.threads)
    with bar(TextColumn("{task.fields[toks]} tokens")) as prog:
        task = prog.add_task("responses", total=len(train_idx), toks=0)
        store = build_dataset(gen, prompts, train_idx, work / "data", cfg.workers,
                              on_progress=lambda d, t, k: prog.update(task, completed=d, toks=k))
    wanted = set(train_idx)
    records = [r for r in store.records if r.i in wanted]  # the work dir may hold data for other prompts
    if not records:
        raise LocalflashError("no usable training sequences were generated", hint="check the prompts and --max-prompt-tokens")

    # 2. vocabulary and mask token
    counts = np.zeros(tinfo.n_vocab, np.int64)
    for r in records:
        np.add.at(counts, r.tokens[r.n_prompt :], 1)
    seen = np.zeros(tinfo.n_vocab, np.int64)
    for r in records:
        np.add.at(seen, r.tokens, 1)
    mask = cfg.mask_token if cfg.mask_token >= 0 else choose_mask_token(shape, seen)
    if not 0 <= mask < tinfo.n_vocab:
        raise LocalflashError(f"--mask-token {mask} is outside the vocabulary of {tinfo.n_vocab}")
    d2t = choose_draft_vocab(counts, cfg.draft_vocab) if 0 < cfg.draft_vocab < tinfo.n_vocab else None
    spec = DFlashSpec(
        n_embd=shape["n_embd"], n_layer=cfg.layers, n_head=shape["n_head"], n_head_kv=shape["n_head_kv"],
        n_ff=shape["n_ff"], target_layers=layer_ids, block_size=cfg.block_size, mask_token_id=mask,
        rope_theta=shape["rope_theta"], seed=cfg.train.seed, n_ctx_train=cfg.max_prompt_tokens + cfg.max_new_tokens,
        key_length=shape["head_dim"] if shape["head_dim"] != shape["n_embd"] // shape["n_head"] else None,
        swa_window=cfg.sliding_window,
        swa_layers=[i < cfg.layers - cfg.full_layers for i in range(cfg.layers)] if cfg.sliding_window else None,
        causal=False if cfg.sliding_window else None,  # written out: vLLM/SGLang would default SWA layers to causal
        embedding_scale=cfg.embedding_scale,
    )
    coverage = float(counts[d2t].sum() / max(1, counts.sum())) if d2t is not None else 1.0
    con.print(f"[bold]2/5 vocabulary[/]: mask token {mask} ({_tok(cfg.target, mask)!r}); draft vocabulary "
              + (f"{len(d2t)} tokens covering {100 * coverage:.1f}% of response tokens" if d2t is not None else f"the target's {tinfo.n_vocab}"))

    # 3. training
    embed, head = target_matrices(cfg.target)
    t2d = None
    head_rows = head
    if d2t is not None:
        head_rows = head[d2t]
        t2d = np.full(tinfo.n_vocab, -1, np.int64)
        t2d[d2t] = np.arange(len(d2t))
    torch.manual_seed(cfg.train.seed)
    model = DFlashDraft(spec, torch.from_numpy(embed), torch.from_numpy(np.ascontiguousarray(head_rows)),
                        torch.from_numpy(d2t) if d2t is not None else None, llama_semantics=True,
                        train_head=cfg.train_head and d2t is not None)
    model.reset_parameters(seed=cfg.train.seed)
    # unit-RMS feature channels (folded into fc on export); position 0 (the attention sink) left out
    sample = records[:: max(1, len(records) // 64)]
    model.set_feature_scale(np.concatenate([store.features(r)[1:] for r in sample]))
    with torch.no_grad():  # random hidden states times the head's rows: start with logits of unit scale
        model.norm.weight.fill_(float(1.0 / np.sqrt(np.mean(np.sum(head_rows.astype(np.float64) ** 2, axis=1)))))
    if cfg.fresh:
        (work / CKPT_NAME).unlink(missing_ok=True)
    trainer = Trainer(model, store, records, cfg.train, work, t2d)
    resumed = trainer.resume()
    n_params = sum(p.numel() for p in model.parameters())
    window = f" (sliding window {cfg.sliding_window}{f', the last {cfg.full_layers} full' if cfg.full_layers else ''})" if cfg.sliding_window else ""
    con.print(f"[bold]3/5 training[/]: {cfg.layers} layers{window}, "
              f"{n_params / 1e6:.1f}M trainable parameters, "
              f"{len(trainer.records)} sequences ({sum(r.n_response for r in records)} response tokens), {trainer.total} steps of "
              f"{cfg.train.batch} x {cfg.train.anchors} blocks on {trainer.device.type}"
              + (f" ({trainer.amp})" if trainer.amp else "") + (f"; resumed at step {trainer.state.step}" if resumed else ""))
    with bar(TextColumn("loss {task.fields[loss]:.3f}  τ~{task.fields[tau]:.2f}  acc1 {task.fields[acc]:.2f}  "
                        "{task.fields[tps]:.0f} tok/s")) as prog:
        task = prog.add_task("steps", total=trainer.total, completed=trainer.state.step, loss=float("nan"), tau=0.0, acc=0.0, tps=0.0)
        ema: dict[str, float] = {}

        def on_step(s, total):
            for k, v in (("loss", s.loss), ("tau", s.tau), ("acc", s.acc1)):
                ema[k] = v if k not in ema else 0.9 * ema[k] + 0.1 * v
            prog.update(task, completed=s.step + 1, tps=s.tokens_per_s, **ema)

        state = trainer.run(on_step)
    hist = state.history
    first = float(np.mean([h["loss"] for h in hist[:10]])) if hist else float("nan")
    last = float(np.mean([h["loss"] for h in hist[-10:]])) if hist else float("nan")
    con.print(f"    loss {first:.3f} -> {last:.3f}, block τ estimate {np.mean([h['tau'] for h in hist[-20:]]):.2f}, "
              f"{state.seconds / 60:.1f} min of training")

    # 4. export
    model.eval()
    with con.status("4/5 export: writing GGUF") as status:
        out = export_gguf(model, cfg.out, cfg.target, cfg.quant, n_target_layers=shape["n_layer"],
                          name=f"dflash-{cfg.target.stem}", on_stage=lambda m: status.update(f"4/5 export: {m}"))
        if cfg.hf_out:
            export_hf(model, cfg.hf_out, n_target_layers=shape["n_layer"])
    con.print(f"[bold]4/5 export[/]: {out} ({out.stat().st_size / 1e6:.1f} MB, {cfg.quant})"
              + (f"; HF checkpoint in {cfg.hf_out}" if cfg.hf_out else ""))

    # 5. τ on the held-out prompts, with the real engine
    report = {"drafter": str(out), "target": str(cfg.target), "spec": asdict(spec), "quant": cfg.quant,
              "train": asdict(cfg.train), "sequences": len(records), "response_tokens": sum(r.n_response for r in records),
              "loss_first": first, "loss_last": last, "train_minutes": state.seconds / 60, "held_out": {}}
    held = [prompts[i] for i in held_idx][: cfg.eval_prompts or None]
    if held:
        rows = []
        with bar() as prog:
            for kind, drafter, label in ((("dflash", out, f"dflash (block {cfg.block_size})")), ("ngram", None, "n-gram")):
                task = prog.add_task(f"τ {label}", total=len(held))
                rep = measure_tau(cfg.target, held, drafter, kind, cfg.eval_tokens, adaptive=False, threads=cfg.threads,
                                  thinking=cfg.thinking, label=label, on_prompt=lambda d, t, task=task: prog.update(task, completed=d))
                rows.append(rep)
                report["held_out"][kind] = {"tau": rep.tau, "acceptance": rep.stats.acceptance, "prompts": len(rep.per_prompt),
                                            "position_acceptance": rep.stats.position_acceptance[:8]}
        con.print("[bold]5/5 held-out τ[/] (greedy, " + f"{len(held)} prompts, {cfg.eval_tokens} tokens each): "
                  + ", ".join(f"{r.label} {r.tau:.2f}" for r in rows))
    report["minutes"] = (time.perf_counter() - t_start) / 60
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


def _tok(target: Path, tid: int) -> str:
    from gguf import GGUFReader

    f = GGUFReader(str(target)).fields.get("tokenizer.ggml.tokens")
    return str(f.contents(tid)) if f is not None else str(tid)
