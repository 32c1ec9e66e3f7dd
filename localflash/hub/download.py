"""Downloads into huggingface_hub's cache that resume, are checked against the sha256, and show one bar.

Why not ``hf_hub_download`` alone: in huggingface_hub 2.4.0 a download writes to a file named per
process (``<etag>.<uuid>.incomplete``), so one that is killed leaves that file behind and the next
process starts from byte 0; a dropped connection is resumed only within the process; and the sha256
the hub publishes for an LFS file is not checked (only the size). Here a file is written to
``blobs/<sha256>.incomplete`` (a fixed name: the next process continues it with an HTTP Range
request), hashed as it is written (the part already there is hashed first on a resume), and renamed
to its blob (and linked from ``snapshots/<commit>/<path>``, ``refs/<revision>`` written) only once
the sha256 matches: a file never counts as complete before that. A mismatch removes the partial
file. Xet-backed files go through ``hf_hub_download`` when ``hf_xet`` is installed (Xet keeps its own
chunk cache, so an interrupted Xet download re-fetches little) and are checked the same way after;
without ``hf_xet`` they come over plain HTTP like any other file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable

from localflash.errors import ChecksumMismatch, DiskFull, HubError
from localflash.hub.client import RemoteFile, cache_dir, endpoint, file_metadata, headers, hub_error, repo_dir

CHUNK = 1 << 20


def xet_available() -> bool:
    try:  # where huggingface_hub itself asks it (file_download imports it from there)
        from huggingface_hub.utils._runtime import is_xet_available
    except ImportError:
        return False
    return bool(is_xet_available()) and os.environ.get("HF_HUB_DISABLE_XET", "").upper() not in ("1", "ON", "YES", "TRUE")


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def _link(f: RemoteFile, blob: Path) -> Path:
    """snapshots/<commit>/<path> -> ../../blobs/<etag> (relative, as huggingface_hub makes it); refs/<revision>."""
    root = repo_dir(f.repo)
    pointer = root / "snapshots" / f.commit / f.path
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:  # no symlinks here (Windows without developer mode): a copy, as huggingface_hub does
        shutil.copy2(blob, pointer)
    if f.revision != f.commit:
        ref = root / "refs" / f.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        if not ref.is_file() or ref.read_text() != f.commit:
            tmp = ref.with_name(ref.name + ".tmp")
            tmp.write_text(f.commit)
            os.replace(tmp, ref)
    return pointer


def _check_space(need: int, where: Path, name: str) -> None:
    free = shutil.disk_usage(where).free
    if need > free:
        raise DiskFull(f"{name}: needs {need / 1e9:.2f} GB more, {free / 1e9:.2f} GB free in {where}",
                       hint="free some space or point HF_HOME (or HF_HUB_CACHE) at a larger disk; the download resumes")


def fetch_file(f: RemoteFile, advance: Callable[[int], None] = lambda n: None) -> Path:
    """``f`` in the cache, complete and checked: reused when its blob is there, else downloaded (resuming
    a partial file); returns the snapshot path. ``advance(n)``: n more bytes are in (for a progress bar)."""
    import filelock

    if f.commit is None:
        file_metadata(f)
    if not f.etag or not f.commit:
        raise HubError(f"{f.repo}/{f.path}: the hub sent no ETag/X-Repo-Commit", hint="is HF_ENDPOINT a hub?")
    root = repo_dir(f.repo)
    blob = root / "blobs" / f.etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = cache_dir() / ".locks" / root.name / f"{f.etag}.lock"  # the lock huggingface_hub takes for this blob
    lock.parent.mkdir(parents=True, exist_ok=True)
    if f.xet is not None and xet_available() and not blob.is_file():
        return _fetch_xet(f, blob, advance)  # hf_hub_download takes this blob's lock itself
    with filelock.FileLock(str(lock)):
        if blob.is_file() and (f.size is None or blob.stat().st_size == f.size):
            advance(f.size or blob.stat().st_size)
            return _link(f, blob)
        _fetch_http(f, blob, advance)
        return _link(f, blob)


def _fetch_http(f: RemoteFile, blob: Path, advance: Callable[[int], None]) -> None:
    from huggingface_hub import get_session, hf_hub_url

    part = blob.with_name(blob.name + ".incomplete")
    have = part.stat().st_size if part.is_file() else 0
    if f.size is not None and have > f.size:
        part.unlink()
        have = 0
    if f.size is not None:
        _check_space(f.size - have, blob.parent, f.name)
    h = hashlib.sha256()
    if have:
        sha256_prefix(part, have, h)
    advance(have)
    url = hf_hub_url(f.repo, f.path, revision=f.commit, endpoint=endpoint())
    hdrs = headers() | {"Accept-Encoding": "identity"}
    if f.size is None or have < f.size:
        if have:
            hdrs["Range"] = f"bytes={have}-"
        streaming = False
        try:
            with get_session().stream("GET", url, headers=hdrs, follow_redirects=True, timeout=30) as r:
                if r.status_code == 416 and have:
                    pass  # the partial file already holds every byte: checked below
                else:
                    if r.status_code >= 400:
                        from huggingface_hub.utils import hf_raise_for_status

                        r.read()
                        hf_raise_for_status(r)
                    if have and r.status_code != 206:  # the server ignored the Range: start over
                        advance(-have)
                        have, h = 0, hashlib.sha256()
                    streaming = True
                    with part.open("r+b" if have else "wb") as out:
                        out.seek(have)
                        for chunk in r.iter_bytes():  # as the bytes arrive: a dropped connection loses none
                            out.write(chunk)
                            h.update(chunk)
                            have += len(chunk)
                            advance(len(chunk))
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DiskFull(f"{f.name}: the disk filled up at {have / 1e9:.2f} GB of {(f.size or 0) / 1e9:.2f} GB",
                               hint="free some space and run the command again: it resumes from there") from e
            raise hub_error(e, f"{f.repo}/{f.path}") from e
        except HubError:
            raise
        except Exception as e:  # noqa: BLE001 (httpx errors, HTTP status errors)
            if streaming and type(e).__module__.startswith(("httpx", "httpcore")):
                raise HubError(f"{f.name}: the connection dropped at {have} of {f.size} bytes ({type(e).__name__})",
                               hint="run the command again: it resumes from there") from e
            raise hub_error(e, f"{f.repo}/{f.path}") from e
    if f.size is not None and have != f.size:
        raise HubError(f"{f.name}: the connection ended at {have} of {f.size} bytes",
                       hint="run the command again: it resumes from there")
    _verify(f, h.hexdigest(), part)
    os.replace(part, blob)


def sha256_prefix(path: Path, n: int, h) -> None:
    with path.open("rb") as src:
        left = n
        while left and (chunk := src.read(min(CHUNK, left))):
            h.update(chunk)
            left -= len(chunk)


def _verify(f: RemoteFile, got: str, written: Path) -> None:
    if f.sha256 and got != f.sha256:
        written.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{f.name}: sha256 {got[:12]}… is not the published {f.sha256[:12]}…; the file was removed",
                               hint="download it again; if it fails again the mirror (HF_ENDPOINT) serves a different file")


def _fetch_xet(f: RemoteFile, blob: Path, advance: Callable[[int], None]) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(f.repo, f.path, revision=f.commit, cache_dir=str(cache_dir()), endpoint=endpoint(),
                                    token=os.environ.get("HF_TOKEN") or None))
    except Exception as e:  # noqa: BLE001
        raise hub_error(e, f"{f.repo}/{f.path}") from e
    blob = path.resolve()  # hf_hub_download's blob (named by the same etag)
    if f.sha256:
        got = sha256_of(blob)
        if got != f.sha256:
            path.unlink(missing_ok=True)  # the snapshot link, then the blob: nothing left looking complete
            _verify(f, got, blob)
    advance(f.size or blob.stat().st_size)
    return _link(f, blob)


def fetch_all(files: list[RemoteFile], quiet: bool = False, console=None) -> list[Path]:
    """Every file in the cache, with one Rich bar over all of them (bytes, speed, ETA) and a line per file."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    for f in files:
        if f.commit is None:
            file_metadata(f)
    total = sum(f.size or 0 for f in files)
    con = console or Console(stderr=True, highlight=False)
    todo = [f for f in files if not (blob := repo_dir(f.repo) / "blobs" / (f.etag or "-")).is_file()
            or (f.size is not None and blob.stat().st_size != f.size)]
    if quiet or not todo:
        return [fetch_file(f) for f in files]
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    out = []
    with Progress(*columns, console=con, transient=False) as bar:
        all_task = bar.add_task(f"{len(files)} file(s)", total=total or None)
        for f in files:
            task = bar.add_task(f"  {f.name}", total=f.size)

            def advance(n, task=task):
                bar.advance(task, n)
                bar.advance(all_task, n)

            out.append(fetch_file(f, advance))
    return out
