"""The DFlash drafter shipped with localflash, on its real target: lossless, and it does draft right sometimes."""

from __future__ import annotations

from pathlib import Path

from localflash.llama import Context, ContextOptions, Model
from localflash.registry.pairs import get_pair
from localflash.speculative.dflash import DFlashDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats
from localflash.train.data import chat_tokens

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain photosynthesis in two sentences.",
]
# one thread: SmolLM2's default CPU numerics are batch-invariant there (a verify row equals the one-row decode of
# its position, at 17 rows and 700 cached tokens: tests/llama/test_exact.py), so the equality needs no exact mode


def _run(target: Model, tokens: list[int], n: int, drafter_path: Path | None) -> tuple[list[int], Stats]:
    ctx = Context(target, ContextOptions(n_ctx=1024, n_batch=256, n_ubatch=256, n_outputs_max=16, n_threads=1))
    drafter = DFlashDrafter(Model(drafter_path), target, ctx, 1024 + 16, n_threads=1) if drafter_path else None
    engine = Engine(target, ctx, drafter, adaptive=False)
    st = Stats()
    out = [t for chunk in engine.generate(tokens, n, SamplingParams(temperature=0.0), st) for t in chunk]
    engine.close()
    return out, st


def test_shipped_drafter_is_the_demo_pairs_and_lossless(smollm2):
    pair = get_pair("demo")
    assert pair.kind == "dflash" and pair.drafter is not None and pair.drafter.is_file()
    assert pair.drafter.stat().st_size <= 20 * 1024 * 1024
    target = Model(smollm2)
    merged = Stats()
    for text in PROMPTS:
        tokens = chat_tokens(target, text)
        plain, _ = _run(target, tokens, 64, None)
        spec, st = _run(target, tokens, 64, pair.drafter)
        assert spec == plain, text
        merged.merge(st)
    assert merged.drafted > 0 and merged.accepted > 0  # trained, not random: some of its drafts are right
