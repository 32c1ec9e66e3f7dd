"""A GGUF header read from bytes: keys, small values and the tensor table, nothing past them.

The bytes come from a local file (an mmap, read at once) or from a source that is asked for more as
the parse needs it (``fetch(start, end)``: the hub client's HTTP range reads), so a remote header costs
about its own size in transfer and a few round trips.
"""

from __future__ import annotations

import struct
from typing import Callable

from gguf import GGMLQuantizationType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_BIG_ARRAY = 4096  # longer arrays (vocabularies, merges) are counted, not decoded
FIRST_READ = 256 * 1024  # bytes a range source is asked for first
MIN_MORE = 64 * 1024  # and at least this much more (or a sixteenth of what is held) each time the parse runs past it


class HeaderField:
    def __init__(self, value, count: int):
        self.value = value
        self.data = range(count)  # only its length is read for arrays left undecoded

    def contents(self):
        return self.value


class HeaderTensor:
    def __init__(self, name: str, dims: tuple[int, ...], qtype: int, n_bytes: int):
        self.name = name
        self.shape = dims
        self.tensor_type = GGMLQuantizationType(qtype)
        self.n_bytes = n_bytes


class HeaderReader:
    """The part of ``gguf.GGUFReader`` the planner needs, from the header alone.

    GGUFReader decodes every tokenizer string into NumPy views (seconds for a 150k vocabulary); this
    reads keys, small values and the tensor table only. ``buf``: the file's bytes (or its first bytes);
    ``more(end)``: called when the parse needs bytes up to ``end`` that ``buf`` lacks, returns a longer
    buffer (None: ``buf`` is the whole file, running past it means a truncated file).
    ``tensor_bytes(qtype, dims)`` sizes each tensor.
    """

    def __init__(self, buf, tensor_bytes: Callable, more: Callable[[int], bytes] | None = None):
        self.m, self.more, self.off = buf, more, 0
        if self._take(4) != b"GGUF":
            raise ValueError("bad magic")
        (version,) = self._unpack("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        n_tensors, n_kv = self._unpack("<QQ")
        self.fields: dict[str, HeaderField] = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            value, count = self._value(vtype)
            self.fields[key] = HeaderField(value, count)
        self.tensors = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = tuple(int(d) for d in self._unpack(f"<{n_dims}Q"))
            qtype, _offset = self._unpack("<IQ")
            self.tensors.append(HeaderTensor(name, dims, qtype, tensor_bytes(qtype, dims)))
        self.header_bytes = self.off

    def _need(self, n: int) -> None:
        end = self.off + n
        if end > len(self.m):
            if self.more is None:
                raise ValueError(f"the header runs past the end of the file ({end} > {len(self.m)} bytes)")
            self.m = self.more(end)
            if end > len(self.m):
                raise ValueError(f"the header runs past the end of the file ({end} > {len(self.m)} bytes)")

    def _take(self, n: int) -> bytes:
        self._need(n)
        out = bytes(self.m[self.off : self.off + n])
        self.off += n
        return out

    def _unpack(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        self._need(size)
        out = struct.unpack_from(fmt, self.m, self.off)
        self.off += size
        return out

    def _skip(self, n: int) -> None:
        self._need(n)
        self.off += n

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        return self._take(n).decode("utf-8", errors="replace")

    def _value(self, vtype: int):
        if vtype == 8:
            return self._string(), 1
        if vtype == 9:
            etype, count = self._unpack("<IQ")
            if etype in _SCALARS and count > _BIG_ARRAY:
                self._skip(count * struct.calcsize(_SCALARS[etype]))
                return None, count
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                return list(self._unpack(f"<{count}{fmt[1]}")), count
            items = [self._value(etype)[0] for _ in range(count)]
            return (items if count <= _BIG_ARRAY else None), count
        return self._unpack(_SCALARS[vtype])[0], 1


class RangeBuffer:
    """The first bytes of a remote file, grown by range reads as a parse asks for more.

    ``fetch(start, end)`` returns bytes ``[start, end)``; ``bytes_read`` counts what was fetched.
    """

    def __init__(self, fetch: Callable[[int, int], bytes], size: int | None = None):
        self.fetch, self.size = fetch, size
        self.buf = bytearray()
        self.bytes_read = 0
        self.requests = 0

    def _end(self, end: int) -> int:
        return min(end, self.size) if self.size is not None else end

    def first(self) -> bytearray:
        return self.grow(FIRST_READ)

    def grow(self, end: int) -> bytearray:
        """Bytes up to at least ``end`` (the file's end at most): asks for ``MIN_MORE`` or a sixteenth of what
        is held, whichever is more, so a header of H bytes costs at most H + max(MIN_MORE, H/16) bytes (about 25 requests for a 2 MB header, 50 for 10 MB)."""
        want = self._end(max(end, len(self.buf) + max(MIN_MORE, len(self.buf) // 16)))
        if want > len(self.buf):
            data = self.fetch(len(self.buf), want)
            self.requests += 1
            self.bytes_read += len(data)
            self.buf += data
        return self.buf
