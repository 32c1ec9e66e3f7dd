"""Tree verification: one target pass over a tree of drafted tokens, and the lossless walk down it.

A drafter with a distribution proposes several continuations at once; they
share their prefixes, so they form a tree whose root is the last committed
token. The target verifies the whole tree in one decode through llama.cpp's
own masking: every root-to-leaf path is a sequence id, a node belongs to the
sequences of the leaves below it and sits at position ``n_past + depth``, so
in a unified KV cache it attends to exactly its ancestors and the committed
prefix. The walk then samples the target's token at the root (greedy, or the
request's seeded sampler, one draw per position exactly as plain decoding
draws), descends to the child holding that token and repeats; the first node
without such a child gives the target's own token (the bonus). Every emitted
token is the target's sample given the tokens before it, so the output is
plain decoding's. A chain is the one-leaf tree: it decodes as one sequence.

After the walk the accepted path stays in sequence 0 and every other node's
cells are freed. The nodes are laid out depth-first with each node's likeliest
child first, so the drafter's own best chain is the first path and sits in
consecutive cells; an accepted path that leaves it would sit in cells out of
position order, which changes how attention sums (the last bits of the
logits, enough to flip a near-tie of greedy decoding now and then), so
``compact`` decodes that part of the path again into the cells right after the
committed text: one more (short) target pass in the cycles that take a side branch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from localflash.errors import LocalflashError

TOP_K = 8  # candidates per node that a drafter's distribution offers the expansion
MAX_LEAVES = 16  # sequence ids a tree may use (the target context's n_seq_max)


@dataclass
class Tree:
    """Nodes in depth-first order (node 0: the root, the last committed token); ``parents[i] < i``.

    Built with array operations and call-free loops over plain lists (no Python call per node):
    ``depth`` is given by the builders that know it; a node's sequences are the leaves of its subtree,
    which in depth-first order are the nodes from it up to the next node no deeper than it.
    """

    tokens: np.ndarray  # int32 [n]
    parents: np.ndarray  # int32 [n], parents[0] = -1
    scores: np.ndarray = field(default=None)  # drafter log-probability of each node's path (0 at the root), if known
    rank: np.ndarray = field(default=None)  # the order nodes were chosen in (best first): the first j form the best j-node tree
    depth: np.ndarray = field(default=None)  # each node's depth (the root's 0); found from ``parents`` if not given
    seq_spans: tuple = field(init=False)  # (first, count) arrays: node i's leaves are first[i] .. first[i] + count[i] - 1
    n_leaves: int = field(init=False)
    _kids: dict = field(init=False)  # (parent, token) -> its first (likelier) child holding that token

    def __post_init__(self):
        n = len(self.tokens)
        self.tokens = np.asarray(self.tokens, np.int32)
        par = self.parents = np.asarray(self.parents, np.int32)
        if self.scores is None:
            self.scores = np.zeros(n)
        if self.rank is None:
            self.rank = np.arange(n)
        idx = np.arange(n)
        bad = (par[1:] < 0) | (par[1:] >= idx[1:])
        if bad.any():
            i = int(bad.argmax()) + 1
            raise ValueError(f"node {i}: parent {int(par[i])} must come before it")
        plist = par.tolist()
        if self.depth is None:
            d = [0] * n
            for i in range(1, n):
                d[i] = d[plist[i]] + 1
            self.depth = d
        depth = self.depth = np.asarray(self.depth, np.int32)
        later = (depth[None, :] <= depth[:, None]) & (idx[None, :] > idx[:, None])
        end = np.where(later.any(axis=1), later.argmax(axis=1), n)  # node i's subtree: i .. end[i] - 1
        if (end[par[1:]] <= idx[1:]).any():
            raise ValueError("the nodes are not in depth-first order (a node lies outside its parent's subtree)")
        leaf = np.ones(n, bool)
        leaf[par[1:]] = False
        before = np.concatenate(([0], np.cumsum(leaf)))  # leaves before each index
        self.n_leaves = int(before[n])
        self.seq_spans = (before[:n].astype(np.int32), (before[end] - before[:n]).astype(np.int32))
        toks = self.tokens.tolist()  # a repeated token under one parent: the first (likelier) child, so filled last to first
        self._kids = dict(zip(zip(plist[::-1], toks[::-1]), range(n - 1, -1, -1)))

    @classmethod
    def chain(cls, root: int, draft: list[int]) -> "Tree":
        """The one-leaf tree: ``root`` followed by ``draft``."""
        return cls(np.array([root] + list(draft), np.int32), np.arange(-1, len(draft), dtype=np.int32),
                   depth=np.arange(len(draft) + 1, dtype=np.int32))

    @property
    def seqs(self) -> list[list[int]]:
        """Each node's sequence ids (the leaves below it), as lists (``seq_spans`` is what a batch takes)."""
        first, count = self.seq_spans
        return [list(range(f, f + c)) for f, c in zip(first.tolist(), count.tolist())]

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.n_leaves == 1

    def child(self, node: int, token: int) -> int:
        """The child of ``node`` holding ``token``, or -1."""
        return self._kids.get((node, token), -1) if node >= 0 else -1

    def path(self, node: int) -> list[int]:
        out = [node]
        while out[-1] > 0:
            out.append(int(self.parents[out[-1]]))
        return out[::-1]


def depth_first(tokens: list[int], parents: list[int], scores: list[float], depth: list[int] | None = None) -> Tree:
    """A Tree from nodes in any parent-first order, laid out depth-first, each node's children in the given order.

    Each node's place comes from the subtree sizes (summed leaves first, then handed out parents first):
    two loops over plain lists, no Python call per node."""
    n = len(tokens)
    size = [1] * n
    for i in range(n - 1, 0, -1):
        size[parents[i]] += size[i]
    pos, free = [0] * n, [1] * n  # each node's place; the next free place under each node (right after it, at first)
    for i in range(1, n):
        p = parents[i]
        pos[i] = q = free[p]
        free[p] = q + size[i]
        free[i] = q + 1
    where = np.asarray(pos, np.int64)
    order = np.empty(n, np.int64)
    order[where] = np.arange(n)
    new_parents = np.full(n, -1, np.int32)
    new_parents[where[1:]] = where[np.asarray(parents[1:], np.int64)]
    return Tree(np.asarray(tokens, np.int32)[order], new_parents, np.asarray(scores, np.float64)[order], order,
                None if depth is None else np.asarray(depth, np.int32)[order])


def prune(tree: Tree, n: int) -> Tree:
    """The first ``n`` drafted nodes ``tree`` chose (by rank): the best tree of that size, still depth-first."""
    if n >= tree.n - 1:
        return tree
    return subtree(tree, tree.rank <= n)  # ancestors rank before their children: a subtree


def subtree(tree: Tree, keep) -> Tree:
    """The nodes where ``keep`` (a mask; a kept node's ancestors are kept), still depth-first."""
    keep = np.flatnonzero(keep)
    if len(keep) == tree.n:
        return tree
    where = np.full(tree.n, -1, np.int64)
    where[keep] = np.arange(len(keep))
    parents = np.concatenate(([-1], where[tree.parents[keep[1:]]])).astype(np.int32)
    return Tree(tree.tokens[keep], parents, tree.scores[keep], tree.rank[keep], tree.depth[keep])


def best_first(root: int, expand, budget: int, max_depth: int, root_state=None) -> Tree:
    """Grow a tree of at most ``budget`` drafted nodes by cumulative drafter log-probability (DDTree's order).

    ``expand(depth, state)`` gives a node's candidate children: (token ids, log-probabilities, states),
    best first; ``depth`` is the node's own (the root's is 0). Each step adds the best-scoring candidate
    of any node in the tree (a path's score is the sum of its log-probabilities), so the first ``j`` nodes
    added are the best tree of ``j`` nodes for every ``j``; children come out in the order they were added.
    A node costs its heap pop, its sibling's and its children's pushes and its expand: nothing else is called.
    """
    nodes = [(root, -1, 0.0, 0)]  # (token, parent, score, depth) a node, in the order added
    heap: list = []
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
    tie = 0
    if max_depth > 0:  # the root's candidates
        ids, logp, states = expand(0, root_state)
        n_ids = len(ids)
        if n_ids:
            push(heap, (-float(logp[0]), tie, 0, 0, ids, logp, states, 0, n_ids))
            tie += 1
    leaves = 1
    node = 0  # nodes drafted so far (the last one's index)
    while heap and node < budget:
        neg, _, parent, depth, ids, logp, states, j, n_ids = heap[0]
        if j > 0:  # a second child: one more leaf (a first child takes its parent's place as a leaf)
            if leaves >= MAX_LEAVES:
                pop(heap)
                continue
            leaves += 1
        if j + 1 < n_ids:  # the best candidate leaves the heap and its next sibling comes in (one call)
            replace(heap, (-(nodes[parent][2] + float(logp[j + 1])), tie, parent, depth, ids, logp, states, j + 1, n_ids))
            tie += 1
        else:
            pop(heap)
        nodes += ((int(ids[j]), parent, -neg, depth + 1),)
        node += 1
        if depth + 1 < max_depth:  # the new node's own candidates (one call a node: no helper)
            ids, logp, states = expand(depth + 1, None if states is None else states[j])
            n_ids = len(ids)
            if n_ids:
                push(heap, (neg - float(logp[0]), tie, node, depth + 1, ids, logp, states, 0, n_ids))
                tie += 1
    tokens, parents, scores, depths = zip(*nodes)
    return depth_first(tokens, parents, scores, depths)


def top_candidates(logits: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` likeliest tokens of one row of logits (best first, ties by id) and their log-probabilities."""
    ids, logp = top_candidates_rows(logits[None, :], k)
    return ids[0], logp[0]


def top_candidates_rows(rows: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_candidates` of every row of ``rows`` at once: ``[n, k]`` ids and log-probabilities."""
    k = min(k, rows.shape[1])
    ids = (-rows).argpartition(k - 1, axis=1)[:, :k]
    at = np.arange(rows.shape[0])[:, None]  # (plain fancy indexing: take_along_axis's wrapper costs ~10 calls a use)
    vals = rows[at, ids].astype(np.float64)
    order = np.lexsort((ids, -vals), axis=1)
    ids, vals = ids[at, order], vals[at, order]
    top = vals[:, :1]
    lse = top[:, 0] + np.log(np.exp(rows - top.astype(np.float32)).sum(axis=1, dtype=np.float64))
    return ids.astype(np.int64), vals - lse[:, None]


def chain_with_siblings(root: int, chain: list[int], steps: list[tuple[np.ndarray, np.ndarray]], budget: int) -> Tree:
    """A drafter's greedy chain plus, at each depth, the next-best tokens of that step as leaves.

    ``steps[d]`` is the distribution the chain's token at depth ``d + 1`` was drawn from (top
    candidates, best first; the chain's own token among them). For drafters that decode one
    token at a time (draft model, EAGLE-3): the side leaves cost the drafter nothing more.
    """
    def expand(depth, on_chain):
        if not on_chain or depth >= len(chain):
            return (), (), None
        ids, logp = steps[depth]
        ids, logp = list(ids), list(logp)
        want = chain[depth]
        if want in ids:
            j = ids.index(want)
            ids.insert(0, ids.pop(j))
            logp.insert(0, logp.pop(j))
        else:  # p_min or a vocabulary map kept it out of the top: the chain still comes first
            ids.insert(0, want)
            logp.insert(0, logp[0])
        return ids, np.array(logp), [True] + [False] * (len(ids) - 1)

    return best_first(root, expand, budget, len(chain), root_state=True)


def walk(tree: Tree, rows, sample, is_eog) -> tuple[list[int], list[int]]:
    """The accepted path (node ids, root first) and the committed tokens: the accepted drafts and the bonus.

    Row ``i`` of ``rows`` is the target's logits at node ``i``; each visited node's row is sampled once.
    """
    node, path, new = 0, [0], []
    while True:
        tok = sample(rows[node])
        new.append(tok)
        if is_eog(tok):
            break
        node = tree.child(node, tok)
        if node < 0:
            break
        path.append(node)
    return path, new


class PathRows:
    """The target's last decode seen through the rows of the accepted path (what drafters read after a verify)."""

    def __init__(self, ctx, rows: list[int]):
        self.ctx = ctx
        self.model = ctx.model
        self.rows = np.asarray(rows, np.int64)
        self.n_last = len(rows)

    def layer_input(self, lid: int, n_rows: int) -> np.ndarray:
        return self.layer_inputs((lid,), n_rows)[0]

    def layer_inputs(self, layer_ids, n_rows: int) -> list[np.ndarray]:
        rows = self.rows[:n_rows]
        return [v[rows] for v in self.ctx.layer_inputs(layer_ids, self.ctx.n_last)]

    def last_tokens(self) -> np.ndarray:
        return self.ctx.last_tokens()[self.rows]


def decode_tree(ctx, tree: Tree, n_past: int) -> None:
    """One target pass over ``tree`` at ``n_past``: every node's logits come out (row i = node i)."""
    if tree.is_chain:
        ctx.decode(tree.tokens, n_past, "all")
        return
    if tree.n_leaves > ctx.n_seq_max:
        raise LocalflashError(f"a tree of {tree.n_leaves} leaves needs a context of that many sequences, not {ctx.n_seq_max}")
    for s in range(1, tree.n_leaves):
        ctx.seq_copy(0, s)  # the committed text is every branch's prefix (no copy: the cells gain an id)
    ctx.decode_rows(tree.tokens, n_past + tree.depth, tree.seq_spans, np.ones(tree.n, np.int8))  # (array operations: no call a node)


def keep_path(ctx, tree: Tree, path: list[int], n_past: int) -> int:
    """Leave the accepted path in sequence 0 and free every other node's cells; return where it leaves
    consecutive cells (``len(path)`` when it does not): :func:`compact` decodes the rest again."""
    d = len(path)
    if tree.is_chain:
        ctx.seq_rm(n_past + d)
        return d
    leaf = int(tree.seq_spans[0][path[-1]])
    if leaf == 0:
        ctx.seq_drop(0, n_past + d)
    else:
        ctx.seq_drop(0, n_past + 1)
        ctx.seq_copy(leaf, 0, n_past + 1, n_past + d)
    for s in range(1, tree.n_leaves):
        ctx.seq_drop(s)
    return next((j for j, node in enumerate(path) if node != j), d)


def compact(ctx, tree: Tree, path: list[int], n_past: int, j0: int) -> None:
    """Decode the accepted nodes from ``j0`` on again, into the cells right after the committed text."""
    if j0 < len(path):
        ctx.seq_drop(0, n_past + j0)
        ctx.decode(tree.tokens[path[j0:]], n_past + j0, "none")


class TreeSize:
    """How many of a tree's nodes to verify: the most expected tokens per second from measured costs.

    The drafter's own probabilities say how likely each node's path is; their sum over the first ``j``
    nodes (by rank) is the expected accepted depth of that tree if they were calibrated. They are not,
    so the sum is scaled by the measured ratio of accepted depth to predicted depth (an EMA). A
    pass of ``r`` rows costs what the verify costs table measured (calibration plus every cycle),
    so on a GPU, where a pass is nearly flat up to a kernel width, the budget grows to that width.
    """

    def __init__(self, verify_costs):
        self.verify = verify_costs  # rows -> seconds (a CostTable)
        self.ratio = 1.0  # accepted depth / predicted depth, recent cycles
        self.draft = None  # seconds a tree draft costs (EMA), counted into every size alike

    def choose(self, tree: Tree) -> int:
        """Drafted nodes to keep, ``0..tree.n - 1``."""
        if tree.n <= 1 or not np.any(tree.scores):
            return tree.n - 1  # no probabilities (n-gram): nothing to weigh, keep the drafter's tree
        by_rank = np.exp(tree.scores[np.argsort(tree.rank)][1:])
        expected = 1.0 + self.ratio * np.concatenate([[0.0], np.cumsum(by_rank)])
        costs = self.verify.many(np.arange(1, tree.n + 1))  # a pass of 1..n rows
        if costs is None or not costs.all():
            return tree.n - 1  # not measured yet: the whole tree once
        costs = np.maximum.accumulate(costs) + (self.draft or 0.0)  # a bigger pass never costs less
        return int(np.argmax(expected / costs))

    def record(self, tree: Tree, accepted: int, t_draft: float) -> None:
        predicted = float(np.exp(tree.scores[1:]).sum())
        if predicted > 0:
            self.ratio += 0.1 * (min(5.0, max(0.05, accepted / predicted)) - self.ratio)
        self.draft = t_draft if self.draft is None else self.draft + 0.2 * (t_draft - self.draft)


@dataclass
class TreeVerifier:
    """The tree side of the engine's cycle: ``budget`` drafted nodes at most; ``size`` (a TreeSize): fewer where they do not pay."""

    budget: int
    compact: bool = True  # keep committed cells in position order (see the module docstring)
    size: TreeSize | None = None
    redecoded: int = 0  # rows of accepted paths decoded again to keep them in order (compact), all cycles

    def cycle(self, engine, history: list[int], last: int, n_past: int, k: int, sample):
        """Draft a tree, verify it in one pass, commit the accepted path; (new tokens, tree, path, t_draft, t_verify)."""
        ctx, drafter = engine.ctx, engine.drafter
        td = engine.clock()
        tree = drafter.propose_tree(history, n_past, k, min(self.budget, ctx.n_ctx - n_past - 1))
        if self.size is not None:
            if not self.size.verify.ema:  # start from the engine's calibration (rows -> seconds)
                self.size.verify.ema.update(engine.policy.verify.ema)
            tree = prune(tree, self.size.choose(tree))
        if hasattr(sample, "prune") and tree.n > 1:  # a grammar's (speculative/grammar.py): its rejected nodes are never verified
            tree = subtree(tree, sample.prune(tree.tokens.tolist(), tree.parents.tolist()))
        t_draft = engine.clock() - td
        tv = engine.clock()
        decode_tree(ctx, tree, n_past)
        path, new = walk(tree, ctx.all_logits(), sample, engine.target.is_eog)
        engine.tokens += tree.tokens[path].tolist()
        j0 = keep_path(ctx, tree, path, n_past)
        t_verify = engine.clock() - tv
        if self.size is not None:
            self.size.verify.add(tree.n, t_verify)
            self.size.record(tree, len(path) - 1, t_draft)
        td = engine.clock()
        drafter.on_target_decode(ctx if tree.is_chain else PathRows(ctx, path), n_past, len(path))
        t_draft += engine.clock() - td
        if self.compact and j0 < len(path):
            tv = engine.clock()
            compact(ctx, tree, path, n_past, j0)
            self.redecoded += len(path) - j0
            t_verify += engine.clock() - tv
        return new, tree, path, t_draft, t_verify
