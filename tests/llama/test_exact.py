"""Exact mode (``--exact``): a row's logits do not depend on its batch, so speculative greedy == plain greedy.

Each numerics setting runs in a subprocess: ggml reads its tiled-matmul switch once per
process (and this test process runs in exact mode, see conftest.py). Every test shows the
default numerics differ first, so it would fail if exact mode did nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from localflash.errors import LocalflashError
from localflash.llama.quantize import quantize
from localflash.config import EXACT_MAX_ROWS, config_from
from localflash.testing.tiny import TinySpec, write_target

# decode `batch` tokens one at a time after an `n_prompt`-token prompt, then the same tokens
# as one batch (a verify step); print the largest |Δlogit| between the two
PROBE = r"""
import json, sys
import numpy as np
from localflash.llama import Context, ContextOptions, Model, ModelOptions
from localflash.engine import exact_options, exact_row_padding
path, exact, threads, n_prompt, batch = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model_kw, ctx_kw = exact_options(exact, "llama", pad=exact_row_padding(path, threads))
m = Model(path, ModelOptions(**model_kw))
ctx = Context(m, ContextOptions(n_ctx=n_prompt + batch + 16, n_threads=threads, n_outputs_max=batch, **ctx_kw))
toks = [100 + (7 * i) % 900 for i in range(n_prompt + batch)]
for off in range(0, n_prompt, 256):
    ctx.decode(toks[off:min(off + 256, n_prompt)], off, "none")
single = []
for i in range(batch):
    ctx.decode([toks[n_prompt + i]], n_prompt + i, "last")
    single.append(ctx.logits(-1).copy())
ctx.seq_rm(n_prompt)
ctx.decode(toks[n_prompt:n_prompt + batch], n_prompt, "all")
rows = ctx.all_logits()
print(json.dumps(max(float(np.abs(rows[j] - single[j]).max()) for j in range(batch))))
"""


def probe(path, exact: bool, threads: int, n_prompt: int, batch: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_TILED")}
    res = subprocess.run([sys.executable, "-c", PROBE, str(path), str(int(exact)), str(threads), str(n_prompt), str(batch)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_q4k(tiny_dir):
    """A tiny llama wide enough for K-quants (256), quantized to Q4_K_M: repacked and tiled by default."""
    f32 = write_target(tiny_dir / "wide-f32.gguf", TinySpec(n_embd=256, n_layer=2, seed=3))
    return quantize(f32, tiny_dir / "wide-q4km.gguf", "Q4_K_M")


def test_exact_mode_makes_k_quant_verify_rows_equal_single_decodes(tiny_q4k):
    # 9 rows: ggml's tiled K-quant matmul (8+ rows) and the repacked weights' gemm round differently from one-row decodes
    assert probe(tiny_q4k, exact=False, threads=1, n_prompt=40, batch=9) > 0
    assert probe(tiny_q4k, exact=True, threads=1, n_prompt=40, batch=9) == 0


def test_exact_mode_makes_rows_equal_at_two_threads_past_512_cached_tokens(tiny_target):
    # with 512+ cells a one-row decode splits its attention over the KV cache across the threads
    assert probe(tiny_target, exact=False, threads=2, n_prompt=600, batch=5) > 0
    assert probe(tiny_target, exact=True, threads=2, n_prompt=600, batch=5) == 0


def test_exact_mode_refuses_draft_lengths_past_its_row_limit(tiny_target):
    assert config_from(None, str(tiny_target), None, exact=True, draft_max=EXACT_MAX_ROWS - 1).exact
    with pytest.raises(LocalflashError, match="--draft-max must be at most"):
        config_from(None, str(tiny_target), None, exact=True, draft_max=EXACT_MAX_ROWS)


def test_cli_exact_run_speculative_equals_plain_at_two_threads(lf, tiny_target, tiny_drafters):
    """`run --exact -t 2`: draft-model and n-gram output byte-identical to plain, past 512 cached tokens."""
    prompt = " ".join(["the river a garden of quiet stone light"] * 70)  # ~600 tokens, repeats for n-gram
    outs = {}
    for spec, extra in (("none", []), ("draft", ["--drafter", tiny_drafters["near"]]), ("ngram", [])):
        r = lf("run", "--model", tiny_target, *extra, "--spec", spec, "--exact", "-t", "2", "-n", "32", "--raw", prompt, timeout=600)
        assert r.returncode == 0, r.stderr
        outs[spec] = r.stdout
    assert outs["none"].strip()
    assert outs["draft"] == outs["none"]
    assert outs["ngram"] == outs["none"]
