"""A model's GGUF header read off the hub with HTTP range requests: what ``plan`` prices before a download.

Only the header is read (metadata and tensor infos; a Qwen 248k-vocab header is about 10 MB, a 27B's
weights 16 GB), for every part of a split model. The bytes read are counted and reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localflash.errors import HubError, LocalflashError
from localflash.formats.gguf_header import HeaderReader, RangeBuffer
from localflash.formats.gguf_meta import ModelMeta, meta_from_readers, read_meta, tensor_bytes
from localflash.hub.client import RemoteFile, cached_path, endpoint, file_metadata, headers, hub_error


@dataclass
class RemoteMeta:
    meta: ModelMeta
    bytes_read: int  # header bytes fetched over the network (0: read from the cache)
    requests: int
    file_bytes: int


def _range_fetch(f: RemoteFile):
    from huggingface_hub import get_session, hf_hub_url

    url = hf_hub_url(f.repo, f.path, revision=f.commit or f.revision, endpoint=endpoint())

    def fetch(start: int, end: int) -> bytes:
        try:
            r = get_session().get(url, headers=headers() | {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"},
                                  follow_redirects=True, timeout=30)
            if r.status_code >= 400:
                from huggingface_hub.utils import hf_raise_for_status

                hf_raise_for_status(r)
        except Exception as e:  # noqa: BLE001
            raise hub_error(e, f"{f.repo}/{f.path}") from e
        if r.status_code != 206:
            raise HubError(f"{f.repo}/{f.path}: the hub ignored the Range header (status {r.status_code})",
                           hint="plan needs a hub that serves byte ranges; download the files and plan them locally")
        return r.content

    return fetch


def remote_meta(files: list[RemoteFile]) -> RemoteMeta:
    """The ``ModelMeta`` of a model on the hub (``files``: its parts in order), from range reads of the
    headers; parts already complete in the cache are read there instead."""
    for f in files:
        if f.commit is None:
            file_metadata(f)
    local = [cached_path(f) for f in files]
    if all(local):
        first = files[0]
        return RemoteMeta(read_meta(_pointer_or_blob(first, local[0])), 0, 0, sum(f.size or 0 for f in files))
    readers, read, requests = [], 0, 0
    for f in files:
        src = RangeBuffer(_range_fetch(f), f.size)
        try:
            r = HeaderReader(src.first(), tensor_bytes, more=src.grow)
        except LocalflashError:
            raise
        except (ValueError, IndexError, KeyError) as e:
            raise LocalflashError(f"{f.repo}/{f.path} is not a readable GGUF file ({e})",
                                  hint="check the file name; plan reads GGUF headers only") from e
        readers.append(r)
        read += src.bytes_read
        requests += src.requests
    total = sum(f.size or 0 for f in files)
    meta = meta_from_readers(Path(files[0].path), readers, total)
    return RemoteMeta(meta, read, requests, total)


def _pointer_or_blob(f: RemoteFile, blob: Path) -> Path:
    from localflash.hub.client import repo_dir

    pointer = repo_dir(f.repo) / "snapshots" / (f.commit or "") / f.path
    return pointer if pointer.exists() else blob
