"""``localflash bench``: plain and speculative decoding on the same prompts, with a verdict per rig.

Every mode gets its own context on one shared target model, and the modes take
turns on each prompt (the order rotates from prompt to prompt), so slow drift
of the machine (clocks, heat, other load) hits every mode alike. Speed is
decode tokens per second (prefill excluded); ``same`` counts the prompts whose
speculative output equals the plain one token for token. The verdict (which
mode pays, per category) is saved per rig and pair in the user data dir;
``chat --draft auto`` starts from it.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import subprocess
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from localflash.errors import LocalflashError
from localflash.archs import KINDS as MODES, MODEL_DRAFTERS, SYNTHETIC, base_kind
from localflash.registry.pairs import data_dir
from localflash.speculative.stats import Stats

PROMPT_SETS = ("spec_bench", "humaneval")
HUMANEVAL_INSTRUCTION = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
VERDICT_FILE = "verdicts.json"
PAYS = 1.03  # a mode "pays" when it is at least this much faster than plain decoding
COUNTS = ("generated", "committed", "cycles", "drafted", "accepted")


# -- prompt sets ---------------------------------------------------------------

@dataclass
class BenchPrompt:
    id: str
    category: str
    text: str  # the user message (chat) or the raw prompt


PROMPT_SET_FILES = {"spec_bench": "spec_bench.jsonl.gz", "humaneval": "humaneval.jsonl.gz"}


def prompt_set_file(name: str) -> Path:
    """The packaged file of a named prompt set (``localflash/data``; licences in ``data/licenses``)."""
    path = Path(__file__).resolve().parents[1] / "data" / PROMPT_SET_FILES[name]
    if not path.is_file():
        raise LocalflashError(
            f"prompt set file not found: {path}",
            hint="the named sets ship with localflash: reinstall it (pip install -e .), "
            "or pass your own with --prompts FILE.jsonl",
        )
    return path


def prompt_set_rows(name: str) -> list[dict]:
    """The rows of a named prompt set, as in its upstream JSONL (for scripts)."""
    return [row for _, row in _jsonl_rows(prompt_set_file(name))]


def _jsonl_rows(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise LocalflashError(f"{path}:{lineno}: not JSON ({e.msg})", hint="one JSON object per line") from e
            if not isinstance(row, dict):
                raise LocalflashError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, row


def _prompt_text(row: dict) -> str | None:
    for key in ("prompt", "text", "question", "instruction"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    turns = row.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    msgs = row.get("messages")
    if isinstance(msgs, list):
        users = [m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[0], str):
            return users[0]
    return None


def load_prompts(spec: str, limit: int | None = None) -> tuple[str, list[BenchPrompt]]:
    """Prompts of a named set (``spec_bench``, ``humaneval``) or a JSONL file; ``limit`` per category.

    Spec-Bench uses the first turn of each question. JSONL rows need ``prompt``
    (or ``text``/``question``/``turns``/``messages``) and may name a ``category``.
    """
    prompts: list[BenchPrompt] = []
    if spec == "spec_bench":
        for lineno, row in _jsonl_rows(prompt_set_file("spec_bench")):
            prompts.append(BenchPrompt(str(row.get("question_id", lineno)), row.get("category", "spec_bench"), row["turns"][0]))
        name = "spec_bench"
    elif spec == "humaneval":
        for lineno, row in _jsonl_rows(prompt_set_file("humaneval")):
            prompts.append(BenchPrompt(row.get("task_id", str(lineno)), "humaneval", HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"])))
        name = "humaneval"
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise LocalflashError(
                f"--prompts {spec!r} is neither a prompt set nor a file",
                hint=f"use {' or '.join(PROMPT_SETS)}, or a JSONL file with a \"prompt\" field per line",
            )
        for lineno, row in _jsonl_rows(path):
            text = _prompt_text(row)
            if text is None:
                raise LocalflashError(f"{path}:{lineno}: no prompt", hint='give each line a "prompt" (or "text", "turns", "messages")')
            pid = row.get("id", row.get("question_id", row.get("task_id", lineno)))
            prompts.append(BenchPrompt(str(pid), str(row.get("category", path.stem)), text))
        name = str(path)
    if not prompts:
        raise LocalflashError(f"{name}: no prompts")
    if limit is not None:
        seen: dict[str, int] = {}
        kept = []
        for p in prompts:
            if seen.get(p.category, 0) < limit:
                kept.append(p)
                seen[p.category] = seen.get(p.category, 0) + 1
        prompts = kept
    return name, prompts


# -- the rig and the verdict ------------------------------------------------------

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            ).stdout.strip() or platform.machine()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpu_names() -> list[str]:
    from localflash.plan.devices import detect

    names = [g.name for g in detect()]  # NVML when nvidia-ml-py is installed
    if names:
        return names
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        names = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        if names:
            return names
    except (OSError, subprocess.SubprocessError):
        pass
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                names.append(line.split(":", 1)[1].strip())
    return names


def rig_info(n_gpu_layers: int) -> dict:
    """What the numbers were measured on: CPU, GPUs in use (if the build and flags offload), threads."""
    from localflash.llama.bindings import lib

    gpus = _gpu_names() if n_gpu_layers != 0 and lib().llama_supports_gpu_offload() else []
    cpu = _cpu_name()
    name = " + ".join(gpus) if gpus else f"{cpu} (CPU, {os.cpu_count()} threads)"
    return {"name": name, "cpu": cpu, "gpus": gpus, "cpu_count": os.cpu_count(), "system": platform.system()}


def pair_key(target: Path, drafter: Path | None) -> str:
    """Verdicts are keyed by file names, so ``--pair`` and explicit files find the same one."""
    return f"{Path(target).name}|{Path(drafter).name if drafter else '-'}"


def verdict_path() -> Path:
    return data_dir() / VERDICT_FILE


def _read_verdicts() -> dict:
    path = verdict_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data.get("verdicts", {}) if isinstance(data, dict) else {}


def save_verdict(verdict: dict) -> Path:
    verdicts = _read_verdicts()
    verdicts[f"{verdict['rig']} :: {verdict['pair_key']}"] = verdict
    path = verdict_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 1, "verdicts": verdicts}, indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def load_verdict(rig: str, key: str) -> dict | None:
    return _read_verdicts().get(f"{rig} :: {key}")


def all_verdicts() -> list[dict]:
    return list(_read_verdicts().values())


def apply_verdict(engine, mode_verdict: dict, weight: float = 4.0) -> bool:
    """Seed the engine's draft-length policy with the bench's per-position acceptance.

    Returns whether drafting paid on the bench (the starting state for ``--draft auto``).
    """
    policy = engine.policy
    rates = mode_verdict.get("position_acceptance") or []
    for j, rate in enumerate(rates[: policy.max_draft]):
        policy.hits[j] = float(rate) * weight
        policy.tries[j] = weight
    return float(mode_verdict.get("speedup", 1.0)) >= 1.0


def make_verdict(report: dict) -> dict:
    modes = [m for m in report["modes"] if m != "none" and not m.startswith(SYNTHETIC)]
    res = report["results"]
    per_mode = {}
    for m in modes:
        allr = res[m]["all"]
        per_mode[m] = {
            "speedup": allr["speedup"],
            "tok_s": allr["tok_s"],
            "tau": allr["tau"],
            "acceptance": allr["acceptance"],
            "position_acceptance": allr["position_acceptance"],
            "categories": {c: r["speedup"] for c, r in res[m]["categories"].items()},
        }
    best = max(modes, key=lambda m: per_mode[m]["speedup"], default=None)
    pays = best is not None and per_mode[best]["speedup"] >= PAYS
    if best is None:
        text = "only plain decoding was measured"
    elif pays:
        cats = per_mode[best]["categories"]
        wins = [f"{c} {s:.2f}×" for c, s in sorted(cats.items(), key=lambda kv: -kv[1]) if s >= PAYS]
        losses = [f"{c} {s:.2f}×" for c, s in sorted(cats.items(), key=lambda kv: kv[1]) if s < 1.0]
        text = f"{best} pays here: {per_mode[best]['speedup']:.2f}× plain overall"
        if len(cats) > 1 and wins:
            text += f"; best on {', '.join(wins[:3])}"
        if losses:
            text += f"; slower on {', '.join(losses[:3])}"
    else:
        text = f"speculation does not pay here (best: {best} {per_mode[best]['speedup']:.2f}×); decode plain (--spec none)"
    return {
        "rig": report["rig"]["name"],
        "rig_info": report["rig"],
        "pair": report["pair"]["name"],
        "pair_key": report["pair"]["key"],
        "target": report["pair"]["target"],
        "drafter": report["pair"]["drafter"],
        "date": report["date"],
        "prompts": report["prompts"]["set"],
        "n_prompts": report["prompts"]["n"],
        "max_tokens": report["settings"]["max_tokens"],
        "temperature": report["settings"]["temperature"],
        "plain_tok_s": res["none"]["all"]["tok_s"],
        "modes": per_mode,
        "best": best if pays else "none",
        "speculation_pays": pays,
        "text": text,
    }


# -- running ------------------------------------------------------------------------

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
        if m not in MODES:
            raise LocalflashError(f"unknown bench mode {m!r}", hint=f"use a comma list of {', '.join(MODES)}")
        if base_kind(m) in MODEL_DRAFTERS and cfg.drafter is None and not cfg.derive:
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
    mtp = any(base_kind(m) == "mtp" for m in modes)
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
            engines[m] = open_engine(replace(cfg, spec=m), target=target)
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
            "n_gpu_layers": cfg.n_gpu_layers,
        },
        "modes": modes,
        "results": results,
        "runs": runs,
        "peak_rss_bytes": peak_rss(),
        "energy": {"watts": watts, "price_per_kwh": price} if watts else None,
    }
    report["verdict"] = make_verdict(report)
    return report


def peak_rss() -> int | None:
    """Peak resident memory of this process in bytes (all engines together)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024


def table_rows(report: dict) -> list[dict]:
    rows = []
    cats = report["prompts"]["categories"]
    scopes = [(c, c) for c in cats] + ([("all", None)] if len(cats) > 1 else [])
    for label, scope in scopes:
        for m in report["modes"]:
            r = report["results"][m]["all"] if scope is None else report["results"][m]["categories"][scope]
            rows.append({"category": label, "mode": m, **r})
    return rows


def print_report(report: dict, console) -> None:
    from rich.text import Text

    from localflash.cli.render import bench_table, drafting_hist, energy_table, fmt_bytes, histogram

    energy = report.get("energy") or {}
    console.print(
        Text.assemble(
            ("bench ", "bold"), f"{report['pair']['name']} on {report['rig']['name']} · ",
            f"{report['prompts']['set']}: {report['prompts']['n']} prompts × {len(report['modes'])} modes, ",
            f"{report['settings']['max_tokens']} tokens each, temp {report['settings']['temperature']:g}",
            f", best of {report['settings']['repeat']}" if report["settings"]["repeat"] > 1 else "",
        )
    )
    if report["prompts"]["skipped"]:
        console.print(f"[yellow]skipped {report['prompts']['skipped']} prompts longer than the context ({report['settings']['ctx']})[/]")
    console.print(bench_table(table_rows(report)))
    for m in report["modes"]:
        if m == "none":
            continue
        allr = report["results"][m]["all"]
        s = Stats(cycles=allr["cycles"], accept_hist=list(allr["accept_hist"]), pos_tries=list(allr["pos_tries"]))
        hist, plain = drafting_hist(s)
        note = f" ({plain} of {allr['cycles']} cycles drafted nothing)" if plain else ""
        console.print(Text.assemble((f"{m}", "bold"), f": drafts accepted per cycle{note}"))
        if hist:
            console.print(histogram(hist))
    rss = report.get("peak_rss_bytes")
    console.print(f"peak memory (RSS, all modes loaded): {fmt_bytes(rss) if rss else 'unknown'}")
    if energy.get("watts"):
        price = energy.get("price_per_kwh") is not None
        console.print(
            f"energy per million tokens at {energy['watts']:g} W"
            + (f" and {energy['price_per_kwh']:g} per kWh" if price else "")
            + " (the same draw assumed for every mode):"
        )
        console.print(energy_table([{"mode": m, **report["results"][m]["all"]} for m in report["modes"]], price))
    if any(m.startswith(SYNTHETIC) for m in report["modes"]):
        console.print("[dim]synthetic@α: benchmark only — an oracle drafter that proposes plain decoding's own tokens, "
                      "each right with probability α; the target verifies as usual (not in the verdict)[/]")
    v = report["verdict"]
    style = "green" if v["speculation_pays"] else "yellow"
    console.print(Text.assemble(("verdict: ", "bold"), (v["text"], style)))
