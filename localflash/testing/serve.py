"""A `localflash serve` process on 127.0.0.1 for the serve scripts (fuzz, soak): start, wait, stop, RSS."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def tiny_models(folder: Path) -> tuple[Path, Path]:
    """The test suite's tiny target (4-layer llama, ChatML) and a DFlash drafter for it."""
    from localflash.formats.dflash_gguf import DFlashSpec
    from localflash.testing.tiny import TinySpec, write_dflash, write_target

    target = folder / "target.gguf"
    drafter = folder / "dflash.gguf"
    if not target.exists():
        write_target(target, TinySpec(n_layer=4, seed=0))
    if not drafter.exists():
        write_dflash(drafter, DFlashSpec(target_layers=[1, 2, 3], block_size=16))
    return target, drafter


class ServerDidNotStart(RuntimeError):
    """The server process exited or printed no URL in time; the message holds its log."""


class LiveServer:
    """``localflash serve --host 127.0.0.1 --port 0 ARGS`` as a child process: waits for its URL and /health."""

    def __init__(self, *args, log: Path | None = None, env: dict | None = None, timeout: float = 300):
        self.log = log or Path(tempfile.mkdtemp(prefix="lf-serve-")) / "server.log"
        self.out = open(self.log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "localflash.cli", "serve", "--host", "127.0.0.1", "--port", "0", *map(str, args)],
                                     stdout=self.out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)", self.log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerDidNotStart(f"server did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{m.group(1)}"
        while httpx.get(self.url + "/health").status_code != 200:
            time.sleep(0.1)
        self.model = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]

    def client(self, key: str = "none", timeout: float = 120):
        """The real ``openai`` client on this server (no retries)."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=timeout)

    def text(self) -> str:
        """The server's log so far."""
        return self.log.read_text()

    def rss_mib(self) -> float:
        """Resident set size of the server process now (VmRSS), in MiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def metric(self, name: str) -> dict[str, float]:
        """``{labels: value}`` of one Prometheus series from /metrics."""
        out = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                key, _, value = line.rpartition(" ")
                out[key[len(name):]] = float(value)
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        return self.proc.returncode
