"""Planning over remote devices (pure arithmetic: no rpc-server, no llama.cpp): where blocks, output and drafter go."""

from __future__ import annotations

import pytest

from localflash.errors import LocalflashError
from localflash.llama.rpc_wire import parse_endpoints
from localflash.plan.costs import GiB
from localflash.plan.devices import Gpu, HostMemory
from localflash.plan.fit import make_plan, runtime_kwargs
from localflash.plan.remote import OUTPUT_PATTERN
from localflash.plan.types import Wishes

HOST = HostMemory(64 * GiB, 60 * GiB)


def remote(endpoint: str, gib: float) -> Gpu:
    return Gpu(0, f"rpc-server {endpoint}", int(gib * GiB), int(gib * GiB), endpoint)


def test_two_remote_cards_and_a_local_one_split_the_27b_with_output_and_drafter_local(shaped):
    gpus = [remote("10.0.0.2:50052", 12), remote("10.0.0.3:50052", 12), Gpu(0, "RTX 3090", 24 * GiB, 24 * GiB)]
    plan = make_plan(shaped["27b"], shaped["dflash"], gpus, HOST, Wishes(ctx=32768))
    kw = runtime_kwargs(plan)
    assert kw["devices"] == ["rpc:10.0.0.2:50052#0", "rpc:10.0.0.3:50052#0", "gpu:0"]
    assert len(kw["tensor_split"]) == 3 and all(s > 0 for s in kw["tensor_split"])
    assert plan.devices[2].layers.endswith(", output") and plan.devices[2].drafter_weights > 0
    assert plan.drafter_device == 0 and not any(r.drafter_weights for r in plan.devices[:2])
    assert [r.remote for r in plan.devices] == ["10.0.0.2:50052", "10.0.0.3:50052", None]
    assert OUTPUT_PATTERN not in [o[0] for o in plan.tensor_overrides]  # the output lands on the local card anyway
    first_local = int(plan.devices[2].layers.split("-")[0])  # blocks before it are remote
    remote_taps = [lid for lid in shaped["dflash"].target_layers if lid - 1 < first_local]  # a tap reads block lid-1's output
    assert plan.traffic["remote_devices"] == 2 and 0 < len(remote_taps) < len(shaped["dflash"].target_layers)
    assert plan.traffic["round_trips"] == 2 + len(remote_taps)  # one read per remote device, one per tap made there


def test_remote_devices_only_keep_the_output_layer_and_drafter_on_this_machine(shaped):
    gpus = [remote("10.0.0.2:50052", 24), remote("10.0.0.3:50052", 24)]
    plan = make_plan(shaped["27b"], shaped["dflash"], gpus, HOST, Wishes(ctx=16384))
    assert plan.n_gpu_layers == shaped["27b"].n_layer_all + 1  # every block remote
    assert (OUTPUT_PATTERN, "CPU") in [tuple(o) for o in plan.tensor_overrides]
    assert not any("output" in r.layers for r in plan.devices) and plan.drafter_device is None
    assert plan.host.drafter_weights > 0 and plan.host.target_weights >= shaped["27b"].output_bytes
    rows = plan.n_outputs_max
    assert plan.traffic["rows"] == rows
    assert plan.traffic["activations_bytes"] == 2 * 2 * rows * shaped["27b"].n_embd * 4
    assert plan.traffic["round_trips"] == 2 + len(shaped["dflash"].target_layers)  # every tap is made remotely


def test_remote_memory_is_a_budget_like_a_card(shaped):
    with pytest.raises(LocalflashError, match="does not fit"):
        make_plan(shaped["27b"], None, [remote("10.0.0.2:50052", 4)], HostMemory(8 * GiB, 6 * GiB), Wishes(ctx=32768))


def test_endpoints_are_checked_host_colon_port():
    assert parse_endpoints("a:1, b:50052") == ["a:1", "b:50052"]
    assert parse_endpoints(["a:1", "b:2,c:3"]) == ["a:1", "b:2", "c:3"]
    for bad in ("a", "a:x", "a:0", ":5"):
        with pytest.raises(LocalflashError, match="is not HOST:PORT"):
            parse_endpoints(bad)
    with pytest.raises(LocalflashError, match="twice"):
        parse_endpoints("a:1,a:1")


def test_a_venv_made_by_make_install_has_the_rpc_backend_so_the_rpc_tests_never_skip_there():
    """tests/rpc skip without GGML_RPC; a venv whose `make install` stamp is the default (RPC) flags' must have it."""
    import hashlib
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    flags = subprocess.run(["bash", "scripts/cmake_flags.sh"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    stamp = Path(sys.prefix) / f".installed-{hashlib.sha1((flags + chr(10)).encode()).hexdigest()[:12]}"
    if "-DGGML_RPC=ON" in flags and stamp.exists():
        from localflash.llama import rpc

        assert rpc.supported(), f"{stamp.name}: built with {flags!r} but the installed wheel has no RPC backend"
