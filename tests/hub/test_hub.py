"""Models by name against a hub served on loopback: huggingface_hub's own client, real HTTP, real files.

HF_ENDPOINT points at :class:`localflash.testing.hub.LoopbackHub`; HF_HOME is a fresh folder per test.
Nothing here reaches the real hub.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from localflash.errors import ChecksumMismatch, DiskFull, HubAuthRequired, HubError, HubNotFound, HubUnreachable, LocalflashError
from localflash.hub import parse_ref, pull, resolve
from localflash.hub.refs import find_model, find_sidecar, quants, split_parts
from localflash.testing.hub import LoopbackHub

REPO = "tester/Tiny-GGUF"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    h = LoopbackHub().start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    yield h
    h.stop()


def hf_cache() -> str:
    """HF_HOME's cache, given to huggingface_hub's functions in this process (it reads HF_HOME once, at import)."""
    return str(Path(os.environ["HF_HOME"]) / "hub")


def blobs(repo: str = REPO) -> list[str]:
    d = Path(os.environ["HF_HOME"]) / "hub" / ("models--" + repo.replace("/", "--")) / "blobs"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_quant_selection_follows_llama_cpps_hf_rules():
    files = ["README.md", "mmproj-F16.gguf", "dflash-M-Q4_K_M.gguf", "M-Q2_K.gguf", "M-Q8_0.gguf", "M-Q4_K_M.gguf",
             "BF16/M-BF16-00002-of-00002.gguf", "BF16/M-BF16-00001-of-00002.gguf", "M-UD-Q4_K_XL.gguf"]
    assert find_model(files) == "M-Q4_K_M.gguf"  # no quant: Q4_K_M first
    assert find_model([f for f in files if "Q4_K_M" not in f or "dflash" in f]) == "M-Q8_0.gguf"  # then Q8_0
    assert find_model(files, "q2_k".upper()) == "M-Q2_K.gguf"
    assert find_model(files, "UD-Q4_K_XL") == "M-UD-Q4_K_XL.gguf"
    assert find_model(files, "BF16") == "BF16/M-BF16-00001-of-00002.gguf"  # part 1 of a split model
    assert split_parts(files, "BF16/M-BF16-00001-of-00002.gguf") == ["BF16/M-BF16-00001-of-00002.gguf", "BF16/M-BF16-00002-of-00002.gguf"]
    assert find_model(files, "Q5_K_M") is None
    assert find_model(["mmproj-F16.gguf", "dflash-M-Q4_K_M.gguf"]) is None  # sidecars are not models
    assert find_sidecar(files, "M-Q4_K_M.gguf", "dflash-") == "dflash-M-Q4_K_M.gguf"
    assert quants(files) == ["Q2_K", "Q8_0", "Q4_K_M", "BF16", "Q4_K_XL"]
    assert parse_ref("a/b:q8_0").quant == "Q8_0" and parse_ref("hf:a/b/sub/F.gguf").file == "sub/F.gguf"
    with pytest.raises(LocalflashError, match="not a hub model name"):
        parse_ref("no-slash:Q4_K_M")


def test_download_by_name_lands_in_the_hf_cache_and_huggingface_hub_reuses_it(hub):
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    data = os.urandom(3 << 20)
    hub.add(REPO, "Tiny-Q4_K_M.gguf", data)
    hub.add(REPO, "Tiny-Q8_0.gguf", os.urandom(1000))
    target, drafter = pull(REPO, f"{REPO}:Q8_0", quiet=True)
    assert target.name == "Tiny-Q4_K_M.gguf" and target.read_bytes() == data and drafter.name == "Tiny-Q8_0.gguf"
    assert try_to_load_from_cache(REPO, "Tiny-Q4_K_M.gguf", cache_dir=hf_cache()) == str(target)
    served = hub.bytes_served()
    assert hf_hub_download(REPO, "Tiny-Q4_K_M.gguf", cache_dir=hf_cache(), endpoint=hub.url) == str(target)  # the other tool finds our file: no bytes sent
    assert pull(REPO, quiet=True)[0] == target and hub.bytes_served() == served


def test_no_such_repo_file_or_quant_is_one_line(hub):
    hub.add(REPO, "Tiny-Q4_K_M.gguf", b"GGUF" + bytes(100))
    hub.add(REPO, "Tiny-Q8_0.gguf", b"GGUF" + bytes(100))
    with pytest.raises(HubNotFound, match="no Q5_K_M quant") as e:
        resolve(parse_ref(f"{REPO}:Q5_K_M"))
    assert e.value.hint == "quants there: Q4_K_M, Q8_0"
    with pytest.raises(HubNotFound, match="no such repo"):
        resolve(parse_ref("tester/Nothing-GGUF"))
    with pytest.raises(HubNotFound, match="no file Other.gguf"):
        resolve(parse_ref(f"{REPO}/Other.gguf"))


def test_gated_repo_without_a_token_is_401_with_a_hint_about_hf_token(hub, monkeypatch):
    hub.add(REPO, "Tiny-Q4_K_M.gguf", os.urandom(5000))
    hub.gate(REPO, "hf_secret")
    with pytest.raises(HubAuthRequired, match="401") as e:
        pull(REPO, quiet=True)
    assert "HF_TOKEN" in e.value.message + e.value.hint and blobs() == []
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert pull(REPO, quiet=True)[0].stat().st_size == 5000


def test_checksum_mismatch_removes_the_file_and_nothing_looks_complete(hub):
    from huggingface_hub import try_to_load_from_cache

    hub.add(REPO, "Tiny-Q4_K_M.gguf", os.urandom(1 << 20), lie=True)
    with pytest.raises(ChecksumMismatch, match="is not the published"):
        pull(REPO, quiet=True)
    assert blobs() == []  # neither a blob nor a partial file
    assert try_to_load_from_cache(REPO, "Tiny-Q4_K_M.gguf", cache_dir=hf_cache()) is None


def test_a_cached_file_is_reused_with_the_network_gone_and_offline(hub, monkeypatch):
    hub.add(REPO, "Tiny-Q4_K_M.gguf", os.urandom(1 << 20))
    path, _ = pull(REPO, quiet=True)
    hub.stop()  # the port is closed: connection refused
    assert pull(REPO, quiet=True)[0] == path
    with pytest.raises(HubUnreachable, match="cannot reach"):
        pull("tester/Never-Fetched-GGUF", quiet=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pull(f"{REPO}:Q4_K_M", quiet=True)[0] == path
    with pytest.raises(HubUnreachable, match="HF_HUB_OFFLINE") as e:
        pull("tester/Never-Fetched-GGUF", quiet=True)
    assert "HF_HUB_OFFLINE" in e.value.hint


def test_a_dropped_connection_resumes_where_it_stopped(hub):
    data = os.urandom(2 << 20)
    f = hub.add(REPO, "Tiny-Q4_K_M.gguf", data)
    f.drop_after = 700_000
    with pytest.raises(HubError, match="connection"):
        pull(REPO, quiet=True)
    assert blobs() == [f"{f.sha256}.incomplete"]
    hub.served.clear()
    assert pull(REPO, quiet=True)[0].read_bytes() == data
    assert hub.bytes_served() == len(data) - 700_000  # only the rest came again
    assert ("GET", f"/{REPO}/resolve/{hub.repos[REPO].commit}/Tiny-Q4_K_M.gguf", "bytes=700000-") in hub.requests


def test_a_download_killed_mid_file_resumes_in_the_next_process(hub, lf_env):
    data = os.urandom(6 << 20)
    f = hub.add(REPO, "Tiny-Q4_K_M.gguf", data, rate=2 << 20)  # 2 MiB/s: about 3 s for the file
    part = Path(os.environ["HF_HOME"]) / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs" / f"{f.sha256}.incomplete"
    env = {**lf_env, "HF_ENDPOINT": hub.url, "HF_HOME": os.environ["HF_HOME"]}
    proc = subprocess.Popen([sys.executable, "-m", "localflash.cli", "pull", REPO, "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (part.is_file() and part.stat().st_size >= 1 << 20) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = part.stat().st_size
    assert proc.returncode == -signal.SIGKILL and 0 < kept < len(data) and blobs() == [part.name]
    f.rate = None
    while hub._conns and time.monotonic() < deadline:  # the killed download's connection is closed server side too
        time.sleep(0.05)
    hub.served.clear()
    r = subprocess.run([sys.executable, "-m", "localflash.cli", "pull", REPO, "-q"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    from huggingface_hub import try_to_load_from_cache

    assert Path(try_to_load_from_cache(REPO, "Tiny-Q4_K_M.gguf", cache_dir=hf_cache())).read_bytes() == data
    assert hub.bytes_served() == len(data) - kept  # the second process asked for the rest only
    assert hub.requests[-1][2] == f"bytes={kept}-" and blobs() == [f.sha256]


def test_disk_full_is_refused_before_a_byte_is_written(hub, monkeypatch):
    import shutil
    from collections import namedtuple

    hub.add(REPO, "Tiny-Q4_K_M.gguf", os.urandom(1 << 20))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 << 20, 10 << 20, 4096))  # the one stand-in: a full disk
    with pytest.raises(DiskFull, match="GB free"):
        pull(REPO, quiet=True)
    assert blobs() == [] and hub.bytes_served() == 0


def _split_gguf(directory: Path) -> list[Path]:
    """A small llama-shaped GGUF written as 3 parts by gguf-py's own splitting writer."""
    from gguf import GGUFWriter

    w = GGUFWriter(directory / "Split-F32.gguf", "llama", split_max_tensors=4)
    w.add_block_count(2), w.add_context_length(256), w.add_embedding_length(64), w.add_feed_forward_length(128)
    w.add_head_count(4), w.add_head_count_kv(4), w.add_vocab_size(32)
    rng = np.random.default_rng(0)
    names = ["token_embd.weight"] + [f"blk.{i}.{t}.weight" for i in range(2) for t in ("attn_q", "attn_k", "attn_v", "ffn_up")]
    for n in names + ["output.weight"]:
        w.add_tensor(n, rng.standard_normal((32 if n in ("token_embd.weight", "output.weight") else 64, 64), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return sorted(directory.glob("Split-F32-*.gguf"))


def test_a_multi_part_gguf_downloads_every_part_and_plans_as_one_model(hub, tmp_path):
    from localflash.formats.gguf_meta import read_meta
    from localflash.hub.header import remote_meta

    parts = _split_gguf(tmp_path)
    assert [p.name for p in parts] == [f"Split-F32-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for p in reversed(parts):
        hub.add(REPO, f"F32/{p.name}", p.read_bytes())
    res = resolve(parse_ref(f"{REPO}:F32"))
    assert [f.name for f in res.files] == [p.name for p in parts]
    remote = remote_meta(res.files)
    first, _ = pull(f"{REPO}:F32", quiet=True)
    assert sorted(q.name for q in first.parent.iterdir()) == [p.name for p in parts]
    local = read_meta(first)
    assert len(local.tensors) == len(remote.meta.tensors) == 10 and local.tensors == remote.meta.tensors
    assert local.weight_bytes == remote.meta.weight_bytes and local.file_bytes == sum(p.stat().st_size for p in parts)


def test_plan_hf_reads_under_2_percent_of_a_100mb_gguf_and_prints_the_plan_of_the_downloaded_file(hub, smollm2):
    import io

    from rich.console import Console

    from localflash.cli.plan import plan_command
    from localflash.plan.devices import Gpu, HostMemory

    hub.add("tester/SmolLM2-GGUF", smollm2.name, smollm2)
    gpus, host = [Gpu(0, "NVIDIA GeForce RTX 3090", 24 << 30, 23 << 30)], HostMemory(32 << 30, 24 << 30)

    def plan(**kw) -> str:
        buf = io.StringIO()
        plan_command(console=Console(file=buf, width=240, highlight=False), detected=gpus, host=host, **kw)
        return buf.getvalue()

    remote = plan(hf="tester/SmolLM2-GGUF:Q4_1")
    read = hub.bytes_served()
    assert 0 < read < 0.02 * smollm2.stat().st_size, read
    assert f"read {read:,} bytes of GGUF header" in remote and "nothing downloaded" in remote
    path, _ = pull("tester/SmolLM2-GGUF:Q4_1", quiet=True)
    local = plan(target=str(path))
    assert remote.rsplit("\ntarget tester/", 1)[0] == local.rstrip("\n")


def test_pull_errors_are_one_line_at_the_cli(hub, lf):
    hub.add(REPO, "Tiny-Q4_K_M.gguf", os.urandom(100))
    hub.gate("tester/Gated-GGUF", "t")
    hub.add("tester/Gated-GGUF", "G-Q4_K_M.gguf", os.urandom(100))
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": os.environ["HF_HOME"]}
    r = lf("pull", f"{REPO}:Q3_K_S", env=env)
    assert r.returncode == 1 and r.stderr.splitlines() == [f"error: {REPO}: no Q3_K_S quant", "hint: quants there: Q4_K_M"]
    r = lf("pull", "tester/Gated-GGUF", env=env)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 2 and "HF_TOKEN" in r.stderr, r.stderr


def test_plan_pair_prices_the_seeds_pair_from_its_hub_headers_as_from_the_files(hub, tmp_path):
    import io

    from rich.console import Console

    from localflash.cli.plan import plan_command
    from localflash.plan.devices import Gpu, HostMemory
    from localflash.registry.pairs import get_pair
    from localflash.testing.shaped import write_preset

    p = get_pair("qwen36-27b-dflash")
    target = write_preset(tmp_path, "qwen3.6-27b", "Q4_K_M")  # sparse: the real shapes, 16.8 GB of zeros
    drafter = write_preset(tmp_path, "qwen3.6-27b-dflash", "Q4_K_M")
    t_repo, t_file = p.target_hf.split("/", 2)[:2], p.target_hf.split("/", 2)[2]
    hub.add("/".join(t_repo), t_file, target, sha256="0" * 64)
    hub.add(p.drafter_hf.split(":")[0], "Qwen3.6-27B-DFlash-Q4_K_M.gguf", drafter, sha256="1" * 64)
    gpus, host = [Gpu(0, "NVIDIA GeForce RTX 3090", 24 << 30, 24 << 30)], HostMemory(32 << 30, 24 << 30)

    def plan(**kw) -> tuple[object, str]:
        buf = io.StringIO()
        out = plan_command(console=Console(file=buf, width=240, highlight=False), detected=gpus, host=host, vram="24GiB", **kw)
        return out, buf.getvalue()

    remote, text = plan(pair="qwen36-27b-dflash")
    local, local_text = plan(target=str(target), drafter=str(drafter), ctx=p.ctx, draft_max=p.draft_max)
    assert remote.to_json() == local.to_json().replace(str(target), target.name).replace(str(drafter), drafter.name)
    assert text.split("\ntarget unsloth/")[0] == local_text.rstrip("\n")
    assert hub.bytes_served() < 1e-3 * (target.stat().st_size + drafter.stat().st_size)
    assert text.count("nothing downloaded") == 2 and blobs("/".join(t_repo)) == []


def test_load_hf_downloads_and_generates_like_the_local_file(hub, smollm2):
    from localflash import load

    hub.add("tester/SmolLM2-GGUF", smollm2.name, smollm2)
    with load(hf="tester/SmolLM2-GGUF:Q4_1", spec="none", ctx=256) as llm:
        by_name = llm.generate("The capital of France is", max_tokens=6, raw=True).text
        path = Path(llm.target.path)
    assert path.name == smollm2.name and "models--tester--SmolLM2-GGUF" in str(path)
    with load(model=str(smollm2), spec="none", ctx=256) as llm:
        assert llm.generate("The capital of France is", max_tokens=6, raw=True).text == by_name


def test_the_xet_route_goes_through_hf_hub_download_and_is_checked_the_same_way(hub):
    """With hf_xet installed a Xet-backed file is fetched by hf_hub_download (the loopback hub has no Xet
    storage, so it serves the bytes over HTTP as huggingface_hub falls back to), then its sha256 is checked."""
    from localflash.hub.client import file_metadata
    from localflash.hub.download import fetch_file, xet_available

    assert xet_available()  # hf_xet comes with huggingface_hub on x86_64/aarch64
    good, bad = os.urandom(1 << 20), os.urandom(1 << 20)
    hub.add(REPO, "Tiny-Q4_K_M.gguf", good)
    hub.add(REPO, "Tiny-Q8_0.gguf", bad, lie=True)
    for path, data in (("Tiny-Q4_K_M.gguf", good), ("Tiny-Q8_0.gguf", bad)):
        f = file_metadata(next(x for x in resolve(parse_ref(f"{REPO}:{path[5:-5]}")).files))
        f.xet = "as if the hub had sent Xet headers"
        if data is good:
            assert fetch_file(f).read_bytes() == good
        else:
            with pytest.raises(ChecksumMismatch):
                fetch_file(f)
    assert blobs() == [hub.repos[REPO].files["Tiny-Q4_K_M.gguf"].sha256]  # the refused file is gone
