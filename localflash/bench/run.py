"""``localflash bench``: plain and speculative decoding on the same prompts, with a verdict per rig.

Every mode gets its own context on one shared target model, and the modes take
turns on each prompt (the order rotates from prompt to prompt), so slow drift
of the machine (clocks, heat, other load) hits every mode alike. Speed is
decode tokens per second (prefill excluded); ``same`` counts the prompts whose
speculative output equals the plain one token for token. The verdict (which
mode pays, per category; bench/verdicts.py) is saved per rig and pair in the user data dir;
``chat --draft auto`` starts from it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from localflash.archs import KINDS as MODES, MODEL_DRAFTERS, SYNTHETIC, TREE, base_kind, split_tree
from localflash.bench.prompts import BenchPrompt
from localflash.bench.rig import peak_rss_bytes, rig_info
from localflash.bench.verdicts import make_verdict, pair_key
from localflash.errors import LocalflashError
from localflash.speculative.stats import Stats

COUNTS = ("generated", "committed", "cycles", "drafted", "accepted", "rows", "tree_cycles", "tree_nodes")


def _totals(stats: list[Stats]) -> Stats:
    total = Stats()
    for s in stats:
        total.merge(s)
    return total


def _summary(stats: list[Stats], same: int, plain_tps: float | None, watts: float | None, price: float | None) -> dict:
    t = _totals(stats)
    tok_s = t.generated / t.t_decode if t.t_decode > 0 else 0.0
    row = {c: getattr(t, c) for c in COUNTS}
    row.update(
        prompts=len(stats),
        t_decode=t.t_decode,
        t_target=t.t_target,
        t_draft=t.t_draft,
        tok_s=tok_s,
        speedup=tok_s / plain_tps if plain_tps else 1.0,
        tau=t.tau,
        tau_per_row=t.tau_per_row,
        mean_tree_nodes=t.mean_tree_nodes,
        acceptance=t.acceptance,
        accept_hist=list(t.accept_hist),
        pos_tries=list(t.pos_tries),
        pos_hits=list(t.pos_hits),
        position_acceptance=t.position_acceptance,
        same_as_plain=same,
    )
    if watts:
        kwh = watts * (1e6 / tok_s) / 3.6e6 if tok_s > 0 else float("inf")
        row["kwh_per_mtok"] = kwh
        if price is not None:
            row["cost_per_mtok"] = kwh * price
    return row


def check_modes(modes: list[str], cfg, synthetic: list[str] | None = None) -> list[str]:
    """``none`` first, no duplicates; each speculative mode must have what it needs.

    ``synthetic`` (a benchmark-only oracle drafter, see speculative/synthetic.py)
    becomes one mode ``synthetic@ALPHA`` per acceptance rate in ``synthetic``.
    """
    out = ["none"]
    for m in modes:
        m = {"plain": "none"}.get(m.strip().lower(), m.strip().lower())
        if m == SYNTHETIC:
            for text in synthetic or ["0.8"]:
                try:
                    alpha = float(text)
                except ValueError:
                    alpha = -1.0
                if not 0.0 <= alpha <= 1.0:
                    raise LocalflashError(f"--synthetic-accept {text.strip()!r} is not a rate", hint="use rates in [0, 1], e.g. 0.6,0.8,0.95")
                out.append(f"{SYNTHETIC}@{alpha:g}")
            continue
        if not m or m in out:
            continue
        kind, budget = split_tree(m)
        if kind not in MODES or kind == "none" and budget is not None or TREE in m and budget is None:
            raise LocalflashError(f"unknown bench mode {m!r}", hint=f"use a comma list of {', '.join(MODES)}, "
                                  f"each with an optional {TREE}N (a tree of N drafted tokens: dflash{TREE}15)")
        if base_kind(kind) in MODEL_DRAFTERS and cfg.drafter is None and not cfg.derive:
            raise LocalflashError(f"bench mode {m} needs a drafter", hint="pass --drafter PATH or a pair that has one")
        out.append(m)
    return out


def run_bench(
    cfg,
    modes: list[str],
    prompt_set: str,
    prompts: list[BenchPrompt],
    max_tokens: int,
    sampling,
    raw: bool = False,
    ctx_given: bool = False,
    watts: float | None = None,
    price: float | None = None,
    repeat: int = 1,
    console=None,
) -> dict:
    """Run every prompt in every mode (rotating order) and return the report dict."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from localflash.llama import Model, ModelOptions
    from localflash.prompt import render_chat, tokenize_prompt
    from localflash.engine import open_engine
    from localflash.speculative.sampling import SamplingParams

    # one model for every mode: with its MTP block when a mode drafts with it (the trunk is the same)
    mtp = any(base_kind(split_tree(m)[0]) == "mtp" for m in modes)
    if cfg.rpc:  # blocks on rpc-servers: the first engine loads the target as its plan says; the vocabulary is enough here
        target = Model(cfg.target, ModelOptions(vocab_only=True))
    else:
        target = Model(cfg.target, ModelOptions(n_gpu_layers=cfg.n_gpu_layers, load_mtp=mtp, use_extra_bufts=not cfg.exact))
    chat = not raw and bool(target.chat_template())
    tokenized = []
    for p in prompts:
        if chat:
            tokenized.append(tokenize_prompt(target, render_chat(target, [{"role": "user", "content": p.text}])))
        else:
            tokenized.append(target.tokenize(p.text, add_special=True, parse_special=False))
    longest = max(len(t) for t in tokenized)
    if not ctx_given:
        # just what the longest prompt and its reply need (one context per mode), up to the pair's context
        need = longest + max_tokens + 16
        cfg = replace(cfg, ctx=min(cfg.ctx, max(256, -(-need // 256) * 256)))
    keep = [i for i, t in enumerate(tokenized) if len(t) + 2 <= cfg.ctx]
    skipped = len(prompts) - len(keep)
    if not keep:
        raise LocalflashError(
            f"every prompt is longer than the context ({cfg.ctx} tokens; the shortest has {min(len(t) for t in tokenized)})",
            hint="raise -c/--ctx",
        )
    prompts = [prompts[i] for i in keep]
    tokenized = [tokenized[i] for i in keep]

    engines = {}
    try:
        for m in modes:
            kind, budget = split_tree(m)
            engines[m] = open_engine(replace(cfg, spec=kind, tree=budget if budget is not None else cfg.tree),
                                     target=None if cfg.rpc and not engines else target)
            target = engines[m].target
        for m, eng in engines.items():  # warm-up: page in weights, calibrate the draft-length policy
            for _ in eng.generate(tokenized[0], min(16, max_tokens), SamplingParams()):
                pass
        stats: dict[str, list[Stats]] = {m: [] for m in modes}
        outputs: dict[str, list[list[int]]] = {m: [] for m in modes}
        runs = []
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True,
        ) as progress:
            task = progress.add_task("bench", total=len(prompts) * len(modes) * repeat)
            for i, (p, toks) in enumerate(zip(prompts, tokenized)):
                r = i % len(modes)
                order = modes[r:] + modes[:r]
                seed = None if sampling.seed is None and sampling.greedy else (sampling.seed or 0) + i
                sp = replace(sampling, seed=seed)
                best: dict[str, Stats] = {}
                if any(m.startswith(SYNTHETIC) for m in modes):  # the oracle's reference: a plain pre-run, untimed
                    ref = [t for new in engines["none"].generate(toks, max_tokens, sp) for t in new]
                    for m in modes:
                        if m.startswith(SYNTHETIC):
                            engines[m].drafter.set_reference(toks + ref)
                for _ in range(repeat):  # keep each mode's fastest run: interference only ever slows a run down
                    for m in order:
                        progress.update(task, description=f"{p.category[:14]:<14} {m:<6}")
                        st = Stats()
                        out: list[int] = []
                        for new in engines[m].generate(toks, max_tokens, sp, st):
                            out += new
                        if m not in best or st.t_decode < best[m].t_decode:
                            best[m] = st
                        if len(outputs[m]) <= i:
                            outputs[m].append(out)
                        progress.advance(task)
                for m in modes:
                    stats[m].append(best[m])
                for m in modes:
                    st = stats[m][-1]
                    runs.append(
                        {
                            "prompt": p.id, "category": p.category, "mode": m, "prompt_tokens": len(toks),
                            **{c: getattr(st, c) for c in COUNTS},
                            "t_decode": st.t_decode, "stop": st.stop,
                            "same_as_plain": outputs[m][-1] == outputs["none"][-1],
                        }
                    )
    finally:
        for eng in engines.values():
            eng.close()

    categories = list(dict.fromkeys(p.category for p in prompts))
    results: dict[str, dict] = {}
    for m in modes:
        results[m] = {"categories": {}}
    for scope in categories + [None]:
        idx = [i for i, p in enumerate(prompts) if scope is None or p.category == scope]
        plain = None
        for m in modes:
            same = sum(outputs[m][i] == outputs["none"][i] for i in idx)
            row = _summary([stats[m][i] for i in idx], same, plain, watts, price)
            if m == "none":
                plain = row["tok_s"]
                row["speedup"] = 1.0
            if scope is None:
                results[m]["all"] = row
            else:
                results[m]["categories"][scope] = row
    report = {
        "version": 1,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rig": rig_info(cfg.n_gpu_layers),
        "pair": {
            "name": cfg.pair or f"{cfg.target.name}",
            "key": pair_key(cfg.target, cfg.drafter),
            "target": str(cfg.target),
            "drafter": str(cfg.drafter) if cfg.drafter else None,
        },
        "prompts": {"set": prompt_set, "n": len(prompts), "skipped": skipped, "categories": categories, "chat_template": chat},
        "settings": {
            "max_tokens": max_tokens,
            "repeat": repeat,
            "ctx": cfg.ctx,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "seed": sampling.seed,
            "adaptive": cfg.adaptive,
            "draft_max": cfg.draft_max,
            "threads": cfg.threads,
            "exact": cfg.exact,
            "tree": cfg.tree,
            "n_gpu_layers": cfg.n_gpu_layers,
        },
        "modes": modes,
        "results": results,
        "runs": runs,
        "peak_rss_bytes": peak_rss_bytes(),
        "energy": {"watts": watts, "price_per_kwh": price} if watts else None,
    }
    report["verdict"] = make_verdict(report)
    return report
