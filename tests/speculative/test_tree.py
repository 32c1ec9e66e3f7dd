"""Tree verification (speculative/tree.py): one target pass over a token tree, output equal to plain decoding's.

Equality is claimed in exact mode (``engine.exact_options``: a row's logits do not depend on its batch),
as for the chain (tests/speculative/test_speculative.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from localflash.config import config_from_options
from localflash.engine import exact_options, open_engine
from localflash.errors import LocalflashError
from localflash.llama import Context, ContextOptions, Model, ModelOptions
from localflash.speculative.dflash import DFlashDrafter
from localflash.speculative.draft_model import DraftModelDrafter
from localflash.speculative.drafter import Drafter, LookupFirstDrafter, NgramDrafter
from localflash.speculative.eagle3 import Eagle3Drafter
from localflash.speculative.loop import Engine, verify_block
from localflash.speculative.sampling import Sampler, SamplingParams
from localflash.speculative.stats import Stats
from localflash.speculative.adapt import CostTable
from localflash.speculative.tree import MAX_LEAVES, Tree, TreeSize, TreeVerifier, best_first, decode_tree, depth_first, prune, walk
from localflash.testing.prompts import word_prompts
from localflash.testing.tiny import DFlash2Spec, Eagle3Spec, write_dflash2, write_eagle3

N_CTX = 1024
N_TOKENS = 64
EXACT_MODEL, EXACT_CTX = exact_options(True, "llama")
def context(model) -> Context:
    return Context(model, ContextOptions(n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_outputs_max=33, n_threads=1,
                                         n_seq_max=MAX_LEAVES, **EXACT_CTX))


def generate(model, tokens, n, make_drafter=None, sampling=None, budget=0, draft_max=None, adaptive=False):
    ctx = context(model)
    drafter = make_drafter(ctx) if make_drafter else None
    engine = Engine(model, ctx, drafter, adaptive=adaptive, draft_max=draft_max)
    if budget:
        engine.tree = TreeVerifier(budget, size=TreeSize(CostTable()) if adaptive else None)
    stats = Stats()
    out = [t for chunk in engine.generate(tokens, n, sampling, stats) for t in chunk]
    redecoded = engine.tree.redecoded if budget else 0
    engine.close()
    return out, stats, redecoded


@pytest.fixture(scope="module")
def target(tiny_target):
    return Model(tiny_target, ModelOptions(**EXACT_MODEL))


@pytest.fixture(scope="module")
def cases(target):
    return [target.tokenize(p) for p in word_prompts(52)]


@pytest.fixture(scope="module")
def plain(target, cases):
    """Plain greedy continuations of 52 prompts."""
    return [generate(target, toks, N_TOKENS)[0] for toks in cases]


SAMPLING = [SamplingParams(temperature=0.8, top_p=0.95, seed=i) for i in range(52)]


@pytest.fixture(scope="module")
def plain_sampled(target, cases):
    """Plain sampled continuations of the same prompts, seed i for case i."""
    return [generate(target, toks, N_TOKENS, sampling=sp)[0] for toks, sp in zip(cases, SAMPLING)]


@pytest.fixture(scope="module")
def files(tiny_dir):
    return {
        "dflash2": write_dflash2(tiny_dir / "tree-dflash2.gguf", DFlash2Spec(target_layers=[1, 2, 3])),
        "eagle3-echo": write_eagle3(tiny_dir / "tree-eagle3-echo.gguf", Eagle3Spec(echo=4.0, fc_scale=0.3)),
    }


class OracleTree(Drafter):
    """Knows the plain continuation; hides it in a random branch of a random tree (sometimes wrong at a random depth)."""

    name = "oracle-tree"
    cost_grows_with_length = False

    def __init__(self, n_prompt: int, truth: list[int], rng, max_draft: int = 8):
        self.n_prompt, self.truth, self.rng, self.max_draft = n_prompt, truth + [0] * 64, rng, max_draft

    def propose_tree(self, history, n_past, k, budget):
        rng = self.rng
        done = len(history) - self.n_prompt
        right = self.truth[done : done + k]
        wrong_at = int(rng.integers(0, len(right) + 1)) if rng.random() < 0.5 else len(right)
        tokens, parents, node, leaves = [history[-1]], [-1], 0, 1
        for d, tok in enumerate(right):
            kids = [int(t) for t in rng.integers(1, 32000, size=int(rng.integers(0, 3)))]
            where = int(rng.integers(0, len(kids) + 1))
            kids.insert(where, tok if d != wrong_at else (tok + 1) % 32000)
            if len(tokens) - 1 + len(kids) > budget or leaves + len(kids) - 1 > MAX_LEAVES:
                break
            tokens += kids
            parents += [node] * len(kids)
            leaves += len(kids) - 1
            node = len(tokens) - len(kids) + where
        return depth_first(tokens, parents, [0.0] * len(tokens))


def check_all(target, cases, want, pick, sampling=None):
    """``pick(i) -> (label, make_drafter, budget)``; every case must equal ``want[i]``; stats and re-decoded rows per label.

    Every fifth case sizes its trees adaptively (TreeSize), the others verify the whole budget."""
    per: dict[str, list] = {}
    for i, toks in enumerate(cases):
        label, maker, budget = pick(i)
        got, st, redecoded = generate(target, toks, N_TOKENS, maker, sampling[i] if sampling else None, budget,
                                      adaptive=i % 5 == 4)
        assert got == want[i], f"case {i} ({label}, tree {budget}) diverged"
        acc = per.setdefault(label, [Stats(), 0])
        acc[0].merge(st)
        acc[1] += redecoded
    assert len(cases) >= 50
    return per


def test_walk_on_a_chain_is_verify_block():
    rng = np.random.default_rng(0)
    sample = Sampler()
    for _ in range(200):
        rows = rng.normal(size=(6, 50)).astype(np.float32)
        draft = [int(np.argmax(r)) if rng.random() < 0.7 else int(rng.integers(0, 50)) for r in rows[:5]]

        class Rows:  # what verify_block reads
            def all_logits(self):
                return rows

        path, new = walk(Tree.chain(7, draft), rows, sample, lambda t: t == 3)
        assert new == verify_block(Rows(), draft, sample, lambda t: t == 3)
        assert path == list(range(len(path)))


def test_best_first_takes_the_likeliest_paths_and_lays_them_out_depth_first():
    logp = np.log(np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]))
    ids = np.array([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    for budget in range(1, 12):
        tree = best_first(1, lambda depth, _: (ids[depth], logp[depth], None), budget, 3)
        # every path of the tree vs every path left out: the tree holds the best `budget` nodes
        all_scores = sorted((logp[0][a] + (logp[1][b] if d > 0 else 0) + (logp[2][c] if d > 1 else 0))
                            for d in range(3) for a in range(3) for b in range(3 if d > 0 else 1) for c in range(3 if d > 1 else 1))
        assert tree.n - 1 == budget
        assert np.isclose(sorted(tree.scores[1:])[0], sorted(all_scores, reverse=True)[budget - 1])
        assert tree.path(int(np.argmax(tree.depth == tree.depth.max()))) == list(range(tree.depth.max() + 1)) or budget < 3
        assert all(tree.parents[i] < i for i in range(1, tree.n))
    assert tree.tokens[:4].tolist() == [1, 10, 20, 30]  # the first path: each node's likeliest child


def test_prune_keeps_the_best_subtree_and_size_weighs_it_by_cost():
    logp = np.log(np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]))
    ids = np.array([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    full = best_first(1, lambda depth, _: (ids[depth], logp[depth], None), 12, 3)
    for n in range(13):
        small = best_first(1, lambda depth, _: (ids[depth], logp[depth], None), n, 3)
        cut = prune(full, n)
        assert cut.tokens.tolist() == small.tokens.tolist() and cut.parents.tolist() == small.parents.tolist()
    flat, linear = CostTable(), CostTable()
    for rows in (1, 4, 8, 16):
        flat.add(rows, 1.0)
        linear.add(rows, float(rows))
    assert TreeSize(flat).choose(full) == 12  # a flat verify (a GPU): every node pays
    assert TreeSize(linear).choose(full) <= 2  # each row costs as much as a token (this CPU at worst): little does
    assert TreeSize(CostTable()).choose(full) == 12  # nothing measured yet: the whole tree once


def test_each_tree_node_sees_exactly_its_path(target):
    """A tree pass gives every node the logits a chain decode of its own path gives it, bit for bit (exact mode)."""
    prefix = target.tokenize("the river of quiet stone")
    tokens = [prefix[-1], 100, 101, 102, 200, 201, 300, 301, 302, 303]
    parents = [-1, 0, 1, 2, 1, 4, 0, 6, 6, 6]
    tree = depth_first(tokens, parents, [0.0] * len(tokens))
    ctx = context(target)
    n_past = len(prefix) - 1
    ctx.decode(prefix[:-1], 0, "none")
    decode_tree(ctx, tree, n_past)
    got = ctx.all_logits().copy()
    assert tree.n_leaves == 5
    for node in range(tree.n):
        path = tree.path(node)
        ref = context(target)
        ref.decode(prefix[:-1], 0, "none")
        ref.decode(tree.tokens[path], n_past, "all")
        assert np.array_equal(ref.all_logits()[-1], got[node]), f"node {node} (path {path})"
        ref.close()
    ctx.close()


def test_oracle_trees_are_lossless_greedy_and_sampled_and_take_side_branches(target, cases, plain, plain_sampled):
    """The truth hidden in a random branch: accepted paths leave the first chain, get re-decoded in order."""
    for want, sampling in ((plain, None), (plain_sampled, SAMPLING)):
        def pick(i):
            budget = (4, 8, 15, 31)[i % 4]
            truth = want[i]
            return f"oracle/{budget}", (lambda ctx: OracleTree(len(cases[i]), truth, np.random.default_rng(i))), budget

        per = check_all(target, cases, want, pick, sampling)
        tot = Stats()
        for st, _ in per.values():
            tot.merge(st)
        assert tot.tree_cycles > 100 and tot.tau > 2
        assert sum(r for _, r in per.values()) > 50  # side branches were taken and compacted


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "draft", "eagle3", "ngram", "draft+ngram"])
def test_every_drafter_tree_equals_plain_decoding_greedy_and_sampled(kind, target, cases, plain, plain_sampled, tiny_dflash,
                                                                     tiny_drafters, files):
    def make(ctx):
        if kind == "dflash":
            return DFlashDrafter(Model(tiny_dflash), target, ctx, N_CTX + 16, n_threads=1)
        if kind == "dflash2":
            return DFlashDrafter(Model(files["dflash2"]), target, ctx, N_CTX + 16, n_threads=1)
        if kind == "eagle3":
            return Eagle3Drafter(Model(files["eagle3-echo"]), target, ctx, N_CTX + 16, max_draft=8, n_threads=1)
        if kind == "ngram":
            return NgramDrafter(8)
        draft = DraftModelDrafter(Model(tiny_drafters["near"]), target, N_CTX, 8, n_threads=1)
        return LookupFirstDrafter(draft) if kind.endswith("+ngram") else draft

    for want, sampling in ((plain, None), (plain_sampled, SAMPLING)):
        per = check_all(target, cases, want, lambda i: (kind, make, (4, 8, 15)[i % 3]), sampling)
        st = per[kind][0]
        assert st.cycles > 0 and st.drafted > 0
        if kind != "ngram":  # the tiny target's text rarely repeats itself: the lookup seldom drafts
            assert st.tree_cycles > 0.5 * st.cycles, f"{kind}: {st.tree_cycles} tree cycles of {st.cycles}"
        if kind in ("draft", "eagle3"):
            assert st.accepted > 0


def test_tree_stats_report_size_depth_and_rows(target, cases, plain, tiny_drafters):
    got, st, _ = generate(target, cases[1], N_TOKENS, lambda ctx: DraftModelDrafter(Model(tiny_drafters["near"]), target, N_CTX, 8, n_threads=1),
                          budget=15)
    assert got == plain[1]
    assert st.tree_cycles and 8 < st.mean_tree_nodes <= 15
    assert st.rows == st.drafted + st.cycles
    assert st.tau_per_row == st.committed / st.rows
    assert "tree" in st.summary() and len(st.pos_tries) <= 8
    assert st.to_dict()["mean_tree_nodes"] == st.mean_tree_nodes


def test_tree_is_refused_on_hybrid_targets_with_the_reason(tiny_qwen35):
    with pytest.raises(LocalflashError, match="its own recurrent state"):
        open_engine(config_from_options(model=str(tiny_qwen35), spec="ngram", tree=8, ctx=256, threads=1))


def test_tree_option_is_checked():
    with pytest.raises(LocalflashError, match="--tree must be in"):
        config_from_options(model="x.gguf", tree=-1)
    with pytest.raises(LocalflashError, match="--tree must be at most"):
        config_from_options(model="x.gguf", tree=63, exact=True)


def test_a_request_after_tree_cycles_prefills_full_batches(target, cases, plain, tiny_drafters):
    """The batch's rows carry a tree's sequence sets after a tree pass; the next prompt's full n_batch chunks
    (plus exact mode's padding row) must go back to sequence 0 whole."""
    ctx = context(target)
    engine = Engine(target, ctx, DraftModelDrafter(Model(tiny_drafters["near"]), target, N_CTX, 8, n_threads=1), adaptive=False)
    engine.tree = TreeVerifier(15)
    long_cases = [i for i, toks in enumerate(cases) if len(toks) > 2 * ctx.n_batch]
    assert long_cases
    for i in [1] + long_cases[:2]:
        st = Stats()
        assert [t for chunk in engine.generate(cases[i], N_TOKENS, None, st) for t in chunk] == plain[i]
        assert st.tree_cycles
    engine.close()


def test_tree_leaf_ranges_depths_and_children_match_a_naive_walk():
    """The array-built Tree (depths, each node's sequence ids, child lookup) equals what walking each node's
    ancestors says, on random best-first trees with repeated tokens and near-tied scores; pruning keeps that."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        table = {}

        def expand(depth, state):
            if (depth, state) not in table:
                ids = rng.integers(0, 6, size=int(rng.integers(0, 5)))  # a repeated token now and then
                table[depth, state] = ids, np.sort(np.round(rng.normal(-2, 1, len(ids)), 1))[::-1], [state * 8 + i + 1 for i in range(len(ids))]
            return table[depth, state]

        full = best_first(9, expand, int(rng.integers(0, 40)), int(rng.integers(1, 8)), root_state=0)
        for tree in (full, prune(full, int(rng.integers(0, full.n)))):
            parents = tree.parents.tolist()
            anc = [tree.path(i) for i in range(tree.n)]  # root .. node
            leaves = [i for i in range(tree.n) if i not in parents]
            assert tree.depth.tolist() == [len(a) - 1 for a in anc]
            assert tree.n_leaves == len(leaves)
            assert tree.seqs == [[s for s, leaf in enumerate(leaves) if i in anc[leaf]] for i in range(tree.n)]
            for node in range(tree.n):
                for tok in range(6):
                    kids = [i for i in range(tree.n) if parents[i] == node and tree.tokens[i] == tok]
                    assert tree.child(node, tok) == (kids[0] if kids else -1)


def test_a_tree_out_of_depth_first_order_is_refused():
    with pytest.raises(ValueError, match="depth-first"):
        Tree(np.array([1, 2, 3, 4], np.int32), np.array([-1, 0, 0, 1], np.int32))  # node 3's parent ended at node 2
    with pytest.raises(ValueError, match="must come before it"):
        Tree(np.array([1, 2], np.int32), np.array([-1, 1], np.int32))
