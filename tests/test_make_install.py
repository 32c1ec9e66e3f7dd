"""`make install` on a fresh venv: pip never runs its resolver while the llama-cpp-python wheel lacks its dependencies.

pip installs the wheel with --no-deps (to force our build over any other); the next pip run that resolves
must include the wheel, or pip prints "ERROR: pip's dependency resolver ... llama-cpp-python requires
diskcache ... numpy", which a newcomer reads as a failed install. This reads the recipe with `make -n`;
a real run takes minutes (torch), too long for the suite.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_first_resolving_pip_run_includes_the_llama_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"")  # present: no build step
    venv = tmp_path / "venv"
    dry = subprocess.run(["make", "-n", "-B", "install", f"WHEEL_DIR={wheels}", f"VENV={venv}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    pip_runs = [shlex.split(line)[line.split().index("install"):] for line in dry.stdout.splitlines()
                if " -m pip " in line and " install " in line]
    assert pip_runs, dry.stdout
    wheel_first = pip_runs[0]
    assert "--no-deps" in wheel_first and any("llama_cpp_python-0.3.36" in a for a in wheel_first)
    resolving = [run for run in pip_runs[1:] if "--no-deps" not in run]
    assert resolving and any("llama_cpp_python-0.3.36" in a for a in resolving[0]), resolving


def test_the_default_build_has_the_rpc_backend_and_rpc_0_leaves_it_out():
    """CI's one build covers the RPC tests (tests/rpc): GGML_RPC=ON unless RPC=0; the wheel cache key follows the flags."""
    flags = lambda **env: subprocess.run(["bash", "scripts/cmake_flags.sh"], cwd=ROOT, capture_output=True, text=True,  # noqa: E731
                                         env={"PATH": "/usr/bin:/bin", **env}, check=True).stdout.split()
    assert "-DGGML_RPC=ON" in flags() and "-DGGML_RPC=ON" in flags(RPC="1")
    assert "-DGGML_RPC=ON" not in flags(RPC="0")
    dry = subprocess.run(["make", "-n", "-B", "install", "RPC=0", "WHEEL_DIR=/nonexistent"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "GGML_RPC" not in dry.stdout
