"""Models by name: ``OWNER/REPO[:QUANT]`` resolved, planned from its header, downloaded into the HF cache.

- :mod:`localflash.hub.refs`: names, and the file a quant picks (llama.cpp's ``-hf`` rules);
- :mod:`localflash.hub.client`: listing, metadata, the cache, errors (over ``huggingface_hub``);
- :mod:`localflash.hub.download`: resumable, sha256-checked downloads with one progress bar;
- :mod:`localflash.hub.header`: a GGUF header by HTTP range reads (plan before download).
"""

from __future__ import annotations

from pathlib import Path

from localflash.hub.client import Resolved, resolve
from localflash.hub.refs import SIDECARS, HubRef, parse_ref

__all__ = ["HubRef", "Resolved", "parse_ref", "resolve", "resolve_drafter", "pull", "local_path", "header_meta"]


def _ref(name: str | HubRef) -> HubRef:
    return name if isinstance(name, HubRef) else parse_ref(name)


def resolve_drafter(name: str | HubRef) -> Resolved:
    """A drafter repo's file: the quant's model file, else its ``dflash-``/``eagle3-``/``mtp-`` sidecar."""
    from localflash.errors import HubNotFound

    ref = _ref(name)
    try:
        return resolve(ref)
    except HubNotFound as first:
        if ref.file:
            raise
        for keyword in SIDECARS:
            try:
                return resolve(ref, sidecar=keyword)
            except HubNotFound:
                continue
        raise first


def pull(target: str | HubRef | None, drafter: str | HubRef | None = None, quiet: bool = False,
         console=None, pins: dict | None = None) -> tuple[Path | None, Path | None]:
    """Download target and drafter (every part) into the cache with one progress bar; returns the paths of
    their first parts. Files already there are reused (with the network gone too). ``pins``: sha256s a
    models.toml entry pins for "target"/"drafter" (a single-file model), checked against the hub's too."""
    from localflash.errors import ChecksumMismatch
    from localflash.hub.download import fetch_all

    t = resolve(_ref(target)) if target else None
    d = resolve_drafter(drafter) if drafter else None
    for role, res in (("target", t), ("drafter", d)):
        pin = (pins or {}).get(role)
        if res is None or not pin or len(res.files) != 1:
            continue
        f = res.files[0]
        if f.sha256 and f.sha256 != pin:
            raise ChecksumMismatch(f"{f.repo}/{f.path}: the hub publishes sha256 {f.sha256[:12]}…, models.toml pins {pin[:12]}…",
                                   hint="the file changed upstream: check the repo, then update or drop the pin")
        f.sha256 = f.sha256 or pin
    files = (t.files if t else []) + (d.files if d else [])
    fresh = [f for f in files if f.cached is None]
    paths = {id(f): f.cached for f in files if f.cached is not None}
    for f, p in zip(fresh, fetch_all(fresh, quiet=quiet, console=console)):
        paths[id(f)] = p
    return (paths[id(t.files[0])] if t else None), (paths[id(d.files[0])] if d else None)


def local_path(name: str | HubRef) -> Path | None:
    """Where a named file (``OWNER/REPO/FILE.gguf`` or ``REPO:QUANT``) is in the cache, without any network."""
    from localflash.hub.client import cached_files
    from localflash.hub.refs import find_model, split_parts

    ref = _ref(name)
    files = cached_files(ref.repo, ref.revision)
    paths = [f.path for f in files]
    first = ref.file if ref.file in paths else (find_model(paths, ref.quant) if not ref.file else None)
    if first is None:
        return None
    try:
        parts = split_parts(paths, first)
    except Exception:  # noqa: BLE001 (a part is missing: not downloaded)
        return None
    by = {f.path: f.cached for f in files}
    return by[parts[0]] if all(by.get(p) for p in parts) else None


def header_meta(name: str | HubRef, drafter: bool = False):
    """The ``ModelMeta`` of a named model from its GGUF header(s) by HTTP range reads (``RemoteMeta``: with the
    bytes read); from the cache when the files are there."""
    from localflash.hub.header import remote_meta

    res = resolve_drafter(name) if drafter else resolve(_ref(name))
    return remote_meta(res.files)
