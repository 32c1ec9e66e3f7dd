"""The hub over ``huggingface_hub``: a repo's files, one file's metadata, the local cache, errors as one line.

Settings are read when called, as ``huggingface_hub`` users expect them: ``HF_ENDPOINT`` (the hub's
address), ``HF_TOKEN`` (gated and private repos), ``HF_HOME`` / ``HF_HUB_CACHE`` (where the cache is),
``HF_HUB_OFFLINE`` (never connect: the cache only).

Files are kept in huggingface_hub's cache layout (``models--OWNER--NAME/{blobs,refs,snapshots}``), so
what ``hf download``, ``hf_hub_download`` or llama.cpp's ``-hf`` fetched is found here and the other way
round. An LFS file's blob is named by its sha256 (the ``X-Linked-Etag`` the hub sends).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from localflash.errors import HubAuthRequired, HubError, HubNotFound, HubUnreachable, LocalflashError
from localflash.hub.refs import HubRef, find_model, find_sidecar, quants, split_parts

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class RemoteFile:
    """One file of a repo at one revision: its size and sha256 (None where the hub does not publish one)."""

    repo: str
    path: str
    size: int | None = None
    sha256: str | None = None
    revision: str = "main"
    commit: str | None = None  # the commit the revision pointed at when asked
    etag: str | None = None  # the name of its blob in the cache (the sha256 for LFS files)
    xet: object | None = None  # huggingface_hub's XetFileData when the hub serves it from Xet storage
    cached: Path | None = None  # where it is in the cache, when it is there

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    from huggingface_hub import constants

    v = os.environ.get("HF_HUB_OFFLINE")
    return v.upper() in ("1", "ON", "YES", "TRUE") if v is not None else constants.HF_HUB_OFFLINE


def cache_dir() -> Path:
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def repo_dir(repo: str) -> Path:
    return cache_dir() / ("models--" + repo.replace("/", "--"))


def headers() -> dict:
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers(token=os.environ.get("HF_TOKEN") or None, library_name="localflash")


def hub_error(e: BaseException, what: str) -> LocalflashError:
    """huggingface_hub's and httpx's exceptions as one of ours (one line, a hint)."""
    from huggingface_hub import errors as he

    if isinstance(e, LocalflashError):
        return e
    status = getattr(getattr(e, "response", None), "status_code", None)
    token = "HF_TOKEN is set but was refused" if os.environ.get("HF_TOKEN") else "no HF_TOKEN is set"
    if isinstance(e, he.GatedRepoError):
        return HubAuthRequired(f"{what}: gated repo, the hub answered {status} ({token})",
                               hint="accept the model's terms on its hub page, then export HF_TOKEN=<a read token>")
    if isinstance(e, he.RevisionNotFoundError):
        return HubNotFound(f"{what}: no such revision", hint="check the @REVISION part of the name")
    if isinstance(e, he.RepositoryNotFoundError):  # the hub answers 401 for a private repo and a missing one alike
        return HubNotFound(f"{what}: no such repo on {endpoint()}" + (" (or a private one)" if status == 401 else ""),
                           hint="check the OWNER/REPO spelling (it is case-sensitive); for a private repo export HF_TOKEN")
    if status in (401, 403):
        return HubAuthRequired(f"{what}: the hub answered {status} ({token})",
                               hint="accept the model's terms on its hub page, then export HF_TOKEN=<a read token>")
    if isinstance(e, he.EntryNotFoundError):
        return HubNotFound(f"{what}: no such file in the repo", hint="`localflash pull OWNER/REPO:QUANT` lists the files there are")
    if isinstance(e, he.OfflineModeIsEnabled):
        return HubUnreachable(f"{what}: HF_HUB_OFFLINE is set and it is not in the cache ({cache_dir()})",
                              hint="unset HF_HUB_OFFLINE to download it, or point HF_HOME at the cache that has it")
    if isinstance(e, he.HfHubHTTPError):
        return HubError(f"{what}: the hub answered {status or e}", hint="try again later; --verbose shows the response")
    if isinstance(e, OSError) or type(e).__module__.startswith(("httpx", "httpcore")):
        return HubUnreachable(f"{what}: cannot reach {endpoint()} ({type(e).__name__}) and it is not in the cache",
                              hint="check the network (HF_ENDPOINT for a mirror), or set HF_HUB_OFFLINE=1 to use only the cache")
    return HubError(f"{what}: {type(e).__name__}: {e}")


def reachable(what: str, timeout: float = 5.0) -> None:
    """One request without retries: with no network huggingface_hub's listing would retry with backoff for
    ~20 s before the cache is used; any answer (even an error status) means the hub is there."""
    from huggingface_hub import get_session

    try:
        get_session().head(endpoint() + "/api/models", timeout=timeout)
    except Exception as e:  # noqa: BLE001
        raise hub_error(e, what) from e


def list_files(repo: str, revision: str = "main") -> list[RemoteFile]:
    """Every file of ``repo`` with size and sha256 (LFS files), from the hub's tree listing."""
    from huggingface_hub import HfApi

    if offline():
        raise HubUnreachable(f"{repo}: HF_HUB_OFFLINE is set", hint="the cache is used instead")
    reachable(repo)
    try:
        api = HfApi(endpoint=endpoint(), token=os.environ.get("HF_TOKEN") or None, library_name="localflash")
        out = []
        for f in api.list_repo_tree(repo, recursive=True, revision=revision):
            if hasattr(f, "size") and f.__class__.__name__ == "RepoFile":
                lfs = getattr(f, "lfs", None)
                out.append(RemoteFile(repo, f.path, f.size, lfs.sha256 if lfs else None, revision))
        return out
    except Exception as e:  # noqa: BLE001 (mapped to one of ours)
        raise hub_error(e, repo) from e


def file_metadata(f: RemoteFile) -> RemoteFile:
    """HEAD of the file: the commit, its etag (blob name), size and Xet data; fills ``f`` and returns it."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        m = get_hf_file_metadata(hf_hub_url(f.repo, f.path, revision=f.revision, endpoint=endpoint()),
                                 token=os.environ.get("HF_TOKEN") or None, endpoint=endpoint())
    except Exception as e:  # noqa: BLE001
        raise hub_error(e, f"{f.repo}/{f.path}") from e
    f.commit, f.etag, f.xet = m.commit_hash, m.etag, m.xet_file_data
    f.size = m.size if m.size is not None else f.size
    if f.sha256 is None and m.etag and _SHA256.match(m.etag):
        f.sha256 = m.etag  # an LFS file's X-Linked-Etag is its sha256
    return f


def cached_files(repo: str, revision: str = "main") -> list[RemoteFile]:
    """The files of ``repo`` in the cache, at the commit ``revision`` points to there (else any snapshot)."""
    root = repo_dir(repo)
    snaps = root / "snapshots"
    if not snaps.is_dir():
        return []
    ref = root / "refs" / revision
    commits = [ref.read_text().strip()] if ref.is_file() else ([revision] if (snaps / revision).is_dir() else [])
    commits += sorted((p.name for p in snaps.iterdir()), key=lambda c: -(snaps / c).stat().st_mtime)
    out, seen = [], set()
    for c in commits:
        base = snaps / c
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(base).as_posix()
            if p.is_file() and rel not in seen:  # a symlink to a blob that is there
                seen.add(rel)
                blob = p.resolve()
                etag = blob.name if blob.parent.name == "blobs" else None
                out.append(RemoteFile(repo, rel, p.stat().st_size, etag if etag and _SHA256.match(etag) else None,
                                      revision, c, etag, cached=p))
    return out


def cached_path(f: RemoteFile) -> Path | None:
    """Where ``f`` already is in the cache, complete (its blob, by etag, with the published size)."""
    if f.etag and f.commit:
        blob = repo_dir(f.repo) / "blobs" / f.etag
        if blob.is_file() and (f.size is None or blob.stat().st_size == f.size):
            return blob
    return None


@dataclass
class Resolved:
    """What a name stands for: the model's files (every part), and where the list came from."""

    ref: HubRef
    files: list[RemoteFile]
    from_cache: bool = False
    available: list[RemoteFile] | None = None  # the repo's files (to list quants)

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)


def resolve(ref: HubRef, sidecar: str | None = None) -> Resolved:
    """The files ``ref`` names: ``REPO:QUANT`` picked as llama.cpp's ``-hf`` does (``sidecar``: a drafter
    keyword such as ``dflash-`` to pick that sidecar instead). Asks the hub, or the cache when offline or
    the hub cannot be reached; raises a one-line error for no such repo/file/quant."""
    try:
        files, from_cache = list_files(ref.repo, ref.revision), False
    except HubUnreachable as e:
        files, from_cache = cached_files(ref.repo, ref.revision), True
        if not files:
            raise HubUnreachable(f"{ref}: {e.message.split(': ', 1)[-1]}" if offline() else e.message,
                                 hint=e.hint if not offline() else
                                 "unset HF_HUB_OFFLINE to download it, or point HF_HOME at the cache that has it") from e
    paths = [f.path for f in files]
    by_path = {f.path: f for f in files}
    if ref.file:
        if ref.file not in by_path:
            where = "the cache" if from_cache else "the repo"
            raise HubNotFound(f"{ref.repo}: no file {ref.file} in {where}",
                              hint="files there: " + (", ".join(p for p in paths if p.endswith(".gguf")) or "no GGUF files"))
        first = ref.file
    elif sidecar:
        first = find_sidecar(paths, find_model(paths, ref.quant) or "", sidecar, ref.quant)
    else:
        first = find_model(paths, ref.quant)
    if first is None:
        there = quants(paths)
        what = f"no {ref.quant} quant" if ref.quant else "no GGUF model file"
        if sidecar:
            what = f"no {sidecar.rstrip('-')} drafter file"
        raise HubNotFound(f"{ref.repo}: {what}{' in the cache' if from_cache else ''}",
                          hint=f"quants there: {', '.join(there)}" if there else "the repo has no GGUF files")
    return Resolved(ref, [by_path[p] for p in split_parts(paths, first)], from_cache, files)
