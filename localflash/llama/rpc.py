"""llama.cpp's RPC backend: remote devices as ggml devices, and the server end.

Client: :func:`add_servers` registers ``HOST:PORT`` endpoints the way llama.cpp's
``common`` does for ``--rpc`` (``ggml_backend_reg_by_name("RPC")``, its
``ggml_backend_rpc_add_server`` proc address, ``ggml_backend_register``), after
probing each one in Python (:func:`localflash.llama.rpc_wire.probe`): llama.cpp's
client aborts the process on a server that is down, so a dead server must be
caught before it is ever named to llama.cpp. The devices then load layers like
local cards; :func:`device_array` gives ``llama_model_params.devices`` the list a
model is placed on (remote devices first, as llama.cpp orders them, then local GPUs;
an empty list keeps a model, e.g. the drafter, on the local CPU).

Server: :func:`serve` runs ``ggml_backend_rpc_start_server`` (reached through the
same registry: the wheel's ``libggml-rpc``) on the local CPU or chosen devices, so
both ends run the same llama.cpp. ``python -m localflash.llama.rpc_server`` is its
command line. Needs a llama-cpp-python built with ``GGML_RPC=ON`` (``make install``).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from localflash.errors import LocalflashError
from localflash.llama.bindings import lib

DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL = 0, 1, 2, 3
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_void_p))
_SET_N_THREADS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)


@dataclass(frozen=True)
class Device:
    """A ggml device as llama.cpp names it (``RPC0``, ``CUDA0``, ``CPU``); ``endpoint`` for a remote one."""

    name: str
    description: str
    kind: int
    free: int
    total: int
    endpoint: str | None = None


@functools.cache
def _ggml():
    import llama_cpp._ggml as g

    lib()  # llama_backend_init first
    so = g.libggml
    sigs = {
        "ggml_backend_reg_by_name": ([ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_reg_get_proc_address": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_register": ([ctypes.c_void_p], None),
        "ggml_backend_reg_dev_count": ([ctypes.c_void_p], ctypes.c_size_t),
        "ggml_backend_reg_dev_get": ([ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p),
        "ggml_backend_dev_count": ([], ctypes.c_size_t),
        "ggml_backend_dev_get": ([ctypes.c_size_t], ctypes.c_void_p),
        "ggml_backend_dev_by_name": ([ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_dev_by_type": ([ctypes.c_int], ctypes.c_void_p),
        "ggml_backend_dev_name": ([ctypes.c_void_p], ctypes.c_char_p),
        "ggml_backend_dev_description": ([ctypes.c_void_p], ctypes.c_char_p),
        "ggml_backend_dev_type": ([ctypes.c_void_p], ctypes.c_int),
        "ggml_backend_dev_memory": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
        "ggml_backend_dev_backend_reg": ([ctypes.c_void_p], ctypes.c_void_p),
        "ggml_backend_reg_name": ([ctypes.c_void_p], ctypes.c_char_p),
    }
    for name, (argtypes, restype) in sigs.items():
        fn = getattr(so, name)
        fn.argtypes, fn.restype = argtypes, restype
    return so


def supported() -> bool:
    """Whether this llama-cpp-python has the RPC backend (built with ``GGML_RPC=ON``)."""
    return bool(_ggml().ggml_backend_reg_by_name(b"RPC"))


def _rpc_proc(name: str, proto):
    g = _ggml()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise LocalflashError("this llama-cpp-python has no RPC backend",
                              hint="rebuild it with the RPC backend: make install (GGML_RPC=ON is the default; not RPC=0)")
    addr = g.ggml_backend_reg_get_proc_address(reg, name.encode())
    if not addr:
        raise LocalflashError(f"the RPC backend lacks {name}", hint="localflash needs llama-cpp-python 0.3.36 built from its sdist")
    return proto(addr)


_registered: dict[str, list[Device]] = {}


def any_registered() -> bool:
    """Whether this process registered an rpc-server (then llama.cpp's default device list includes it)."""
    return bool(_registered)


def add_servers(endpoints: list[str], timeout: float = 3.0) -> list[Device]:
    """Register rpc-server endpoints (once per process each) and return their devices, in order."""
    from localflash.llama.rpc_wire import probe

    out = []
    for endpoint in endpoints:
        if endpoint not in _registered:
            probe(endpoint, timeout)  # a dead server: one line here, not llama.cpp's abort()
            reg = _rpc_proc("ggml_backend_rpc_add_server", _ADD_SERVER)(endpoint.encode())
            if not reg:
                raise LocalflashError(f"RPC server {endpoint} reports no devices")
            g = _ggml()
            g.ggml_backend_register(reg)
            _registered[endpoint] = [_device(g.ggml_backend_reg_dev_get(reg, i), endpoint)
                                     for i in range(g.ggml_backend_reg_dev_count(reg))]
        out += _registered[endpoint]
    return out


def _device(dev, endpoint: str | None = None) -> Device:
    g = _ggml()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return Device(g.ggml_backend_dev_name(dev).decode(), (g.ggml_backend_dev_description(dev) or b"").decode(),
                  g.ggml_backend_dev_type(dev), free.value, total.value, endpoint)


def local_gpus() -> list[Device]:
    """This machine's own GPU devices (CUDA0, ...), without the RPC ones."""
    g = _ggml()
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        if g.ggml_backend_dev_type(dev) in (DEV_GPU, DEV_IGPU) and \
                g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(dev)) != b"RPC":
            out.append(_device(dev))
    return out


def device_names(keys: list[str]) -> list[str]:
    """The ggml names of a plan's device keys (``rpc:HOST:PORT#i`` of a registered server, ``gpu:N``)."""
    out = []
    for key in keys:
        kind, _, rest = key.partition(":")
        if kind == "rpc":
            endpoint, _, i = rest.rpartition("#")
            out.append(add_servers([endpoint])[int(i)].name)
        else:
            gpus = local_gpus()
            if int(rest) >= len(gpus):
                raise LocalflashError(f"the plan names GPU {rest}, but llama.cpp sees {len(gpus)} GPU device(s)")
            out.append(gpus[int(rest)].name)
    return out


def device_array(names: list[str]):
    """A NULL-terminated ``ggml_backend_dev_t`` array of the named devices (``[]``: CPU only)."""
    g = _ggml()
    arr = (ctypes.c_void_p * (len(names) + 1))()
    for i, name in enumerate(names):
        dev = g.ggml_backend_dev_by_name(name.encode())
        if not dev:
            raise LocalflashError(f"no ggml device named {name!r}")
        arr[i] = dev
    return arr


def serve(host: str, port: int, threads: int, devices: list[str] | None = None, cache_dir: str | None = None) -> None:
    """Run an rpc-server on this process until it is killed (blocks; the devices default to the local CPU)."""
    g = _ggml()
    if devices:
        devs = list(device_array(devices))[:-1]
    else:
        devs = [g.ggml_backend_dev_by_type(DEV_CPU)]
    arr = (ctypes.c_void_p * len(devs))(*devs)
    start = _rpc_proc("ggml_backend_rpc_start_server", _START_SERVER)
    start(f"{host}:{port}".encode(), cache_dir.encode() if cache_dir else None, threads, len(devs), arr)
