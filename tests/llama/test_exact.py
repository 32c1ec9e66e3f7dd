"""Exact mode (``--exact``): a row's logits do not depend on its batch, so speculative greedy == plain greedy.

Every measurement runs in a subprocess of its own, started without ``GGML_CPU_TILED_*`` in its
environment: ggml reads its tiled-matmul switch once per process, so each numerics setting needs
a fresh one, and this pytest process never sets the switch (the in-process lossless tests use
``exact_kwargs``, the per-model and per-context options alone; the tests below show that this
suffices for their files and not for a K-quant file). Each test shows the default numerics differ
first, so it would fail if exact mode did nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from localflash.config import EXACT_MAX_ROWS, config_from
from localflash.errors import LocalflashError
from localflash.llama.quantize import quantize
from localflash.testing.tiny import HybridSpec, write_hybrid

# after an `n_prompt`-token prompt, decode `batch` tokens one at a time in one context and as one batch
# (a verify step) in another; print the largest |Δlogit| between the two, over three token sequences.
# numerics: "default", "exact" (engine.exact_options: the process-wide tiled switch too) or
# "kwargs" (engine.exact_kwargs: the per-model and per-context options only)
PROBE = r"""
import json, sys
import numpy as np
from localflash.engine import _arch_of, exact_kwargs, exact_options, exact_row_padding
from localflash.llama import Context, ContextOptions, Model, ModelOptions
path, numerics, threads, n_prompt, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
arch, pad = _arch_of(path), exact_row_padding(path, threads)
model_kw, ctx_kw = (exact_options(True, arch, pad) if numerics == "exact" else exact_kwargs(arch, pad)
                    if numerics == "kwargs" else ({}, {}))
m = Model(path, ModelOptions(**model_kw))
worst = 0.0
for trial in range(3):
    a, b = (Context(m, ContextOptions(n_ctx=n_prompt + batch + 16, n_threads=threads, n_outputs_max=batch, n_rs_seq=batch,
                                      **ctx_kw)) for _ in range(2))
    toks = [100 + (7 * i + 13 * trial) % 900 for i in range(n_prompt + batch)]
    for c in (a, b):
        for off in range(0, n_prompt, 256):
            c.decode(toks[off:min(off + 256, n_prompt)], off, "none")
    single = []
    for i in range(batch):
        a.decode([toks[n_prompt + i]], n_prompt + i, "last")
        single.append(a.logits(-1).copy())
    b.decode(toks[n_prompt:n_prompt + batch], n_prompt, "all")
    rows = b.all_logits()
    worst = max([worst] + [float(np.abs(rows[j] - single[j]).max()) for j in range(batch)])
    a.close(); b.close()
print(json.dumps(worst))
"""


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_TILED")}


def probe(path, numerics: str, threads: int, n_prompt: int, batch: int) -> float:
    res = subprocess.run([sys.executable, "-c", PROBE, str(path), numerics, str(threads), str(n_prompt), str(batch)],
                         capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_exact_mode_makes_k_quant_verify_rows_equal_single_decodes(tiny_q4k):
    # 9 rows: ggml's tiled K-quant matmul (8+ rows) and the repacked weights' gemm round differently from one-row decodes
    assert probe(tiny_q4k, "default", threads=1, n_prompt=40, batch=9) > 0
    assert probe(tiny_q4k, "kwargs", threads=1, n_prompt=40, batch=9) > 0  # without the process-wide tiled switch: not yet
    assert probe(tiny_q4k, "exact", threads=1, n_prompt=40, batch=9) == 0


def test_exact_mode_makes_f32_rows_equal_at_one_thread(tiny_target):
    # F32 weights: llamafile's sgemm multiplies 2+ rows, vec_dot one; exact mode pads one-row decodes to two rows
    assert probe(tiny_target, "default", threads=1, n_prompt=40, batch=5) > 0
    assert probe(tiny_target, "kwargs", threads=1, n_prompt=40, batch=5) == 0


def test_exact_mode_makes_rows_equal_at_two_threads_past_512_cached_tokens(tiny_target):
    # with 512+ cells a one-row decode splits its attention over the KV cache across the threads
    assert probe(tiny_target, "default", threads=2, n_prompt=600, batch=5) > 0
    assert probe(tiny_target, "exact", threads=2, n_prompt=600, batch=5) == 0
    # the tiny F32 llama has no weight the tiled matmul takes: the per-model/context options alone are exact
    # (test_speculative.py relies on this, in the pytest process)
    assert probe(tiny_target, "kwargs", threads=2, n_prompt=600, batch=5) == 0


def test_smollm2_rows_equal_without_the_tiled_switch_and_at_one_thread_by_default(smollm2):
    """SmolLM2 (Q4_1 and a Q8_0 embedding/output): 2 threads past 512 cells differ by default, the per-model/context
    options alone make them equal; at one thread its default numerics are batch-invariant already, even at 17 rows
    and 700 cached tokens (test_default_drafter.py's setting: 1 thread, shorter contexts)."""
    assert probe(smollm2, "default", threads=2, n_prompt=700, batch=5) > 0
    assert probe(smollm2, "kwargs", threads=2, n_prompt=700, batch=5) == 0
    assert probe(smollm2, "default", threads=1, n_prompt=700, batch=17) == 0


@pytest.mark.parametrize("threads, n_prompt", [(1, 40), (2, 600)])
def test_exact_mode_makes_a_k_quant_hybrid_exact(tiny_qwen35_q4k, threads, n_prompt):
    """qwen35 (Gated-DeltaNet + attention) with every matmul weight a K-quant: recurrent kernels included, a verify
    batch's rows equal one-row decodes in exact mode (one-row decodes run on one thread there)."""
    assert probe(tiny_qwen35_q4k, "default", threads=threads, n_prompt=n_prompt, batch=5) > 0
    assert probe(tiny_qwen35_q4k, "exact", threads=threads, n_prompt=n_prompt, batch=5) == 0


def test_exact_mode_is_not_exact_for_a_hybrid_with_sgemm_weights(tiny_qwen35, tiny_dir):
    """What exact mode cannot fix: a recurrent target cannot drop a padding row, so a one-row decode takes vec_dot
    where a batch takes llamafile's sgemm: an F32 qwen35, and a qwen3next whose expert router stays F32 when
    everything else is Q4_K (llama.cpp's quantizer keeps ffn_gate_inp)."""
    assert probe(tiny_qwen35, "exact", threads=1, n_prompt=40, batch=5) > 0
    wide = dict(n_embd=256, n_ff=512, head_dim=64, n_rot=16, linear_head_dim=64, linear_v_heads=4, n_ff_exp=256)
    f32 = write_hybrid(tiny_dir / "qwen3next-wide-f32.gguf", HybridSpec(arch="qwen3next", seed=4, **wide))
    q3n = quantize(f32, tiny_dir / "qwen3next-wide-q4km.gguf", "Q4_K_M")
    assert probe(q3n, "exact", threads=1, n_prompt=600, batch=5) > 0


# a GPU build, as far as open_engine can tell (this machine has none): exact mode must refuse target layers there
ON_A_GPU_BUILD = r"""
import sys
import localflash.llama
from localflash.config import config_from
from localflash.engine import open_engine
from localflash.errors import LocalflashError
localflash.llama.gpu_offload_supported = lambda: True
for ngl in (-1, 0):
    try:
        open_engine(config_from(None, sys.argv[1], None, exact=True, spec="none", n_gpu_layers=ngl, vram="24GiB")).close()
        print(ngl, "opened")
    except LocalflashError as e:
        print(ngl, "refused:", e.message, "|", e.hint)
"""


def test_exact_mode_refuses_target_layers_on_a_gpu(tiny_target):
    """A planned 24 GiB card takes all 5 of the tiny target's layers (4 blocks and the output): one line, no load."""
    res = subprocess.run([sys.executable, "-c", ON_A_GPU_BUILD, str(tiny_target)], capture_output=True, text=True,
                         env=_clean_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == [
        "-1 refused: --exact makes greedy output byte-exact on the CPU only; this run would put 5 target layers on the "
        "GPU, whose kernels it does not cover | add --n-gpu-layers 0 (-ngl 0) to run the target on the CPU, or drop --exact",
        "0 opened"]


def test_exact_mode_refuses_draft_lengths_past_its_row_limit(tiny_target):
    assert config_from(None, str(tiny_target), None, exact=True, draft_max=EXACT_MAX_ROWS - 1).exact
    with pytest.raises(LocalflashError, match="--draft-max must be at most"):
        config_from(None, str(tiny_target), None, exact=True, draft_max=EXACT_MAX_ROWS)


def test_cli_exact_run_draft_model_equals_plain_where_default_numerics_do_not(lf, tiny_q4k, tiny_drafters):
    """`run --exact -t 2` on the tiny Q4_K_M llama: draft-model output byte-identical to plain.

    The control: the same two runs without --exact differ (at the 13th token, where the batched K-quant
    numerics move a near-tie), so the equality is exact mode's doing."""
    prompt = " ".join(["and silver we the a hills"] * 56)  # 337 tokens
    draft = ["--drafter", tiny_drafters["near"], "--spec", "draft", "--draft-max", "4", "--fixed"]

    def run(*extra):
        r = lf("run", "--model", tiny_q4k, *extra, "-t", "2", "-n", "32", "--raw", prompt, env={"GGML_CPU_TILED_MM": "1"},
               timeout=600)  # "1": the default, whatever this process was started with
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip()
        return r.stdout

    assert run(*draft) != run("--spec", "none")
    assert run(*draft, "--exact") == run("--spec", "none", "--exact")
