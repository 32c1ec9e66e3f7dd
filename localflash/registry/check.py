"""``localflash models``: list the registry's pairs and validate one pair's files."""

from __future__ import annotations

from pathlib import Path

from localflash.archs import base_kind
from localflash.errors import LocalflashError
from localflash.formats.gguf_meta import read_meta
from localflash.registry.pairs import Pair


def file_state(path: Path | None) -> dict:
    """Presence and size of one pair file (no loading)."""
    if path is None:
        return {"path": None, "exists": False, "size": None}
    exists = path.is_file()
    return {"path": str(path), "exists": exists, "size": path.stat().st_size if exists else None}


def list_rows(pairs: dict[str, Pair]) -> list[dict]:
    rows = []
    for name, p in pairs.items():
        row = p.to_dict()
        row["target_file"] = file_state(p.target) | {"hf": p.target_hf, "listed_size": p.sizes.get("target")}
        row["drafter_file"] = file_state(p.drafter) | {"hf": p.drafter_hf, "listed_size": p.sizes.get("drafter")}
        row["derive"] = p.derive
        rows.append(row)
    return rows


def fits(row: dict, gpus: list, host=None) -> dict:
    """Whether a listed pair fits the detected cards: a full plan when its files are here (``plan``'s defaults),
    else an estimate from the sizes models.toml lists (weights plus 1.5 GB for KV, compute and runtime)."""
    t, d = row["target_file"], row["drafter_file"]
    if not gpus:
        return {"fits": None, "how": "no GPU detected"}
    vram = sum(g.free for g in gpus)
    if t["exists"] and (d["path"] is None or d["exists"] or row.get("derive")):
        from localflash.plan import Wishes, make_plan
        from localflash.plan.devices import host_memory

        try:
            dm = read_meta(Path(d["path"])) if d["path"] and d["exists"] else None
            plan = make_plan(read_meta(Path(t["path"])), dm, gpus, host or host_memory(),
                             Wishes(ctx=row.get("ctx"), mtp=base_kind(row["kind"]) == "mtp"))
        except LocalflashError as e:
            return {"fits": False, "how": e.message}
        on_gpu = plan.slowdown <= 1.0 + 1e-9
        return {"fits": on_gpu, "how": f"planned: n_ctx {plan.n_ctx}, KV {plan.type_k}" + ("" if on_gpu else f", {plan.slowdown:.1f}x slower (offloaded)")}
    sizes = [f["size"] or f["listed_size"] for f in (t, d) if f["path"] is not None]
    if None in sizes or not sizes:
        return {"fits": None, "how": "size unknown: run `localflash plan --pair NAME`"}
    need = sum(sizes) + 1.5 * 1024**3
    return {"fits": need <= vram, "how": f"by listed size: ~{need / 1024**3:.1f} of {vram / 1024**3:.1f} GiB (`plan --pair` reads the headers)"}


def _load(path: Path):
    """Load a model's metadata and vocabulary on the CPU (tensors stay memory-mapped)."""
    from localflash.llama import Model, ModelOptions

    return Model(path, ModelOptions(n_gpu_layers=0))


def tensor_shape(path: Path, name: str) -> tuple[int, ...] | None:
    """Shape (ggml order, ne0 first) of one tensor, from the GGUF header alone; None when the file has none
    (or its header does not parse)."""
    try:
        tensors = read_meta(path).tensors
    except LocalflashError:
        return None
    return next((t.shape for t in tensors if t.name == name), None)


def _fc_input_width(path: Path) -> int | None:
    """Input width of a DFlash drafter's ``fc`` (the fused target features)."""
    shape = tensor_shape(path, "fc.weight")
    return shape[0] if shape else None


def check_pair(pair: Pair) -> tuple[list[tuple[str, bool | None, str]], bool]:
    """Validate a pair: files, arch, vocabulary, layer ids, fused width. Returns rows and overall ok."""
    from localflash.plan.devices import fmt_bytes
    from localflash.archs import LAYER_INPUT_ARCHS
    from localflash.speculative.dflash import check_dflash_pair
    from localflash.speculative.draft_model import check_same_vocab

    rows: list[tuple[str, bool | None, str]] = []
    ok = True

    def add(what: str, good: bool | None, detail: str) -> None:
        nonlocal ok
        rows.append((what, good, detail))
        if good is False:
            ok = False

    add("pair", None, f"{pair.name} ({pair.kind}) from {pair.source}")
    try:
        target = _load(pair.target)
    except LocalflashError as e:
        add("target", False, e.message)
        return rows, False
    add("target", True, f"{pair.target.name}, {fmt_bytes(pair.target.stat().st_size)}")
    add("arch", True, f"{target.arch}: {target.n_layer} layers, width {target.n_embd}, vocab {target.n_vocab}")
    tmpl = target.chat_template()
    if tmpl:
        from localflash.prompt import supports_thinking

        add("chat template", True, "thinking switch" if supports_thinking(target) else "present")
    else:
        add("chat template", None, "none (prompts go in raw)")

    drafter = None
    kind = base_kind(pair.kind)  # prompt lookup in front changes nothing checked here
    if kind in ("ngram", "none"):
        add("drafter", None, "n-gram prompt lookup, no model" if pair.kind == "ngram" else "none: plain decoding")
    elif kind == "mtp":
        n = target.n_layer_nextn
        add("drafter", n > 0, f"the target's own MTP block ({n} nextn layer{'s' * (n != 1)})" if n
            else "the target has no MTP (nextn) layers")
    elif pair.drafter is not None and not pair.drafter.exists() and pair.derive:
        add("drafter", None, f"derived on first use: {pair.derive} requantization of the target -> {pair.drafter}")
        add("vocabulary", True, "same as the target (derived from it)")
    else:
        try:
            drafter = _load(pair.drafter)
        except LocalflashError as e:
            add("drafter", False, e.message)
    if drafter is not None:
        size_d, size_t = pair.drafter.stat().st_size, pair.target.stat().st_size
        add("drafter", True, f"{pair.drafter.name}, {fmt_bytes(size_d)} ({100 * size_d / size_t:.0f}% of the target)")
        if kind == "draft" and size_d > 0.5 * size_t:
            add("speed", None, "a draft model over half the target's size rarely pays; check with `localflash bench`")
        if kind == "draft":
            if drafter.arch in ("dflash", "eagle3"):
                add("drafter arch", False, f"a {drafter.arch} drafter in a pair of kind 'draft' (set kind = \"{drafter.arch}\")")
            else:
                add("drafter arch", True, f"{drafter.arch}: {drafter.n_layer} layers, width {drafter.n_embd}")
            try:
                check_same_vocab(target, drafter)
                add("vocabulary", True, f"{target.n_vocab} tokens, token texts match")
            except LocalflashError as e:
                add("vocabulary", False, e.message)
        elif kind == "dflash":
            add("drafter arch", drafter.arch == "dflash", f"{drafter.arch}" + ("" if drafter.arch == "dflash" else ", expected dflash"))
            add(
                "layer inputs",
                target.arch in LAYER_INPUT_ARCHS,
                f"{target.arch} " + ("exports layer inputs" if target.arch in LAYER_INPUT_ARCHS else "cannot export layer inputs"),
            )
            ids = drafter.target_layer_ids() if drafter.arch == "dflash" else []
            if ids:
                inside = max(ids) < target.n_layer and min(ids) >= 0
                add("layer ids", inside, f"{ids} within 0..{target.n_layer - 1}" if inside else f"{ids} outside 0..{target.n_layer - 1}")
                fc = _fc_input_width(pair.drafter)
                want = len(ids) * target.n_embd
                if fc is None:
                    add("fused width", False, "no fc.weight tensor")
                else:
                    add("fused width", fc == want, f"fc takes {fc}; target gives {len(ids)} × {target.n_embd} = {want}")
            elif drafter.arch == "dflash":
                add("layer ids", False, "dflash.target_layers is missing")
            add("vocabulary", drafter.n_vocab == target.n_vocab, f"drafter {drafter.n_vocab}, target {target.n_vocab}")
            if drafter.arch == "dflash":
                bs = drafter.meta("dflash.block_size")
                add("block", None, f"block size {bs or 16}, mask token {drafter.mask_token()}")
                if drafter.dflash_selector_top_k():
                    add("selector", None, f"DFlash2: top-{drafter.dflash_selector_top_k()} candidates per position, "
                        f"conv kernel {drafter.meta('dflash.conv_kernel_size')}")
                if ok:
                    try:
                        check_dflash_pair(target, drafter)
                    except LocalflashError as e:
                        add("pair", False, e.message)
        elif kind == "eagle3":
            _check_eagle3(add, target, drafter, ok)
        drafter.close()
    target.close()
    add("context", None, f"ctx {pair.ctx}, draft max {pair.draft_max}, drafter trained with thinking: {'yes' if pair.thinking else 'no'}")
    return rows, ok


def _check_eagle3(add, target, drafter, ok: bool) -> None:
    """The EAGLE-3 rows of ``models check``: arch, tapped layers, target width, vocabulary."""
    from localflash.archs import LAYER_INPUT_ARCHS
    from localflash.speculative.eagle3 import check_eagle3_pair

    if drafter.arch != "eagle3":
        hint = " (a DFlash drafter: set kind = \"dflash\")" if drafter.arch == "dflash" else ""
        add("drafter arch", False, f"{drafter.arch}, expected eagle3{hint}")
        return
    add("drafter arch", True, f"eagle3: width {drafter.n_embd}")
    add("layer inputs", target.arch in LAYER_INPUT_ARCHS,
        f"{target.arch} " + ("exports layer inputs" if target.arch in LAYER_INPUT_ARCHS else "cannot export layer inputs"))
    ids = drafter.target_layer_ids()
    inside = len(ids) == 3 and max(ids) < target.n_layer and min(ids) >= 0
    add("layer ids", inside, f"{ids} within 0..{target.n_layer - 1}" if inside else f"{ids} do not fit 0..{target.n_layer - 1}")
    hidden = int(drafter.meta("eagle3.target_hidden_size") or 0)
    add("target width", hidden == target.n_embd, f"target_hidden_size {hidden}, target {target.n_embd}")
    add("vocabulary", drafter.n_vocab == target.n_vocab, f"drafter {drafter.n_vocab}, target {target.n_vocab}")
    d2t = tensor_shape(drafter.path, "d2t")
    add("draft vocabulary", None, f"{d2t[0]} ids mapped to the target's by d2t" if d2t else "the target's (no d2t)")
    if ok and inside and hidden == target.n_embd:
        try:
            check_eagle3_pair(target, drafter)
        except LocalflashError as e:
            add("pair", False, e.message)
