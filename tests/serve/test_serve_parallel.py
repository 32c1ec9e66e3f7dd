"""`localflash serve --parallel N`: concurrent clients get the replies they would get alone.

Two live servers per drafter on the same files, both in exact mode at one thread (see
tests/speculative/test_slots.py for why that makes equality exact): ``--parallel 1`` (one
request at a time) answers every request alone first; then ``--parallel 8`` gets them from 4
and then 8 concurrent real `openai` clients — chat and completions, streamed and not, mixed
lengths, a sampled one with a seed — while other clients cancel their streams mid-way. Every
reply must equal its solo reply byte for byte. Also: /slots, the slot share's 400, /metrics.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from localflash.testing.serve import LiveServer

openai = pytest.importorskip("openai", reason="the dev extra installs openai")

TOPICS = ["the sea", "a mountain", "bread", "a library", "rain", "a city at night", "bicycles", "tea"]


def _requests() -> list[dict]:
    out = []
    for i, topic in enumerate(TOPICS):
        kind = ["chat", "chat_stream", "completion", "completion_stream"][i % 4]
        out.append({"kind": kind, "prompt": f"Write two sentences about {topic}.", "max_tokens": [12, 40, 24, 64][i % 4],
                    "temperature": 0.8 if i == 5 else 0.0, "seed": 11 if i == 5 else None})
    return out


def _send(client, model: str, r: dict) -> str:
    common = dict(model=model, max_tokens=r["max_tokens"], temperature=r["temperature"], seed=r["seed"])
    if r["kind"].startswith("chat"):
        messages = [{"role": "user", "content": r["prompt"]}]
        if r["kind"] == "chat":
            return client.chat.completions.create(messages=messages, **common).choices[0].message.content
        return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(messages=messages, stream=True, **common)
                       if c.choices)
    if r["kind"] == "completion":
        return client.completions.create(prompt=r["prompt"], **common).choices[0].text
    return "".join(c.choices[0].text for c in client.completions.create(prompt=r["prompt"], stream=True, **common) if c.choices)


def _cancel_midway(client, model: str) -> None:
    s = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell a long story."}],
                                       max_tokens=300, temperature=0, stream=True)
    for j, _ in enumerate(s):
        if j == 3:
            break
    s.close()


@pytest.fixture(scope="module", params=["tiny-dflash", "qwen35-mtp"])
def servers(request, tiny_target, tiny_dflash, tiny_qwen35_q4k, tmp_path_factory):
    # the hybrid is the K-quant one: exact mode makes its rows independent of the batch they share (an F32 hybrid's
    # one-row decodes take another kernel than its batches, tests/llama/test_exact.py), whatever the clients' timing
    load = {"tiny-dflash": ["-m", tiny_target, "--drafter", tiny_dflash, "--spec", "dflash"],
            "qwen35-mtp": ["-m", tiny_qwen35_q4k, "--spec", "mtp"]}[request.param]
    args = [*map(str, load), "--exact", "-t", "1", "--fixed", "--draft-max", "4"]
    folder = tmp_path_factory.mktemp("parallel")
    solo = LiveServer(*args, "-c", "512", "--parallel", "1", log=folder / "solo.log")
    try:
        client = openai.OpenAI(base_url=solo.url + "/v1", api_key="none", max_retries=0, timeout=300)
        alone = [_send(client, solo.model, r) for r in _requests()]
        assert all(alone)
    finally:
        assert solo.stop() == 0
    slots = LiveServer(*args, "-c", "4096", "--parallel", "8", "--queue", "4", log=folder / "slots.log")
    yield slots, alone
    assert slots.stop() == 0
    assert "Traceback" not in slots.log.read_text()


def _draft_counters(url: str) -> tuple[float, float]:
    """/metrics: draft tokens and accepted draft tokens so far."""
    values = dict(line.split(" ", 1) for line in httpx.get(url + "/metrics").text.splitlines() if line and not line.startswith("#"))
    return (float(values["llamacpp:spec_decode_num_draft_tokens_total"]), float(values["llamacpp:spec_decode_num_accepted_tokens_total"]))


@pytest.mark.parametrize("clients", [4, 8])
def test_concurrent_clients_get_their_solo_replies(servers, clients):
    """Also: the requests overlapped (/slots, polled meanwhile, showed two or more slots decoding at once) and the
    server drafted (its /metrics draft counters grew; accepted ones too with the MTP block that mostly agrees)."""
    server, alone = servers
    reqs = _requests()
    got: dict[int, str] = {}
    errors: list[BaseException] = []
    drafted0, accepted0 = _draft_counters(server.url)
    busiest = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            states = [s["state"] for s in httpx.get(server.url + "/slots").json()]
            busiest[0] = max(busiest[0], states.count("decoding"))
            done.wait(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()

    def client_loop(c: int):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        try:
            if c % 3 == 1:
                _cancel_midway(client, server.model)  # a client leaves mid-stream, then sends its requests
            for i in range(c, len(reqs), clients):
                got[i] = _send(client, server.model, reqs[i])
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert not errors
    assert [got[i] for i in range(len(reqs))] == alone
    assert busiest[0] >= 2, busiest  # requests overlapped: decoded in the same steps
    drafted, accepted = _draft_counters(server.url)
    assert drafted > drafted0, (drafted0, drafted)
    if "qwen35" in server.model:  # the K-quant qwen35 and its MTP block
        assert accepted > accepted0, (accepted0, accepted)
    slots = httpx.get(server.url + "/slots").json()
    assert len(slots) == 8 and all(s["state"] == "idle" for s in slots)
    metrics = httpx.get(server.url + "/metrics").text
    assert "localflash:slots 8" in metrics and "localflash:aggregate_tokens_per_second" in metrics
    values = dict(line.split(" ", 1) for line in metrics.splitlines() if line.startswith("llamacpp:n_"))
    # llama-server's pair: batched decodes, and the slots they carried (each decode at least one; some, two or more)
    assert int(values["llamacpp:n_decode_total"]) > 0
    assert 1.0 < float(values["llamacpp:n_busy_slots_per_decode"]) <= 8


def test_a_prompt_larger_than_a_slot_is_a_400(servers):
    server, _ = servers
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "stone " * 700, "max_tokens": 4})
    assert r.status_code == 400 and "one slot holds" in r.json()["error"]["message"]
