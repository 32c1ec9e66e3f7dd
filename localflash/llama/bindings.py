"""The one place that loads llama_cpp: the library, its log, and the staging symbols.

llama.cpp's ``llama-ext.h`` functions (layer-input capture for DFlash/EAGLE-3,
the MTP "nextn" embeddings, the token-embedding copy) have C++ linkage, so
``libllama.so`` exports them under Itanium-mangled names. We look each one up
by its plain, Itanium and MSVC names and fail with one clear message if the
installed llama-cpp-python is not the version these names belong to.
"""

from __future__ import annotations

import ctypes
import functools
from collections import deque
from types import SimpleNamespace

from localflash.errors import LocalflashError

REQUIRED_VERSION = "0.3.36"

_state = SimpleNamespace(verbose=False, log_cb=None, recent=deque(maxlen=64))


@functools.cache
def lib():
    """Import llama_cpp once, silence its log, initialise the backend."""
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - install problem
        raise LocalflashError(
            f"llama-cpp-python is not installed ({e})",
            hint=f"run `make install` (it builds llama-cpp-python=={REQUIRED_VERSION})",
        ) from e
    version = getattr(llama_cpp, "__version__", "?")
    if version != REQUIRED_VERSION:
        raise LocalflashError(
            f"llama-cpp-python {version} is installed; localflash needs exactly {REQUIRED_VERSION}",
            hint=f"pip install llama-cpp-python=={REQUIRED_VERSION} (see `make install`)",
        )
    _install_log(llama_cpp)
    llama_cpp.llama_backend_init()
    return llama_cpp


# OpenMP's spin before a waiting compute thread sleeps, as the server sets it (GOMP_SPINCOUNT, in pause loops):
# ~0.1-0.2 ms, longer than a barrier waits on a free core, far shorter than libgomp's default 300,000 (~10+ ms)
SERVER_OMP_SPIN = 3000


def short_omp_spin(environ=None, loaded: bool | None = None) -> str | None:
    """Make llama.cpp's OpenMP threads sleep soon when they wait (``localflash serve``), unless the user chose.

    ggml's CPU backend runs a graph on an OpenMP team whose threads wait at a barrier after every
    node and, between decodes, for the next graph; libgomp spins ~300,000 pause loops (10+ ms)
    before it sleeps. In a server the same cores also run its Python threads (the slot pool's
    step between decodes, a worker per request, the event loop writing each token) and the
    clients: a spinning thread holds a core they need, and a compute thread they push off its
    core leaves its partner spinning at the next barrier. With ``-t`` = the cores, that costs
    more than the compute itself (benchmarks/serve/profile_serve_threads.py, 4 clients on 2 busy cores:
    605 ms CPU per generated token at libgomp's default, 67-81 ms at this one; llama-server 82 at this one).
    The price on an idle machine is a few percent (benchmarks/serve/server_variants.py, Qwen2.5-Coder 1.5B, 4 clients:
    1.00x llama-server at this spin, 1.02x at the default); with one busy process beside them 1.38x and 0.99x.
    libgomp reads GOMP_SPINCOUNT once, when llama.cpp's library loads: this must run before
    :func:`lib` (``loaded``: whether it has; default: ``llama_cpp`` imported). Returns the value
    set, or None where GOMP_SPINCOUNT / OMP_WAIT_POLICY is already in ``environ`` or it is too late.
    """
    import os
    import sys

    environ = os.environ if environ is None else environ
    loaded = "llama_cpp" in sys.modules if loaded is None else loaded
    if loaded or "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return None
    environ["GOMP_SPINCOUNT"] = str(SERVER_OMP_SPIN)
    return environ["GOMP_SPINCOUNT"]


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log on stderr (``--verbose``) or keep it quiet."""
    _state.verbose = verbose


def verbose() -> bool:
    """Whether ``--verbose`` is on (localflash's own diagnostics go to stderr then, too)."""
    return _state.verbose


def recent_log() -> list[str]:
    """The last lines llama.cpp logged (kept even when silenced, for error messages)."""
    return [line for line in _state.recent if line.strip()]


def _install_log(llama_cpp) -> None:
    import sys

    @llama_cpp.llama_log_callback
    def on_log(level, text, user_data):
        msg = text.decode("utf-8", errors="replace")
        _state.recent.append(msg.rstrip("\n"))
        if _state.verbose:
            sys.stderr.write(msg)

    _state.log_cb = on_log  # keep alive: a collected callback crashes the next log call
    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))


# name -> (itanium symbol, msvc symbol, argtypes, restype); pointers are c_void_p
_EXT_SIGNATURES = {
    "llama_set_embeddings_layer_inp": (
        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
        [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    "llama_get_embeddings_layer_inp": (
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
        [ctypes.c_void_p, ctypes.c_uint32],
        ctypes.POINTER(ctypes.c_float),
    ),
    "llama_model_target_layer_ids": (
        "_Z28llama_model_target_layer_idsPK11llama_model",
        "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
        [ctypes.c_void_p],
        ctypes.POINTER(ctypes.c_int32),
    ),
    "llama_model_target_layer_ids_n": (
        "_Z30llama_model_target_layer_ids_nPK11llama_model",
        "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
        [ctypes.c_void_p],
        ctypes.c_uint32,
    ),
    "llama_set_embeddings_nextn": (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb",
        "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z",
        [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool],
        None,
    ),
    "llama_get_embeddings_nextn": (
        "_Z26llama_get_embeddings_nextnP13llama_context",
        "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z",
        [ctypes.c_void_p],
        ctypes.POINTER(ctypes.c_float),
    ),
    "llama_get_embeddings_nextn_ith": (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
        "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z",
        [ctypes.c_void_p, ctypes.c_int32],
        ctypes.POINTER(ctypes.c_float),
    ),
    "llama_model_dflash_selector_top_k": (
        "_Z33llama_model_dflash_selector_top_kPK11llama_model",
        "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z",
        [ctypes.c_void_p],
        ctypes.c_int32,
    ),
    "llama_model_get_tok_embd": (
        "_Z24llama_model_get_tok_embdPK11llama_modelPf",
        "?llama_model_get_tok_embd@@YAIPEBUllama_model@@PEAM@Z",
        [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)],
        ctypes.c_uint32,
    ),
}


@functools.cache
def ext_address(name: str):
    """``name`` of llama-ext.h bound again with an integer (``c_void_p``) result: a buffer's address
    without a ctypes pointer object (for the per-cycle getters, read many times a cycle)."""
    itanium, msvc, argtypes, _ = _EXT_SIGNATURES[name]
    cdll = lib().llama_cpp._lib
    for symbol in (name, itanium, msvc):
        try:
            fn = cdll[symbol]  # a new function object: ext()'s binding keeps its own result type
        except AttributeError:
            continue
        fn.argtypes, fn.restype = argtypes, ctypes.c_void_p
        return fn
    ext()  # raises the one clear message about the missing symbols
    raise LocalflashError(f"libllama lacks {name}")


@functools.cache
def lib_address(name: str):
    """llama.h's ``name`` (a float-buffer getter) bound again with an integer (``c_void_p``) result, as :func:`ext_address`."""
    src = getattr(lib(), name)
    fn = lib().llama_cpp._lib[name]
    fn.argtypes, fn.restype = src.argtypes, ctypes.c_void_p
    return fn


@functools.cache
def ext() -> SimpleNamespace:
    """The staging functions of ``llama-ext.h``, bound by their mangled names."""
    cdll = lib().llama_cpp._lib
    bound = {}
    missing = []
    for name, (itanium, msvc, argtypes, restype) in _EXT_SIGNATURES.items():
        for symbol in (name, itanium, msvc):
            fn = getattr(cdll, symbol, None)
            if fn is not None:
                fn.argtypes = argtypes
                fn.restype = restype
                bound[name] = fn
                break
        else:
            missing.append(name)
    if missing:
        raise LocalflashError(
            f"libllama lacks {', '.join(missing)}",
            hint=f"localflash needs llama-cpp-python=={REQUIRED_VERSION} built from its sdist",
        )
    return SimpleNamespace(**bound)
