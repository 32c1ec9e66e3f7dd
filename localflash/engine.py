"""From a RunConfig (``localflash/config.py``: a pair, or target/drafter files and options) to a ready Engine.

``run``, ``chat``, ``serve``, ``bench`` and ``load()`` all load through :func:`open_engine`.
"""

from __future__ import annotations

from pathlib import Path

from localflash.archs import BLOCK_ROOM, DRAFT_MAX, SLOT_SHARED_DRAFTERS, LOOKUP, MODEL_DRAFTERS, RECURRENT_ARCHS, SYNTHETIC, base_kind, kind_of_drafter_arch
from localflash.config import EXACT_MAX_ROWS, RunConfig
from localflash.errors import LocalflashError

# why --tree is refused on recurrent/hybrid targets (the measurement: docs/benchmarks.md, "Tree verification")
TREE_ON_RECURRENT = ("--tree is not available on {arch} targets: each branch would need its own recurrent state and "
                     "rollback snapshots (Qwen3.6-27B: 150 MiB a state, 40 GiB for 16 branches 16 deep), and llama.cpp "
                     "splits branching sequences on recurrent memory into several passes")


# weight types ggml's CPU backend multiplies by 2+ rows with llamafile's sgemm and by one row with vec_dot
SGEMM_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL"}


def exact_row_padding(target: Path, threads: int) -> bool:
    """Whether exact mode must pad one-row decodes to two rows for this target and thread count.

    Needed with more than one thread (a single row's attention is split over the threads past
    512 cached tokens) or when a matmul weight is of a type llamafile's sgemm takes (one row goes
    to vec_dot instead). A K-quant file at one thread needs neither, and padding doubles the
    CPU work of a one-row decode there (benchmarks/conformance/exact_cost.py).
    """
    from localflash.formats.gguf_meta import read_meta
    from localflash.llama import check_gguf, default_threads

    if (threads or default_threads()) != 1:
        return True
    meta = read_meta(check_gguf(target))
    tied = not any(t.name == "output.weight" for t in meta.tensors)
    return any(t.type in SGEMM_TYPES for t in meta.tensors
               if len(t.shape) >= 2 and (not t.name.startswith("token_embd.") or tied))


def exact_options(exact: bool, arch: str | None = None, pad: bool = True) -> tuple[dict, dict]:
    """(ModelOptions, ContextOptions) keywords of the target for exact mode, or none.

    Exact mode makes a row's logits on the CPU independent of how many rows its batch has,
    so speculative greedy output equals plain greedy output byte for byte, at any thread
    count: no CPU weight repacking; ggml's tiled K-quant matmul off (process-wide, see
    ``use_exact_numerics``); flash attention on (without it K·Q goes through a matmul whose
    kernel depends on the batch); micro-batches of at most EXACT_MAX_ROWS rows (open_engine: a prompt
    chunk of 64+ rows would take ggml's tiled flash attention, which rounds differently); and no one-row decodes (padded to two rows, which keeps them
    on the batch kernels: llamafile's sgemm and the unsplit attention; ``pad``, see
    ``exact_row_padding``: not needed for a K-quant file at one thread). Recurrent/hybrid
    targets cannot drop a padding row, so they decode one row on one thread instead (the
    split attention is then one chunk): exact where every matmul weight is a K-quant
    (measured with their recurrent kernels, tests/llama/test_exact.py), not where one takes
    llamafile's sgemm (an F32 hybrid; qwen3next's F32 expert router).
    benchmarks/conformance/check_batch_invariance.py measures each setting; docs/benchmarks.md has the figures.
    """
    if not exact:
        return {}, {}
    from localflash.llama import use_exact_numerics

    use_exact_numerics()
    return exact_kwargs(arch, pad)


def exact_kwargs(arch: str | None = None, pad: bool = True) -> tuple[dict, dict]:
    """:func:`exact_options`' per-model and per-context keywords alone, without its process-wide switch.

    Enough for a target with no weight that ggml's tiled matmul takes (K-quants): the tests that
    claim equalities in their own process on the tiny F32 llama and on SmolLM2 (Q4_1/Q8_0) use it,
    so that process's numerics stay the default ones (tests/llama/test_exact.py measures both files).
    """
    rows = {"n_threads_single": 1} if arch in RECURRENT_ARCHS else {"min_rows": 2} if pad else {}
    return {"use_extra_bufts": False}, {"flash_attn": 1, **rows}


def _check_exact_on_cpu(cfg: RunConfig, n_gpu_layers: int) -> None:
    """Exact mode is the CPU backend's: refuse target layers on a GPU (a CPU-only build offloads nothing)."""
    from localflash.llama import gpu_offload_supported

    if cfg.exact and n_gpu_layers != 0 and gpu_offload_supported():
        layers = "all" if n_gpu_layers < 0 else str(n_gpu_layers)
        raise LocalflashError(f"--exact makes greedy output byte-exact on the CPU only; this run would put {layers} target "
                              "layers on the GPU, whose kernels it does not cover",
                              hint="add --n-gpu-layers 0 (-ngl 0) to run the target on the CPU, or drop --exact")


def drafter_kind(cfg: RunConfig) -> str:
    """The drafter kind a RunConfig asks for, ``--spec auto`` resolved from the file headers (nothing loaded).

    ``auto``: the drafter file's kind (by its architecture); ``draft`` for a drafter made
    from the target on first use; else ``mtp`` when the target has MTP layers, else ``ngram``.
    """
    if cfg.spec != "auto":
        return cfg.spec
    if cfg.drafter is not None and (cfg.drafter.exists() or not cfg.derive):
        return kind_of_drafter_arch(_arch_of(cfg.drafter))  # a missing file: check_gguf's one-line error
    if cfg.derive:
        return "draft"
    return "mtp" if nextn_layers(cfg.target) else "ngram"


def ensure_drafter_file(cfg: RunConfig) -> Path | None:
    """The drafter path, deriving it (a requantized target) on first use."""
    if cfg.derive and cfg.drafter is not None and not cfg.drafter.exists():
        from localflash.llama.quantize import quantize

        quantize(cfg.target, cfg.drafter, cfg.derive)
    return cfg.drafter


def open_engine(cfg: RunConfig, target=None):
    """Load target and drafter and return an Engine (caller closes it); with ``cfg.parallel`` > 1 a SlotPool.

    ``target``: an already loaded target Model to share (``bench`` runs one context per mode on it).
    """
    from localflash.llama import Context, ContextOptions, Model, ModelOptions, verbose
    from localflash.llama.rollback import check_snapshot_depth
    from localflash.speculative.loop import Engine
    from localflash.speculative.adapt import CostTable
    from localflash.speculative.tree import MAX_LEAVES, TreeSize, TreeVerifier
    from localflash.plan import runtime_kwargs

    drafter_path = ensure_drafter_file(cfg) if base_kind(cfg.spec) in ("auto", *MODEL_DRAFTERS) else None
    n_nextn = nextn_layers(cfg.target)
    spec = drafter_kind(cfg)
    kind = base_kind(spec)
    if kind == "mtp" and not n_nextn:
        raise LocalflashError(
            f"{cfg.target.name} has no MTP (nextn) layers, so --spec mtp cannot draft with it",
            hint="Qwen3.5/3.6 GGUFs converted with their MTP block have them; otherwise use --spec ngram, draft or dflash",
        )
    if kind in MODEL_DRAFTERS and drafter_path is None:
        raise LocalflashError(f"--spec {kind} needs a drafter file", hint="pass --drafter PATH or use a pair")
    max_draft = default_draft_max(kind)
    if kind == "dflash" and drafter_path is not None:
        max_draft = dflash_draft_max(drafter_path, max_draft)
    if cfg.draft_max is not None:
        max_draft = min(max_draft, cfg.draft_max) if kind == "dflash" else cfg.draft_max
    tree = cfg.tree or 0
    if tree and (_arch_of(cfg.target) or "") in RECURRENT_ARCHS:
        raise LocalflashError(TREE_ON_RECURRENT.format(arch=_arch_of(cfg.target)), hint="use --tree 0 (a chain) on this target")
    if tree and cfg.parallel > 1:
        raise LocalflashError("--tree verifies one request's tree in a unified cache; parallel slots each keep a stream of their own",
                              hint="use --tree with --parallel 1, or slots with chains (--tree 0)")
    check_snapshot_depth(_arch_of(cfg.target) or "", max_draft, 512)
    from localflash.llama import rpc

    if cfg.rpc:
        rpc.add_servers(list(cfg.rpc))  # each probed first: a server that is down is one line, not llama.cpp's abort
    plan = plan_for(cfg, drafter_path if kind in MODEL_DRAFTERS else None, max_draft, mtp=kind == "mtp")
    kw = runtime_kwargs(plan)
    target_devices = drafter_devices = None
    if rpc.any_registered():  # llama.cpp's default list would hold every RPC device this process registered: name them
        local = [d.name for d in rpc.local_gpus()]
        target_devices = rpc.device_names(kw["devices"]) if kw["devices"] else local
        drafter_devices = local  # the drafter stays on this machine (main_gpu: the plan's card for it)
    exact_model, exact_ctx = exact_options(cfg.exact, target.arch if target is not None else _arch_of(cfg.target),
                                           pad=cfg.exact and exact_row_padding(cfg.target, cfg.threads))
    if target is not None and cfg.exact and target.options.use_extra_bufts:
        raise LocalflashError("exact mode needs the target loaded without CPU weight repacking (ModelOptions(use_extra_bufts=False))")
    if target is not None:
        _check_exact_on_cpu(cfg, target.options.n_gpu_layers)
    if target is None:
        n_gpu_layers = kw["n_gpu_layers"] if cfg.n_gpu_layers < 0 else cfg.n_gpu_layers
        _check_exact_on_cpu(cfg, n_gpu_layers)
        target = Model(
            cfg.target,
            ModelOptions(
                n_gpu_layers=n_gpu_layers,
                split_mode=kw["split_mode"],
                main_gpu=kw["main_gpu"],
                tensor_split=kw["tensor_split"],
                tensor_overrides=kw["tensor_buft_overrides"] or None,
                load_mtp=kind == "mtp",
                devices=target_devices,
                **exact_model,
            ),
        )
    drafter_model = None
    if kind in MODEL_DRAFTERS:
        d = kw["drafter"] or {}
        drafter_model = Model(drafter_path, ModelOptions(n_gpu_layers=d.get("n_gpu_layers", -1), split_mode=0, main_gpu=d.get("main_gpu", 0),
                                                         devices=drafter_devices))
    n_rs = plan.n_rs_seq  # the plan prices it; a hybrid target's verify cut goes back at most max_draft
    n_seq = max(1, cfg.parallel)
    # exact mode: no micro-batch reaches ggml's tiled flash attention (64+ query rows), so a prompt's rows
    # round the same however it is chunked: alone, or riding in a slot pool's steps beside other sequences
    n_ubatch = min(plan.n_ubatch, EXACT_MAX_ROWS) if cfg.exact else plan.n_ubatch
    ctx = Context(
        target,
        ContextOptions(
            n_ctx=plan.n_ctx,
            n_batch=plan.n_batch,
            n_ubatch=n_ubatch,
            n_outputs_max=max(min(n_seq * max(max_draft + 1, 1), plan.n_batch), tree + 1, MAX_LEAVES if tree else 1),  # >= n_seq_max
            n_seq_max=MAX_LEAVES if tree else n_seq,
            # a tree: shared cells; slots: one pool (cfg.kv_unified(), any slot up to the whole context, SlotPool keeps
            # the slots' sum within it) or one KV stream each (--kv-pool split, exact mode), laid out as in a context of its own
            kv_unified=bool(tree) or cfg.kv_unified(),
            n_threads=cfg.threads,
            type_k=plan.type_k,
            type_v=plan.type_v,
            n_rs_seq=n_rs,
            **exact_ctx,
        ),
    )
    in_graph = sample_in_graph(cfg, ctx, target)
    # no drafter file (MTP, n-gram): the target's; a unified pool keeps the drafters at their 1/N share (as planned):
    # a slot's sequence past it decodes on without drafts (the drafters' ctx_limit)
    drafter_ctx = min(plan.drafter_n_ctx or plan.n_ctx, ctx.n_ctx_seq if not ctx.kv_unified or tree else ctx.n_ctx // n_seq)
    drafter_kv = plan.drafter_type_kv or cfg.kv_drafter or plan.type_k  # the drafter's cache type as planned (MTP: --kv-drafter, else --kv)
    if n_seq > 1:  # parallel slots: a drafter per slot, driven a step at a time by one group (speculative/group.py)
        from localflash.speculative.slots import SlotPool

        group = make_slot_drafters(spec, target, ctx, drafter_model, n_seq, n_ctx=drafter_ctx, max_draft=max_draft,
                                   threads=cfg.threads, p_min=cfg.p_min, kv=drafter_kv)
        pool = SlotPool(target, ctx, group.drafters, adaptive=cfg.adaptive, draft_max=max_draft,
                        max_rows=EXACT_MAX_ROWS if cfg.exact else None, n_ubatch=n_ubatch, group=group, exact=cfg.exact,
                        sample_in_graph=in_graph)
        pool.plan = plan
        return pool
    drafter = make_drafter(spec, target, ctx, drafter_model, n_ctx=drafter_ctx, max_draft=max_draft, threads=cfg.threads,
                           p_min=cfg.p_min, kv=drafter_kv, in_graph_argmax=False if tree else None)
    engine = Engine(target, ctx, drafter, adaptive=cfg.adaptive, draft_max=max_draft, sample_in_graph=in_graph)
    if tree:  # adaptive: each cycle verifies as much of the tree as pays (TreeSize); --fixed: all of it
        engine.tree = TreeVerifier(tree, size=TreeSize(CostTable()) if cfg.adaptive else None)
    engine.plan = plan
    if verbose():
        import sys

        sys.stderr.write(f"localflash: target cache rollback: {ctx.describe_rollback()}\n")
    return engine


def sample_in_graph(cfg: RunConfig, ctx, target) -> bool:
    """Whether the target's rows are sampled in llama.cpp's graph (``--sample-in-graph``); if so a chain is attached to ``ctx``.

    ``auto``: where the target's output layer is on a GPU: a verify pass's rows then stay on the card
    and only token ids cross the bus (the host path copies every row: rows x vocabulary x 4 bytes).
    Not on a CPU: ggml's CPU sampling ops take every row of the pass (argmax, top-k, a full sort for
    top-p), where the host sampler reads only the rows up to the first rejection (docs/benchmarks.md).
    ``on`` forces it (an error where llama.cpp cannot attach the chain; config_from refuses it with a
    tree, whose walk reads every node's logits), ``off`` keeps the host path. Parallel slots resolve
    alike; each slot's chain is attached when a request takes the slot (graph_sampler.slot_sampler), so
    here a greedy chain is only tried on sequence 0 and detached again.
    """
    want = cfg.sample_in_graph
    if want == "off" or cfg.tree:
        return False
    from localflash.llama import gpu_offload_supported

    layers = target.options.n_gpu_layers
    if want == "auto" and not (gpu_offload_supported() and (layers < 0 or layers > target.n_layer)):
        return False
    if ctx.sample_greedy_in_graph():
        if cfg.parallel > 1:
            ctx.sample_on_host()
        return True
    if want == "on":
        raise LocalflashError("llama.cpp could not attach a sampler chain to the target context", hint="use --sample-in-graph off")
    return False


class SharedModel:
    """A drafter model lent to another slot's drafter: everything but ``close`` (its owner closes it)."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def close(self) -> None:
        pass


def _no_drafter():
    from localflash.speculative.drafter import Drafter

    return Drafter()


def make_slot_drafters(kind: str, target, ctx, drafter_model, n_seq: int, *, n_ctx: int, max_draft: int, threads: int = 0,
                       p_min: float = 0.0, kv: str = "f16"):
    """The drafters of ``n_seq`` parallel slots on the target context ``ctx``, in the group that drives them a step at a time.

    DFlash, a draft model and MTP (each also behind prompt lookup): every slot's drafter on its sequence of
    one shared drafter context of ``n_seq`` x ``n_ctx`` positions (DFlash: + the block's room), so a step
    costs it, for all slots together, one intake and one draft decode (``DFlashGroup``), one catch-up and
    k - 1 draft decodes (``DraftModelGroup``), or one intake and k draft decodes (``MtpGroup``); n-gram and
    EAGLE-3: :func:`make_drafter`'s drafter per slot, EAGLE-3's sharing the loaded weights (slot 0's owns
    them), looped over by the default group.
    """
    from localflash.speculative.group import DrafterGroup, LookupFirstGroup

    base = base_kind(kind)
    if base in SLOT_SHARED_DRAFTERS:
        from localflash.speculative.drafter import LookupFirstDrafter

        if base == "dflash":
            from localflash.speculative.dflash import DFlashGroup
            from localflash.speculative.dspark import dflash_drafter

            group = DFlashGroup(drafter_model, target, ctx, n_ctx + BLOCK_ROOM, n_seq, n_threads=threads, p_min=p_min, kv=kv,
                                make=dflash_drafter)
        elif base == "draft":
            from localflash.speculative.draft_model import DraftModelGroup

            group = DraftModelGroup(drafter_model, target, n_ctx, n_seq, max_draft, p_min, n_threads=threads, kv=kv)
        else:
            from localflash.speculative.mtp import MtpGroup

            group = MtpGroup(target, ctx, n_ctx, n_seq, max_draft, p_min, n_threads=threads, kv=kv)
        if kind.endswith(LOOKUP):
            group = LookupFirstGroup([LookupFirstDrafter(d) for d in group.drafters], group)
        return group
    drafters = [make_drafter(kind, target, ctx, drafter_model if i == 0 or drafter_model is None else SharedModel(drafter_model),
                             n_ctx=n_ctx, max_draft=max_draft, threads=threads, p_min=p_min, kv=kv)
                for i in range(n_seq)]
    return DrafterGroup([d or _no_drafter() for d in drafters])


def dflash_draft_max(path: Path, default: int) -> int:
    """The longest draft of a ``dflash`` file: an anchor-first DSpark file drafts its whole block, DFlash B - 1."""
    from localflash.formats.gguf_meta import read_meta
    from localflash.llama import check_gguf

    meta = read_meta(check_gguf(path))
    if meta.is_dspark and meta.sample_from_anchor and meta.block_size:
        return meta.block_size
    return default


def default_draft_max(kind: str) -> int:
    """The longest draft of a kind unless --draft-max says otherwise (``synthetic@ALPHA``: the synthetic one)."""
    base = base_kind(kind)
    return DRAFT_MAX[SYNTHETIC if base.startswith(SYNTHETIC) else base]


def make_drafter(kind: str, target, ctx, drafter_model=None, *, n_ctx: int, max_draft: int | None = None, threads: int = 0,
                 p_min: float = 0.0, kv: str = "f16", in_graph_argmax: bool | None = None, inner=None):
    """The drafter of one kind (a --spec or bench mode), or None for ``none``; the one place drafters are made.

    ``kind``: a base kind, its ``+ngram`` form (prompt lookup first) or ``synthetic@ALPHA`` (bench
    only: an oracle drafter; ``inner``: a real drafter whose cost it pays). ``target``/``ctx``: the
    target Model and the Context it verifies on (DFlash, EAGLE-3 and MTP read it); ``drafter_model``:
    the loaded drafter file (dflash, eagle3, draft). ``n_ctx``: the tokens the drafter's cache must
    hold (DFlash and EAGLE-3 get their block's room on top); ``max_draft``: the longest draft
    (default: the kind's :data:`~localflash.archs.DRAFT_MAX`; DFlash drafts its block). ``kv``:
    the drafter's cache type (its own context's, MTP's context's); ``in_graph_argmax``: DFlash's argmax in llama.cpp's graph (None: where it pays).
    """
    base = base_kind(kind)
    if max_draft is None:
        max_draft = default_draft_max(base)
    if base == "none":
        return None
    if base == "dflash":
        from localflash.speculative.dspark import dflash_drafter

        drafter = dflash_drafter(drafter_model, target, ctx, n_ctx + BLOCK_ROOM, n_threads=threads, p_min=p_min,
                                 in_graph_argmax=in_graph_argmax, kv=kv)
    elif base == "eagle3":
        from localflash.speculative.eagle3 import Eagle3Drafter

        drafter = Eagle3Drafter(drafter_model, target, ctx, n_ctx + max_draft + 1, max_draft, p_min, n_threads=threads, kv=kv)
    elif base == "draft":
        from localflash.speculative.draft_model import DraftModelDrafter

        drafter = DraftModelDrafter(drafter_model, target, n_ctx, max_draft, p_min, n_threads=threads, kv=kv)
    elif base == "mtp":
        from localflash.speculative.mtp import MtpDrafter

        drafter = MtpDrafter(target, ctx, n_ctx, max_draft, p_min, n_threads=threads, kv=kv)
    elif base == "ngram":
        from localflash.speculative.drafter import NgramDrafter

        drafter = NgramDrafter(max_draft)
    elif base.startswith(SYNTHETIC):
        from localflash.speculative.synthetic import SyntheticDrafter

        drafter = SyntheticDrafter(float(base.partition("@")[2]), max_draft, target.n_vocab, inner=inner)
    else:
        raise ValueError(f"no drafter kind {kind!r}")
    if kind.endswith(LOOKUP):
        from localflash.speculative.drafter import LookupFirstDrafter

        drafter = LookupFirstDrafter(drafter)
    return drafter


def plan_for(cfg: RunConfig, drafter_path: Path | None, max_draft: int, mtp: bool = False):
    """The VRAM/RAM plan this run loads with (the same one `localflash plan` prints)."""
    from localflash.plan import devices
    from localflash.formats.gguf_meta import read_meta
    from localflash.llama import check_gguf
    from localflash.plan import Wishes, make_plan

    t_meta = read_meta(check_gguf(cfg.target))
    d_meta = read_meta(check_gguf(drafter_path)) if drafter_path else None
    chosen = devices.select_gpus(devices.detect(), vram=cfg.vram, gpus=cfg.gpus)
    if cfg.rpc:  # remote devices first, as llama.cpp orders them; their memory as their servers report it
        from localflash.llama import rpc

        chosen = [devices.Gpu(i, f"rpc-server {e}", d.total, d.free, e)
                  for e in cfg.rpc for i, d in enumerate(rpc.add_servers([e]))] + chosen
    wishes = Wishes(ctx=cfg.ctx, kv=cfg.kv, n_draft=max(max_draft, 1), mtp=mtp, n_seq=max(1, cfg.parallel),
                    drafter_kv=cfg.kv_drafter)
    return make_plan(t_meta, d_meta, chosen, devices.host_memory(), wishes)


def nextn_layers(path: Path) -> int:
    """MTP (nextn) blocks in the target file (0 when it has none or cannot be read here)."""
    from localflash.formats.gguf_meta import read_meta
    from localflash.llama import check_gguf

    return read_meta(check_gguf(path)).n_layer_nextn


def _arch_of(path: Path | None) -> str | None:
    if path is None:
        return None
    from localflash.formats.gguf_meta import read_meta
    from localflash.llama import check_gguf

    return read_meta(check_gguf(path)).arch
