"""The GPU device check's CPU dry run (benchmarks/device/device_check.sh --cpu-dry-run): the hybrid MTP stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device" / "device_check.sh"


def dry_run(tmp_path, lf_env, **env):
    return subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**lf_env, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OUT": str(tmp_path), **env})


def test_dry_run_of_the_hybrid_mtp_stage(tmp_path, lf_env):
    """A tiny qwen35 with one MTP block, loaded as --spec mtp: both speeds, acceptance, greedy equality, the plan's price."""
    r = dry_run(tmp_path, lf_env, TARGETS="27b-mtp")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "device_check_dry.json").read_text())
    st = rep["stages"]["27b-mtp"]
    assert st["arch"] == "qwen35" and st["n_layer_nextn"] == 1 and st["spec"] == "mtp"
    assert st["plain"]["tok_s"] > 0 and st["mtp"]["tok_s"] > 0 and st["plain"]["drafted"] == 0
    assert st["mtp"]["drafted"] > 0 and st["mtp"]["acceptance"] is not None  # random weights: ~0, but measured
    assert st["greedy_equality"]["tokens"] > 0 and "equal" in st["greedy_equality"]
    assert st["memory"]["plan"]["n_ctx"] > 0 and "host" in st["memory"]["plan"]
    assert not rep.get("errors") and not rep["skipped"]


def test_dry_run_refuses_a_bench_host_variant_it_does_not_have(tmp_path, lf_env):
    r = dry_run(tmp_path, lf_env, TARGETS="27b-mtp", HOST_VARIANTS="graph,no-such-variant")
    assert r.returncode != 0 and "names no variant no-such-variant" in r.stderr
