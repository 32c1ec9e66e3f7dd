"""The target's rows sampled in llama.cpp's graph: lossless, same-seed identical to plain decoding on that path.

On this CPU build the in-graph path is forced on (``sample_in_graph=True`` / ``--sample-in-graph on``):
the target context carries llama.cpp's chain and only token ids come back. Greedy speculative output
equals plain greedy output; sampled speculative output equals plain sampled output of the same seed
(the transactional ``dist``: rejected rows leave the stream alone, each committed token advances it);
the two paths draw differently for the same seed (mt19937 vs PCG64, float32 vs float64), each
identical to itself.

Equality is claimed where a row's logits do not depend on the batch it is in (the tiny F32 llama with
exact mode's per-context options, as in test_speculative.py). The tiny F32 qwen35 hybrid is not
batch-invariant (verify rows differ from one-row decodes by ~1e-5, in exact mode too), and the graph's
``dist`` inverts a float32 cumulative sum over the whole vocabulary in id order, so with top-k off a
uniform near 1 can land on a neighbouring id there (measured: token 29 of one prompt, u = 0.99599,
4e-6 from a boundary); the hybrid's sampled case therefore keeps top-k on (40 candidates).
"""

from __future__ import annotations

import pytest

from localflash.config import config_from
from localflash.engine import exact_kwargs, open_engine
from localflash.errors import LocalflashError
from localflash.llama import Context, ContextOptions, Model, ModelOptions, gpu_offload_supported
from localflash.llama.graph_sampling import logits_bytes_to_host
from localflash.speculative.dflash import DFlashDrafter
from localflash.speculative.draft_model import DraftModelDrafter
from localflash.speculative.drafter import NgramDrafter
from localflash.speculative.loop import Engine
from localflash.speculative.sampling import SamplingParams
from localflash.speculative.stats import Stats
from localflash.testing.prompts import word_prompts

N_CTX = 512
EXACT_MODEL, EXACT_CTX = exact_kwargs("llama")
SETTINGS = [SamplingParams(0.7, 40, 0.9, 0.0), SamplingParams(1.0, 0, 1.0, 0.0), SamplingParams(0.8, 40, 0.95, 0.05)]


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target, ModelOptions(**EXACT_MODEL))


def generate(target, tokens, n, make_drafter=None, sampling=None, in_graph=True, n_outputs_max=17, runs=1):
    """Outputs of ``runs`` requests of the same prompt on one engine (the chain reset in between), and the last stats."""
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=n_outputs_max, n_threads=1, **EXACT_CTX))
    engine = Engine(target, ctx, make_drafter(ctx) if make_drafter else None, adaptive=False, sample_in_graph=in_graph)
    outs = []
    for _ in range(runs):
        st = Stats()
        outs.append([t for chunk in engine.generate(tokens, n, sampling, st) for t in chunk])
    engine.close()
    return outs, st


DRAFTERS = {
    "draft-model": lambda target, paths: (lambda ctx: DraftModelDrafter(Model(paths["near"]), target, N_CTX, 8, n_threads=1)),
    "dflash": lambda target, paths: (lambda ctx: DFlashDrafter(Model(paths["dflash"]), target, ctx, N_CTX + 16, n_threads=1,
                                                               in_graph_argmax=True)),
    "ngram": lambda target, paths: (lambda ctx: NgramDrafter(8)),
}


@pytest.fixture(scope="module")
def paths(tiny_drafters, tiny_dflash):
    return {"near": tiny_drafters["near"], "dflash": tiny_dflash}


@pytest.mark.parametrize("kind", list(DRAFTERS))
def test_greedy_speculative_equals_plain_greedy_on_the_graph_path(target, paths, kind):
    drafted = accepted = 0
    for text in word_prompts(10, seed=11):
        toks = target.tokenize(text)
        (plain,), st_plain = generate(target, toks, 64, n_outputs_max=1)
        (host,), _ = generate(target, toks, 64, in_graph=False)
        (spec,), st = generate(target, toks, 64, DRAFTERS[kind](target, paths))
        assert st_plain.sampled_in == st.sampled_in == "graph"
        assert plain == host  # the graph's argmax is NumPy's
        assert spec == plain, text
        drafted, accepted = drafted + st.drafted, accepted + st.accepted
    assert drafted > 0 and (kind == "dflash" or accepted > 0)  # a random DFlash block is (almost) never right


@pytest.mark.parametrize("setting", SETTINGS, ids=["top-p", "unfiltered", "top-k+top-p+min-p"])
def test_same_seed_sampled_speculative_equals_plain_on_the_graph_path(target, paths, setting):
    """The transactional stream: a verify pass's rejected rows draw nothing that counts; plain decoding on a
    one-row context (dist without transactions) and on a 17-row one draw the same stream."""
    make = DRAFTERS["draft-model"](target, paths)
    differ_from_host = accepted = 0
    for seed, text in enumerate(word_prompts(8, seed=4)):
        toks = target.tokenize(text)
        sp = SamplingParams(setting.temperature, setting.top_k, setting.top_p, setting.min_p, seed=seed)
        (one_row,), _ = generate(target, toks, 48, sampling=sp, n_outputs_max=1)
        (plain,), _ = generate(target, toks, 48, sampling=sp)
        (spec, again), st = generate(target, toks, 48, make, sampling=sp, runs=2)
        (host,), st_host = generate(target, toks, 48, sampling=sp, in_graph=False)
        assert one_row == plain == spec == again, text  # again: the same seed restarts the stream on the next request
        assert st.sampled_in == "graph" and st_host.sampled_in == "host"
        differ_from_host += host != plain
        accepted += st.accepted
    assert accepted > 0
    assert differ_from_host > 0  # the two paths' draws differ (docs: "Sampling in the graph")


def test_skipping_the_accept_breaks_same_seed_identity(target, paths, monkeypatch):
    """The test above can fail: without llama_sampler_accept the stream never advances past the first draw."""
    monkeypatch.setattr(Context, "accept_sampled", lambda self, tokens: None)
    make = DRAFTERS["draft-model"](target, paths)
    mismatches = 0
    for seed, text in enumerate(word_prompts(4, seed=4)):
        toks = target.tokenize(text)
        sp = SamplingParams(1.0, 0, 1.0, 0.0, seed=seed)
        (plain,), _ = generate(target, toks, 48, sampling=sp, n_outputs_max=1)  # one row per decode: no transactions
        (spec,), _ = generate(target, toks, 48, make, sampling=sp)
        mismatches += spec != plain
    assert mismatches > 0


def test_a_sampling_change_between_requests_takes_effect(target):
    """One engine, one chain at a time: each request's settings and seed are the ones it ran with."""
    toks = target.tokenize("the river of quiet stone and")
    a, b = SamplingParams(1.0, 0, 1.0, 0.0, seed=1), SamplingParams(1.0, 0, 1.0, 0.0, seed=2)
    top1 = SamplingParams(1.0, 1, 1.0, 0.0, seed=1)  # top-k 1: the greedy token whatever the draw
    fresh = {name: generate(target, toks, 32, sampling=sp)[0][0] for name, sp in (("greedy", None), ("a", a), ("b", b))}
    assert fresh["a"] != fresh["b"] != fresh["greedy"] != fresh["a"]
    ctx = Context(target, ContextOptions(n_ctx=N_CTX, n_outputs_max=9, n_threads=1, **EXACT_CTX))
    engine = Engine(target, ctx, NgramDrafter(8), adaptive=False, sample_in_graph=True)
    got = [[t for c in engine.generate(toks, 32, sp) for t in c] for sp in (None, a, b, a, top1, None)]
    engine.close()
    assert got == [fresh["greedy"], fresh["a"], fresh["b"], fresh["a"], fresh["greedy"], fresh["greedy"]]


def test_hybrid_target_is_lossless_and_same_seed_identical_on_the_graph_path(tiny_qwen35, tiny_qwen35_drafters, tiny_qwen35_dflash):
    """qwen35 through the real load path (``--sample-in-graph on``): snapshot rollbacks after every rejection."""
    def load(spec="none", drafter=None):
        return open_engine(config_from(None, str(tiny_qwen35), str(drafter) if drafter else None, spec=spec, ctx=1024, threads=1,
                                       adaptive=False, draft_max=4 if spec != "none" else None, sample_in_graph="on"))

    plain = load()
    specs = {"draft": load("draft", tiny_qwen35_drafters["near"]), "dflash": load("dflash", tiny_qwen35_dflash)}
    try:
        for seed, text in enumerate(word_prompts(6, seed=9)):
            toks = plain.target.tokenize(text)
            for sp in (None, SamplingParams(0.9, 40, 1.0, 0.0, seed=seed)):
                want = [t for c in plain.generate(toks, 48, sp) for t in c]
                for name, eng in specs.items():
                    st = Stats()
                    got = [t for c in eng.generate(toks, 48, sp, st) for t in c]
                    assert got == want, (name, text, sp)
                    assert st.sampled_in == "graph" and st.drafted > 0
        assert specs["draft"].ctx.counts["snapshot"] > 0
    finally:
        for e in [plain, *specs.values()]:
            e.close()


def test_the_load_option_resolves_where_it_can(tiny_target, tiny_dflash):
    """auto: on where the target's output layer is on a GPU (off on a CPU build); on attaches; parallel slots resolve
    alike (each request's chain on its slot's sequence); a tree refuses on."""
    def stats_of(parallel=1, **kw):
        eng = open_engine(config_from(None, str(tiny_target), None, spec="ngram", ctx=256 * parallel, threads=1, parallel=parallel, **kw))
        st = Stats()
        one = eng.slots[parallel - 1] if parallel > 1 else eng
        list(one.generate(eng.target.tokenize("a b c"), 4, None, st))
        eng.close()
        return st

    for parallel in (1, 2):
        assert stats_of(parallel).sampled_in == ("graph" if gpu_offload_supported() else "host")  # auto: the tiny target loads with -ngl -1
        assert stats_of(parallel, sample_in_graph="on").sampled_in == "graph"
        assert stats_of(parallel, sample_in_graph="off").sampled_in == "host"
    with pytest.raises(LocalflashError, match="--tree"):
        config_from(None, str(tiny_target), None, spec="ngram", tree=8, sample_in_graph="on")
    with pytest.raises(LocalflashError, match="unknown --sample-in-graph"):
        config_from(None, str(tiny_target), None, sample_in_graph="gpu")
    st = stats_of(tree=8)  # a tree keeps the host path under auto
    assert st.sampled_in == "host"


def test_logits_cross_to_the_host_by_the_row_or_by_the_id():
    """A block-16 verify at the 248,320-token vocabulary: 15.9 MB of logits, or 64 bytes of ids."""
    assert logits_bytes_to_host(16, 248_320, in_graph=False) == 15_892_480
    assert logits_bytes_to_host(16, 248_320, in_graph=True) == 64
