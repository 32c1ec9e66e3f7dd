#!/usr/bin/env python3
"""localflash's loop side by side with llama.cpp's own (``llama-speculative-simple``), equal work, kept as a guard.

Both sides get the same files, prompt, context size, token budget, one thread
(``-t 1``, drafter too; ``OMP_WAIT_POLICY=PASSIVE``), greedy, CPU only
(``-ngl 0``), and a fixed draft length k (4 / 8 / 15). Rows:

- **draft**: the target file is its own drafter: localflash ``run --spec draft
  --fixed --draft-max k`` against ``--spec-type draft-simple --spec-draft-n-max k
  --spec-draft-n-min 0 --spec-draft-p-min 0`` (p-min 0: no draft stops early).
  Greedy drafts from the target itself are accepted, so every cycle on both
  sides verifies k+1 rows after k drafted tokens. The peer's drafter does a
  little more by design: each cycle it also decodes the verified batch into
  the draft model (``common_speculative_process``: k+1 rows, one output row)
  before k one-token decodes, where ours decodes only the tokens its cache
  lacks (k decodes, k output rows in all).
- **dflash**: a random-weight DFlash drafter of the target's width written for
  block k+1 (``dflash.block_size``), so both sides decode ``[last, MASK x k]``
  once per cycle and verify k+1 rows: localflash ``--spec dflash --fixed
  --draft-max k`` against ``--spec-type draft-dflash --spec-draft-n-max k``.
  The peer injects the features of every verified row into the drafter, ours
  those of the committed rows. Random drafts are rejected; equal work then
  means the same acceptance on both sides, which the table shows (accepted /
  drafted per side) and the ``equal work`` column checks (rates within
  ``--acceptance-tol``; a row that fails it says so and is left out of the guard).

Targets are cheap random-weight ``llama`` models (``--layers`` blocks of width
``--width``, Q4_0, head Q6_K), so the loop's cost shows beside the forward
passes: one carries the Qwen2 tokenizer (151,936 tokens, the sdist's
``models/ggml-vocab-qwen2.gguf``), one the 248,320-token vocabulary of the
Qwen3.6 models (a placeholder SentencePiece vocabulary of that size,
``localflash/testing/shaped.py``). DFlash drafters: one block, Q8_0, tapping
every target layer. Files are written once under ``--work``. Token budgets
differ by row so both rows run enough cycles: ``--tokens-draft`` 128 (all
drafts accepted: 8 cycles at k = 15, 26 at k = 4), ``--tokens-dflash`` 32
(about one cycle per token).

**What is timed.** The peer prints ``decoded N tokens in T seconds``: T runs
from after its prompt pass (which leaves the last prompt token to the first
cycle) to the end of its loop, N counts every token it generated (a few past
``-n``: its last cycles are not cut to the budget, and it ends with a
zero-draft cycle). localflash's ``--json`` statistics give ``t_decode``, from
after its prompt pass (which yields the first token) to the end, and
``generated``; ours is counted over the same span: (generated - 1) / t_decode,
the tokens its decode cycles made over their time. Model loading, process
start and prompt processing are outside both spans. Both are rates of the same
steady loop; the ends differ by a cycle (the counts are in the table).

Runs interleave (ours, peer, ours, peer, ...) ``--runs`` times per setting;
each side's figure is its best run (a shared machine only slows a run down),
the ratio is best ours / best peer. Same tokens: the peer prints the prompt
and its text to stdout, ours prints the text; the shorter must be a prefix of
the longer. Where it is not, the texts part at a near tie of the random model:
the two loops form different batches (the peer decodes the last prompt token
in its first verify, ours in the prompt pass), and llama.cpp's logits depend a
little on the batch. Exit status 1 if an equal-work row falls below ``--guard``.

    .venv/bin/python benchmarks/speed/loop_vs_peer.py --json out/loop_vs_peer.json
    .venv/bin/python benchmarks/speed/loop_vs_peer.py --ks 4 --runs 1 --tokens-draft 24 --tokens-dflash 12 --guard 0  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench_suite import peer_command, run_peer  # noqa: E402  (benchmarks/speed/, the script's own folder)
from localflash.bench import rig as bl  # noqa: E402

ROOT = bl.ROOT
VOCABS = {"qwen2": 151936, "qwen3.6": 248320}
ROWS = ("draft", "dflash")
PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle, "
          "and explain what the message says.")
PROMPT_END = PROMPT.split()[-1]  # the peer echoes the prompt as its pieces ("▁" for spaces); its text follows this word
SDIST_VOCAB = "src/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"  # under PEER_DIR


def write_models(work: Path, vocab: str, ks: list[int], width: int, layers: int, qwen2_vocab: Path) -> tuple[Path, dict[int, Path]]:
    """The target for ``vocab`` and a DFlash drafter of block k+1 for every k (kept if already written)."""
    from localflash.testing.shaped import ModelSpec, PRESETS, write_random

    work.mkdir(parents=True, exist_ok=True)
    pool = np.random.default_rng(1).integers(0, 256, size=16 << 20, dtype=np.uint8)
    n_vocab = VOCABS[vocab]
    head_dim = 64
    spec = ModelSpec("llama", f"llama-{vocab}-{width}x{layers}", n_layer=layers, n_embd=width, n_ff=2 * width,
                     n_head=width // head_dim, n_head_kv=width // head_dim, head_dim=head_dim, n_vocab=n_vocab,
                     n_ctx_train=4096)
    tokenizer = qwen2_vocab if vocab == "qwen2" else None
    target = work / f"{spec.name}-Q4_0.gguf"
    if not target.exists():
        write_random(target, spec, "Q4_0", pool, tokenizer_from=tokenizer)
    drafters = {}
    for k in ks:
        dspec = replace(PRESETS["qwen3.6-27b-dflash"], name=f"dflash-{vocab}-{width}-b{k + 1}", n_layer=1, n_embd=width,
                        n_ff=2 * width, n_head=spec.n_head, n_head_kv=spec.n_head_kv, head_dim=head_dim, n_vocab=n_vocab,
                        target_layers=tuple(range(layers)), block_size=k + 1, swa_window=0, swa_layers=())
        drafters[k] = work / f"{dspec.name}-Q8_0.gguf"
        if not drafters[k].exists():
            write_random(drafters[k], dspec, "Q8_0", pool, mask_token=n_vocab - 1, tokenizer_from=tokenizer)
    return target, drafters


def ours_command(target: Path, drafter: Path, kind: str, k: int, prompt: str, n: int, ctx: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "localflash.cli", "run", "-m", str(target), "--drafter", str(drafter), "--spec", kind,
            "--draft-max", str(k), "--fixed", "-c", str(ctx), "-t", str(threads), "-ngl", "0", "-n", str(n),
            "--temp", "0", "--raw", "--json", prompt]


def run_ours(cmd: list[str]) -> dict:
    """One ``localflash run``; its --json statistics (last stderr line), tok/s over the peer's span, its text."""
    res = subprocess.run(cmd, capture_output=True)  # bytes: text mode would turn the model's "\r\n" into "\n"
    stdout, stderr = (x.decode("utf-8", errors="replace") for x in (res.stdout, res.stderr))
    if res.returncode != 0:
        raise RuntimeError(f"localflash failed ({res.returncode}): {' '.join(cmd)}\n{stderr[-2000:]}")
    st = json.loads(stderr.strip().splitlines()[-1])
    made = st["generated"] - 1  # the first token comes out of the prompt pass, before t_decode starts
    return {"tok_s": made / st["t_decode"] if st["t_decode"] > 0 else 0.0, "generated": st["generated"],
            "prompt_tokens": st["prompt_tokens"], "t_decode": st["t_decode"], "cycles": st["cycles"], "drafted": st["drafted"], "accepted": st["accepted"],
            "stop": st["stop"], "text": stdout[:-1] if stdout.endswith("\n") else stdout}


def same_tokens(a: str | None, b: str | None) -> tuple[bool | None, int]:
    """Whether the shorter text is a prefix of the longer (None: the peer's text was not found), and the common prefix length."""
    if a is None or b is None:
        return None, 0
    a, b = a.rstrip("\ufffd"), b.rstrip("\ufffd")  # a cut multi-byte character at either end
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n == min(len(a), len(b)), n


def acceptance(r: dict) -> float:
    return r["accepted"] / r["drafted"] if r["drafted"] else 0.0


def measure(a, target: Path, drafter: Path, row: str, k: int, prompt_file: Path, log) -> dict:
    """``a.runs`` interleaved runs of each side at one setting; the best of each, their ratio, acceptance, equality."""
    n = a.tokens_draft if row == "draft" else a.tokens_dflash
    cmd_ours = ours_command(target, drafter, row, k, PROMPT, n, a.ctx, a.threads)
    cmd_peer = peer_command(target, drafter, row, k, prompt_file, n, a.ctx, a.threads, binary=a.peer)
    runs: dict[str, list[dict]] = {"ours": [], "peer": []}
    for _ in range(a.runs):
        runs["ours"].append(run_ours(cmd_ours))
        p = run_peer(cmd_peer, PROMPT_END)
        runs["peer"].append({key: p[key] for key in ("tok_s", "generated", "t_decode", "cycles", "text")}
                            | {"drafted": p["n_drafted"], "accepted": p["n_accept"]})
    best = {who: max(rs, key=lambda r: r["tok_s"]) for who, rs in runs.items()}
    acc = {who: acceptance(best[who]) for who in runs}
    # equal work: the same share of the drafts accepted on both sides (ends differ by a cycle: see the docstring)
    equal = abs(acc["ours"] - acc["peer"]) <= a.acceptance_tol
    same, n_same = same_tokens(best["ours"]["text"], best["peer"]["text"])
    out = {"row": row, "k": k, "tokens": n, "tok_s": {w: [r["tok_s"] for r in rs] for w, rs in runs.items()},
           "best": {w: best[w]["tok_s"] for w in runs}, "ratio": best["ours"]["tok_s"] / best["peer"]["tok_s"],
           "acceptance": acc, "counts": {w: {key: best[w][key] for key in ("generated", "cycles", "drafted", "accepted")} for w in runs},
           "prompt_tokens": best["ours"]["prompt_tokens"],
           "equal_work": equal, "same_tokens": same, "same_chars": n_same, "texts": {w: best[w]["text"] for w in runs},
           "stop_ours": best["ours"]["stop"], "commands": {"ours": cmd_ours, "peer": cmd_peer}}
    log(f"  {row:<6} k={k:<2} ours {' '.join(f'{x:6.1f}' for x in out['tok_s']['ours'])} | peer "
        f"{' '.join(f'{x:6.1f}' for x in out['tok_s']['peer'])} | ratio {out['ratio']:.2f} | accept "
        f"{acc['ours']:.0%} / {acc['peer']:.0%} | load {os.getloadavg()[0]:.2f}")
    return out


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"`benchmarks/speed/loop_vs_peer.py`, {report['date']}, localflash {report['machine'].get('localflash_commit', '?')}"
             f"{' (dirty)' if report['machine'].get('localflash_dirty') else ''}; {s['tokens']['draft']} tokens a run (draft rows), "
             f"{s['tokens']['dflash']} (dflash rows), {s['threads']} thread(s), "
             f"best of {s['runs']} interleaved runs; load average {report['load_start'][0]:.2f} at the start, "
             f"{report['load_end'][0]:.2f} at the end ({report['minutes']:.1f} min).", "",
             "| vocab | row | k | ours tok/s (runs) | peer tok/s (runs) | ours best | peer best | ours / peer | accepted ours | accepted peer | equal work | same tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        c = r["counts"]
        same = {True: "yes", False: f"no: from character {r['same_chars']}", None: "–"}[r["same_tokens"]]
        lines.append(
            f"| {r['vocab']} ({VOCABS[r['vocab']]:,}) | {r['row']} | {r['k']} | {' '.join(f'{x:.1f}' for x in r['tok_s']['ours'])} | "
            f"{' '.join(f'{x:.1f}' for x in r['tok_s']['peer'])} | {r['best']['ours']:.1f} | {r['best']['peer']:.1f} | "
            f"**{r['ratio']:.2f}×** | {c['ours']['accepted']}/{c['ours']['drafted']} | {c['peer']['accepted']}/{c['peer']['drafted']} | "
            f"{'yes' if r['equal_work'] else 'NO: acceptance differs, not equal work'} | {same} |")
    below = [r for r in report["results"] if r["equal_work"] and r["ratio"] < s["guard"]]
    lines += ["", f"Guard (every equal-work row ≥ {s['guard']}×): "
              + ("held." if not below else "MISSED by " + ", ".join(f"{r['vocab']} {r['row']} k={r['k']} ({r['ratio']:.2f}×)" for r in below))]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="4,8,15", help="fixed draft lengths (default 4,8,15)")
    ap.add_argument("--runs", type=int, default=5, help="interleaved runs per side and setting; the best counts (default 5)")
    ap.add_argument("--tokens-draft", type=int, default=128,
                    help="tokens per run (-n) of the draft rows (default 128: drafts all accepted, 8 cycles at k = 15)")
    ap.add_argument("--tokens-dflash", type=int, default=32,
                    help="tokens per run of the dflash rows (default 32: random drafts rejected, about a cycle a token)")
    ap.add_argument("--vocabs", default="qwen2,qwen3.6", help=f"comma list of {', '.join(VOCABS)}")
    ap.add_argument("--rows", default="draft,dflash", help="comma list of draft, dflash")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=512, help="context size, both sides (default 512; a multiple of 256)")
    ap.add_argument("--width", type=int, default=256, help="target width (default 256)")
    ap.add_argument("--layers", type=int, default=4, help="target blocks (default 4)")
    ap.add_argument("--guard", type=float, default=1.2, help="fail (exit 1) when an equal-work row's ours/peer is below this")
    ap.add_argument("--acceptance-tol", type=float, default=0.05, help="largest acceptance gap still called equal work")
    ap.add_argument("--peer-dir", default=os.environ.get("PEER_DIR", str(ROOT / "peer")), help="scripts/build_peer.sh's PEER_DIR")
    ap.add_argument("--qwen2-vocab", default=None, help=f"the Qwen2 tokenizer GGUF (default: PEER_DIR/{SDIST_VOCAB})")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "localflash" / "loop_vs_peer"))
    ap.add_argument("--json", default=None, help="write the report as JSON here")
    a = ap.parse_args(argv)
    ks = [int(x) for x in a.ks.split(",")]
    vocabs = [v for v in a.vocabs.split(",") if v]
    rows = [r for r in a.rows.split(",") if r]
    if not set(vocabs) <= set(VOCABS) or not set(rows) <= set(ROWS):
        ap.error(f"--vocabs takes {', '.join(VOCABS)}; --rows takes {', '.join(ROWS)}")
    a.peer = Path(a.peer_dir) / "bin" / "llama-speculative-simple"
    qwen2_vocab = Path(a.qwen2_vocab or Path(a.peer_dir) / SDIST_VOCAB)
    if not a.peer.exists():
        print(f"error: no {a.peer} (scripts/build_peer.sh builds it; --peer-dir or PEER_DIR names its folder)", file=sys.stderr)
        return 1
    if "qwen2" in vocabs and not qwen2_vocab.exists():
        print(f"error: no {qwen2_vocab} (the Qwen2 tokenizer: pass --qwen2-vocab)", file=sys.stderr)
        return 1
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # both sides' subprocesses inherit it

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": bl.machine_info(),
              "load_start": list(os.getloadavg()),
              "settings": {"ks": ks, "runs": a.runs, "tokens": {"draft": a.tokens_draft, "dflash": a.tokens_dflash}, "vocabs": vocabs, "rows": rows, "threads": a.threads,
                           "ctx": a.ctx, "width": a.width, "layers": a.layers, "guard": a.guard, "prompt": PROMPT,
                           "omp_wait": "PASSIVE"},
              "command": ".venv/bin/python benchmarks/speed/loop_vs_peer.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    build_info = Path(a.peer_dir) / "BUILD_INFO"
    if build_info.exists():
        report["peer_build"] = build_info.read_text()
    report["results"] = []
    with tempfile.TemporaryDirectory(prefix="lf-loop-peer-") as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(PROMPT + "\n", encoding="utf-8")  # the peer's -f drops one trailing newline
        for vocab in vocabs:
            target, drafters = write_models(Path(a.work), vocab, ks, a.width, a.layers, qwen2_vocab)
            log(f"{vocab}: target {target.name}")
            for row in rows:
                for k in ks:
                    drafter = target if row == "draft" else drafters[k]
                    report["results"].append({"vocab": vocab} | measure(a, target, drafter, row, k, prompt_file, log))
    report["load_end"] = list(os.getloadavg())
    report["minutes"] = (time.perf_counter() - t0) / 60
    md = markdown(report)
    report["markdown"] = md
    print(md)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
        log(f"wrote {a.json}")
    return 1 if any(r["equal_work"] and r["ratio"] < a.guard for r in report["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
