"""The rig a benchmark runs on, and the shared pieces of the benchmark scripts (benchmarks/).

Rig facts (:func:`cpu_name`, :func:`gpu_names`, :func:`rig_info`, :func:`machine_info`)
name what a figure was measured on; ``localflash bench`` and ``localflash models`` use them too.

One target model is loaded once. Each *mode* is an Engine with its own draft
policy: plain decoding, or one drafter kind with a fixed draft length or the
adaptive length. Modes of one drafter kind share one target context and one
drafter (every run starts from an empty cache, so sharing is safe), and plain
decoding gets a context of its own, so nothing a drafter switches on (layer
input capture for DFlash) slows the plain baseline down.

Timing. ``llama_decode`` is wrapped per context, so a run splits its decode
phase into target forward time, drafter forward time (decode calls on the
drafter's context, feature injection included) and host time = everything
else (sampling, the Python loop, batch filling, ctypes). The same split
is kept in CPU seconds of the calling thread (``time.thread_time``): with one
llama.cpp thread the compute runs on that thread, so the CPU-time host share
is the host overhead a machine of one's own would see, free of the time
other processes take the core away (which wall-clock shares include).
On a CPU ``llama_decode`` returns when the compute is done; on a GPU the first logits
read waits for it, so ``sync`` (default on for GPUs) adds an explicit
``llama_synchronize`` to keep device time out of the host share.

Decode tok/s = (tokens after the first) / (decode-phase seconds): the first
token comes out of prefill, so it is counted with the prompt, the same way
llama.cpp's ``llama-speculative-simple`` counts (its prompt pass leaves the
last prompt token to the first decode cycle).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from localflash.bench.prompts import BenchPrompt

ROOT = Path(__file__).resolve().parents[2]  # the checkout (git commit in reports; peer/ builds)

# -- environment ----------------------------------------------------------------

def set_omp_wait(policy: str) -> None:
    """Set OpenMP's wait policy for llama.cpp's threads (and for any peer binary started later).

    ggml's CPU backend (built with OpenMP) meets at an ``omp barrier`` several
    times per layer. With the default (active) policy a thread that arrives
    first spins; when other processes hold the cores, the thread it waits for
    is off the CPU, and a 2-thread decode of SmolLM2 drops from ~85 to
    0.2-0.6 tok/s on this 2-core machine at load 10. ``passive`` makes waiting
    threads sleep: slower on an idle machine, far faster on a shared one.
    Must run before llama_cpp (libgomp) is loaded.
    """
    import sys

    if policy == "default":
        return
    if "llama_cpp" in sys.modules:
        raise RuntimeError("set_omp_wait must run before llama_cpp is imported")
    os.environ["OMP_WAIT_POLICY"] = policy.upper()


# -- prompts ------------------------------------------------------------------

def render(model, text: str) -> tuple[str, list[int]]:
    """The chat-formatted prompt text (what a C++ peer is given) and its tokens."""
    from localflash.prompt import render_chat, tokenize_prompt

    if model.chat_template():
        s = render_chat(model, [{"role": "user", "content": text}])
        return s, tokenize_prompt(model, s)
    return text, model.tokenize(text)


# -- modes --------------------------------------------------------------------

@dataclass
class Mode:
    name: str  # "plain", "ngram-k4", "draft-adaptive", ...
    kind: str  # none or a drafter kind (archs.KINDS): ngram, draft, dflash, eagle3, mtp, their +ngram forms
    k: int  # fixed draft length, or the adaptive maximum
    adaptive: bool
    engine: object = None


class Timer:
    """Wraps a Context's ``_run`` (the one place ``llama_decode`` is called) and adds up its seconds."""

    def __init__(self, ctx, sync: bool = False):
        from localflash.llama.bindings import lib

        self.seconds = 0.0
        self.cpu = 0.0  # this thread's CPU seconds inside llama_decode (all of it when n_threads = 1)
        self.calls = 0
        inner = ctx._run
        sync_fn = lib().llama_synchronize if sync else None
        ptr = ctx.ptr

        def timed(raw, n):
            t, c = time.perf_counter(), time.thread_time()
            inner(raw, n)
            if sync_fn is not None:
                sync_fn(ptr)
            self.seconds += time.perf_counter() - t
            self.cpu += time.thread_time() - c
            self.calls += 1

        ctx._run = timed


@dataclass
class Bench:
    """A loaded target and the drafters and engines of every mode."""

    target: object
    modes: list[Mode]
    timers: dict[str, tuple[Timer, Timer | None]] = field(default_factory=dict)  # kind -> (target, drafter)
    closers: list = field(default_factory=list)

    def close(self) -> None:
        for c in self.closers:
            c()


def mode_names(kinds: list[str], lengths: list[int], adaptive_max: dict[str, int], adaptive: bool = True) -> list[tuple[str, str, int, bool]]:
    out = [("plain", "none", 0, False)]
    for kind in kinds:
        for k in lengths:
            if kind == "dflash" and k > adaptive_max.get("dflash", 15):
                continue
            out.append((f"{kind}-k{k}", kind, k, False))
        if adaptive:
            out.append((f"{kind}-adaptive", kind, adaptive_max.get(kind, 8), True))
    return out


def build(target_path: Path, drafters: dict[str, Path | None], specs: list[tuple[str, str, int, bool]], *, n_ctx: int,
          threads: int = 0, n_gpu_layers: int = -1, sync: bool = False, target=None) -> Bench:
    """Load everything ``specs`` (from :func:`mode_names`) needs; ``drafters`` maps a model kind (dflash, draft, eagle3) -> its file."""
    from localflash.archs import MODEL_DRAFTERS, RECURRENT_ARCHS, base_kind
    from localflash.engine import make_drafter
    from localflash.llama import Context, ContextOptions, Model, ModelOptions
    from localflash.speculative.drafter import Drafter, LookupFirstDrafter
    from localflash.speculative.loop import Engine

    if target is None:
        mtp = any(kind.startswith("mtp") for _, kind, _, _ in specs)
        target = Model(target_path, ModelOptions(n_gpu_layers=n_gpu_layers, load_mtp=mtp))
    bench = Bench(target, [])
    kmax = {kind: max([k for _, kd, k, _ in specs if kd == kind] or [0]) for kind in {s[1] for s in specs}}
    shared: dict[str, tuple[object, object]] = {}
    for kind in kmax:
        n_rs = kmax[kind] if target.arch in RECURRENT_ARCHS else 0  # as engine/plan: the longest draft
        ctx = Context(target, ContextOptions(n_ctx=n_ctx, n_outputs_max=max(kmax[kind] + 1, 1), n_threads=threads, n_rs_seq=n_rs))
        if kind == "none":
            drafter = Drafter()
        else:
            base = base_kind(kind)
            dm = Model(drafters[base], ModelOptions(n_gpu_layers=n_gpu_layers)) if base in MODEL_DRAFTERS else None
            drafter = make_drafter(kind, target, ctx, dm, n_ctx=n_ctx, max_draft=max(kmax[kind], 1), threads=threads)
        inner = drafter.model if isinstance(drafter, LookupFirstDrafter) else drafter
        drafter_timer = Timer(inner.ctx, sync) if hasattr(inner, "ctx") else None  # drafters with a context of their own
        bench.timers[kind] = (Timer(ctx, sync), drafter_timer)
        shared[kind] = (ctx, drafter)
        bench.closers.append(lambda c=ctx, d=drafter: (d.close(), c.close()))
    for name, kind, k, adaptive in specs:
        ctx, drafter = shared[kind]
        eng = Engine(target, ctx, drafter, adaptive=adaptive, draft_max=k)
        bench.modes.append(Mode(name, kind, k, adaptive, eng))
    return bench


@dataclass
class Run:
    mode: str
    prompt: str
    category: str
    prompt_tokens: int
    generated: int
    tokens: list[int]
    t_decode: float
    t_target: float  # target llama_decode seconds in the decode phase
    t_draft: float  # drafter llama_decode seconds in the decode phase
    t_prefill: float
    stats: dict
    cpu_decode: float = 0.0  # CPU seconds of this thread in the decode phase
    cpu_inside: float = 0.0  # ... of which inside llama_decode (target and drafter)

    @property
    def cpu_host(self) -> float:
        return max(0.0, self.cpu_decode - self.cpu_inside)

    @property
    def t_host(self) -> float:
        return max(0.0, self.t_decode - self.t_target - self.t_draft)

    @property
    def tok_s(self) -> float:
        return (self.generated - 1) / self.t_decode if self.t_decode > 0 else 0.0


def run_one(bench: Bench, mode: Mode, prompt: BenchPrompt, tokens: list[int], max_tokens: int) -> Run:
    """Generate greedily from an empty cache; split the decode phase by the decode timers."""
    from localflash.speculative.stats import Stats

    eng = mode.engine
    eng.reset()
    tt, dt = bench.timers[mode.kind]
    st = Stats()
    out: list[int] = []
    gen = eng.generate(tokens, max_tokens, None, st)
    first = next(gen, None)  # prefill and the first token; the decode phase starts here
    t0, d0 = tt.seconds, dt.seconds if dt else 0.0
    c0, ci0 = time.thread_time(), tt.cpu + (dt.cpu if dt else 0.0)
    if first:
        out += first
        for new in gen:
            out += new
    cpu = time.thread_time() - c0
    cpu_inside = tt.cpu + (dt.cpu if dt else 0.0) - ci0
    t_target = tt.seconds - t0
    t_draft = (dt.seconds - d0) if dt else 0.0
    d = st.to_dict()
    return Run(mode.name, prompt.id, prompt.category, len(tokens), st.generated, out, st.t_decode, t_target, t_draft,
               st.t_prefill, d, cpu, cpu_inside)


def summarize(runs: list[Run], plain: list[Run] | None = None) -> dict:
    """Totals over runs: tok/s, τ, acceptance per position, time split, host per cycle."""
    gen = sum(r.generated - 1 for r in runs)
    t = sum(r.t_decode for r in runs)
    cycles = sum(r.stats["cycles"] for r in runs)
    drafted = sum(r.stats["drafted"] for r in runs)
    accepted = sum(r.stats["accepted"] for r in runs)
    committed = sum(r.stats["committed"] for r in runs)
    tries: list[int] = []
    hits: list[int] = []
    hist: list[int] = []
    for r in runs:
        for arr, src in ((tries, r.stats["pos_tries"]), (hits, r.stats["pos_hits"]), (hist, r.stats["accept_hist"])):
            for i, v in enumerate(src):
                while len(arr) <= i:
                    arr.append(0)
                arr[i] += v
    t_target = sum(r.t_target for r in runs)
    t_draft = sum(r.t_draft for r in runs)
    t_host = sum(r.t_host for r in runs)
    row = {
        "runs": len(runs),
        "tokens": gen,
        "seconds": t,
        "tok_s": gen / t if t > 0 else 0.0,
        "cycles": cycles,
        "drafted": drafted,
        "accepted": accepted,
        "tau": committed / cycles if cycles else 0.0,
        "acceptance": accepted / drafted if drafted else 0.0,
        "position_acceptance": [h / n if n else 0.0 for h, n in zip(hits + [0] * len(tries), tries)],
        "accept_hist": hist,
        "t_target": t_target,
        "t_draft": t_draft,
        "t_host": t_host,
        "target_share": t_target / t if t > 0 else 0.0,
        "draft_share": t_draft / t if t > 0 else 0.0,
        "host_share": t_host / t if t > 0 else 0.0,
        "host_ms_per_cycle": 1000 * t_host / cycles if cycles else 0.0,
        "cycle_ms": 1000 * t / cycles if cycles else 0.0,
    }
    cpu = sum(r.cpu_decode for r in runs)
    cpu_host = sum(r.cpu_host for r in runs)
    row.update(host_cpu_share=cpu_host / cpu if cpu > 0 else 0.0, host_cpu_ms_per_cycle=1000 * cpu_host / cycles if cycles else 0.0)
    if plain is not None:
        by_prompt = {r.prompt: r for r in plain}
        same = sum(1 for r in runs if r.prompt in by_prompt and r.tokens == by_prompt[r.prompt].tokens)
        row["same_as_plain"] = same
    return row


def fmt_pos(acc: list[float], n: int = 8) -> str:
    return " ".join(f"{a:.2f}" for a in acc[:n]) + (" …" if len(acc) > n else "")


# -- the machine ----------------------------------------------------------------

def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo, sysctl on macOS, else what platform knows)."""
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


def gpu_names() -> list[str]:
    """The names of the NVIDIA GPUs here (NVML, nvidia-smi or /proc/driver/nvidia; none: [])."""
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

    gpus = gpu_names() if n_gpu_layers != 0 and lib().llama_supports_gpu_offload() else []
    cpu = cpu_name()
    name = " + ".join(gpus) if gpus else f"{cpu} (CPU, {os.cpu_count()} threads)"
    return {"name": name, "cpu": cpu, "gpus": gpus, "cpu_count": os.cpu_count(), "system": platform.system()}


def machine_info() -> dict:
    """The machine and software versions a script's figures come from (for its JSON report)."""
    from importlib.metadata import version

    import numpy

    info = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": version("llama-cpp-python"),
        "numpy": numpy.__version__,
    }
    try:
        info["localflash_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout
        info["localflash_dirty"] = bool(dirty.strip())
    except OSError:
        pass
    return info


def load_snapshot() -> dict:
    """Load average and the processes using the CPU right now (others share this machine)."""
    snap = {"loadavg": list(os.getloadavg())}
    try:
        top = subprocess.run(["top", "-bn1", "-w", "200"], capture_output=True, text=True, timeout=10).stdout.splitlines()
        snap["top"] = [ln for ln in top[:20] if ln.strip()][:16]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return snap


def peak_rss_bytes() -> int | None:
    """Peak resident memory of this process in bytes (None where unknown: Windows)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024
