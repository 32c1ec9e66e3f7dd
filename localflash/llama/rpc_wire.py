"""llama.cpp ``rpc-server`` endpoints, asked over the wire what they hold (no llama.cpp loaded).

Nothing here loads llama.cpp. :func:`probe` speaks the first three messages of
llama.cpp's RPC protocol (``ggml/src/ggml-rpc/ggml-rpc.cpp``, protocol 7.x): HELLO
(the server's protocol version), DEVICE_COUNT and GET_DEVICE_MEMORY, then hangs
up. llama.cpp's own client aborts the whole process when a server is down or
speaks another version, so the engine probes every endpoint with this first and
fails with one line instead. A server serves one client at a time: while another
client holds it, the probe times out and says so.

Wire format: request ``| cmd (1 byte) | size (u64) | data |``, response ``| size (u64) | data |``,
little-endian.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from localflash.errors import LocalflashError

PROTO_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION of the vendored ggml-rpc.h
PROTO_MINOR = 0
CMD_GET_DEVICE_MEMORY, CMD_HELLO, CMD_DEVICE_COUNT = 11, 14, 15
CONN_CAPS_SIZE = 24
DEFAULT_PORT = 50052


@dataclass(frozen=True)
class RemoteDevice:
    """One device of an rpc-server: ``endpoint`` HOST:PORT, its index there, and its memory."""

    endpoint: str
    device: int
    total: int
    free: int

    @property
    def name(self) -> str:
        return f"{self.endpoint}#{self.device}"


def parse_endpoints(value) -> list[str]:
    """``"h1:50052,h2:50052"`` or a list of them -> checked ``HOST:PORT`` strings (empty: none)."""
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else [x for v in value for x in str(v).split(",")]
    out = []
    for item in (x.strip() for x in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise LocalflashError(f"--rpc {item!r} is not HOST:PORT", hint=f"e.g. --rpc 192.168.1.20:{DEFAULT_PORT},192.168.1.21:{DEFAULT_PORT}")
        out.append(f"{host}:{int(port)}")
    if len(set(out)) != len(out):
        raise LocalflashError(f"--rpc names a server twice: {','.join(out)}")
    return out


def server_hint(endpoint: str) -> str:
    """What to run on the machine behind ``endpoint``."""
    host, _, port = endpoint.rpartition(":")
    bind = "" if host in ("127.0.0.1", "localhost") else " --host 0.0.0.0 --allow-remote"
    return f"start it there: localflash rpc-server --port {port}{bind} (same localflash/llama.cpp build on both ends)"


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    return buf


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    sock.sendall(bytes([cmd]) + struct.pack("<Q", len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv(sock, 8))
    if size != reply_size:
        raise ConnectionError(f"unexpected reply of {size} bytes to command {cmd}")
    return _recv(sock, size)


def probe(endpoint: str, timeout: float = 3.0) -> list[RemoteDevice]:
    """The devices of one rpc-server, or a ``LocalflashError`` that names the host and what to run there."""
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as e:
        raise LocalflashError(f"RPC server {endpoint} is unreachable ({e.strerror or e})", hint=server_hint(endpoint)) from None
    try:
        with sock:
            sock.settimeout(timeout)
            rsp = _call(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
            major, minor, patch = rsp[0], rsp[1], rsp[2]
            if major != PROTO_MAJOR or minor > PROTO_MINOR:
                raise LocalflashError(
                    f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this build {PROTO_MAJOR}.{PROTO_MINOR}",
                    hint="run the same llama.cpp on both ends: " + server_hint(endpoint))
            (count,) = struct.unpack("<I", _call(sock, CMD_DEVICE_COUNT, b"", 4))
            devices = []
            for i in range(count):
                free, total = struct.unpack("<QQ", _call(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16))
                devices.append(RemoteDevice(endpoint, i, total, free))
    except socket.timeout:
        raise LocalflashError(f"RPC server {endpoint} accepted but did not answer within {timeout:g} s",
                              hint="an rpc-server serves one client at a time: is another localflash using it?") from None
    except (OSError, ConnectionError) as e:
        raise LocalflashError(f"RPC server {endpoint} broke off the handshake ({e})",
                              hint="is that port an rpc-server? " + server_hint(endpoint)) from None
    if not devices:
        raise LocalflashError(f"RPC server {endpoint} reports no devices", hint=server_hint(endpoint))
    return devices


def probe_all(endpoints: list[str], timeout: float = 3.0) -> list[RemoteDevice]:
    """Every device of every endpoint, in order (the first server that fails raises)."""
    return [d for e in endpoints for d in probe(e, timeout)]



def rpc_check_rows(endpoints: list[str], timeout: float = 3.0) -> tuple[list[tuple[str, bool, str]], dict[str, str]]:
    """``models check`` rows for rpc-servers, (what, ok, detail), and the hint for each failed one (by ``what``)."""
    rows, hints = [], {}
    for e in endpoints:
        what = f"rpc-server {e}"
        try:
            devs = probe(e, timeout)
        except LocalflashError as err:
            rows.append((what, False, err.message))
            hints[what] = err.hint or ""
            continue
        mem = ", ".join(f"device {d.device}: {d.free / 1024**3:.1f} of {d.total / 1024**3:.1f} GiB free" for d in devs)
        rows.append((what, True, f"protocol {PROTO_MAJOR}.x; {mem}"))
    return rows, hints
