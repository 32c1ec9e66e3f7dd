"""MTP drafting with a qwen35 target's own nextn block: lossless, in step with the target, wired into the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from localflash.errors import LocalflashError
from localflash.llama import Context, ContextOptions, Model, ModelOptions
from localflash.llama.nextn import MtpContext, enable_nextn, nextn_rows
from localflash.speculative.drafter import LookupFirstDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.mtp import MtpDrafter
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats
from localflash.testing.tiny import HybridSpec, write_hybrid
from localflash.testing.prompts import word_prompts

N_CTX = 1024
N_BATCH = 32  # prompts of more than 32 tokens prefill in several batches (and feed the MTP cache per batch)


def prompts(n: int, seed: int = 7) -> list[str]:
    """Every third repeats itself (lookup food), every fifth is longer than the batch."""
    return word_prompts(n, seed, repeat_every=3, long_times=6)


def engine(model: Model, kind: str, draft_max: int = 3, adaptive: bool = False, p_min: float = 0.0) -> Engine:
    ctx = Context(model, ContextOptions(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_outputs_max=draft_max + 1,
                                        n_threads=1, n_rs_seq=draft_max + 1))
    drafter = None
    if kind != "none":
        drafter = MtpDrafter(model, ctx, N_CTX, draft_max, p_min, n_threads=1)
        if kind == "mtp+ngram":
            drafter = LookupFirstDrafter(drafter)
    return Engine(model, ctx, drafter, adaptive=adaptive, draft_max=draft_max)


def run_all(eng: Engine, cases, n: int, sampling=None) -> tuple[list[list[int]], Stats]:
    total, outs = Stats(), []
    for i, toks in enumerate(cases):
        eng.reset()
        st = Stats()
        sp = None if sampling is None else SamplingParams(temperature=sampling, seed=100 + i)
        outs.append([t for chunk in eng.generate(toks, n, sp, st) for t in chunk])
        total.merge(st)
    return outs, total


TIE = 2e-3  # top-2 logit gap below which a greedy choice is left to rounding (see the test below)


def plain_greedy(model: Model, cases, n: int, want: int) -> tuple[list, list[list[int]]]:
    """The first ``want`` cases whose plain greedy continuation never passes within ``TIE`` of a tie, and it.

    llama.cpp's CPU kernels are not batch-invariant: a verify pass of several tokens and one-token
    decodes round differently (by up to ~3e-4 on logits of spread 4 here, measured below), so at a near-tie the target itself
    may pick either token. Those cases say nothing about the drafter and are left out here (on this machine 23 of the first 75 of
    the 96 candidates for the 52 kept); exact mode keeps them all: test_mtp_greedy_is_lossless_at_near_ties_in_exact_mode."""
    ctx = Context(model, ContextOptions(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=1, n_rs_seq=4))
    kept, outs = [], []
    for toks in cases:
        ctx.clear()
        for off in range(0, len(toks), N_BATCH):
            ctx.decode(toks[off:off + N_BATCH], off, "last")
        out, gap = [], np.inf
        for _ in range(n):
            logits = ctx.logits(-1)
            top2 = np.partition(logits, -2)[-2:]
            gap = min(gap, float(top2[1] - top2[0]))
            out.append(int(np.argmax(logits)))
            ctx.decode([out[-1]], len(toks) + len(out) - 1, "last")
        if gap > TIE:
            kept.append(toks)
            outs.append(out)
        if len(kept) == want:
            break
    ctx.close()
    assert len(kept) == want
    return kept, outs


@pytest.fixture(scope="module")
def agree(tiny_qwen35_mtp_agree):
    return Model(tiny_qwen35_mtp_agree, ModelOptions(load_mtp=True))


@pytest.fixture(scope="module")
def candidates(agree):
    out = [agree.tokenize(p) for p in prompts(96)]
    assert sum(len(t) > N_BATCH for t in out) >= 19
    return out


@pytest.fixture(scope="module")
def reference(agree, candidates):
    """52 prompt cases and their plain greedy continuations (128 tokens)."""
    return plain_greedy(agree, candidates, 128, 52)


def test_verify_passes_and_one_token_decodes_round_alike_within_the_tie_margin(agree, candidates):
    """Why TIE is 2e-3: logits of one 4-token verify pass against four one-token decodes (worst seen: 3.2e-4)."""
    worst = 0.0
    for toks in candidates[:6]:
        n0 = len(toks) - 4
        a, b = (Context(agree, ContextOptions(n_ctx=256, n_batch=N_BATCH, n_ubatch=N_BATCH, n_outputs_max=4, n_threads=1,
                                              n_rs_seq=4)) for _ in range(2))
        for c in (a, b):
            for off in range(0, n0, N_BATCH):
                c.decode(toks[off:min(n0, off + N_BATCH)], off, "none")
        b.decode(toks[n0:], n0, "all")
        batched = b.all_logits().copy()
        for i in range(4):
            a.decode([toks[n0 + i]], n0 + i, "last")
            worst = max(worst, float(np.abs(a.logits(-1) - batched[i]).max()))
    assert 0 < worst < TIE / 4


@pytest.mark.parametrize("kind, adaptive", [("mtp", False), ("mtp", True), ("mtp+ngram", False), ("mtp+ngram", True)])
def test_mtp_greedy_is_lossless(agree, reference, kind, adaptive):
    """52 prompts × 128 tokens at 1 thread, one engine reused (reset between prompts)."""
    cases, plain = reference
    assert sum(len(t) > N_BATCH for t in cases) >= 10
    eng = engine(agree, kind, adaptive=adaptive)
    outs, st = run_all(eng, cases, 128)
    mtp = eng.drafter.model if kind == "mtp+ngram" else eng.drafter
    assert mtp.n_fed == len(eng.tokens) and mtp.ctx.pos_max() == mtp.n_fed - 1  # MTP cache = committed text
    eng.close()
    for i, (got, want) in enumerate(zip(outs, plain)):
        assert got == want, f"case {i} diverged"
    assert st.drafted > 0 and 0 < st.accepted < st.drafted  # partial acceptance: the cut-back path runs
    if kind == "mtp+ngram" and not adaptive:  # (adaptive: mostly off on a CPU, a few probes)
        assert eng.drafter.looked_up > 0 and eng.drafter.modelled > 0


# in a fresh process (exact mode's tiled-matmul switch is process-wide): plain and MTP greedy on each prompt of
# stdin (a JSON list), the way the CLI builds them; prints, per prompt, whether MTP's output equals plain's and
# the plain run's smallest top-2 logit gap
MTP_VS_PLAIN = r"""
import json, sys
import numpy as np
from localflash.config import config_from
from localflash.engine import exact_options, open_engine
from localflash.llama import Model, ModelOptions
path, exact, n_tok = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
if exact:
    exact_options(True)
target = Model(path, ModelOptions(use_extra_bufts=not exact, load_mtp=True))
make = lambda **kw: open_engine(config_from(None, path, None, exact=exact, threads=1, ctx=1024, **kw), target=target)
plain, mtp = make(spec="none"), make(spec="mtp", draft_max=3, adaptive=False)
gaps, read = [], plain.ctx.logits
def reading(row=-1):
    x = read(row)
    top = np.partition(x, -2)[-2:]
    gaps.append(float(top[1] - top[0]))
    return x
plain.ctx.logits = reading
out = []
for text in json.load(sys.stdin):
    toks = target.tokenize(text)
    plain.reset(); mtp.reset(); gaps.clear()
    want = [t for c in plain.generate(toks, n_tok) for t in c]
    got = [t for c in mtp.generate(toks, n_tok) for t in c]
    out.append([got == want, min(gaps)])
print(json.dumps(out))
"""


def mtp_vs_plain(path, texts: list[str], exact: bool, n_tok: int = 64) -> list[tuple[bool, float]]:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_TILED")}
    res = subprocess.run([sys.executable, "-c", MTP_VS_PLAIN, str(path), str(int(exact)), str(n_tok)], input=json.dumps(texts),
                         capture_output=True, text=True, env=env, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    return [tuple(x) for x in json.loads(res.stdout.strip().splitlines()[-1])]


def test_mtp_greedy_is_lossless_at_near_ties_in_exact_mode(tiny_qwen35_q4k):
    """No prompt left out: on a Q4_K_M hybrid (tests/llama/test_exact.py: exact there) MTP greedy equals plain greedy
    on every prompt, the near ties the tests above leave out (a plain top-2 gap below TIE) included.

    The control: without exact mode the same engines disagree on some of these prompts (the repacked K-quant gemm
    and the tiled matmul round a verify batch differently from one-token decodes)."""
    texts = prompts(24)
    exact = mtp_vs_plain(tiny_qwen35_q4k, texts, exact=True)
    assert [same for same, _ in exact] == [True] * 24
    assert sum(gap < TIE for _, gap in exact) >= 2  # measured: 2 of the 24
    default = mtp_vs_plain(tiny_qwen35_q4k, texts[:8], exact=False)
    assert not all(same for same, _ in default)


def test_mtp_always_right_and_always_wrong_are_lossless(tmp_path, candidates):
    """An MTP block that agrees with a near-linear trunk (nearly every draft kept) and a random one (almost none)."""
    right = Model(write_hybrid(tmp_path / "right.gguf", HybridSpec(seed=3, n_nextn=1, mtp_agree=0.0, layer_scale=0.01)),
                  ModelOptions(load_mtp=True))
    wrong = Model(write_hybrid(tmp_path / "wrong.gguf", HybridSpec(seed=3, n_nextn=1)), ModelOptions(load_mtp=True))
    for model, check in ((right, lambda st: st.accepted > 0.9 * st.drafted > 0), (wrong, lambda st: st.accepted < 0.1 * st.drafted)):
        cases, want = plain_greedy(model, candidates, 128, 10)
        got, st = run_all(engine(model, "mtp", draft_max=4), cases, 128)
        assert got == want and check(st), (model.path.name, st.accepted, st.drafted)


# mtp+ngram adaptive: the draft-length calibration cuts its filler decodes on hybrid memory (a stale-state bug
# before the checkpoint-restoring rollback of issue 16); bench below reuses the cache across prompts.
@pytest.mark.parametrize("kind, adaptive", [("mtp", False), ("mtp+ngram", True)])
def test_sampled_mtp_equals_plain_sampling_with_same_seed(agree, candidates, kind, adaptive):
    want, _ = run_all(engine(agree, "none"), candidates[:8], 64, sampling=0.9)
    got, st = run_all(engine(agree, kind, adaptive=adaptive), candidates[:8], 64, sampling=0.9)
    assert got == want and st.drafted > 0


def test_mtp_cache_equals_a_fresh_feed_of_the_committed_text(tiny_qwen35_mtp, candidates):
    """After a run, the next draft from the incremental MTP cache equals one from a cache fed the text at once.

    The random MTP block reads the target's hidden state strongly, so pairing token p with any other
    state than h_{p-1} would change these logits."""
    model = Model(tiny_qwen35_mtp, ModelOptions(load_mtp=True))
    eng = engine(model, "mtp", draft_max=4)
    toks = candidates[5]  # longer than the batch
    out = [t for chunk in eng.generate(toks, 96, None) for t in chunk]
    d: MtpDrafter = eng.drafter
    text = eng.tokens
    assert len(text) == len(toks) + len(out) - 1 and d.n_fed == len(text)
    d.ctx.decode_pairs([out[-1]], d._hidden_at(len(text) - 1)[None], len(text), output_last=True)
    incremental = d.ctx.logits(-1).copy()

    target = Context(model, ContextOptions(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=1))
    enable_nextn(target, masked=False)
    target.decode(text, 0, "last")
    h = nextn_rows(target, len(text)).copy()
    fresh = MtpContext(model, ContextOptions(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_outputs_max=1, n_threads=1))
    fresh.decode_pairs(text, np.vstack([np.zeros((1, model.n_embd), np.float32), h[:-1]]), 0, output_last=False)
    fresh.decode_pairs([out[-1]], h[-1:], len(text), output_last=True)
    once = fresh.logits(-1)
    assert int(np.argmax(once)) == int(np.argmax(incremental))
    np.testing.assert_allclose(incremental, once, atol=1e-3 * float(np.abs(once).max()))
    shifted = MtpContext(model, ContextOptions(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_outputs_max=1, n_threads=1))
    shifted.decode_pairs(text, h, 0, output_last=False)  # paired with h_p instead of h_{p-1}: a different draft
    shifted.decode_pairs([out[-1]], h[-1:], len(text), output_last=True)
    assert not np.allclose(shifted.logits(-1), once, atol=1e-3 * float(np.abs(once).max()))
    # a chat's next turn may resume just before this prompt's last token, 96 tokens back: h is still known there
    d.rollback(len(toks) - 1)
    np.testing.assert_allclose(d._hidden_at(len(toks) - 2), h[len(toks) - 2], atol=1e-3 * float(np.abs(h).max()))
    eng.close()


def test_mtp_refuses_a_target_without_nextn_layers(tiny_qwen35):
    model = Model(tiny_qwen35, ModelOptions(load_mtp=True))
    ctx = Context(model, ContextOptions(n_ctx=256, n_threads=1))
    with pytest.raises(LocalflashError, match="no MTP"):
        MtpDrafter(model, ctx, 256)


def test_auto_picks_mtp_only_for_a_target_with_nextn_layers(tiny_qwen35_mtp_agree, tiny_qwen35):
    from localflash.config import config_from
    from localflash.engine import open_engine

    for path, want in ((tiny_qwen35_mtp_agree, "mtp"), (tiny_qwen35, "ngram")):
        eng = open_engine(config_from(None, str(path), None, threads=1, ctx=256))
        assert eng.drafter.name == want and eng.policy.max_draft == (3 if want == "mtp" else 8)
        eng.close()
    eng = open_engine(config_from(None, str(tiny_qwen35_mtp_agree), None, spec="mtp+ngram", draft_max=5, threads=1, ctx=256))
    assert eng.drafter.name == "mtp+ngram" and eng.policy.max_draft == 5 and eng.target.mtp_loaded
    eng.close()


def test_pair_of_kind_mtp(lf_env, tiny_qwen35_mtp_agree):
    from pathlib import Path

    from localflash.registry.pairs import get_pair
    from localflash.config import config_from

    user = Path(lf_env["XDG_CONFIG_HOME"]) / "localflash" / "models.toml"
    user.parent.mkdir(parents=True)
    user.write_text(f'[pairs.q35]\ntarget = "{tiny_qwen35_mtp_agree}"\nkind = "mtp+ngram"\nctx = 512\n')
    pair = get_pair("q35")
    assert (pair.kind, pair.drafter, pair.draft_max) == ("mtp+ngram", None, 3)
    assert config_from("q35", None, None, spec="auto").spec == "mtp+ngram"


def test_spec_mtp_without_nextn_layers_is_one_line(lf, tiny_qwen35):
    r = lf("run", "-m", tiny_qwen35, "--spec", "mtp", "-t", "1", "hi")
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert lines[0].startswith("error: ") and "no MTP (nextn) layers" in lines[0]
    assert all(ln.startswith(("error:", "hint:")) for ln in lines)


def test_run_accepts_the_mtp_kinds(lf, tiny_qwen35_mtp_agree, tmp_path):
    import json

    r = lf("run", "-m", tiny_qwen35_mtp_agree, "--spec", "mtp+ngram", "-t", "1", "--raw", "-n", "40", "--json", "a garden of quiet stone")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stderr.strip().splitlines()[-1])
    assert st["drafter"] == "mtp+ngram" and st["drafted"] > 0 and st["generated"] == 40


def test_bench_runs_the_mtp_kinds_as_modes(lf, tiny_qwen35_mtp_agree, tmp_path):
    import json

    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text("\n".join(json.dumps({"id": f"p{i}", "category": "t", "prompt": p})
                                      for i, p in enumerate(prompts(3))) + "\n")
    out = tmp_path / "bench.json"
    r = lf("bench", "-m", tiny_qwen35_mtp_agree, "--modes", "mtp,mtp+ngram", "--prompts", prompts_file, "-n", "32",
           "-t", "1", "--raw", "--fixed", "--no-save", "--json", out)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["modes"] == ["none", "mtp", "mtp+ngram"]
    assert all(row["same_as_plain"] for row in report["runs"])
    assert report["results"]["mtp"]["all"]["drafted"] > 0


def test_chat_status_shows_mtp_acceptance(lf, tiny_qwen35_mtp_agree):
    import re

    feed = "Name three colours.\n/stats\n/quit\n"
    r = lf("chat", "-m", tiny_qwen35_mtp_agree, "--spec", "mtp", "--draft", "on", "--temp", "0", "-n", "24", "-t", "1",
           input=feed)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"τ [\d.]+ · accept \d+% \(\d+/\d+\) · ctx \d+/\d+ · mtp on", r.stderr), r.stderr
    assert "acceptance per draft position" in r.stdout
