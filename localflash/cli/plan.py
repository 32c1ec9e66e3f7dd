"""``localflash plan``: read the GGUF headers, resolve the GPUs, plan, print a Rich table or JSON.

The planner and the GGUF reader are imported inside :func:`plan_command`, so ``--help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from localflash.cli.app import app
from localflash.cli.options import DRAFT_MAX, DRAFTER, LOAD_FLAGS, MODEL, PAIR, PARALLEL
from localflash.errors import LocalflashError

if TYPE_CHECKING:
    from rich.console import Console

    from localflash.plan import Plan, devices


@app.command("plan")
def plan(
    pair: Optional[str] = PAIR.option(),
    target: Optional[str] = MODEL.option(also=("--target",)),
    drafter: Optional[str] = DRAFTER.option(),
    vram: Optional[str] = typer.Option(None, "--vram", help="Plan for one card of this size, e.g. 24GiB."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Cards by index (0,1) or by size (24GiB,24GiB)."),
    ctx: Optional[int] = typer.Option(None, "--ctx", "-c", help="Context wish in tokens (0: the largest that fits)."),
    kv: Optional[str] = typer.Option(None, "--kv", help="Target KV cache type: f16, q8_0, q4_0 (default: the best that fits)."),
    kv_drafter: Optional[str] = LOAD_FLAGS["kv_drafter"].option(),
    split: str = typer.Option("layer", "--split", help="layer | tensor (experimental) for several cards."),
    draft_max: Optional[int] = DRAFT_MAX.option(),
    margin: str = typer.Option("512MiB", "--margin", help="Memory left free on every card."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan and the runtime settings as JSON."),
    mtp: Optional[bool] = typer.Option(None, "--mtp/--no-mtp", help="Price drafting with the target's MTP block (default: when it has one and no drafter is given)."),
    rpc: Optional[str] = LOAD_FLAGS["rpc"].option(),
    parallel: int = PARALLEL.option(),
    hf: Optional[str] = LOAD_FLAGS["hf"].option(),
    hf_drafter: Optional[str] = LOAD_FLAGS["hf_drafter"].option(),
):
    """Price target + drafter on your GPUs before loading: per-card table, settings, and what changed to fit.

    Files on the hub (-hf, --hf-drafter, a pair named by hub files) are priced from their GGUF headers,
    read with HTTP range requests: nothing is downloaded."""
    plan_command(pair, target, drafter, vram, gpus, ctx, kv, split, draft_max, margin, json_out, mtp=mtp, rpc=rpc,
                 parallel=parallel, hf=hf, hf_drafter=hf_drafter, kv_drafter=kv_drafter)


def plan_command(
    pair: str | None = None,
    target: str | None = None,
    drafter: str | None = None,
    vram: str | None = None,
    gpus: str | None = None,
    ctx: int | None = None,
    kv: str | None = None,
    split: str = "layer",
    draft_max: int | None = None,
    margin: str = "512MiB",
    json_out: bool = False,
    console: Console | None = None,
    detected: list[devices.Gpu] | None = None,
    host: devices.HostMemory | None = None,
    mtp: bool | None = None,
    rpc: str | list[str] | None = None,
    parallel: int = 1,
    hf: str | None = None,
    hf_drafter: str | None = None,
    kv_drafter: str | None = None,
) -> Plan:
    """Plan ``--pair NAME`` or ``--target T [--drafter D]`` and print it (``detected``/``host`` override probing).

    ``mtp``: price MTP drafting with the target's nextn block; None: when the target has one and no drafter is
    given (what ``run --spec auto`` loads), or when the pair's kind is mtp. ``rpc``: rpc-server endpoints, asked
    for their memory over the wire; their devices come first in the split, as llama.cpp orders them."""
    from rich.console import Console

    from localflash.formats.gguf_meta import read_meta
    from localflash.plan import devices
    from localflash.plan import Wishes, make_plan, runtime_kwargs

    out = console or Console(highlight=False)
    warnings = []
    remote = {}  # "target"/"drafter" -> hub name, for the files read off the hub
    if (hf or hf_drafter) and (pair or target):
        raise LocalflashError("-hf and --pair/--target both given", hint="use one or the other")
    if pair:
        if target or drafter:
            raise LocalflashError("--pair and --target/--drafter both given", hint="use one or the other")
        from localflash.registry.pairs import get_pair

        p = get_pair(pair)
        target_path, drafter_path = p.target, p.drafter
        if p.target_hf and not Path(target_path).is_file():
            remote["target"] = p.target_hf
        if p.drafter_hf and not Path(drafter_path).is_file():
            remote["drafter"] = p.drafter_hf
        ctx = p.ctx if ctx is None else ctx
        if mtp is None and p.kind.startswith("mtp"):
            mtp = True
        draft_max = p.draft_max if draft_max is None else draft_max
        if drafter_path is not None and not Path(drafter_path).exists() and p.derive:
            warnings.append(f"drafter {drafter_path.name} is made on first use; planned without it")
            drafter_path = None
    elif target:
        target_path, drafter_path = Path(target), Path(drafter) if drafter else None
    elif hf:
        target_path, drafter_path = None, Path(drafter) if drafter else None
        remote["target"] = hf
        if hf_drafter:
            remote["drafter"] = hf_drafter
    else:
        raise LocalflashError("nothing to plan", hint="give --pair NAME, -hf OWNER/REPO[:QUANT] or --target FILE [--drafter FILE]")

    read = {}
    if remote:
        from localflash.hub import header_meta

        read = {role: header_meta(name, drafter=role == "drafter") for role, name in remote.items()}
    t_meta = read["target"].meta if "target" in read else read_meta(target_path)
    d_meta = read["drafter"].meta if "drafter" in read else read_meta(drafter_path) if drafter_path else None
    if "drafter" in read:
        drafter_path = d_meta.path
    found = devices.detect() if detected is None else detected
    chosen = devices.select_gpus(found, vram=vram, gpus=gpus)
    if rpc:
        from localflash.plan.remote import parse_endpoints

        chosen = devices.remote_gpus(parse_endpoints(rpc)) + chosen
    if mtp is None:
        mtp = drafter_path is None and t_meta.n_layer_nextn > 0
    if mtp and not t_meta.n_layer_nextn:
        raise LocalflashError(f"{Path(target_path).name} has no MTP (nextn) layers to plan for", hint="drop --mtp")
    wishes = Wishes(ctx=ctx, kv=kv, split=split, margin=devices.parse_size(margin), mtp=mtp, n_seq=max(1, parallel),
                    drafter_kv=kv_drafter)
    if mtp and draft_max is None:
        from localflash.archs import MTP_DRAFT_MAX

        draft_max = MTP_DRAFT_MAX
    if draft_max is not None:
        wishes.n_draft = draft_max
    plan = make_plan(t_meta, d_meta, chosen, host or devices.host_memory(), wishes)
    plan.warnings[:0] = warnings
    if not chosen:
        plan.warnings.append("no GPU found (or nvidia-ml-py missing): planned for host RAM only")
    if plan.traffic:
        plan.warnings.append("rpc-server has no authentication: keep it on a trusted network")
    if json_out:
        import json

        doc = json.loads(plan.to_json())
        doc["runtime_kwargs"] = runtime_kwargs(plan)
        if read:
            doc["hub_headers"] = {role: {"name": remote[role], "bytes_read": r.bytes_read, "requests": r.requests,
                                         "file_bytes": r.file_bytes} for role, r in read.items()}
        out.print_json(json.dumps(doc))
    else:
        print_plan(plan, out, parallel)
        for role, r in read.items():
            out.print(hub_read_line(role, remote[role], r), style="dim", soft_wrap=True)
    return plan


def hub_read_line(role: str, name: str, r) -> str:
    from localflash.hub.client import endpoint

    if not r.bytes_read:
        return f"{role} {name}: header read from the local cache"
    return (f"{role} {name}: read {r.bytes_read:,} bytes of GGUF header in {r.requests} range request(s) from {endpoint()} "
            f"({r.bytes_read / max(r.file_bytes, 1):.3%} of its {r.file_bytes / 1e9:.2f} GB); nothing downloaded")


def _label(row) -> str:
    if row.remote:
        return f"RPC {row.remote}" + (f"#{row.index}" if row.index else "")
    return f"GPU{row.index}" if row.index is not None else "host"


def print_plan(plan: Plan, out: Console, parallel: int = 1) -> None:
    from rich import box
    from rich.table import Table

    gib = lambda n: f"{n / 1024**3:.2f}"  # noqa: E731
    title = Path(plan.target).name + (f" + {Path(plan.drafter).name}" if plan.drafter else "")
    t = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
              caption="GiB; runtime = CUDA context and "
              "pool on GPUs, output buffers on the host")
    for col in ("device", "target", "KV", "compute", "drafter", "runtime", "used", "budget", "free"):
        t.add_column(col, justify="left" if col == "device" else "right", no_wrap=True)
    for row in [*plan.devices, plan.host]:
        drafter = row.drafter_weights + row.drafter_kv + row.drafter_compute
        style = "red" if row.free < 0 else "green"
        label = _label(row)
        t.add_row(label, gib(row.target_weights), gib(row.target_kv), gib(row.target_compute), gib(drafter),
                  gib(row.overhead), gib(row.used), gib(row.budget), f"[{style}]{gib(row.free)}[/]")
    out.print(t)
    for row in [*plan.devices, plan.host]:
        label = _label(row) if row.remote else f"GPU{row.index} ({row.name.split(' ', 1)[-1]})" if row.index is not None else "host"
        out.print(f"{label}: {row.layers}", style="dim")
    if plan.traffic:
        tr = plan.traffic
        out.print(f"network per verify pass of {tr['rows']} tokens: {tr['round_trips']} round trip(s) "
                  f"({tr['remote_devices']} remote device(s) + drafter taps read there), "
                  f"{(tr['activations_bytes'] + tr['tap_bytes']) / 1024:.0f} KiB of hidden states + up to "
                  f"{tr['mask_bytes_at_n_ctx'] / 1024:.0f} KiB of attention mask at n_ctx {plan.n_ctx} "
                  "(it grows with the tokens cached), graph uploads on top")
    settings = (f"n_ctx {plan.n_ctx}, KV {plan.type_k}, n_gpu_layers {plan.n_gpu_layers}, split {plan.split_mode}"
                + (f" {plan.tensor_split}" if plan.tensor_split else "") + f", main_gpu {plan.main_gpu}")
    if plan.drafter:
        where = f"GPU{plan.drafter_device}" if plan.drafter_device is not None else "host"
        settings += f"; drafter on {where}, n_ctx {plan.drafter_n_ctx}, KV {plan.drafter_type_kv}"
    if plan.mtp:
        settings += f"; drafter: the target's MTP block (MTP context n_ctx {plan.n_ctx}, KV {plan.type_k})"
    out.print(settings)
    if parallel > 1:  # the same cells either way; compute is priced for attention over the whole context (the unified worst case)
        kv = (sum(d.target_kv for d in plan.devices) + plan.host.target_kv) / 2**20
        out.print(f"slots: {parallel} share one KV pool of {plan.n_ctx} tokens (target KV {kv:.0f} MiB): a request may use up to "
                  f"{plan.n_ctx}, the slots together as many; --kv-pool split (--exact): {plan.n_ctx // parallel} a slot, the same KV")
    if plan.drafter_slots:
        out.print(plan.drafter_slots_line())
    if plan.tensor_overrides:
        out.print("tensor overrides: " + ", ".join(f"{rx} -> {buf}" for rx, buf in plan.tensor_overrides))
    options = ", ".join(f"{n} with {kv}" for kv, n in plan.context_options.items() if n)
    if options:
        out.print(f"largest context that fits this placement: {options}")
    for c in plan.changes:
        out.print(f"[yellow]•[/] {c.setting} = {c.value}: {c.reason}")
    for w in plan.warnings:
        out.print(f"[red]warning:[/] {w}")
