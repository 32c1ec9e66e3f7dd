"""llama.cpp's RPC backend: two rpc-servers on 127.0.0.1 hold the target's layers; the output equals local plain output.

The servers are ``python -m localflash.llama.rpc_server`` (CPU backends, the installed wheel's
own llama.cpp), started with ggml's batch-invariant CPU matmuls like ``--exact`` on this side,
so greedy speculative decoding over the wire is compared token for token with plain decoding
that never touched RPC.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from localflash.api import load
from localflash.engine import exact_options
from localflash.llama import rpc
from localflash.registry.pairs import get_pair
from localflash.testing.rpc import RpcServer, free_port

# equality is claimed in exact mode: chosen before this process makes its first context (as tests/speculative)
exact_options(True, "llama")

pytestmark = pytest.mark.skipif(not rpc.supported(), reason="llama-cpp-python built without GGML_RPC (make install builds it with RPC)")

PROMPTS = ["The river and the garden", "def is_prime(n):", "Name three colours and three animals."]


@pytest.fixture(scope="module")
def servers():
    a, b = RpcServer(threads=1), RpcServer(threads=1)
    yield [a.endpoint, b.endpoint]
    a.kill()
    b.kill()


def outputs(n_tokens: int, **options) -> tuple[list[list[int]], object, dict]:
    """Each prompt's greedy reply, the plan, and the replies' drafted and accepted tokens together."""
    with load(threads=1, exact=True, **options) as llm:
        done = [llm.generate(p, max_tokens=n_tokens) for p in PROMPTS]
        counts = {"drafted": sum(c.stats.drafted for c in done), "accepted": sum(c.stats.accepted for c in done)}
        return [c.token_ids for c in done], llm.info().plan, counts


def remote_blocks(plan) -> dict[str, str]:
    return {row.remote: row.layers for row in plan.devices if row.remote}


def test_tiny_target_every_drafter_over_two_rpc_servers_equals_local_plain(servers, tiny_target, tiny_dflash, tiny_drafters):
    """``--fixed``: every cycle drafts (the lookup: wherever it finds a match), so the equality covers verify passes over
    the wire, and the drafted and accepted counts say so. The random DFlash drafter is (almost) never right on any
    prompt, over RPC or not: its counts over RPC must equal its counts with the target local (a verify that went wrong
    on the wire would change them); the demo pair's trained drafter shows DFlash accepting over RPC (test below)."""
    want, _, _ = outputs(48, model=tiny_target, spec="none", ctx=1024)
    _, _, dflash_local = outputs(48, model=tiny_target, spec="dflash", drafter=tiny_dflash, ctx=1024, fixed=True, draft_max=4)
    cases = [("none", None), ("ngram", None), ("dflash", tiny_dflash), ("draft", tiny_drafters["near"]),
             ("dflash+ngram", tiny_dflash)]
    for spec, drafter in cases:
        got, plan, counts = outputs(48, model=tiny_target, spec=spec, drafter=drafter, ctx=1024, rpc=servers, fixed=True, draft_max=4)
        assert got == want, f"--spec {spec} over RPC diverged from local plain decoding"
        if spec == "none":
            assert counts["drafted"] == 0
        else:
            assert counts["drafted"] > 0, (spec, counts)
        if spec in ("ngram", "draft", "dflash+ngram"):
            assert counts["accepted"] > 0, (spec, counts)  # the lookup on the prompts' repeats, a noisy copy of the target
        if spec == "dflash":
            assert counts == dflash_local, (counts, dflash_local)
        placed = remote_blocks(plan)
        assert set(placed) == set(servers) and all(placed.values()), placed  # both servers hold blocks
        assert "blocks" not in plan.host.layers  # every block remote; the host keeps embedding + output


def test_demo_pair_over_two_rpc_servers_equals_local_plain(servers):
    """The trained DFlash drafter, the n-gram lookup and the target as its own draft model, ``--fixed``: every one
    drafts and has drafts accepted over the wire."""
    demo = get_pair("demo")
    want, _, _ = outputs(64, pair="demo", spec="none")
    for spec, drafter in (("dflash", None), ("ngram", None), ("draft", demo.target)):
        got, plan, counts = outputs(64, pair="demo", spec=spec, drafter=drafter, rpc=servers, fixed=True, draft_max=4)
        assert got == want, f"demo --spec {spec} over RPC diverged from local plain decoding"
        assert counts["drafted"] > 0 and counts["accepted"] > 0, (spec, counts)
        placed = remote_blocks(plan)
        assert set(placed) == set(servers)
        n_remote = sum(int(b) - int(a) + 1 for a, b in (v.split(",")[0].split("-") for v in placed.values()))
        assert n_remote == 30  # all of SmolLM2-135M's 30 blocks; the output layer stays with the drafter
        assert plan.traffic["remote_devices"] == 2
        assert plan.traffic["round_trips"] == 2 + (5 if spec == "dflash" else 0)  # the demo drafter taps 5 remote layers


def test_round_trips_per_pass_are_what_the_plan_says_whatever_the_rows(servers):
    """Counted on the wire: a proxy in front of each server counts client->server bursts (one per round trip)."""
    from localflash.testing.rpc import DelayProxy

    proxies = [DelayProxy(e, 0) for e in servers]
    try:
        for spec in ("none", "dflash", "ngram"):
            with load(pair="demo", spec=spec, threads=1, fixed=True, draft_max=4, rpc=[p.endpoint for p in proxies]) as llm:
                llm.generate("Hello", max_tokens=4)
                for p in proxies:
                    p.reset_counts()
                c = llm.generate("one two three one two three one two three one two", max_tokens=64)
                passes = c.stats.cycles + 1  # the prefill pass counts too (a few more reads): diluted over 64 tokens
                per_pass = sum(p.bursts for p in proxies) / passes
                assert abs(per_pass - llm.info().plan.traffic["round_trips"]) <= 0.3, (spec, per_pass)
                if spec == "ngram":
                    assert c.stats.drafted > 0  # multi-row verify passes, still the round trips of one row
    finally:
        for p in proxies:
            p.close()


def test_probe_reads_memory_over_the_wire(servers):
    from localflash.llama.rpc_wire import probe

    for e in servers:
        (dev,) = probe(e)
        assert dev.endpoint == e and 0 < dev.free <= dev.total


def _cli(*args, timeout=120):
    import os

    return subprocess.run([sys.executable, "-m", "localflash.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def test_dead_server_at_start_is_one_line_naming_the_host_and_what_to_run():
    port = free_port()
    r = _cli("run", "--pair", "demo", "-n", "4", "--rpc", f"127.0.0.1:{port}", "hello")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and r.stdout == ""
    assert lines[0].startswith(f"error: RPC server 127.0.0.1:{port} is unreachable"), r.stderr
    assert lines[1] == f"hint: start it there: localflash rpc-server --port {port} (same localflash/llama.cpp build on both ends)"
    assert len(lines) == 2, r.stderr


def test_models_check_reports_an_unreachable_server_in_one_line(servers):
    port = free_port()
    r = _cli("models", "check", "demo", "--rpc", f"{servers[0]},127.0.0.1:{port}")
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()
    assert err[0].startswith(f"error: RPC server 127.0.0.1:{port} is unreachable") and len(err) == 2, r.stderr
    assert f"rpc-server {servers[0]}" in r.stdout and "GiB free" in r.stdout


def test_rpc_server_refuses_a_non_loopback_host_without_allow_remote():
    r = subprocess.run([sys.executable, "-m", "localflash.llama.rpc_server", "--host", "0.0.0.0", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("error: refusing to listen on 0.0.0.0: the RPC server has no authentication")


def test_plan_with_rpc_shows_remote_rows_and_traffic(servers, capsys):
    from rich.console import Console

    from localflash.cli.plan import plan_command
    from localflash.plan.devices import HostMemory

    console = Console(width=200, highlight=False)
    with console.capture() as cap:
        plan = plan_command(pair="demo", rpc=",".join(servers), console=console, detected=[],
                            host=HostMemory(64 << 30, 32 << 30))
    text = cap.get()
    for e in servers:
        assert f"RPC {e}" in text
    assert "network per verify pass of 16 tokens: 7 round trip(s) (2 remote device(s) + drafter taps read there)" in text
    assert plan.device_keys == [f"rpc:{e}#0" for e in servers]
    assert ("^(output|output_norm|token_embd)\\.weight$", "CPU") in [tuple(o) for o in plan.tensor_overrides]
