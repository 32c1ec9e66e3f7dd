"""The verdict of a bench run (which mode pays on this rig, per category), saved per rig and pair.

``localflash bench`` makes and saves it; ``localflash models`` lists them; ``chat --draft auto``
starts from one (``LLM.conversation(verdict=...)`` seeds the draft-length policy with the bench's acceptance).
"""

from __future__ import annotations

import json
from pathlib import Path

from localflash.archs import SYNTHETIC
from localflash.registry.pairs import data_dir

VERDICT_FILE = "verdicts.json"
PAYS = 1.03  # a mode "pays" when it is at least this much faster than plain decoding


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
