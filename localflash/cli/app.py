"""The localflash command line. Heavy imports happen inside commands so --help is instant."""

from __future__ import annotations

import sys
import traceback
from typing import Optional

import typer

from localflash.cli.options import DRAFT_MAX, DRAFTER, MAX_TOKENS, MODEL, PAIR, RAW, SYSTEM, LoadFlags, SamplingFlags, shared_options, use
from localflash.errors import LocalflashError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Speculative decoding for quantized GGUF models: DFlash, draft models, n-gram lookup.",
)

_state = {"verbose": False}


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Show llama.cpp's log and full tracebacks.")):
    _state["verbose"] = verbose
    if verbose:
        from localflash.llama import set_verbose

        set_verbose(True)


def fail(message: str, hint: str | None = None, code: int = 1):
    typer.echo(f"error: {message}", err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(code)


@app.command()
@shared_options
def run(
    prompt: str = typer.Argument(..., help="The prompt (use - to read it from stdin)."),
    load: LoadFlags = use(),
    max_tokens: int = MAX_TOKENS.option(256),
    sampling: SamplingFlags = use(),
    raw: bool = RAW.option(),
    system: Optional[str] = SYSTEM.option(),
    json_out: bool = typer.Option(False, "--json", help="Print the statistics as JSON on stderr at the end."),
):
    """Generate text from a prompt; text on stdout, the summary on stderr."""
    from localflash.api import open_llm
    from localflash.errors import ContextOverflow
    from localflash.speculative.stats import STOP_REASONS

    if prompt == "-":
        prompt = sys.stdin.read()
    params = sampling.params()
    cfg = load.config()
    with open_llm(cfg) as llm:
        n_ctx = llm.n_ctx
        rounded = ""
        if cfg.ctx < n_ctx:
            rounded = f" (-c {cfg.ctx} rounded up: llama.cpp sizes the context in blocks of 256 tokens)"
        elif cfg.ctx > n_ctx:
            rounded = f" (asked {cfg.ctx}: the largest that fits in memory)"
        try:
            chunks = llm.stream(prompt, raw=raw, system=system or None, max_tokens=max_tokens, sampling=params)
        except ContextOverflow as e:
            fail(f"the prompt has {e.prompt_tokens} tokens but the context holds {n_ctx}{rounded}: no room to generate",
                 hint=f"raise -c/--ctx above {e.prompt_tokens} or shorten the prompt")
        if rounded:
            typer.echo(f"note: context {n_ctx} tokens{rounded}", err=True)
        out = sys.stdout
        for chunk in chunks:
            out.write(chunk.text)
            out.flush()
        out.write("\n")
        out.flush()
        stats = chunk.stats
        typer.echo(stats.summary(), err=True)
        off = llm.engine.policy.off_reason() if llm.engine.calibrated else None
        if off:
            typer.echo(off, err=True)
        if stats.stop == "context":
            typer.echo(f"stopped: the context is full at {n_ctx} tokens; raise -c/--ctx for a longer reply", err=True)
        elif stats.stop == "eog" and not stats.generated:
            typer.echo("note: the model ended its reply at once (its first token was end-of-generation)", err=True)
        elif stats.stop not in ("eog", "length"):
            typer.echo(f"stopped: {STOP_REASONS.get(stats.stop, stats.stop)}", err=True)
        if json_out:
            import json

            typer.echo(json.dumps(stats.to_dict() | {"n_ctx": n_ctx}), err=True)


@app.command()
@shared_options
def chat(
    load: LoadFlags = use(),
    draft: str = typer.Option("auto", "--draft", help="on | off | auto (per phase, where drafting pays)."),
    max_tokens: int = MAX_TOKENS.option(1024),
    sampling: SamplingFlags = use(temp=0.8, top_p=0.95, min_p=0.05),
    system: Optional[str] = SYSTEM.option(),
    think: Optional[bool] = typer.Option(None, "--think/--no-think", help="Thinking on/off (templates that have the switch)."),
    plain: bool = typer.Option(False, "--plain", help="No live status line, even on a terminal."),
):
    """Chat with a model: streamed replies, live tok/s and acceptance, slash commands (/help)."""
    from localflash.bench.rig import rig_info
    from localflash.bench.verdicts import load_verdict, pair_key
    from localflash.cli.chat import ChatSession, LiveUI, PlainUI
    from localflash.engine import open_engine

    if draft not in ("on", "off", "auto"):
        fail(f"--draft must be on, off or auto, got {draft!r}")
    params = sampling.params()
    cfg = load.config()
    engine = open_engine(cfg)
    try:
        verdict = None
        if draft == "auto" and engine.policy.max_draft:
            found = load_verdict(rig_info(cfg.n_gpu_layers)["name"], pair_key(cfg.target, cfg.drafter))
            verdict = (found or {}).get("modes", {}).get(engine.drafter.name)
        live = not plain and sys.stdin.isatty() and sys.stdout.isatty()
        session = ChatSession(
            engine, LiveUI() if live else PlainUI(), params, max_tokens=max_tokens, system=system,
            thinking=think, draft_mode=draft, verdict=verdict,
            info={"pair": cfg.pair, "target": str(cfg.target), "drafter": str(cfg.drafter) if cfg.drafter else None},
        )
        session.loop()
    finally:
        engine.close()


@app.command()
@shared_options
def bench(
    load: LoadFlags = use(skip=("spec",)),
    modes: Optional[str] = typer.Option(None, "--modes", help="Comma list of none, ngram, draft, dflash, mtp, dflash+ngram, draft+ngram, mtp+ngram, or 'all' (default: plain + the pair's kind); synthetic: a benchmark-only oracle drafter (see --synthetic-accept)."),
    prompts: str = typer.Option("spec_bench", "--prompts", help="spec_bench | humaneval | FILE.jsonl."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Prompts per category (0: all; default: 3 of each named set's categories, all of a FILE)."),
    max_tokens: int = MAX_TOKENS.option(128),
    repeat: int = typer.Option(1, "--repeat", help="Runs per prompt and mode; the fastest counts (rejects interference)."),
    sampling: SamplingFlags = use(),
    raw: bool = RAW.option(),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the full report as JSON to this file (- for stdout)."),
    watts: Optional[float] = typer.Option(None, "--watts", help="Power draw while decoding, for energy per million tokens."),
    price_kwh: Optional[float] = typer.Option(None, "--price-kwh", help="Electricity price per kWh (needs --watts)."),
    save: bool = typer.Option(True, "--save/--no-save", help="Save the verdict for this rig and pair (used by chat --draft auto)."),
    synthetic_accept: str = typer.Option("0.6,0.8,0.95", "--synthetic-accept", help="Acceptance rates of --modes synthetic (benchmark-only oracle drafter)."),
):
    """Plain vs speculative decoding on the same prompts, interleaved; table, histogram, verdict."""
    import json

    from rich.console import Console

    from localflash.bench.prompts import PROMPT_SETS, load_prompts
    from localflash.bench.run import check_modes, run_bench
    from localflash.bench.verdicts import save_verdict
    from localflash.cli.bench_report import print_report

    if limit is None:
        limit = 3 if prompts in PROMPT_SETS else 0
    if limit < 0:
        fail(f"--limit must be 0 (all) or more, got {limit}")
    if not 1 <= repeat <= 100:
        fail(f"--repeat must be in 1..100, got {repeat}")
    if watts is not None and watts <= 0:
        fail(f"--watts must be positive, got {watts:g}")
    if price_kwh is not None and (watts is None or price_kwh < 0):
        fail("--price-kwh needs --watts and a price of 0 or more", hint="e.g. --watts 350 --price-kwh 0.30")
    params = sampling.params()
    cfg = load.config()
    if modes is None or modes.strip().lower() == "all":
        kind = cfg.spec
        if kind == "auto":
            kind = "ngram"
            if cfg.drafter is not None and cfg.drafter.exists():
                from localflash.archs import kind_of_drafter_arch
                from localflash.llama import Model, ModelOptions

                probe = Model(cfg.drafter, ModelOptions(n_gpu_layers=0))
                kind = kind_of_drafter_arch(probe.arch)
                probe.close()
            elif cfg.derive:
                kind = "draft"
            else:
                from localflash.engine import nextn_layers

                kind = "mtp" if nextn_layers(cfg.target) else "ngram"
        wanted = [kind] if modes is None else ["ngram", kind]
    else:
        wanted = modes.split(",")
    mode_list = check_modes(wanted, cfg, synthetic_accept.split(","))
    set_name, plist = load_prompts(prompts, limit or None)
    to_stdout = json_out == "-"
    out = Console(stderr=to_stdout, highlight=False)
    err = Console(stderr=True)
    report = run_bench(
        cfg, mode_list, set_name, plist, max_tokens, params, raw=raw, ctx_given=load.ctx is not None,
        watts=watts, price=price_kwh, repeat=repeat, console=err,
    )
    print_report(report, out)
    if save and len(mode_list) > 1:
        path = save_verdict(report["verdict"])
        out.print(f"[dim]verdict saved to {path}[/]")
    if json_out:
        text = json.dumps(report, indent=1)
        if to_stdout:
            sys.stdout.write(text + "\n")
        else:
            with open(json_out, "w", encoding="utf-8") as f:
                f.write(text + "\n")


@app.command()
@shared_options
def serve(
    load: LoadFlags = use(),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", help="TCP port (0: any free one, printed at startup)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="LOCALFLASH_API_KEY", help="Require Authorization: Bearer KEY."),
    queue: int = typer.Option(16, "--queue", help="Requests that may wait while one runs; more get 503 + Retry-After."),
):
    """Serve the model over an OpenAI-compatible HTTP API (chat, completions, tools, SSE, /metrics)."""
    from localflash.api import open_llm
    from localflash.serve import require_stack, serve as run_server

    require_stack()
    llm = open_llm(load.config())
    try:
        run_server(llm, host=host, port=port, api_key=api_key, queue=queue)
    finally:
        llm.close()


@app.command("plan")
def plan(
    pair: Optional[str] = PAIR.option(),
    target: Optional[str] = MODEL.option(also=("--target",)),
    drafter: Optional[str] = DRAFTER.option(),
    vram: Optional[str] = typer.Option(None, "--vram", help="Plan for one card of this size, e.g. 24GiB."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Cards by index (0,1) or by size (24GiB,24GiB)."),
    ctx: Optional[int] = typer.Option(None, "--ctx", "-c", help="Context wish in tokens (0: the largest that fits)."),
    kv: Optional[str] = typer.Option(None, "--kv", help="KV cache type: f16, q8_0, q4_0 (default: the best that fits)."),
    split: str = typer.Option("layer", "--split", help="layer | tensor (experimental) for several cards."),
    draft_max: Optional[int] = DRAFT_MAX.option(),
    margin: str = typer.Option("512MiB", "--margin", help="Memory left free on every card."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan and the runtime settings as JSON."),
    mtp: Optional[bool] = typer.Option(None, "--mtp/--no-mtp", help="Price drafting with the target's MTP block (default: when it has one and no drafter is given)."),
):
    """Price target + drafter on your GPUs before loading: per-card table, settings, and what changed to fit."""
    from localflash.cli.plan import plan_command

    plan_command(pair, target, drafter, vram, gpus, ctx, kv, split, draft_max, margin, json_out, mtp=mtp)


models_app = typer.Typer(
    invoke_without_command=True, no_args_is_help=False,
    help="List the pairs of models.toml with file presence and size; `models check NAME` validates one.",
)
app.add_typer(models_app, name="models")


@models_app.callback()
def models(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the list as JSON."),
    paths: bool = typer.Option(False, "--paths", help="Show full file paths."),
):
    """List the pairs of models.toml (shipped + user file) with file presence and size."""
    if ctx.invoked_subcommand is not None:
        return
    import json
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from localflash.bench.rig import cpu_name
    from localflash.bench.verdicts import all_verdicts, pair_key
    from localflash.registry.check import list_rows
    from localflash.registry.pairs import config_dir, load_pairs
    from localflash.cli.render import fmt_bytes

    pairs = load_pairs()
    rows = list_rows(pairs)
    cpu = cpu_name()
    verdicts = {}
    for v in sorted(all_verdicts(), key=lambda v: v.get("date", "")):
        if v.get("rig_info", {}).get("cpu") == cpu:
            verdicts[v.get("pair_key")] = v
    for r, p in zip(rows, pairs.values()):
        v = verdicts.get(pair_key(p.target, p.drafter))
        r["verdict"] = v["text"] if v else None
    if json_out:
        typer.echo(json.dumps(rows, indent=1))
        return
    console = Console(highlight=False)

    def cell(f: dict, derive: str | None) -> Text:
        if f["path"] is None:
            return Text("-", style="dim")
        name = f["path"] if paths else Path(f["path"]).name
        if f["exists"]:
            return Text.assemble(name, "\n", ("✓ ", "green"), (fmt_bytes(f["size"]), "dim"))
        if derive:
            return Text.assemble(name, "\n", ("○ ", "yellow"), (f"made from the target ({derive}) on first use", "dim"))
        return Text.assemble(name, "\n", ("✗ missing", "red"))

    t = Table(header_style="bold")
    for col in ("pair", "kind", "target", "drafter", "ctx", "draft"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["kind"], cell(r["target_file"], None), cell(r["drafter_file"], r["derive"]), str(r["ctx"]), str(r["draft_max"]))
    console.print(t)
    for r in rows:
        if r["notes"] or r["verdict"]:
            console.print(Text.assemble((f"{r['name']}: ", "bold"), r["notes"], (f" · bench here: {r['verdict']}" if r["verdict"] else "", "green")))
    user = config_dir() / "models.toml"
    console.print(f"[dim]user pairs: {user}{'' if user.exists() else ' (none yet)'}; validate one with `localflash models check NAME`[/]")


@models_app.command("check")
def models_check(
    name: str = typer.Argument(..., help="A pair name from `localflash models`."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
):
    """Load a pair's metadata and validate it: files, arch, vocabulary, layer ids, fused width."""
    import json

    from rich.console import Console
    from rich.text import Text

    from localflash.registry.check import check_pair
    from localflash.registry.pairs import get_pair
    from localflash.cli.render import check_table

    p = get_pair(name)
    rows, ok = check_pair(p)
    if json_out:
        typer.echo(json.dumps({"pair": name, "ok": ok, "checks": [{"what": w, "ok": g, "detail": d} for w, g, d in rows]}, indent=1))
    else:
        console = Console(highlight=False)
        console.print(check_table(rows))
        console.print(Text(f"{name}: ok" if ok else f"{name}: not usable as configured", style="bold green" if ok else "bold red"))
    if not ok:
        bad = next(d for w, g, d in rows if g is False)
        fail(f"pair {name!r} failed its check: {bad}", hint="fix the pair in models.toml (see `localflash models --paths`)")


@app.command("convert-drafter")
def convert_drafter(
    src: str = typer.Argument(..., help="HF drafter folder (config.json + *.safetensors); a dflash GGUF with --to-hf."),
    out: str = typer.Argument(..., help="Output GGUF file (a folder with --to-hf)."),
    target: Optional[str] = typer.Option(None, "--target", "-m", help="Target GGUF: its tokenizer is copied, its shape checked."),
    quant: str = typer.Option("Q4_K_M", "--quant", help="Q4_K_M | Q8_0 | F16 | F32."),
    to_hf: bool = typer.Option(False, "--to-hf", help="Reverse: a dflash GGUF to an HF checkpoint (for vLLM/SGLang)."),
    dtype: str = typer.Option("bf16", "--dtype", help="HF weight type with --to-hf: bf16 | f16 | f32."),
):
    """Convert a DFlash drafter (z-lab HF checkpoint) to a quantized GGUF for llama.cpp, or back with --to-hf."""
    from localflash.formats.dflash_hf import convert_command

    convert_command(src, out, target, quant, to_hf, dtype)


@app.command("train-drafter")
def train_drafter(
    target: str = typer.Option(..., "--target", "-m", help="Target GGUF the drafter will serve."),
    prompts: list[str] = typer.Option(..., "--prompts", help="Prompt file(s): JSONL (prompt/question/... or turns) or text."),
    out: str = typer.Option(..., "--out", "-o", help="Drafter GGUF to write."),
    work_dir: Optional[str] = typer.Option(None, "--work-dir", help="Data, checkpoints and report (default: the user cache)."),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Let the target think while making the data."),
    max_prompts: int = typer.Option(0, "--max-prompts", help="Use only the first N prompts (0: all)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="Longest target response."),
    holdout_every: int = typer.Option(40, "--holdout-every", help="Every N-th prompt is held out for the τ check."),
    layers: int = typer.Option(5, "--layers", help="Draft layers."),
    taps: int = typer.Option(5, "--taps", help="Target layers fused (spread like z-lab's)."),
    block_size: int = typer.Option(16, "--block-size", help="Block size B (drafts B-1 tokens per forward)."),
    draft_vocab: int = typer.Option(0, "--draft-vocab", help="Reduced draft vocabulary with its own head (0: the target's)."),
    sliding_window: int = typer.Option(0, "--sliding-window", help="Attend only the last W context positions in every layer (0: full)."),
    full_layers: int = typer.Option(0, "--full-layers", help="With --sliding-window: the last N layers attend the whole context, prompt included."),
    embedding_scale: float = typer.Option(0.0, "--embedding-scale", help="Scale the block's token embeddings (0: off)."),
    train_head: bool = typer.Option(False, "--train-head", help="Train the reduced-vocabulary head (needs --draft-vocab)."),
    mask_token: int = typer.Option(-1, "--mask-token", help="Mask token id (-1: the target's, else an unused control token)."),
    epochs: float = typer.Option(3.0, "--epochs"),
    steps: int = typer.Option(0, "--steps", help="Training steps (overrides --epochs)."),
    anchors: int = typer.Option(64, "--anchors", help="Random anchors (blocks) per sequence per step."),
    batch: int = typer.Option(4, "--batch", help="Sequences per step."),
    lr: float = typer.Option(6e-4, "--lr"),
    gamma: float = typer.Option(0.0, "--gamma", help="Loss decay γ over block slots (0: the paper's 7 for B=16, 5 for 10, 4 for 8; a one-layer drafter learns its first slots better with 1)."),
    seed: int = typer.Option(0, "--seed"),
    quant: str = typer.Option("Q8_0", "--quant", help="Q4_K_M | Q8_0 | F16 | F32."),
    hf_out: Optional[str] = typer.Option(None, "--hf-out", help="Also write an HF checkpoint to this folder."),
    workers: int = typer.Option(1, "--workers", help="Parallel processes generating the data."),
    threads: int = typer.Option(0, "--threads", "-t", help="llama.cpp threads per process (0: automatic)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda for training."),
    eval_tokens: int = typer.Option(128, "--eval-tokens", help="Tokens per held-out prompt in the τ check."),
    fresh: bool = typer.Option(False, "--fresh", help="Restart training (keeps the generated data)."),
):
    """Train a DFlash drafter for TARGET: its own responses and features, random anchors, weighted CE, GGUF export, τ."""
    from pathlib import Path

    from localflash.train.pipeline import PipelineConfig, run as run_pipeline
    from localflash.train.trainer import TrainConfig

    cfg = PipelineConfig(
        target=Path(target).expanduser(), prompts=[Path(p).expanduser() for p in prompts], out=Path(out).expanduser(),
        work_dir=Path(work_dir).expanduser() if work_dir else None, thinking=thinking, max_prompts=max_prompts,
        max_new_tokens=max_new_tokens, holdout_every=holdout_every, workers=workers, threads=threads, layers=layers,
        taps=taps, block_size=block_size, draft_vocab=draft_vocab, sliding_window=sliding_window, full_layers=full_layers, embedding_scale=embedding_scale, train_head=train_head, mask_token=mask_token, quant=quant,
        hf_out=Path(hf_out).expanduser() if hf_out else None, eval_tokens=eval_tokens, fresh=fresh,
        train=TrainConfig(anchors=anchors, batch=batch, epochs=epochs, steps=steps, lr=lr, gamma=gamma, seed=seed, device=device),
    )
    report = run_pipeline(cfg)
    typer.echo(report["drafter"])


def main() -> None:
    """Console entry point: user errors become one line and a non-zero exit."""
    try:
        rc = app(standalone_mode=False)  # click returns typer.Exit's code here instead of exiting
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except LocalflashError as e:
        if _state["verbose"]:
            traceback.print_exc()
        typer.echo(f"error: {e.message}", err=True)
        if e.hint:
            typer.echo(f"hint: {e.hint}", err=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        sys.exit(130)
    except Exception as e:  # click usage errors and the like
        # typer ships its own copy of click (typer._click), so match by shape, not by class
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(e.exit_code)
        if _state["verbose"]:
            raise
        typer.echo(f"error: {type(e).__name__}: {e}", err=True)
        typer.echo("hint: run with --verbose for the full traceback", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
