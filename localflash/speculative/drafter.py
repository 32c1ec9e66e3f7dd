"""The small interface every drafter implements, and the n-gram (prompt lookup) drafter."""

from __future__ import annotations

from localflash.speculative.tree import MAX_LEAVES, Tree, depth_first


class Drafter:
    """Proposes tokens that the target then verifies in one pass.

    The engine calls, in order: :meth:`rollback` when a request reuses part of
    the cached context, :meth:`on_target_decode` after every target decode
    with the number of its rows that are now committed, :meth:`on_prompt`
    once the prompt is prefilled, and :meth:`propose` once per cycle.
    Drafters never decide what is emitted; the target does.
    """

    name = "none"
    max_draft = 0
    cost_grows_with_length = True  # False when one forward drafts the whole block (DFlash)
    ctx_limit = 1 << 30  # positions the drafter's own cache can hold; past it, no drafting
    lazy_prompt = False  # True: its cache may lag the text (the next draft catches up), so a slot pool that is
    # not drafting leaves a joining prompt out of it rather than decode it for nothing

    def rollback(self, n_keep: int) -> None:
        """Forget everything at positions >= ``n_keep``."""

    def on_target_decode(self, target_ctx, start_pos: int, n_committed: int) -> None:
        """Rows ``[0, n_committed)`` of the target's last decode are committed at ``start_pos..``."""

    def on_prompt(self, prompt: list[int]) -> None:
        """The target has prefilled ``prompt``: catch up now (timed as prefill), not in the first cycle."""

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``history`` (whose last token sits at position ``n_past``)."""
        return []

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int):
        """A tree of at most ``budget`` drafted nodes, at most ``k`` deep, rooted at ``history[-1]``
        (``speculative/tree.py``); a drafter without alternatives offers its chain, the one-leaf tree."""
        return Tree.chain(history[-1], self.propose(history, n_past, min(k, budget)))

    def close(self) -> None:
        """Release the drafter's model and context."""


class NgramDrafter(Drafter):
    """Prompt lookup: continue the most recent earlier occurrence of the current suffix.

    Tries suffix lengths ``max_ngram`` down to ``min_ngram``; costs no model pass,
    so it pays wherever output repeats the prompt (code edits, summaries, RAG).
    The shortest key is 3 tokens, as llama.cpp's prompt lookup uses: 2-token
    matches draft twice as often but are rarely right, and on a CPU a wrong
    draft costs a verify pass that is dearer than a plain step.
    Only the last ``window`` tokens are searched.

    The n-grams seen so far are kept in one dict per length (n-gram -> its most
    recent start), updated with the few tokens each cycle adds, so a proposal
    costs O(max_ngram) dict lookups instead of a scan of the whole window.
    A history list is taken to be the same text as long as it only grows in
    place (as the engine's does); a new list is compared with the indexed one.
    """

    name = "ngram"
    cost_grows_with_length = False

    def __init__(self, max_draft: int = 8, max_ngram: int = 4, min_ngram: int = 3, window: int = 4096, branches: int = 4):
        self.max_draft = max_draft
        self.branches = branches  # earlier occurrences kept per n-gram: a tree's branches
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.window = window
        self._seen: list[int] = []  # a copy of the history the index was built from, to notice a new one
        self._src: list[int] | None = None  # the list last seen: if it only grew in place, no full comparison
        self._index: dict[int, dict[tuple, list[int]]] = {size: {} for size in range(min_ngram, max_ngram + 1)}
        self._end = 0  # n-grams ending at or before this index are in ``_index``

    def _sync(self, history: list[int]) -> None:
        """Bring the index up to date with ``history``, rebuilding it if that is not a continuation."""
        n = len(history)
        m = len(self._seen)
        grown = history is self._src and n >= m and (m == 0 or history[m - 1] == self._seen[-1])
        if not grown and (n < m or history[:m] != self._seen):  # not a continuation: start over
            self._seen = []
            self._index = {size: {} for size in range(self.min_ngram, self.max_ngram + 1)}
            self._end = max(0, n - self.window - 1)
        self._seen.extend(history[len(self._seen) :])
        # index every n-gram lying wholly inside history[:n-1] (something follows it)
        for end in range(self._end + 1, n):
            for size, table in self._index.items():
                s = end - size
                if s >= 0:
                    starts = table.setdefault(tuple(history[s:end]), [])
                    starts.append(s)  # oldest first
                    if len(starts) > self.branches:
                        del starts[0]
        self._end = max(self._end, n - 1)
        self._src = history

    def on_prompt(self, prompt: list[int]) -> None:
        self._sync(prompt)  # index the prompt during prefill; each cycle then adds only its new tokens

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        k = min(k, self.max_draft)
        if k <= 0:
            return []
        self._sync(history)
        total = len(history)
        n = min(total, self.window)
        lo = total - n  # first index inside the window
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            starts = self._index[size].get(tuple(history[total - size :]))
            if starts and starts[-1] >= lo:
                start = starts[-1] + size
                return list(history[start : min(start + k, total)])
        return []

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int) -> Tree:
        """The continuations of the suffix's earlier occurrences as branches: longest match first, then the most
        recent (the chain :meth:`propose` drafts is the first path); shared prefixes merge."""
        k = min(k, self.max_draft)
        if k <= 0 or budget <= 0:
            return Tree.chain(history[-1], [])
        self._sync(history)
        total = len(history)
        n = min(total, self.window)
        lo = total - n
        conts, seen = [], set()
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            for s in reversed(self._index[size].get(tuple(history[total - size :]), ())):
                if s >= lo and s + size not in seen:
                    seen.add(s + size)
                    conts.append(history[s + size : min(s + size + k, total)])
        tokens, parents = [history[-1]], [-1]
        kids: list[dict[int, int]] = [{}]
        leaves = 1
        for cont in conts:
            node = 0
            for tok in cont:
                nxt = kids[node].get(tok)
                if nxt is None:
                    if len(tokens) - 1 >= budget or (kids[node] and leaves >= MAX_LEAVES):
                        break
                    leaves += bool(kids[node])
                    nxt = kids[node][tok] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                    kids.append({})
                node = nxt
        return depth_first(tokens, parents, [0.0] * len(tokens))


class LookupFirstDrafter(Drafter):
    """Prompt lookup first; the model drafter only when the lookup finds no match.

    Where the reply repeats its context (summaries, RAG answers, translations
    that keep names, code edits) a 3–4-token suffix match is right most of the
    time and costs no model pass; elsewhere the model drafts as usual. Every
    engine event reaches both, so the model drafter's cache stays in step
    whichever of them proposed. The target still decides every token.
    """

    def __init__(self, model: Drafter, lookup: NgramDrafter | None = None):
        self.model = model
        self.lookup = lookup or NgramDrafter(max_draft=model.max_draft)
        self.name = f"{model.name}+ngram"
        self.max_draft = model.max_draft
        self.cost_grows_with_length = model.cost_grows_with_length
        self.ctx_limit = model.ctx_limit
        self.looked_up = 0  # cycles the lookup drafted
        self.modelled = 0  # cycles the model drafted

    def rollback(self, n_keep: int) -> None:
        self.model.rollback(n_keep)

    def on_target_decode(self, target_ctx, start_pos: int, n_committed: int) -> None:
        self.model.on_target_decode(target_ctx, start_pos, n_committed)

    def on_prompt(self, prompt: list[int]) -> None:
        self.lookup.on_prompt(prompt)
        self.model.on_prompt(prompt)

    def propose(self, history: list[int], n_past: int, k: int) -> list[int]:
        draft = self.lookup.propose(history, n_past, k)
        if draft:
            self.looked_up += 1
            return draft
        self.modelled += 1
        return self.model.propose(history, n_past, k)

    def propose_tree(self, history: list[int], n_past: int, k: int, budget: int):
        tree = self.lookup.propose_tree(history, n_past, k, budget)
        if tree.n > 1:
            self.looked_up += 1
            return tree
        self.modelled += 1
        return self.model.propose_tree(history, n_past, k, budget)

    def close(self) -> None:
        self.model.close()
