"""`serve -c 8192 --parallel 4`: one KV pool for all slots (speculative/kv_pool.py), against one share each.

A live server on the tiny target with real `openai` clients. With the unified pool (the default) a
6,000-token request is served while other slots stream, where ``--kv-pool split`` (2,048 tokens a
slot) answers it with a 400. Two requests that do not fit the pool together: the second waits for
the first, then evicts the first's idle cache, says both in its timings and the log, and every reply
equals the reply the same request got alone on the same server.

Unified KV is not byte-exact by construction (a sequence's cells interleave with the other slots'
and attention sums them in cell order; config.EXACT_UNIFIED): the equalities below are of greedy
tokens on this model, where --exact, which keeps one stream per slot, is what guarantees them.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from localflash.config import config_from
from localflash.errors import LocalflashError
from localflash.testing.serve import LiveServer

openai = pytest.importorskip("openai", reason="the dev extra installs openai")


def _text(lines: int, word: str) -> str:
    return "".join(f"{word} {i}: the value of item {i} is {i * 7 % 13}.\n" for i in range(lines))


LONG = _text(320, "line")  # ~6,000 tokens
SHORT = ["Write about the sea.", "Once upon a time", "The mountain was"]


def _complete(client, model, prompt, max_tokens=16):
    return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)


def _stream(client, model, prompt, max_tokens, out: dict, key, first: threading.Event | None = None):
    parts = []
    for c in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True):
        if c.choices:
            parts.append(c.choices[0].text)
            if first is not None:
                first.set()
    out[key] = "".join(parts)


class SlotWatch:
    """Polls /slots in a thread and keeps every answer (what the slots did while a test's requests ran)."""

    def __init__(self, url: str):
        self.url, self.seen, self._stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.seen.append(httpx.get(self.url + "/slots").json())
            time.sleep(0.05)

    def stop(self) -> list:
        self._stop.set()
        self.thread.join()
        return self.seen


@pytest.fixture(scope="module")
def unified(tiny_target, tmp_path_factory):
    server = LiveServer("-m", tiny_target, "--spec", "ngram", "-t", "1", "--fixed", "--draft-max", "4", "-c", "8192",
                        "--parallel", "4", log=tmp_path_factory.mktemp("kv") / "unified.log")
    yield server
    assert server.stop() == 0
    assert "Traceback" not in server.text()


def test_a_6000_token_request_is_served_while_other_slots_stream(unified):
    client = unified.client()
    alone = _complete(client, unified.model, LONG)
    assert 5500 <= alone.usage.prompt_tokens <= 6500 and alone.usage.prompt_tokens > 8192 // 4
    solo = {i: _complete(client, unified.model, p, 300).choices[0].text for i, p in enumerate(SHORT)}
    assert "a request may use up to 8192" in unified.text()

    out: dict = {}
    firsts = [threading.Event() for _ in SHORT]
    streams = [threading.Thread(target=_stream, args=(unified.client(), unified.model, p, 300, out, i, firsts[i])) for i, p in enumerate(SHORT)]
    for t in streams:
        t.start()
    assert all(f.wait(120) for f in firsts)
    watch = SlotWatch(unified.url)
    long = _complete(client, unified.model, LONG)
    seen = watch.stop()
    for t in streams:
        t.join()
    assert long.choices[0].text == alone.choices[0].text
    assert out == solo
    # while the long prompt was in its slot (more than a 1/4 share), another slot was decoding
    assert any(any(s.get("prompt_tokens", 0) > 2048 for s in snap) and any(s["state"] == "decoding" and s.get("prompt_tokens", 0) < 100 for s in snap)
               for snap in seen)


def test_without_unified_kv_the_same_request_is_a_400(tiny_target, tmp_path):
    server = LiveServer("-m", tiny_target, "--spec", "ngram", "-t", "1", "-c", "8192", "--parallel", "4", "--kv-pool", "split",
                        log=tmp_path / "split.log")
    try:
        assert "4 × 2048 tokens" in server.text()
        with pytest.raises(openai.BadRequestError) as e:
            _complete(server.client(), server.model, LONG)
        assert "holds 2048" in str(e.value)
        assert _complete(server.client(), server.model, SHORT[0]).choices[0].text  # the server goes on
    finally:
        assert server.stop() == 0


def test_a_request_that_does_not_fit_waits_then_evicts_idle_caches(unified):
    """A (~3,000-token prompt, 1,500 tokens to write: ~4,500 cells reserved) runs; B (~4,000 + 16) cannot fit beside it:
    B waits for A, then evicts A's finished conversation; neither reply changes."""
    client = unified.client()
    a_prompt, b_prompt = _text(160, "row"), _text(215, "entry")
    a_chunks = list(client.completions.create(model=unified.model, prompt=a_prompt, max_tokens=1500, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    a_alone = "".join(c.choices[0].text for c in a_chunks if c.choices)
    b_alone = _complete(client, unified.model, b_prompt)
    a_cells = a_chunks[-1].usage.prompt_tokens + 1500 + 4 + 1  # prompt, reply, a draft block's rows (--draft-max 4)
    assert a_cells <= 8192 and b_alone.usage.prompt_tokens + 16 + 5 <= 8192 < a_cells + b_alone.usage.prompt_tokens + 16 + 5

    out: dict = {}
    first = threading.Event()
    a = threading.Thread(target=_stream, args=(unified.client(), unified.model, a_prompt, 1500, out, "a", first))
    a.start()
    assert first.wait(120)
    watch = SlotWatch(unified.url)
    b = _complete(client, unified.model, b_prompt)
    seen = watch.stop()
    a.join()
    assert out["a"] == a_alone
    assert b.choices[0].text == b_alone.choices[0].text
    timings = b.model_extra["timings"]
    assert timings["kv_wait_ms"] > 0 and timings["kv_evicted"] > 0
    assert any(any(s["state"] == "kv_wait" for s in snap) for snap in seen)
    assert "for KV room" in unified.text() and "evicted" in unified.text()


def test_exact_mode_keeps_one_stream_per_slot(tiny_target):
    with pytest.raises(LocalflashError, match="does not combine with --kv-pool unified"):
        config_from(None, str(tiny_target), None, exact=True, kv_pool="unified", parallel=4)
    assert not config_from(None, str(tiny_target), None, exact=True, parallel=4).kv_unified()
    assert config_from(None, str(tiny_target), None, parallel=4).kv_unified()
    assert not config_from(None, str(tiny_target), None, parallel=4, kv_pool="split").kv_unified()
