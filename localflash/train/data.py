"""Training data for a DFlash drafter, made by the target itself.

1. Prompts (JSON Lines or plain text) are rendered with the target's chat
   template, exactly as ``localflash run`` renders them.
2. The target answers each one greedily through the real speculative
   :class:`~localflash.speculative.loop.Engine` (n-gram drafting: lossless and
   cheaper than plain decoding). A recording drafter keeps the inputs of the
   tapped target layers for every committed position: the very rows
   :class:`~localflash.speculative.dflash.DFlashDrafter` injects at inference,
   from the same kind of decode batches. There is no second implementation
   of the target anywhere.
3. Tokens go to ``sequences-<shard>.jsonl`` and features (float16) to a flat
   ``features-<shard>.f16`` file, appended prompt by prompt, so an
   interrupted run resumes where it stopped. Several shards can be generated
   by parallel worker processes.

Every ``holdout_every``-th prompt is kept out of the data: it is the held-out
split on which training reports τ with the real engine.

A record's ``tokens`` are prompt + response (+ the end-of-generation token
when the target stopped by itself); its features cover positions
``0 .. len(tokens) - 2`` (the last token is never decoded, so it has none,
and no anchor needs it).
"""

from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localflash.errors import LocalflashError
from localflash.speculative.drafter import Drafter, NgramDrafter

PROMPT_FIELDS = ("prompt", "question", "instruction", "input", "text")
FEATURE_DTYPE = np.float16
FEATURE_LIMIT = 60000.0  # float16 holds up to 65504


# -- prompts -------------------------------------------------------------------
def load_prompts(paths: list[str | Path], limit: int | None = None) -> list[str]:
    """Prompt texts from JSONL (field prompt/question/instruction/input/text, or turns[0]) or text files."""
    out: list[str] = []
    for path in paths:
        p = Path(path).expanduser()
        if not p.is_file():
            raise LocalflashError(f"prompt file not found: {p}")
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as f:
            jsonl = ".jsonl" in p.name or ".json" in p.name
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                if not jsonl:
                    out.append(line)
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise LocalflashError(f"{p}:{n}: not valid JSON ({e.msg})") from e
                text = _prompt_of(row)
                if text is None:
                    raise LocalflashError(
                        f"{p}:{n}: no prompt field",
                        hint=f"each line needs one of {', '.join(PROMPT_FIELDS)} or turns",
                    )
                out.append(text)
    if not out:
        raise LocalflashError("no prompts found", hint="pass --prompts FILE.jsonl with one prompt per line")
    return out[:limit] if limit else out


def _prompt_of(row) -> str | None:
    if isinstance(row, str):
        return row
    if not isinstance(row, dict):
        return None
    for key in PROMPT_FIELDS:
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    turns = row.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    return None


def split_holdout(prompts: list[str], every: int) -> tuple[list[int], list[int]]:
    """Indices for training and for the held-out τ check (every ``every``-th prompt)."""
    if every <= 1:
        return list(range(len(prompts))), []
    held = [i for i in range(len(prompts)) if i % every == every - 1]
    held_set = set(held)
    return [i for i in range(len(prompts)) if i not in held_set], held


def chat_tokens(model, text: str, thinking: bool = False) -> list[int]:
    """The prompt as ``localflash run`` sends it: the chat template when there is one."""
    from localflash.prompt import render_chat, supports_thinking, tokenize_prompt

    if not model.chat_template():
        return model.tokenize(text, add_special=True, parse_special=False)
    rendered = render_chat(model, [{"role": "user", "content": text}], thinking=thinking if supports_thinking(model) else None)
    return tokenize_prompt(model, rendered)


# -- the recording drafter ----------------------------------------------------------
class FeatureRecorder(Drafter):
    """Wraps a drafter and keeps, per committed position, the tapped layers' inputs.

    It sees exactly what DFlashDrafter sees: ``on_target_decode`` after every
    target decode (prefill chunks and verify passes), rows ``[0, n_committed)``.
    """

    def __init__(self, inner: Drafter, layer_ids: list[int], n_ctx: int, n_embd: int):
        self.inner = inner
        self.name = inner.name
        self.max_draft = inner.max_draft
        self.cost_grows_with_length = inner.cost_grows_with_length
        self.layer_ids = list(layer_ids)
        self.n_embd = n_embd
        self.buf = np.zeros((n_ctx, len(layer_ids) * n_embd), np.float32)
        self.n = 0  # positions 0..n-1 hold features

    def rollback(self, n_keep: int) -> None:
        self.n = min(self.n, n_keep)
        self.inner.rollback(n_keep)

    def on_target_decode(self, target_ctx, start_pos: int, n_committed: int) -> None:
        if start_pos != self.n:
            raise LocalflashError(f"features out of step: decode at {start_pos}, recorded up to {self.n}")
        rows, d = target_ctx.n_last, self.n_embd
        for k, lid in enumerate(self.layer_ids):
            self.buf[start_pos : start_pos + n_committed, k * d : (k + 1) * d] = target_ctx.layer_input(lid, rows)[:n_committed]
        self.n = start_pos + n_committed
        self.inner.on_target_decode(target_ctx, start_pos, n_committed)

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        return self.inner.propose(history, n_past, k)


# -- generation ---------------------------------------------------------------------
@dataclass
class GenConfig:
    target: str
    layer_ids: list[int]  # llama.cpp layer-input ids (HF id + 1)
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024
    thinking: bool = False
    n_threads: int = 0
    n_ctx: int = 0  # 0: max_prompt_tokens + max_new_tokens + 64

    @property
    def ctx(self) -> int:
        return self.n_ctx or self.max_prompt_tokens + self.max_new_tokens + 64


def _meta_key(cfg: GenConfig) -> dict:
    p = Path(cfg.target)
    return {
        "target": p.name,
        "target_bytes": p.stat().st_size,
        "layer_ids": list(cfg.layer_ids),
        "max_new_tokens": cfg.max_new_tokens,
        "max_prompt_tokens": cfg.max_prompt_tokens,
        "thinking": cfg.thinking,
    }


def build_dataset(
    cfg: GenConfig,
    prompts: list[str],
    indices: list[int],
    out_dir: str | Path,
    workers: int = 1,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> "FeatureStore":
    """Generate (or finish generating) responses and features for ``prompts[indices]``.

    ``on_progress(done, total, tokens)`` is called as records land on disk.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    key = _meta_key(cfg)
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old.get("key") != key:
            raise LocalflashError(
                f"{out} holds data made with other settings ({_diff(old.get('key', {}), key)})",
                hint="use another --work-dir, or delete that one",
            )
        if old.get("workers") != workers:
            workers = old["workers"]  # shards are fixed once started
    meta_path.write_text(json.dumps({"key": key, "workers": workers}, indent=1))
    todo = {w: [i for i in indices if i % workers == w] for w in range(workers)}
    total = len(indices)

    wanted = set(indices)

    def poll() -> tuple[int, int]:
        done = toks = 0
        for w in range(workers):
            done += sum(r["i"] in wanted for r in _read_records(out / f"skipped-{w}.jsonl"))
            for rec in _read_records(out / f"sequences-{w}.jsonl"):
                if rec["i"] in wanted:
                    done += 1
                    toks += len(rec["tokens"]) - rec["n_prompt"]
        return done, toks

    if workers == 1:
        def cb(done: int, toks: int) -> None:
            if on_progress:
                on_progress(done, total, toks)

        _generate_shard(cfg, {i: prompts[i] for i in todo[0]}, out, 0, cb)
    else:
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_generate_shard, args=(cfg, {i: prompts[i] for i in todo[w]}, out, w, None), daemon=True)
            for w in range(workers)
        ]
        for p in procs:
            p.start()
        try:
            while any(p.is_alive() for p in procs):
                if on_progress:
                    done, toks = poll()
                    on_progress(done, total, toks)
                time.sleep(2.0)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
        bad = [p.exitcode for p in procs if p.exitcode]
        if bad:
            raise LocalflashError(f"a data worker failed (exit code {bad[0]})", hint="run again with --workers 1 to see why")
    if on_progress:
        done, toks = poll()
        on_progress(done, total, toks)
    return FeatureStore(out)


def _diff(a: dict, b: dict) -> str:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys) or "unknown"


def _read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    recs = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                recs.append(json.loads(line))
    return recs


def _generate_shard(cfg: GenConfig, prompts: dict[int, str], out: Path, shard: int, on_record) -> None:
    """One worker: answer ``prompts`` with the target, append tokens and features."""
    from localflash.llama import Context, ContextOptions, Model
    from localflash.speculative.loop import Engine
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.stats import Stats

    seq_path = out / f"sequences-{shard}.jsonl"
    feat_path = out / f"features-{shard}.f16"
    records = _read_records(seq_path)
    # drop a half-written tail: the text file and the feature file must agree
    with seq_path.open("a+", encoding="utf-8") as f:
        f.seek(0)
        good = sum(len(line.encode("utf-8")) for line in f if line.endswith("\n"))
    with seq_path.open("r+b") as f:
        f.truncate(good)
    model = Model(cfg.target)
    width = len(cfg.layer_ids) * model.n_embd
    (out / "width").write_text(str(width))
    rows = sum(r["n_feat"] for r in records)
    feat_path.touch()
    with feat_path.open("r+b") as f:
        f.truncate(rows * width * np.dtype(FEATURE_DTYPE).itemsize)
    done = {r["i"] for r in records}
    skipped = {r["i"] for r in _read_records(out / f"skipped-{shard}.jsonl")}
    # progress counts only this call's prompts (the files may hold others)
    n_done = sum(i in prompts for i in done | skipped)
    n_tok = sum(len(r["tokens"]) - r["n_prompt"] for r in records if r["i"] in prompts)
    ctx = Context(model, ContextOptions(n_ctx=cfg.ctx, n_outputs_max=9, n_threads=cfg.n_threads))
    ctx.capture_layer_inputs(cfg.layer_ids)
    recorder = FeatureRecorder(NgramDrafter(8), cfg.layer_ids, cfg.ctx, model.n_embd)
    engine = Engine(model, ctx, recorder, adaptive=True)
    greedy = SamplingParams(temperature=0.0)
    try:
        with seq_path.open("a", encoding="utf-8") as fs, feat_path.open("ab") as ff, (out / f"skipped-{shard}.jsonl").open("a") as fk:
            for i, text in prompts.items():
                if i in done or i in skipped:
                    continue
                tokens = chat_tokens(model, text, cfg.thinking)
                if len(tokens) > cfg.max_prompt_tokens:
                    fk.write(json.dumps({"i": i, "why": f"prompt of {len(tokens)} tokens"}) + "\n")
                    fk.flush()
                    skipped.add(i)
                    n_done += 1
                    continue
                stats = Stats()
                response: list[int] = []
                for new in engine.generate(tokens, cfg.max_new_tokens, greedy, stats):
                    response += new
                seq = tokens + response + ([model.eos] if stats.stop == "eog" and model.eos >= 0 else [])
                n_feat = len(seq) - 1
                if recorder.n < n_feat:
                    raise LocalflashError(f"prompt {i}: recorded {recorder.n} feature rows, need {n_feat}")
                feats = recorder.buf[:n_feat]
                peak = float(np.abs(feats).max()) if n_feat else 0.0
                if not np.isfinite(peak) or peak > FEATURE_LIMIT:
                    fk.write(json.dumps({"i": i, "why": f"feature magnitude {peak:g} does not fit float16"}) + "\n")
                    fk.flush()
                    skipped.add(i)
                    n_done += 1
                    continue
                ff.write(feats.astype(FEATURE_DTYPE).tobytes())
                ff.flush()
                fs.write(json.dumps({"i": i, "n_prompt": len(tokens), "n_feat": n_feat, "stop": stats.stop, "tokens": seq}) + "\n")
                fs.flush()
                n_tok += len(response)
                done.add(i)
                n_done += 1
                if on_record:
                    on_record(n_done, n_tok)
    finally:
        engine.close()
        model.close()


# -- reading it back ----------------------------------------------------------------
@dataclass
class Record:
    i: int  # prompt index
    tokens: np.ndarray  # int64 [n]
    n_prompt: int
    shard: int
    offset: int  # first feature row in the shard file
    n_feat: int

    @property
    def n_response(self) -> int:
        return len(self.tokens) - self.n_prompt


class FeatureStore:
    """The generated sequences and a memory map of their features."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        meta_path = self.dir / "meta.json"
        if not meta_path.exists():
            raise LocalflashError(f"{self.dir} holds no generated data (meta.json missing)")
        meta = json.loads(meta_path.read_text())
        self.key = meta["key"]
        self.layer_ids: list[int] = self.key["layer_ids"]
        self.records: list[Record] = []
        self._maps: dict[int, np.ndarray] = {}
        wfile = self.dir / "width"
        width = int(wfile.read_text()) if wfile.exists() else None
        item = np.dtype(FEATURE_DTYPE).itemsize
        for w in range(meta["workers"]):
            recs = _read_records(self.dir / f"sequences-{w}.jsonl")
            path = self.dir / f"features-{w}.f16"
            rows = sum(r["n_feat"] for r in recs)
            if not recs:
                continue
            size = path.stat().st_size if path.exists() else 0
            if width is None:
                width = size // rows // item
            # a run stopped mid-record leaves feature rows past the last complete line: ignored
            if rows * width * item > size:
                raise LocalflashError(f"{path} does not match {path.with_name(f'sequences-{w}.jsonl').name}")
            self._maps[w] = np.memmap(path, dtype=FEATURE_DTYPE, mode="r", shape=(rows, width))
            off = 0
            for r in recs:
                self.records.append(Record(r["i"], np.asarray(r["tokens"], np.int64), r["n_prompt"], w, off, r["n_feat"]))
                off += r["n_feat"]
        self.width = width or 0
        self.records.sort(key=lambda r: r.i)

    def __len__(self) -> int:
        return len(self.records)

    def features(self, rec: Record) -> np.ndarray:
        """``[n_feat, K * n_embd]`` float16 rows of one record (a memory-map view)."""
        return self._maps[rec.shard][rec.offset : rec.offset + rec.n_feat]

    def response_tokens(self) -> int:
        return sum(r.n_response for r in self.records)

    def token_counts(self, n_vocab: int) -> np.ndarray:
        """How often each token id appears among response tokens (the draft-vocabulary choice)."""
        counts = np.zeros(n_vocab, np.int64)
        for r in self.records:
            np.add.at(counts, r.tokens[r.n_prompt :], 1)
        return counts

    def summary(self) -> dict:
        return {"sequences": len(self), "response_tokens": self.response_tokens(), "width": self.width, **self.key}


def worker_count(requested: int) -> int:
    return max(1, min(requested, os.cpu_count() or 1))
