"""Names on the hub: ``REPO[:QUANT]``, the GGUF file a quant picks, the parts of a split GGUF.

The pick follows llama.cpp's ``-hf`` (``common/download.cpp``: ``find_best_model``,
``get_split_files``, ``find_best_sibling``): with a quant, the first model file whose path holds
``QUANT`` followed by ``.`` or ``-`` (case-insensitive); without one, Q4_K_M, then Q8_0, then the
first model file. Model files are ``*.gguf`` files that are not mmproj, imatrix or a sidecar
(``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-``); of a split model only part 1 is picked, and its
parts are every file with the same prefix and part count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from localflash.errors import LocalflashError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
SIDECARS = ("mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class HubRef:
    """``REPO[:QUANT]`` or ``REPO/FILE.gguf`` as the user wrote it, split."""

    repo: str
    quant: str = ""  # empty: llama.cpp's default pick
    file: str = ""  # a file named outright (models.toml entries, REPO/path/FILE.gguf)
    revision: str = "main"

    def __str__(self) -> str:
        return f"{self.repo}/{self.file}" if self.file else self.repo + (f":{self.quant}" if self.quant else "")


def parse_ref(text: str) -> HubRef:
    """``owner/name``, ``owner/name:Q4_K_M``, ``owner/name/sub/file.gguf``, ``owner/name@rev:Q8_0``."""
    s = text.strip()
    if s.startswith("hf:"):
        s = s[3:]
    for prefix in ("https://huggingface.co/", "hf.co/"):
        if s.startswith(prefix):
            s = s[len(prefix):]
    quant = ""
    if ":" in s:
        s, quant = s.rsplit(":", 1)
    revision = "main"
    if "@" in s:
        s, revision = s.split("@", 1)
    parts = s.split("/")
    if len(parts) > 2 and parts[-1].lower().endswith(".gguf"):
        repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    else:
        repo, file = s, ""
    if not _REPO.match(repo) or (file and quant):
        raise LocalflashError(f"not a hub model name: {text!r}",
                              hint="use OWNER/REPO[:QUANT] (e.g. unsloth/Qwen3.6-27B-GGUF:Q4_K_M) or OWNER/REPO/FILE.gguf")
    return HubRef(repo, quant.upper(), file, revision)


@dataclass(frozen=True)
class SplitInfo:
    prefix: str  # the path without .gguf and without the part suffix (tag included)
    tag: str  # the quant tag the name ends with (upper case), or ""
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """None for a path that is not a .gguf."""
    if not path.lower().endswith(".gguf"):
        return None
    prefix, index, count = path[:-5], 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m[1], int(m[2]), int(m[3])
    t = _TAG.search(prefix)
    return SplitInfo(prefix, t[1].upper() if t else "", index, count)


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(k in name for k in ("mmproj", "imatrix", *SIDECARS))


def find_model(paths: list[str], quant: str = "") -> str | None:
    """The file ``REPO:QUANT`` picks (part 1 of a split model), or None."""
    for tag in ([quant] if quant else DEFAULT_QUANTS):
        pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
        for p in paths:
            s = split_info(p)
            if is_model_file(p) and pattern.search(p) and not (s.count > 1 and s.index != 1):
                return p
    if not quant:
        for p in paths:
            s = split_info(p)
            if is_model_file(p) and not (s.count > 1 and s.index != 1):
                return p
    return None


def split_parts(paths: list[str], first: str) -> list[str]:
    """Every part of the model ``first`` names, in part order (``[first]`` for a single file)."""
    s = split_info(first)
    if s is None or s.count <= 1:
        return [first]
    parts = [(split_info(p).index, p) for p in paths if (o := split_info(p)) and o.count == s.count and o.prefix == s.prefix]
    if len(parts) != s.count:
        have = sorted(i for i, _ in parts)
        raise LocalflashError(f"{first} is part 1 of {s.count}, but the repo has parts {have}",
                              hint="the upload is incomplete: pick another quant")
    return [p for _, p in sorted(parts)]


def find_sidecar(paths: list[str], model: str, keyword: str, quant: str = "") -> str | None:
    """A drafter next to ``model`` (``dflash-``, ``eagle3-``, ``mtp-`` files), as llama.cpp's ``-hfd`` finds one:
    deepest shared folder first, then an exact quant match, then the closest bit count."""
    def bits(tag: str) -> int:
        m = re.search(r"\d+", tag)
        return int(m[0]) if m else 0

    want = bits(quant) if quant else bits((split_info(model) or SplitInfo("", "", 1, 1)).tag)
    model_dir = model.split("/")[:-1]
    best, best_key = None, None
    for p in paths:
        if not p.lower().endswith(".gguf") or keyword not in p:
            continue
        d = p.split("/")[:-1]
        if d != model_dir[: len(d)]:
            continue
        exact = bool(quant) and f"-{quant.upper()}." in p.upper()
        key = (len(d), exact, -abs(bits(split_info(p).tag) - want))
        if best_key is None or key > best_key:
            best, best_key = p, key
    return best


def quants(paths: list[str]) -> list[str]:
    """The quant tags of the model files there are (for a 'no such quant' message)."""
    out = []
    for p in paths:
        s = split_info(p)
        if is_model_file(p) and s.index == 1 and s.tag and s.tag not in out:
            out.append(s.tag)
    return out
