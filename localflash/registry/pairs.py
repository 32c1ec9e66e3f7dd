"""models.toml -> named target/drafter pairs with resolved paths."""

from __future__ import annotations

import importlib.util
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from localflash.archs import DRAFT_MAX, KINDS, MODEL_DRAFTERS, base_kind
from localflash.errors import LocalflashError

SHIPPED = Path(__file__).resolve().parents[1] / "models.toml"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "localflash"


def derived_path(target: Path, ftype: str) -> Path:
    """Where ``target`` requantized to ``ftype`` is cached: a ``derive:`` drafter, a benchmark's requantized target."""
    return cache_dir() / "derived" / f"{Path(target).stem}.{ftype}.gguf"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "localflash"


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "localflash"


@dataclass
class Pair:
    name: str
    target: Path
    drafter: Path | None
    kind: str
    draft_max: int = 8
    ctx: int = 4096
    thinking: bool = False
    notes: str = ""
    acceptance: float | None = None  # expected drafter acceptance with f16 caches (greedy, fixed length): the guard's reference
    source: Path = field(default=SHIPPED)
    derive: str | None = None  # e.g. "Q2_K": the drafter is the target requantized
    target_hf: str | None = None  # "OWNER/REPO/FILE.gguf" or "OWNER/REPO:QUANT": the target's name on the hub
    drafter_hf: str | None = None
    sizes: dict = field(default_factory=dict)  # {"target": bytes, "drafter": bytes} as the hub lists them
    sha256: dict = field(default_factory=dict)  # {"target": hex, "drafter": hex} pinned (the hub's own is always checked)
    tested: str = ""  # what has been run here with this pair, and what has not

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "target": str(self.target),
            "drafter": str(self.drafter) if self.drafter else None,
            "kind": self.kind,
            "draft_max": self.draft_max,
            "ctx": self.ctx,
            "thinking": self.thinking,
            "notes": self.notes,
            "source": str(self.source),
            "target_hf": self.target_hf,
            "drafter_hf": self.drafter_hf,
            "sizes": self.sizes,
            "tested": self.tested,
        }


def resolve_path(spec: str, base: Path) -> Path:
    """Turn a models.toml path into a filesystem path (the file need not exist).

    ``hf:OWNER/REPO/FILE.gguf`` or ``hf:OWNER/REPO:QUANT``: the file in huggingface_hub's cache when it is
    there (nothing is asked of the network), else a path under the repo's cache folder that does not exist."""
    if spec.startswith("hf:"):
        from localflash.hub import local_path, parse_ref
        from localflash.hub.client import repo_dir

        ref = parse_ref(spec)
        return local_path(ref) or repo_dir(ref.repo) / "snapshots" / "not-downloaded" / (ref.file or f"{ref.quant or 'default'}.gguf")
    if spec.startswith("pkg:"):
        package, _, rest = spec[4:].partition("/")
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            return Path(f"<package {package} not installed>") / rest
        return Path(list(found.submodule_search_locations)[0]) / rest
    if spec.startswith("cache:"):
        return cache_dir() / spec[6:]
    p = Path(spec).expanduser()
    return p if p.is_absolute() else (base.parent / p)


def _parse(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise LocalflashError(f"{path}: bad TOML: {e}", hint="fix the line named above") from e


def _pair(name: str, raw: dict, source: Path) -> Pair:
    if not isinstance(raw, dict) or "target" not in raw:
        raise LocalflashError(f"{source}: pair {name!r} has no target")
    kind = raw.get("kind", "ngram" if "drafter" not in raw else "draft")
    if kind not in KINDS:
        raise LocalflashError(f"{source}: pair {name!r} has kind {kind!r}", hint=f"use one of {', '.join(KINDS)}")
    target = resolve_path(str(raw["target"]), source)
    hf = {k: str(raw[k])[3:] for k in ("target", "drafter") if str(raw.get(k, "")).startswith("hf:")}
    drafter_spec = raw.get("drafter")
    derive = None
    drafter = None
    if drafter_spec:
        drafter_spec = str(drafter_spec)
        if drafter_spec.startswith("derive:"):
            derive = drafter_spec[7:]
            drafter = derived_path(target, derive)
        else:
            drafter = resolve_path(drafter_spec, source)
    if base_kind(kind) in MODEL_DRAFTERS and drafter is None:
        raise LocalflashError(f"{source}: pair {name!r} of kind {kind} needs a drafter")
    try:
        return Pair(
            name=name,
            target=target,
            drafter=drafter,
            kind=kind,
            draft_max=int(raw.get("draft_max", DRAFT_MAX[base_kind(kind)] or 8)),
            ctx=int(raw.get("ctx", 4096)),
            thinking=bool(raw.get("thinking", False)),
            notes=str(raw.get("notes", "")),
            acceptance=float(raw["acceptance"]) if raw.get("acceptance") is not None else None,
            source=source,
            derive=derive,
            target_hf=hf.get("target"),
            drafter_hf=hf.get("drafter"),
            sizes={k: int(raw[f"{k}_size"]) for k in ("target", "drafter") if f"{k}_size" in raw},
            sha256={k: str(raw[f"{k}_sha256"]).lower() for k in ("target", "drafter") if raw.get(f"{k}_sha256")},
            tested=str(raw.get("tested", "")),
        )
    except (TypeError, ValueError) as e:
        raise LocalflashError(f"{source}: pair {name!r}: {e}") from e


def load_pairs(paths: list[Path] | None = None) -> dict[str, Pair]:
    """Shipped pairs, then the user's file (its pairs override same-named ones)."""
    if paths is None:
        paths = [SHIPPED, config_dir() / "models.toml"]
    pairs: dict[str, Pair] = {}
    for path in paths:
        if not path.exists():
            continue
        data = _parse(path)
        for name, raw in (data.get("pairs") or {}).items():
            pairs[name] = _pair(name, raw, path)
    return pairs


def get_pair(name: str, paths: list[Path] | None = None) -> Pair:
    pairs = load_pairs(paths)
    if name not in pairs:
        known = ", ".join(sorted(pairs)) or "none"
        raise LocalflashError(f"unknown pair {name!r}", hint=f"known pairs: {known} (see `localflash models`)")
    return pairs[name]
