"""An rpc-server killed mid-reply: that request ends with a clear error, and ``localflash serve`` answers the next one.

llama.cpp's RPC client aborts its process when a server goes away, so ``serve --rpc``
keeps the engine in a child process (``serve/isolated.py``); these run the real thing:
two rpc-servers, a live ``localflash serve``, a ``kill -9`` of one server mid-stream.
"""

from __future__ import annotations

import json

import httpx
import pytest

from localflash.llama import rpc
from localflash.testing.rpc import RpcServer
from localflash.testing.serve import LiveServer

pytestmark = pytest.mark.skipif(not rpc.supported(), reason="llama-cpp-python built without GGML_RPC (make install builds it with RPC)")


def test_server_killed_mid_stream_fails_that_request_and_serve_answers_the_next():
    a, b = RpcServer(threads=1), RpcServer(threads=1)
    server = LiveServer("--pair", "demo", "-t", "1", "--rpc", f"{a.endpoint},{b.endpoint}")
    try:
        body = {"messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
                "max_tokens": 400, "stream": True}
        events = []
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                events.append(ev)
                if len(events) == 3:
                    b.kill()  # mid-stream: the engine process aborts inside llama.cpp
        deltas = [e for e in events if "choices" in e]
        assert len(deltas) >= 3
        err = events[-1]["error"]
        assert err["code"] == "engine_lost" and err["message"].startswith("the engine process died mid-reply (signal 6")
        assert not any(e["choices"][0].get("finish_reason") for e in deltas)  # no pretend ending

        r = httpx.post(server.url + "/v1/chat/completions", timeout=300,
                       json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        log = server.text()
        assert f"engine restart without {b.endpoint}" in log and f"on {a.endpoint} and this machine" in log
        assert httpx.get(server.url + "/health").status_code == 200
        (slot,) = httpx.get(server.url + "/slots").json()
        assert slot["restarts"] == 1 and slot["rpc"] == [a.endpoint] and slot["state"] == "idle"
    finally:
        server.stop()
        a.kill()
        b.kill()


def test_serve_with_a_dead_server_at_start_exits_non_zero_with_one_line():
    import subprocess
    import sys

    from localflash.testing.rpc import free_port

    port = free_port()
    r = subprocess.run([sys.executable, "-m", "localflash.cli", "serve", "--pair", "demo", "--port", "0",
                        "--rpc", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1
    assert lines[0].startswith(f"error: RPC server 127.0.0.1:{port} is unreachable") and len(lines) == 2, r.stderr
