"""DFlash2 (selector lattice) and EAGLE-3 drafters: lossless on tiny targets, in step with the committed text."""

from __future__ import annotations

import numpy as np
import pytest

from localflash.llama import Context, ContextOptions, Model
from localflash.speculative.dflash import DFlashDrafter, walk_lattice
from localflash.speculative.drafter import LookupFirstDrafter
from localflash.speculative.eagle3 import Eagle3Drafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats
from localflash.formats.dflash_gguf import DFlash2Spec, DFlashSpec
from localflash.testing.tiny import Eagle3Spec, write_dflash, write_dflash2, write_eagle3
from localflash.testing.prompts import word_prompts

N_CTX = 1024


def prompts(n: int, seed: int = 0) -> list[str]:
    return word_prompts(n, seed)


def generate(model, tokens, n, make_drafter=None, sampling=None, adaptive=False, n_rs_seq=0):
    opts = ContextOptions(n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_outputs_max=17, n_threads=1, n_rs_seq=n_rs_seq)
    ctx = Context(model, opts)
    drafter = make_drafter(ctx) if make_drafter else None
    engine = Engine(model, ctx, drafter, adaptive=adaptive)
    stats = Stats()
    out = [t for chunk in engine.generate(tokens, n, sampling, stats) for t in chunk]
    engine.close()
    return out, stats


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target)


@pytest.fixture(scope="module")
def plain_outputs(target):
    """Plain greedy continuations of 52 prompts, 128 tokens each."""
    cases = [target.tokenize(p) for p in prompts(52)]
    return cases, [generate(target, toks, 128)[0] for toks in cases]


@pytest.fixture(scope="module")
def files(tiny_dir):
    return {
        "dflash2-b8": write_dflash2(tiny_dir / "dflash2-b8.gguf", DFlash2Spec(target_layers=[1, 2, 3])),
        "dflash2-b4": write_dflash2(
            tiny_dir / "dflash2-b4.gguf", DFlash2Spec(target_layers=[0, 3], block_size=4, selector_top_k=3, seed=4)
        ),
        "eagle3": write_eagle3(tiny_dir / "eagle3.gguf", Eagle3Spec(target_layers=[0, 1, 3])),
        "eagle3-echo": write_eagle3(tiny_dir / "eagle3-echo.gguf", Eagle3Spec(echo=4.0, fc_scale=0.3)),
        "eagle3-d2t": write_eagle3(tiny_dir / "eagle3-d2t.gguf", Eagle3Spec(draft_vocab=8000, own_embeddings=True, seed=5)),
    }


def _check_all(target, plain_outputs, pick, limit=None):
    """``pick(i) -> (label, make_drafter, adaptive)``; every case must equal plain greedy; stats per label."""
    cases, expected = plain_outputs
    per_label: dict[str, Stats] = {}
    n = 0
    for i, (toks, want) in enumerate(list(zip(cases, expected))[:limit]):
        label, maker, adaptive = pick(i)
        got, st = generate(target, toks, 128, maker, adaptive=adaptive)
        assert got == want, f"case {i} ({label}, adaptive={adaptive}) diverged"
        per_label.setdefault(label, Stats()).merge(st)
        n += 1
    assert n >= (limit or 50) and all(len(w) == 128 for w in expected[:n])
    return per_label


def test_dflash2_is_lossless_fixed_and_adaptive(target, plain_outputs, files):
    """Blocks 8 and 4, top-k 4 and 3, with and without a p_min cut; random weights: (almost) always wrong."""
    names = []

    def pick(i):
        which = ("dflash2-b8", "dflash2-b4")[i % 2]
        p_min = (0.0, 0.4)[(i // 2) % 2]

        def make(ctx):
            d = DFlashDrafter(Model(files[which]), target, ctx, N_CTX + 16, n_threads=1, p_min=p_min)
            names.append(d.name)
            return d

        return f"{which}/p{p_min}", make, i % 4 >= 2 or i % 3 == 0

    st = _check_all(target, plain_outputs, pick)
    assert set(names) == {"dflash2"}
    assert all(s.drafted > 0 for s in st.values())
    assert sum(s.accepted for s in st.values()) < 0.05 * sum(s.drafted for s in st.values())  # always wrong, still lossless
    # the p_min cut shortens drafts: fewer drafted per cycle than without it
    assert st["dflash2-b8/p0.4"].drafted / st["dflash2-b8/p0.4"].cycles < st["dflash2-b8/p0.0"].drafted / st["dflash2-b8/p0.0"].cycles


def test_eagle3_is_lossless_fixed_and_adaptive(target, plain_outputs, files):
    """Random (always wrong), echoing (often right) and reduced-vocabulary drafters; d2t drafts are target ids."""
    drafted_ids: set[int] = set()

    def pick(i):
        which = ("eagle3", "eagle3-echo", "eagle3-d2t")[i % 3]

        def make(ctx):
            d = Eagle3Drafter(Model(files[which]), target, ctx, N_CTX + 16, max_draft=(7, 4, 6)[i % 3], n_threads=1)
            if which == "eagle3-d2t":
                propose = d.propose
                d.propose = lambda h, n, k: [drafted_ids.add(t) or t for t in propose(h, n, k)]
            return d

        return which, make, (i // 3) % 2 == 1

    st = _check_all(target, plain_outputs, pick)
    assert st["eagle3"].drafted > 0 and st["eagle3"].acceptance < 0.05
    assert st["eagle3-echo"].acceptance > 0.1  # copies the token's embedding: the tiny target's next token, often
    assert st["eagle3-d2t"].drafted > 0 and drafted_ids
    assert all(t % 4 == 0 for t in drafted_ids)  # the d2t map of Eagle3Spec: draft row r -> target id 4r


def test_both_are_lossless_on_a_hybrid_qwen35_target(tiny_qwen35, tiny_dir):
    """52 cases x 128 tokens on the tiny qwen35 (Gated-DeltaNet + attention), DFlash2 and EAGLE-3 alternating,
    fixed and adaptive length (the adaptive calibration goes through the hybrid cache's checkpoint restore)."""
    target = Model(tiny_qwen35)
    d2 = write_dflash2(tiny_dir / "q35-dflash2.gguf", DFlash2Spec(target_layers=[1, 3, 5], seed=6))
    e3 = write_eagle3(tiny_dir / "q35-eagle3.gguf", Eagle3Spec(target_layers=[1, 3, 5], echo=4.0, fc_scale=0.3))
    per: dict[str, Stats] = {}
    for i, text in enumerate(prompts(52, seed=9)):
        toks = target.tokenize(text)
        want, _ = generate(target, toks, 128)
        if i % 2 == 0:
            label, make = "dflash2", lambda ctx: DFlashDrafter(Model(d2), target, ctx, N_CTX + 16, n_threads=1)  # noqa: E731
        else:
            label, make = "eagle3", lambda ctx: Eagle3Drafter(Model(e3), target, ctx, N_CTX + 16, 6, n_threads=1)  # noqa: E731
        adaptive = (i // 2) % 2 == 1
        got, st = generate(target, toks, 128, make, adaptive=adaptive, n_rs_seq=9)
        assert len(want) == 128 and got == want, f"case {i} ({label}, adaptive={adaptive}) diverged"
        per.setdefault(label, Stats()).merge(st)
    assert per["dflash2"].drafted > 0 and per["eagle3"].accepted > 0  # the echo drafter is right now and then


def test_lookup_first_is_lossless_with_both(target, plain_outputs, files):
    made = []

    def pick(i):
        path = files[("dflash2-b8", "eagle3-echo")[i % 2]]

        def make(ctx):
            inner = (DFlashDrafter(Model(path), target, ctx, N_CTX + 16, n_threads=1) if i % 2 == 0
                     else Eagle3Drafter(Model(path), target, ctx, N_CTX + 16, 6, n_threads=1))
            made.append(LookupFirstDrafter(inner))
            return made[-1]

        return made and made[-1].name or "lookup", make, False

    _check_all(target, plain_outputs, pick, limit=12)
    assert {d.name for d in made} == {"dflash2+ngram", "eagle3+ngram"}
    assert sum(d.looked_up for d in made) > 0 and sum(d.modelled for d in made) > 0


@pytest.mark.parametrize("which", ["dflash2-b8", "eagle3-echo"])
def test_sampled_output_equals_plain_sampling_with_same_seed(target, files, which):
    for seed, text in enumerate(prompts(6, seed=3)):
        toks = target.tokenize(text)
        sp = SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
        if which.startswith("dflash2"):
            make = lambda ctx: DFlashDrafter(Model(files[which]), target, ctx, N_CTX + 16, n_threads=1)  # noqa: E731
        else:
            make = lambda ctx: Eagle3Drafter(Model(files[which]), target, ctx, N_CTX + 16, 4, n_threads=1)  # noqa: E731
        assert generate(target, toks, 64, make, sampling=sp)[0] == generate(target, toks, 64, sampling=sp)[0]


def test_lattice_walk_follows_the_pairwise_scores():
    """Each position takes the best candidate *given the previous choice*, not its own best; p_min stops the walk."""
    top_k, d = 2, 8
    rows = np.zeros((4, d), np.float32)
    rows[1, :2] = [10, 11]  # candidate ids at position 1
    rows[1, 2:6] = [1.0, 3.0, 1.0, 3.0]  # position 1 scores (same for every predecessor): candidate 1 wins
    rows[2, :2] = [20, 21]
    rows[2, 2:6] = [5.0, 0.0, 0.0, 2.0]  # after candidate 0: pick 0; after candidate 1: pick 1
    rows[3, :2] = [30, 31]
    rows[3, 2:6] = [9.0, 0.0, 0.0, 0.1]  # after 1: nearly a tie (p = 0.52)
    assert walk_lattice(rows, top_k, 3) == [11, 21, 31]
    assert walk_lattice(rows, top_k, 2) == [11, 21]
    assert walk_lattice(rows, top_k, 3, p_min=0.6) == [11, 21]  # position 3's choice has p 0.52 < 0.6


def test_eagle3_cache_equals_one_built_from_the_committed_text(target, files):
    """After many draft/verify cycles the drafter's KV pairs (token[P+1], g[P]) match a one-go rebuild."""
    path = files["eagle3"]
    toks = target.tokenize("the river of quiet stone and nine silver hills")
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1))
    drafter = Eagle3Drafter(Model(path), target, ctx, N_CTX + 16, 4, n_threads=1)
    engine = Engine(target, ctx, drafter, adaptive=False)
    out = [t for c in engine.generate(toks, 80) for t in c]
    committed = engine.tokens
    assert committed == toks + out[:-1]  # the last emitted token is not yet in any cache
    assert drafter.n_fed == len(committed) and drafter.ctx.pos_max() == len(committed) - 2  # the last pair waits

    def seed_logits(d: Eagle3Drafter) -> np.ndarray:
        """The first draft step's logits: the pending pair completed with the newest token."""
        d.batch.decode([out[-1]], d.pending[None, :], [len(committed) - 1], [True])
        return d.ctx.logits(0).copy()

    def rebuilt(tokens) -> np.ndarray:
        fresh_ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1))
        fresh = Eagle3Drafter(Model(path), target, fresh_ctx, N_CTX + 16, 4, n_threads=1)
        fresh_ctx.decode(tokens, 0, "last")
        fresh.on_target_decode(fresh_ctx, 0, len(tokens))
        return seed_logits(fresh)

    spec_logits = seed_logits(drafter)
    same = np.abs(spec_logits - rebuilt(committed)).max()
    assert same < 1e-2  # one big batch vs many verify batches: F32 kernels differ in the last bits only
    corrupted = list(committed)
    corrupted[len(toks) + 5] = (corrupted[len(toks) + 5] + 1) % target.n_vocab
    assert np.abs(spec_logits - rebuilt(corrupted)).max() > 20 * max(same, 1e-4)  # a wrong pair shows
    engine.close()


def test_wrong_kind_and_misfit_drafters_fail_in_one_line(lf, tiny_dir, tiny_target):
    cases = {
        "dflash2 without keys": (write_dflash2(tiny_dir / "d2-nokeys.gguf", DFlash2Spec(target_layers=[1, 2, 3], omit_keys=True)), "auto", "conv/selector metadata"),
        "eagle3 too wide": (write_eagle3(tiny_dir / "e3-wide.gguf", Eagle3Spec(target_hidden_size=128)), "auto", "target_hidden_size 128"),
        "eagle3 too deep": (write_eagle3(tiny_dir / "e3-deep.gguf", Eagle3Spec(target_layers=[1, 2, 9])), "eagle3", "[1, 2, 9]"),
        "eagle3 file as dflash": (write_eagle3(tiny_dir / "e3-plain.gguf", Eagle3Spec()), "dflash", "not a DFlash drafter"),
        "dflash2 file as eagle3": (write_dflash2(tiny_dir / "d2-ok.gguf", DFlash2Spec(target_layers=[1, 2])), "eagle3+ngram", "not an EAGLE-3"),
        "dflash1 file as eagle3": (write_dflash(tiny_dir / "d1.gguf", DFlashSpec(target_layers=[1, 2])), "eagle3", "not an EAGLE-3"),
    }
    for what, (path, spec, needle) in cases.items():
        r = lf("run", "--model", tiny_target, "--drafter", path, "--spec", spec, "-n", "4", "-t", "1", "hello")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode != 0, what
        assert lines and lines[0].startswith("error: ") and needle in lines[0], (what, r.stderr)
        assert len(lines) <= 2 and all(ln.startswith(("error: ", "hint: ")) for ln in lines), (what, r.stderr)
        assert "Traceback" not in r.stderr


def test_plan_prices_the_published_dflash2_and_eagle3_shapes(tmp_path):
    """Shaped (weightless) copies of the published drafters: llama.cpp loads them, the planner prices them."""
    from dataclasses import replace

    from localflash.plan.devices import Gpu, HostMemory
    from localflash.formats.gguf_meta import read_meta
    from localflash.plan import Wishes, make_plan
    from localflash.testing.shaped import PRESETS, write_preset, write_shaped

    gib = 1 << 30
    card, host = [Gpu(0, "RTX 3090", 24 * gib, 24 * gib)], HostMemory(64 * gib, 32 * gib)
    for preset, arch, taps in (("qwen3.8-27b-dflash2", "dflash", [2, 17, 32, 47, 62]), ("qwen3-8b-eagle3", "eagle3", [2, 18, 33])):
        small = write_shaped(tmp_path / f"{preset}.gguf", replace(PRESETS[preset], n_vocab=32000), "Q4_K_M", tokenizer=True)
        m = Model(small)
        assert (m.arch, m.target_layer_ids()) == (arch, taps)
        assert m.dflash_selector_top_k() == (8 if arch == "dflash" else 0)
        assert m.size_bytes == read_meta(small).weight_bytes  # the planner's weight bytes are llama.cpp's
        m.close()
    d2 = read_meta(write_preset(tmp_path, "qwen3.8-27b-dflash2", "Q4_K_M"))
    assert 0.95 * gib < d2.weight_bytes < 1.1 * gib  # "~1 GB Q4"
    target = read_meta(write_preset(tmp_path, "qwen3.6-27b", "Q4_K_M"))
    plan = make_plan(target, d2, card, host, Wishes(ctx=32768, n_draft=7))
    gpu = plan.devices[0]
    assert plan.n_ctx == 32768 and gpu.drafter_weights >= d2.weight_bytes - d2.input_bytes
    assert gpu.used <= 24 * gib
    e3 = read_meta(write_preset(tmp_path, "qwen3-8b-eagle3", "Q4_K_M"))
    assert e3.n_embd_inp == 3 * 4096 and e3.target_hidden_size == 4096
    plan = make_plan(read_meta(write_preset(tmp_path, "qwen3-8b", "Q4_K_M")), e3, card, host, Wishes(ctx=32768, n_draft=8))
    assert plan.devices[0].drafter_kv > 0 and plan.devices[0].drafter_weights >= e3.weight_bytes


def test_models_check_validates_eagle3_and_dflash2_pairs(tmp_path, tiny_target, files):
    from localflash.registry.check import check_pair
    from localflash.registry.pairs import load_pairs

    wide = write_eagle3(tmp_path / "e3-wide.gguf", Eagle3Spec(target_hidden_size=96))
    deep = write_eagle3(tmp_path / "e3-deep.gguf", Eagle3Spec(target_layers=[1, 2, 7]))
    body = "".join(
        f'[pairs.{name}]\ntarget = "{tiny_target}"\ndrafter = "{path}"\nkind = "{kind}"\n\n'
        for name, path, kind in (
            ("e3", files["eagle3-d2t"], "eagle3"), ("e3-lookup", files["eagle3"], "eagle3+ngram"),
            ("d2", files["dflash2-b8"], "dflash"), ("e3-wide", wide, "eagle3"), ("e3-deep", deep, "eagle3"),
            ("d2-as-e3", files["dflash2-b8"], "eagle3"), ("e3-as-draft", files["eagle3"], "draft"),
        )
    )
    (tmp_path / "models.toml").write_text(body)
    pairs = load_pairs([tmp_path / "models.toml"])

    def check(name):
        rows, ok = check_pair(pairs[name])
        return {what: (good, detail) for what, good, detail in rows}, ok

    rows, ok = check("e3")
    assert ok and rows["target width"][0] and rows["layer ids"][0] and "8000 ids" in rows["draft vocabulary"][1]
    assert check("e3-lookup")[1]
    rows, ok = check("d2")
    assert ok and "DFlash2: top-4" in rows["selector"][1]
    rows, ok = check("e3-wide")
    assert not ok and rows["target width"] == (False, "target_hidden_size 96, target 64")
    rows, ok = check("e3-deep")
    assert not ok and rows["layer ids"][0] is False
    rows, ok = check("d2-as-e3")
    assert not ok and 'set kind = "dflash"' in rows["drafter arch"][1]
    assert not check("e3-as-draft")[1]


def test_a_second_request_reusing_the_cache_stays_lossless(target, files):
    """Prefix reuse cuts the drafters' caches back (rollback); the next request is still plain greedy's."""
    first = target.tokenize("the river of quiet stone and nine silver hills")
    for which in ("eagle3-echo", "dflash2-b8"):
        ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1))
        if which.startswith("eagle3"):
            drafter = Eagle3Drafter(Model(files[which]), target, ctx, N_CTX + 16, 4, n_threads=1)
        else:
            drafter = DFlashDrafter(Model(files[which]), target, ctx, N_CTX + 16, n_threads=1)
        engine = Engine(target, ctx, drafter, adaptive=False)
        out = [t for c in engine.generate(first, 40) for t in c]
        for second in (first + out[:25] + target.tokenize("a garden")[1:], first[:6] + target.tokenize("of light")[1:]):
            got = [t for c in engine.generate(second, 48) for t in c]
            assert got == generate(target, second, 48)[0], which
            assert drafter.ctx.pos_max() <= len(engine.tokens)
        engine.close()
