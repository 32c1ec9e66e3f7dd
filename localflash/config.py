"""What to load and how: the one table of load options, and the RunConfig they resolve to.

:data:`LOAD_OPTIONS` is the single definition of every option a caller may give
when loading a model: the CLI builds its model flags from it
(``cli/options.py``: ``LOAD_FLAGS``, ``LoadFlags``) and ``localflash.load()``
checks its keywords against it. :func:`config_from_options` turns given options
into a :class:`RunConfig` (a models.toml pair merged with the options given),
which :func:`localflash.engine.open_engine` loads.

No heavy imports here: the CLI's ``--help`` reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from localflash.archs import SPECS
from localflash.errors import LocalflashError
from localflash.registry.pairs import get_pair

EXACT_MAX_ROWS = 63  # in exact mode: a verify batch of 64+ rows takes ggml's tiled flash attention, which rounds differently
DEFAULT_CTX = 4096  # without a pair or --ctx
TREE_MAX = 64  # drafted nodes a --tree verify may hold
SAMPLE_IN_GRAPH = ("auto", "on", "off")
KV_POOLS = ("auto", "unified", "split")  # parallel slots' KV layout (engine.open_engine, speculative/slots.py)
# why --exact keeps one KV stream per slot: in one pool a sequence's cells interleave with the other slots' (a cell
# freed by a rejected draft goes to whichever sequence decodes next), and the attention sums a row's cells in cell order
EXACT_UNIFIED = ("--exact does not combine with --kv-pool unified: in one KV pool a slot's cells interleave with the other "
                 "slots' and the attention sums them in cell order, so a reply's rounding would depend on its neighbours")  # where the target's rows are sampled (speculative/graph_sampler.py)


@dataclass(frozen=True)
class LoadOption:
    """One load option: the type a caller gives, its default, its CLI names (none: Python API only), its help."""

    type: Any
    default: Any
    flags: tuple[str, ...] = ()
    help: str = ""


LOAD_OPTIONS: dict[str, LoadOption] = {
    "pair": LoadOption(Optional[str], None, ("--pair", "-p"), "A pair from models.toml."),
    "model": LoadOption(Optional[str], None, ("--model", "-m"), "Target GGUF file."),
    "drafter": LoadOption(Optional[str], None, ("--drafter",), "Drafter GGUF (DFlash, EAGLE-3 or a small model), next to its target."),
    "hf": LoadOption(Optional[str], None, ("-hf", "--hf"), "Target on the hub: OWNER/REPO[:QUANT] (the quant picked as llama.cpp's -hf does), downloaded into the HF cache (HF_HOME) on first use."),
    "hf_drafter": LoadOption(Optional[str], None, ("-hfd", "--hf-drafter"), "Drafter on the hub: OWNER/REPO[:QUANT] (its model file, else its dflash-/eagle3-/mtp- file)."),
    "spec": LoadOption(str, "auto", ("--spec",), "auto | none | dflash | draft | eagle3 | ngram | mtp; dflash+ngram / draft+ngram / eagle3+ngram / mtp+ngram try prompt lookup first."),
    "draft_max": LoadOption(Optional[int], None, ("--draft-max",), "Longest draft per cycle."),
    "fixed": LoadOption(bool, False, ("--fixed",), "Always draft --draft-max tokens (no adaptive length)."),
    "p_min": LoadOption(float, 0.0, ("--p-min",), "Draft model / MTP: stop a draft at a token below this probability (0: never)."),
    "ctx": LoadOption(Optional[int], None, ("--ctx", "-c"), f"Context size in tokens (default: the pair's, else {DEFAULT_CTX}; bench: what the longest prompt needs)."),
    "threads": LoadOption(int, 0, ("--threads", "-t"), "CPU threads (0: automatic)."),
    "n_gpu_layers": LoadOption(int, -1, ("--n-gpu-layers", "-ngl"), "Target layers on the GPU (-1: all)."),
    "kv": LoadOption(Optional[str], None, ("--kv",), "Target KV cache type: f16, q8_0, q4_0."),
    "kv_drafter": LoadOption(Optional[str], None, ("--kv-drafter",), "Drafter KV cache type: f16, q8_0, q4_0 (default: the cheaper of f16 and --kv; MTP: --kv)."),
    "exact": LoadOption(bool, False, ("--exact",), "Byte-exact greedy on CPU: speculative output == plain output at any thread count (slower verify)."),
    "parallel": LoadOption(int, 1, (), "Parallel slots: requests decoded together on one context (serve --parallel, bench --parallel)."),
    "kv_pool": LoadOption(str, "auto", ("--kv-pool",), "Parallel slots' KV cache: unified (one pool: any slot up to the whole -c, while the slots together fit), "
                          "split (1/N of -c per slot, each laid out as a context of its own); auto: unified, split with --exact."),
    "slot_prompt_similarity": LoadOption(float, 0.5, ("--slot-prompt-similarity", "-sps"), "Parallel slots: the share of a slot's cached "
                                         "prompt a request must reuse to be routed to that slot (as llama-server's -sps); 0: no prefix "
                                         "routing (an empty, else the least recently used free slot)."),
    "rpc": LoadOption(Optional[str], None, ("--rpc",), "llama.cpp rpc-servers for target layers: HOST:PORT[,HOST:PORT...] (load(): a list too); trusted network only."),
    "tree": LoadOption(Optional[int], None, ("--tree",), "Verify a tree of at most N drafted tokens per target pass (0: a chain; default: a chain). Not on hybrid targets."),
    "sample_in_graph": LoadOption(str, "auto", ("--sample-in-graph",), "auto | on | off: sample the target's rows inside llama.cpp's graph, so only token ids reach the host (auto: on where the target's output layer is on a GPU; not with --tree)."),
    # Python API only
    "vram": LoadOption(Optional[str], None, (), 'VRAM budget override, e.g. "24GiB" (default: detected).'),
    "gpus": LoadOption(Optional[str], None, (), 'Cards by index ("0,1") or by size ("24GiB,24GiB").'),
    "derive": LoadOption(Optional[str], None, (), "Requantize the target into this type to make the drafter file (written to drafter= on first use)."),
}


def _default(name: str):
    return LOAD_OPTIONS[name].default


@dataclass
class RunConfig:
    """A resolved load: the files, the drafter kind and the runtime settings :func:`~localflash.engine.open_engine` uses."""

    target: Path
    drafter: Path | None = None
    spec: str = _default("spec")  # auto = the pair's drafter kind, or guessed from the drafter file
    draft_max: int | None = _default("draft_max")
    adaptive: bool = not _default("fixed")
    ctx: int = DEFAULT_CTX
    kv: str = "f16"
    kv_drafter: str | None = _default("kv_drafter")  # None: the planner's choice (pricer.drafter_kv)
    n_gpu_layers: int = _default("n_gpu_layers")
    threads: int = _default("threads")
    p_min: float = _default("p_min")
    derive: str | None = _default("derive")  # requantize the target into this type to make the drafter
    pair: str | None = None
    vram: str | None = _default("vram")  # budget override, e.g. "24GiB" (default: detected)
    gpus: str | None = _default("gpus")  # "0,1" or "24GiB,24GiB"
    exact: bool = _default("exact")  # byte-exact greedy on CPU: see engine.exact_options()
    parallel: int = _default("parallel")  # slots decoded together (speculative/slots.py); 1: one request at a time
    rpc: tuple[str, ...] = ()  # rpc-server endpoints (HOST:PORT) that hold target layers
    tree: int | None = _default("tree")  # drafted nodes per tree verify (0/None: a chain); speculative/tree.py
    sample_in_graph: str = _default("sample_in_graph")  # auto | on | off: engine.sample_in_graph resolves it
    kv_pool: str = _default("kv_pool")  # auto | unified | split: parallel slots' KV layout (see kv_unified())
    slot_prompt_similarity: float = _default("slot_prompt_similarity")  # LLM.slot_for's routing threshold; 0: routing off

    def kv_unified(self) -> bool:
        """Whether parallel slots share one KV pool (``--kv-pool``; auto: yes, but not with --exact)."""
        return self.parallel > 1 and not self.tree and (self.kv_pool == "unified" or (self.kv_pool == "auto" and not self.exact))


def config_from_options(**options) -> RunConfig:
    """The RunConfig load options ask for (``load()``'s keywords, the CLI's model flags; left out: their defaults)."""
    unknown = sorted(set(options) - set(LOAD_OPTIONS))
    if unknown:
        raise LocalflashError(f"load() got unknown option(s): {', '.join(unknown)}", hint=f"load options: {', '.join(LOAD_OPTIONS)}")
    o = {name: opt.default for name, opt in LOAD_OPTIONS.items()} | options
    model, drafter = o.pop("model"), o.pop("drafter")
    hf, hf_drafter = o.pop("hf"), o.pop("hf_drafter")
    if hf or hf_drafter:
        model, drafter = _from_hub(o.get("pair"), model, drafter, hf, hf_drafter)
    return config_from(o.pop("pair"), str(model) if model is not None else None, str(drafter) if drafter is not None else None,
                       adaptive=not o.pop("fixed"), **o)


def _from_hub(pair, model, drafter, hf, hf_drafter) -> tuple[str | None, str | None]:
    """-hf / --hf-drafter: the files in the HF cache (downloaded, resumed and checked first when needed)."""
    from localflash.hub import pull

    if hf and model:
        raise LocalflashError("-hf and --model both given", hint="use one or the other")
    if hf_drafter and drafter:
        raise LocalflashError("--hf-drafter and --drafter both given", hint="use one or the other")
    t, d = pull(hf, hf_drafter)
    return (str(t) if t else model), (str(d) if d else drafter)


def _pull_pair(p) -> None:
    """A pair named by hub files: download what is not in the cache yet (pinned sha256s checked too)."""
    from localflash.hub import pull

    want_t = p.target_hf if p.target_hf and not Path(p.target).is_file() else None
    want_d = p.drafter_hf if p.drafter_hf and p.drafter is not None and not Path(p.drafter).is_file() else None
    if want_t or want_d:
        t, d = pull(want_t, want_d, pins=p.sha256)
        p.target = t or p.target
        p.drafter = d or p.drafter


def config_from(pair: str | None, target: str | None, drafter: str | None, **flags) -> RunConfig:
    """Merge a models.toml pair with explicit flags (RunConfig fields; flags win when given)."""
    given = {k: v for k, v in flags.items() if v is not None}
    if pair:
        p = get_pair(pair)
        if not target:
            _pull_pair(p)
        cfg = RunConfig(
            target=p.target,
            drafter=p.drafter,
            spec=p.kind if p.kind != "none" else "none",
            draft_max=p.draft_max,
            ctx=p.ctx,
            derive=p.derive,
            pair=p.name,
        )
        if given.get("spec") == "auto":
            given.pop("spec")
    elif target:
        cfg = RunConfig(target=Path(target))
    else:
        raise LocalflashError("name a model", hint="use --pair NAME (see `localflash models`) or --model FILE.gguf")
    if target and pair:
        cfg.target = Path(target)
    if drafter:
        cfg.drafter = Path(drafter)
        cfg.derive = None
    cfg = replace(cfg, **given)
    if cfg.rpc:
        from localflash.llama.rpc_wire import parse_endpoints

        cfg.rpc = tuple(parse_endpoints(cfg.rpc))
    if cfg.spec not in SPECS:
        raise LocalflashError(f"unknown --spec {cfg.spec!r}", hint=f"use one of {', '.join(SPECS)}")
    if cfg.draft_max is not None and not 0 <= cfg.draft_max <= 64:
        raise LocalflashError(f"--draft-max must be in 0..64, got {cfg.draft_max}")
    if not 0.0 <= cfg.p_min < 1.0:
        raise LocalflashError(f"--p-min must be in [0, 1), got {cfg.p_min:g}")
    if cfg.exact and cfg.draft_max is not None and cfg.draft_max + 1 > EXACT_MAX_ROWS:
        raise LocalflashError(f"--exact verifies at most {EXACT_MAX_ROWS} rows at once, so --draft-max must be at most "
                              f"{EXACT_MAX_ROWS - 1}, got {cfg.draft_max}")
    if cfg.sample_in_graph not in SAMPLE_IN_GRAPH:
        raise LocalflashError(f"unknown --sample-in-graph {cfg.sample_in_graph!r}", hint=f"use one of {', '.join(SAMPLE_IN_GRAPH)}")
    if cfg.sample_in_graph == "on" and cfg.tree:
        raise LocalflashError("--sample-in-graph on does not combine with --tree: a tree's walk reads every node's logits on the host",
                              hint="use --sample-in-graph auto or off")
    if cfg.kv_pool not in KV_POOLS:
        raise LocalflashError(f"unknown --kv-pool {cfg.kv_pool!r}", hint=f"use one of {', '.join(KV_POOLS)}")
    if cfg.tree is not None and not 0 <= cfg.tree <= TREE_MAX:
        raise LocalflashError(f"--tree must be in 0..{TREE_MAX} drafted nodes, got {cfg.tree}")
    if cfg.exact and cfg.tree and cfg.tree + 1 > EXACT_MAX_ROWS:
        raise LocalflashError(f"--exact verifies at most {EXACT_MAX_ROWS} rows at once, so --tree must be at most "
                              f"{EXACT_MAX_ROWS - 1}, got {cfg.tree}")
    return check_parallel(cfg)


def check_parallel(cfg: RunConfig) -> RunConfig:
    """Refuse a slot count out of range or a context too small to share among the slots."""
    if not 0.0 <= cfg.slot_prompt_similarity <= 1.0:
        raise LocalflashError(f"--slot-prompt-similarity must be in [0, 1], got {cfg.slot_prompt_similarity:g}",
                              hint="0 turns prefix routing off; 0.5 is the default")
    if not 1 <= cfg.parallel <= 64:
        raise LocalflashError(f"--parallel must be in 1..64, got {cfg.parallel}")
    if cfg.ctx < 16 * cfg.parallel:
        raise LocalflashError(f"-c/--ctx must be at least 16 per slot, got {cfg.ctx} for {cfg.parallel} slot(s)",
                              hint="raise -c/--ctx or lower --parallel")
    if cfg.exact and cfg.kv_pool == "unified" and cfg.parallel > 1:
        raise LocalflashError(EXACT_UNIFIED, hint="use --kv-pool split (or auto) with --exact")
    return cfg
