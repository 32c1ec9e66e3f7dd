"""`localflash serve` as a live process on a loopback port, driven by the real `openai` client.

Tiny random-weight models (and SmolLM2 with a Qwen/Hermes tool template for the
tool round trip) at one thread, so greedy output is exact and comparable with
`localflash run`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the dev extra installs openai")

from localflash.testing.serve import LiveServer  # noqa: E402

PROMPT = "Write a haiku about the sea."


def Server(log: Path, *args, env: dict | None = None) -> LiveServer:
    """``localflash serve -t 1 ARGS`` on a free loopback port, logging to ``log``."""
    return LiveServer("-t", "1", *args, log=log, env=env, timeout=120)


@pytest.fixture(scope="module")
def tiny_server(tiny_target, tiny_dflash, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve") / "server.log", "-m", tiny_target, "--drafter", tiny_dflash, "-c", "1024", "--queue", "4")
    yield s
    s.stop()


def chat(server: LiveServer, stream: bool, **kw):
    """One chat request -> (text, finish_reason, usage, timings, tool_calls)."""
    client = server.client()
    args = dict(model=server.model, messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=24)
    args.update(kw)
    if not stream:
        r = client.chat.completions.create(**args)
        c = r.choices[0]
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []]
        return c.message.content or "", c.finish_reason, r.usage, r.model_extra["timings"], calls
    text, finish, usage, timings, calls = [], None, None, None, {}
    for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if ch.usage is not None:
            usage, timings = ch.usage, ch.model_extra["timings"]
        for c in ch.choices:
            text.append(c.delta.content or "")
            for t in c.delta.tool_calls or []:
                got = calls.setdefault(t.index, ["", ""])
                got[0] += t.function.name or ""
                got[1] += t.function.arguments or ""
            finish = c.finish_reason or finish
    return "".join(text), finish, usage, timings, [(n, json.loads(a)) for n, a in calls.values()]


def test_chat_streamed_equals_whole_equals_localflash_run(tiny_server, tiny_target, tiny_dflash, lf):
    whole, finish, usage, timings, _ = chat(tiny_server, stream=False)
    streamed, s_finish, s_usage, s_timings, _ = chat(tiny_server, stream=True)
    run = lf("run", "-m", tiny_target, "--drafter", tiny_dflash, "-t", "1", "-n", "24", "--temp", "0", PROMPT)
    assert run.returncode == 0, run.stderr
    assert whole == streamed == run.stdout.removesuffix("\n")
    assert finish == s_finish == "length"
    for u, t in ((usage, timings), (s_usage, s_timings)):
        assert u.completion_tokens == t["predicted_n"] == 24
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert u.prompt_tokens == t["cache_n"] + t["prompt_n"] and u.prompt_tokens_details.cached_tokens == t["cache_n"]
        assert 0 <= t["draft_n_accepted"] <= t["draft_n"] and t["drafter"] == "dflash"
        assert t["predicted_ms"] > 0 and t["predicted_per_second"] > 0 and t["tau"] >= 1.0
    assert s_usage.prompt_tokens == usage.prompt_tokens
    assert s_usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1  # same prompt: all but the last token reused


def test_list_content_and_a_developer_message_render_the_same_through_the_server_and_the_api(tiny_server, tiny_target, tiny_dflash):
    """One template_message: ``developer`` is ``system`` and text parts are joined with a newline, over HTTP and in Python."""
    import localflash

    typed = [{"role": "developer", "content": "Answer briefly."},
             {"role": "user", "content": [{"type": "text", "text": "Name a colour."}, {"type": "text", "text": "And a fruit."}]}]
    plain = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour.\nAnd a fruit."}]

    def served(messages):
        text, _, usage, _, _ = chat(tiny_server, stream=False, messages=messages, max_tokens=16)
        return text, usage.prompt_tokens

    with localflash.load(model=tiny_target, drafter=tiny_dflash, ctx=1024, threads=1) as llm:
        rendered = llm.session.encode(typed)[1]
        assert rendered == llm.session.encode(plain)[1]
        assert rendered.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>") and "Name a colour.\nAnd a fruit." in rendered
        in_python = {name: (r.text, r.prompt_tokens) for name, r in
                     (("typed", llm.chat(typed, temperature=0, max_tokens=16)), ("plain", llm.chat(plain, temperature=0, max_tokens=16)))}
    over_http = {"typed": served(typed), "plain": served(plain)}
    assert over_http["typed"][0], over_http
    assert over_http["typed"] == over_http["plain"] == in_python["typed"] == in_python["plain"]


def test_completions_streamed_and_whole_agree_and_stop_strings_cut(tiny_server):
    client = tiny_server.client()
    args = dict(model="target", prompt="Once upon a time", max_tokens=20, temperature=0)
    whole = client.completions.create(**args)
    text = whole.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **args) if c.choices)
    assert text == streamed and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 20 == whole.model_extra["timings"]["predicted_n"]
    stop = text[len(text) // 2:][:3]  # a string the reply is known to contain
    assert stop.strip(), text
    cut = client.completions.create(stop=[stop], **args)
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    cut_stream = "".join(c.choices[0].text for c in client.completions.create(stream=True, stop=stop, **args) if c.choices)
    assert cut_stream == cut.choices[0].text


def test_models_health_and_metrics(tiny_server):
    models = tiny_server.client().models.list()
    assert [m.id for m in models.data] == ["target"]
    assert httpx.get(tiny_server.url + "/health").json() == {"status": "ok", "running": 0, "queued": 0}

    def counters() -> dict[str, int]:
        text = httpx.get(tiny_server.url + "/metrics").text
        for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_deferred",
                     "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                     "vllm:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total",
                     'localflash:requests_total{finish_reason="length"}'):
            assert re.search(rf"^{re.escape(name)} \d", text, re.M), name
        return {k: int(float(v)) for k, v in re.findall(r"^(\S+) (\S+)$", text, re.M)}

    before = counters()
    _, _, usage, timings, _ = chat(tiny_server, stream=False, messages=[{"role": "user", "content": "Count to ten."}], max_tokens=40)
    after = counters()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["llamacpp:tokens_predicted_total"] == usage.completion_tokens == timings["predicted_n"]
    assert delta["llamacpp:prompt_tokens_total"] == timings["prompt_n"]
    assert delta["llamacpp:prompt_tokens_cached_total"] == timings["cache_n"]
    for prefix in ("llamacpp:", "vllm:"):
        assert delta[prefix + "spec_decode_num_draft_tokens_total"] == timings["draft_n"]
        assert delta[prefix + "spec_decode_num_accepted_tokens_total"] == timings["draft_n_accepted"]
    assert delta['localflash:requests_total{finish_reason="length"}'] == 1
    schema = httpx.get(tiny_server.url + "/openapi.json").json()
    chat_op = schema["paths"]["/v1/chat/completions"]["post"]
    assert "400" in chat_op["responses"] and "422" not in chat_op["responses"]  # validation errors are 400 here
    assert "messages" in schema["components"]["schemas"]["ChatCompletionRequest"]["required"]


def test_four_concurrent_clients_each_get_their_own_complete_reply(tiny_server):
    prompts = [f"Tell me about {w}." for w in ("rivers", "mountains", "cities", "forests")]
    want = [chat(tiny_server, stream=False, messages=[{"role": "user", "content": p}], max_tokens=16)[0] for p in prompts]
    got: dict[int, str] = {}

    def one(i):
        got[i] = chat(tiny_server, stream=i % 2 == 1, messages=[{"role": "user", "content": prompts[i]}], max_tokens=16)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [got.get(i) for i in range(4)] == want


def test_client_closing_its_stream_stops_generation_within_a_cycle(tiny_server):
    client = tiny_server.client()
    stream = client.chat.completions.create(model="target", messages=[{"role": "user", "content": PROMPT}],
                                            temperature=0, max_tokens=900, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while "client left" not in tiny_server.text():
        assert time.monotonic() < deadline, tiny_server.text()
        time.sleep(0.05)
    line = [ln for ln in tiny_server.text().splitlines() if "client left" in ln][-1]
    m = re.search(r"generated (\d+) tok.*cancelled.*stopped (\d+) cycle", line)
    assert m, line
    assert int(m.group(1)) < 900 and int(m.group(2)) <= 1, line
    text, finish, usage, _, _ = chat(tiny_server, stream=False)
    assert finish == "length" and text
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1  # the engine kept the shared prefix


def test_queue_full_answers_503_with_retry_after(tiny_target, tmp_path):
    s = Server(tmp_path / "server.log", "-m", tiny_target, "--spec", "none", "-c", "4096", "--queue", "1", "--parallel", "1")
    try:
        client = s.client()
        long = client.chat.completions.create(model="target", messages=[{"role": "user", "content": PROMPT}],
                                              temperature=0, max_tokens=4000, stream=True)
        next(iter(long))  # the first request runs
        waiting = {}
        t = threading.Thread(target=lambda: waiting.update(r=chat(s, stream=False, max_tokens=8)))
        t.start()
        while httpx.get(s.url + "/health").json()["queued"] < 1:
            time.sleep(0.02)
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "queue_full" and r.json()["error"]["type"] == "unavailable_error"
        long.close()  # frees the engine: the queued request runs and completes
        t.join(60)
        assert waiting["r"][1] == "length" and waiting["r"][0]
    finally:
        assert s.stop() == 0
    assert "Traceback" not in s.text() and "stopped" in s.text()


def _err(r) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    return body["error"]


def test_each_bad_request_gets_its_status_and_json_error_then_the_server_serves(tiny_target, tmp_path):
    s = Server(tmp_path / "server.log", "-m", tiny_target, "--spec", "ngram", "-c", "256", "--api-key", "sesame")
    try:
        url, auth = s.url + "/v1/chat/completions", {"Authorization": "Bearer sesame"}
        good = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        long_prompt = "word " * 400
        cases = [
            ("no key", dict(json=good), 401, "invalid_api_key"),
            ("wrong key", dict(json=good, headers={"Authorization": "Bearer nope"}), 401, "invalid_api_key"),
            ("malformed JSON", dict(content=b'{"messages": [', headers={**auth, "Content-Type": "application/json"}), 400, "invalid_json"),
            ("not an object", dict(json=[1, 2], headers=auth), 400, "invalid_value"),
            ("missing messages", dict(json={"max_tokens": 4}, headers=auth), 400, "invalid_value"),
            ("wrong type", dict(json={**good, "temperature": "hot"}, headers=auth), 400, "invalid_value"),
            ("bad role", dict(json={"messages": [{"role": "wizard", "content": "x"}]}, headers=auth), 400, "invalid_value"),
            ("out of range", dict(json={**good, "top_p": 0}, headers=auth), 400, "invalid_value"),
            ("n = 2", dict(json={**good, "n": 2}, headers=auth), 400, "unsupported_value"),
            ("unknown model", dict(json={**good, "model": "gpt-9"}, headers=auth), 404, "model_not_found"),
            ("prompt too long", dict(json={**good, "messages": [{"role": "user", "content": long_prompt}]}, headers=auth), 400, "context_length_exceeded"),
        ]
        for name, kw, status, code in cases:
            r = httpx.post(url, timeout=60, **kw)
            assert r.status_code == status, (name, r.status_code, r.text)
            err = _err(r)
            assert err["code"] == code, (name, err)
            if code == "context_length_exceeded":
                assert err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256 and "256" in err["message"]
            ok = httpx.post(url, json=good, headers=auth, timeout=60)
            assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None, name
        r = httpx.get(s.url + "/v1/nowhere", headers=auth)
        assert r.status_code == 404 and _err(r)["code"] == "not_found"
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").chat.completions.create(model=s.model, messages=[{"role": "user", "content": "x"}])
        assert s.client("sesame").chat.completions.create(model=s.model, messages=good["messages"], max_tokens=4).choices
    finally:
        assert s.stop() == 0
    assert "Traceback" not in s.text()


HERMES_TEMPLATE = (Path(__file__).parent / "data" / "hermes_tools.jinja")


@pytest.fixture(scope="module")
def smollm2_tools(smollm2, tmp_path_factory) -> Path:
    """SmolLM2 (ChatML) carrying a Qwen2.5/Hermes-style tool template instead of its own."""
    out = tmp_path_factory.mktemp("tools") / "smollm2-tools.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(smollm2), str(out),
                    "--chat-template-file", str(HERMES_TEMPLATE), "--force"], check=True, capture_output=True)
    return out


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tool_call_round_trip_with_a_hermes_template(smollm2_tools, tmp_path):
    s = Server(tmp_path / "server.log", "-m", smollm2_tools, "--spec", "ngram", "-c", "2048")
    try:
        client = s.client()
        earlier = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}
        messages = [{"role": "user", "content": "What is the weather in Rome?"}, earlier,
                    {"role": "user", "content": "What is the weather in Paris?"}]
        whole = chat(s, stream=False, messages=messages, tools=TOOLS, max_tokens=48)
        streamed = chat(s, stream=True, messages=messages, tools=TOOLS, max_tokens=48)
        for text, finish, _, _, calls in (whole, streamed):
            assert finish == "tool_calls" and text == ""
            assert calls == [("get_weather", {"city": "Paris"})]
        r = client.chat.completions.create(model=s.model, messages=messages, tools=TOOLS, max_tokens=48, temperature=0)
        call = r.choices[0].message.tool_calls[0]
        follow = messages + [r.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
        text, finish, usage, _, calls = chat(s, stream=False, messages=follow, tools=TOOLS, max_tokens=32)
        assert calls == [] and finish in ("stop", "length") and text.strip()
        assert usage.prompt_tokens > whole[2].prompt_tokens + 10  # the call and its result were rendered
        assert usage.prompt_tokens_details.cached_tokens >= whole[2].prompt_tokens - 1  # earlier turns came from the cache
        plain = chat(s, stream=False, messages=messages, max_tokens=48)  # no tools: nothing is parsed
        assert plain[4] == [] and plain[1] != "tool_calls"
    finally:
        assert s.stop() == 0


def test_the_first_request_reports_the_draft_length_calibration_apart(tiny_target, tiny_dflash, tmp_path):
    """A fresh server's first request pays the adaptive draft length's timing passes: timings' calibrate_ms (not in
    predicted_ms) and /metrics' localflash:calibrate_seconds_total; later requests pay nothing."""
    s = Server(tmp_path / "server.log", "-m", tiny_target, "--drafter", tiny_dflash, "-c", "1024")
    try:
        first = chat(s, stream=False, max_tokens=8)[3]
        second = chat(s, stream=True, max_tokens=8)[3]
        metrics = httpx.get(s.url + "/metrics").text
    finally:
        s.stop()
    assert first["calibrate_ms"] > 0 and second["calibrate_ms"] == 0
    total = float(re.search(r"^localflash:calibrate_seconds_total (\S+)$", metrics, re.M).group(1))
    assert total == pytest.approx(first["calibrate_ms"] / 1000, rel=1e-4)
