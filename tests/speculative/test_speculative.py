"""Lossless speculative decoding: every drafter's output equals plain decoding's, token for token."""

from __future__ import annotations

import numpy as np
import pytest

from localflash.errors import LocalflashError
from localflash.llama import Context, ContextOptions, Model, ModelOptions
from localflash.engine import exact_kwargs
from localflash.speculative import loop
from localflash.speculative.dflash import DFlashDrafter
from localflash.speculative.draft_model import DraftModelDrafter
from localflash.speculative.drafter import LookupFirstDrafter, NgramDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats
from localflash.formats.dflash_gguf import DFlashSpec
from localflash.testing.tiny import TinySpec, write_dflash, write_target
from localflash.testing.prompts import word_prompts

N_CTX = 1024
# equality is claimed where a row's logits do not depend on its batch: exact mode's per-model and per-context
# options, without its process-wide tiled-matmul switch (this pytest process keeps the default numerics): the
# tiny F32 target has no weight that kernel takes, and tests/llama/test_exact.py shows these options alone make
# its verify rows equal one-row decodes (where the default numerics do not)
EXACT_MODEL, EXACT_CTX = exact_kwargs("llama")


def prompts(n: int, seed: int = 0) -> list[str]:
    return word_prompts(n, seed)


def generate(model: Model, tokens, n, make_drafter=None, sampling=None, draft_max=None, adaptive=False, n_batch=64):
    ctx = Context(model, ContextOptions(n_ctx=N_CTX, n_batch=n_batch, n_ubatch=n_batch, n_outputs_max=17, n_threads=1, **EXACT_CTX))
    drafter = make_drafter(ctx) if make_drafter else None
    engine = Engine(model, ctx, drafter, adaptive=adaptive, draft_max=draft_max)
    stats = Stats()
    out = [t for chunk in engine.generate(tokens, n, sampling, stats) for t in chunk]
    engine.close()
    return out, stats


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target, ModelOptions(**EXACT_MODEL))


@pytest.fixture(scope="module")
def plain_outputs(target):
    """Plain greedy continuations of 52 prompts, 128 tokens each."""
    cases = [target.tokenize(p) for p in prompts(52)]
    return cases, [generate(target, toks, 128)[0] for toks in cases]


def _check_all(target, plain_outputs, make_drafter, adaptive=False, limit=None):
    """Each case picks its drafter via ``make_drafter(case_index, ctx)``; returns stats per label."""
    cases, expected = plain_outputs
    per_label: dict[str, Stats] = {}
    n = 0
    for i, (toks, want) in enumerate(list(zip(cases, expected))[:limit]):
        label, maker, dmax = make_drafter(i)
        got, st = generate(target, toks, 128, maker, draft_max=dmax, adaptive=adaptive)
        assert got == want, f"case {i} ({label}) diverged"
        per_label.setdefault(label, Stats()).merge(st)
        n += 1
    assert n >= (limit or 50) and all(len(w) == 128 for w in expected[:n])
    return per_label


BLOCKS = (4, 8, 16)


def test_ngram_is_lossless(target, plain_outputs):
    st = _check_all(target, plain_outputs, lambda i: ("ngram", lambda ctx: NgramDrafter(8), 8))["ngram"]
    assert st.drafted > 0 and st.accepted > 0  # repetitive prompts feed the lookup


def test_draft_model_is_lossless(target, plain_outputs, tiny_drafters):
    """Drafter = target (always right), a noisy copy (sometimes right), a far one (mostly wrong); blocks 4/8/16."""

    def pick(i):
        which, block = ("same", "near", "far")[i % 3], BLOCKS[(i // 3) % 3]
        path = tiny_drafters[which]
        return which, (lambda ctx: DraftModelDrafter(Model(path), target, N_CTX, block - 1, n_threads=1)), block - 1

    st = _check_all(target, plain_outputs, pick)
    assert st["same"].accepted == st["same"].drafted > 0
    assert 0 < st["near"].acceptance < 1
    assert st["far"].acceptance < 0.5


def test_dflash_is_lossless(target, plain_outputs, tiny_dir):
    paths = {
        b: write_dflash(tiny_dir / f"dflash-b{b}.gguf", DFlashSpec(target_layers=[1, 2, 3], block_size=b, seed=b))
        for b in BLOCKS
    }

    def pick(i):
        block = BLOCKS[i % 3]
        return f"b{block}", (lambda ctx: DFlashDrafter(Model(paths[block]), target, ctx, N_CTX + 16, n_threads=1)), block - 1

    st = _check_all(target, plain_outputs, pick)
    assert all(s.drafted > 0 for s in st.values())  # random weights: (almost) always wrong, still lossless


def test_dflash_with_lookup_first_is_lossless_and_keeps_the_drafter_in_step(target, plain_outputs, tiny_dflash):
    """Prompt lookup drafts where it finds a match, DFlash elsewhere; the DFlash cache sees every committed row."""
    made = []

    def pick(i):
        def make(ctx):
            d = LookupFirstDrafter(DFlashDrafter(Model(tiny_dflash), target, ctx, N_CTX + 16, n_threads=1))
            made.append(d)
            return d
        return "dflash+ngram", make, 15

    st = _check_all(target, plain_outputs, pick, limit=20)["dflash+ngram"]
    assert st.drafted > 0 and st.accepted > 0
    assert sum(d.looked_up for d in made) > 0 and sum(d.modelled for d in made) > 0  # both sources drafted
    # after a mix of lookup and DFlash cycles the drafter's features cover exactly the committed tokens
    both = 0
    for text in prompts(12):  # random weights rarely repeat: a few of these mix both sources
        toks = target.tokenize(text)
        ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1, **EXACT_CTX))
        hybrid = LookupFirstDrafter(DFlashDrafter(Model(tiny_dflash), target, ctx, N_CTX + 16, n_threads=1))
        engine = Engine(target, ctx, hybrid, adaptive=False)
        out = [t for c in engine.generate(toks, 128) for t in c]
        both += hybrid.looked_up > 0 and hybrid.modelled > 0
        assert hybrid.model.n_injected == len(engine.tokens) == len(toks) + len(out) - 1
        # in its cache, or held on the host since the lookup's last drafts (taken in before the model's next draft)
        assert hybrid.model.ctx.pos_max() + 1 + hybrid.model.n_held == len(engine.tokens)
        hybrid.model.catch_up()
        assert hybrid.model.ctx.pos_max() == len(engine.tokens) - 1
        engine.close()
    assert both > 0
    # sampled: the same seed gives the plain sampler's text
    for seed, text in enumerate(prompts(6, seed=5)):
        toks = target.tokenize(text)
        sp = SamplingParams(temperature=0.8, seed=seed)
        make = lambda ctx: LookupFirstDrafter(DFlashDrafter(Model(tiny_dflash), target, ctx, N_CTX + 16, n_threads=1))  # noqa: E731
        assert generate(target, toks, 48, make, sampling=sp)[0] == generate(target, toks, 48, sampling=sp)[0]


class OracleDrafter(NgramDrafter):
    """Test-only: proposes the known plain continuation, optionally corrupting one random position."""

    name = "oracle"

    def __init__(self, prompt_len, continuation, max_draft, rng=None):
        super().__init__(max_draft)
        self.prompt_len, self.continuation, self.rng = prompt_len, continuation, rng

    def propose(self, history, n_past, k):
        i = len(history) - self.prompt_len  # tokens emitted so far = index of the next one
        draft = list(self.continuation[i : i + k])
        if self.rng is not None and draft:
            j = int(self.rng.integers(0, len(draft) + 1))
            if j < len(draft):
                draft[j] = (draft[j] + 1) % 32000
        return draft


def test_verify_loop_always_right_and_random(target, plain_outputs):
    cases, expected = plain_outputs

    def pick(i):
        mode, block = ("right", "random")[i % 2], BLOCKS[(i // 2) % 3]
        toks, want = cases[i], expected[i]
        rng = np.random.default_rng(i) if mode == "random" else None
        return mode, (lambda ctx: OracleDrafter(len(toks), want + [0] * 16, block - 1, rng)), block - 1

    st = _check_all(target, plain_outputs, pick)
    assert st["right"].accepted == st["right"].drafted and st["right"].tau > 3
    assert 0 < st["random"].acceptance < 1


def test_adaptive_length_is_lossless(target, plain_outputs, tiny_drafters):
    path = tiny_drafters["near"]
    pick = lambda i: ("near", lambda ctx: DraftModelDrafter(Model(path), target, N_CTX, 8, n_threads=1), 8)  # noqa: E731
    _check_all(target, plain_outputs, pick, adaptive=True, limit=12)


@pytest.mark.parametrize("temp,top_p", [(0.7, 0.9), (1.0, 1.0)])
def test_sampled_output_equals_plain_sampling_with_same_seed(target, tiny_drafters, temp, top_p):
    path = tiny_drafters["near"]
    for seed, text in enumerate(prompts(12, seed=3)):
        toks = target.tokenize(text)
        sp = SamplingParams(temperature=temp, top_p=top_p, seed=seed)
        plain, _ = generate(target, toks, 64, sampling=sp)
        spec, st = generate(target, toks, 64, lambda ctx: DraftModelDrafter(Model(path), target, N_CTX, 4, n_threads=1), sampling=sp, draft_max=4)
        assert spec == plain


def test_dflash_takes_the_prompt_in_during_prefill(target, tiny_dflash):
    """A short prompt's features (held: fewer than HOLD_ROWS rows) are in the drafter's cache once prefill is
    done, not left for the first cycle's draft to take in (where they would count as decode time)."""
    toks = target.tokenize("the river of quiet stone")
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1, **EXACT_CTX))
    drafter = DFlashDrafter(Model(tiny_dflash), target, ctx, N_CTX + 16, n_threads=1, in_graph_argmax=False)
    engine = Engine(target, ctx, drafter, adaptive=False)
    first = next(engine.generate(toks, 8))  # prefill and the prompt's last row: no cycle has run
    assert len(first) == 1 and drafter.n_held == 0
    assert drafter.n_injected == len(toks) and drafter.ctx.pos_max() == len(toks) - 1
    engine.close()


def test_dflash_injects_exactly_the_committed_positions(target, tiny_dflash):
    """After many cycles the drafter's cache equals one built from the committed text in one go."""
    toks = target.tokenize("the river of quiet stone and nine silver hills")
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1, **EXACT_CTX))
    drafter = DFlashDrafter(Model(tiny_dflash), target, ctx, N_CTX + 16, n_threads=1, in_graph_argmax=False)
    engine = Engine(target, ctx, drafter, adaptive=False)
    out = [t for c in engine.generate(toks, 80) for t in c]
    committed = engine.tokens
    assert committed == toks + out[:-1]  # the last emitted token is not yet in any cache
    assert drafter.n_injected == len(committed)
    assert drafter.n_held <= 2  # the last cycle drafted nothing (one token left): its rows are held
    drafter.catch_up()
    assert drafter.ctx.pos_max() == len(committed) - 1  # no noise block or rejected row left behind
    drafter.ctx.decode([out[-1]] + [drafter.mask] * 15, len(committed), "all")
    spec_logits = drafter.ctx.all_logits().copy()

    def rebuilt(tokens):
        """A drafter fed the features of ``tokens`` in one prefill, then asked for the same block."""
        fresh_ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=17, n_threads=1, **EXACT_CTX))
        fresh = DFlashDrafter(Model(tiny_dflash), target, fresh_ctx, N_CTX + 16, n_threads=1, in_graph_argmax=False)
        fresh_ctx.decode(tokens, 0, "last")
        fresh.on_target_decode(fresh_ctx, 0, len(tokens))
        fresh.catch_up()
        fresh.ctx.decode([out[-1]] + [fresh.mask] * 15, len(committed), "all")
        return fresh.ctx.all_logits().copy()

    # one big batch vs many verify batches: F32 kernels differ by batch shape in the last bits only
    same = np.abs(spec_logits - rebuilt(committed)).max()
    assert same < 1e-2
    # a single wrong (e.g. rejected) row among the injected positions shows up far above that noise
    corrupted = list(committed)
    corrupted[len(toks) + 5] = (corrupted[len(toks) + 5] + 1) % target.n_vocab
    assert np.abs(spec_logits - rebuilt(corrupted)).max() > 20 * max(same, 1e-4)


def test_bad_pairs_are_refused(target, tiny_dir, tiny_target, tiny_dflash):
    renamed = write_target(tiny_dir / "renamed.gguf", TinySpec(n_layer=2, rename_tokens=True))
    with pytest.raises(LocalflashError, match="different tokenizers"):
        DraftModelDrafter(Model(renamed), target, 256)
    ctx = Context(target, ContextOptions(n_ctx=256, n_threads=1, **EXACT_CTX))
    deep = write_dflash(tiny_dir / "deep.gguf", DFlashSpec(target_layers=[1, 9]))
    with pytest.raises(LocalflashError, match="has 4 layers"):
        DFlashDrafter(Model(deep), target, ctx, 256)
    wide = write_dflash(tiny_dir / "wide.gguf", DFlashSpec(n_embd=128, n_head=4, target_layers=[1, 2]))
    with pytest.raises(LocalflashError, match="fuses 2 x 128"):
        DFlashDrafter(Model(wide), target, ctx, 256)
    with pytest.raises(LocalflashError, match="not a DFlash drafter"):
        DFlashDrafter(Model(tiny_target), target, ctx, 256)


def test_dflash_refuses_target_without_layer_inputs(tiny_dir, tiny_dflash):
    """qwen2 graphs do not export layer inputs: DFlash must say so and suggest other drafters."""
    from localflash.speculative.dflash import check_dflash_pair

    qwen2 = Model(tiny_dir / "target.gguf")
    qwen2.arch = "qwen2"  # the arch string is all the check reads; loading a real qwen2 needs its own tensors
    with pytest.raises(LocalflashError) as err:
        check_dflash_pair(qwen2, Model(tiny_dflash))
    assert "cannot export layer inputs" in err.value.message and "--spec draft" in err.value.hint


def test_accepting_every_draft_breaks_losslessness(target, plain_outputs, tiny_drafters, monkeypatch):
    """The equality tests can fail: a verify step that trusts the drafter diverges."""

    def trusting(ctx, draft, sample, is_eog):
        return list(draft) + [sample(ctx.logits(len(draft) if draft else -1))]

    monkeypatch.setattr(loop, "verify_block", trusting)
    cases, expected = plain_outputs
    path = tiny_drafters["far"]
    diverged = 0
    for toks, want in list(zip(cases, expected))[:5]:
        got, _ = generate(target, toks, 128, lambda ctx: DraftModelDrafter(Model(path), target, N_CTX, 4, n_threads=1), draft_max=4)
        diverged += got != want
    assert diverged == 5


def test_draft_model_windowed_catch_up_is_lossless(target, plain_outputs, tiny_drafters, monkeypatch):
    """Long stretches without drafting, then a burst: the draft cache is rebuilt from a window and stays usable."""
    from localflash.speculative import draft_model

    monkeypatch.setattr(draft_model, "CATCH_UP_MAX", 6)
    cases, expected = plain_outputs
    windows = 0
    for toks, want in list(zip(cases, expected))[:8]:
        ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_outputs_max=17, n_threads=1, **EXACT_CTX))
        drafter = DraftModelDrafter(Model(tiny_drafters["same"]), target, N_CTX, 4, n_threads=1)
        engine = Engine(target, ctx, drafter, adaptive=False, draft_max=4)
        cycle = iter(range(10**6))
        engine.policy.choose = lambda limit: min(4, limit) if next(cycle) % 12 >= 10 else 0  # 10 cycles off, 2 on
        stats = Stats()
        got = [t for chunk in engine.generate(toks, 128, None, stats) for t in chunk]
        windows += drafter.window_start > 0
        assert got == want
        assert stats.accepted > 0.5 * stats.drafted > 0  # drafter = target: from a short window it is still mostly right
        assert drafter.ctx.pos_max() == len(drafter.kv) - 1
        engine.close()
    assert windows == 8
