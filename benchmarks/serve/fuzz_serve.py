"""Fuzz `localflash serve` from its own OpenAPI schema with schemathesis: no 5xx, no hang.

Starts a server on 127.0.0.1 (tiny random-weight target + DFlash drafter, one
thread), runs `schemathesis run` over /openapi.json (positive and negative
cases, every operation) with the `not_a_server_error` check and a response-time
bound, then reads the server's own counters and sends one good request.

    .venv/bin/python benchmarks/serve/fuzz_serve.py --max-examples 60 --max-time 240
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from localflash.testing.serve import LiveServer, tiny_models  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-examples", type=int, default=60, help="test cases per operation and phase")
    ap.add_argument("--max-time", type=int, default=240, help="seconds for the whole schemathesis run")
    ap.add_argument("--max-response-time", type=float, default=30.0, help="a slower response counts as a hang")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lf-fuzz-"))
    target, drafter = tiny_models(work)
    server = LiveServer("-m", str(target), "--drafter", str(drafter), "-t", "1", "-c", "512", "--queue", "4", log=work / "server.log")
    report = work / "events.ndjson"
    t0 = time.perf_counter()
    try:
        cmd = [sys.executable, "-m", "schemathesis.cli", "run", server.url + "/openapi.json",
               "--checks", "not_a_server_error", "--max-response-time", str(args.max_response_time),
               "--max-examples", str(args.max_examples), "--max-time", str(args.max_time), "--seed", str(args.seed),
               "--workers", "1", "--request-timeout", str(args.max_response_time + 30), "--generation-database", "none",
               "--report", "ndjson", "--report-ndjson-path", str(report), "--no-color"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        statuses = _statuses(report)
        after = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})
        errors = server.metric("localflash:errors_total")
        finished = server.metric("localflash:requests_total")
    finally:
        rc = server.stop()
    log = server.log.read_text()
    summary = {
        "requests": sum(statuses.values()),
        "statuses": dict(sorted(statuses.items())),
        "server_errors_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "server_error_counter": {k: int(v) for k, v in errors.items()},
        "generations_by_finish": {k: int(v) for k, v in finished.items()},
        "tracebacks_in_log": log.count("Traceback"),
        "request_after_fuzz": after.status_code,
        "schemathesis_exit": run.returncode,
        "server_exit": rc,
        "wall_s": round(wall, 1),
    }
    print("\n".join(run.stdout.splitlines()[-25:]))
    print(json.dumps(summary, indent=1))
    ok = summary["server_errors_5xx"] == 0 and after.status_code == 200 and rc == 0 and run.returncode == 0
    print("fuzz: " + ("no 5xx, no hang, still serving" if ok else f"FAILED (log: {server.log})"))
    return 0 if ok else 1


def _statuses(report: Path) -> collections.Counter:
    """HTTP status of every response schemathesis saw (from its ndjson event log)."""
    counts: collections.Counter = collections.Counter()
    if not report.exists():
        return counts
    text = report.read_text()
    for m in re.finditer(r'"status_code":\s*(\d{3})', text):
        counts[int(m.group(1))] += 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
