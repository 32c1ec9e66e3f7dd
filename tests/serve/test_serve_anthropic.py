"""Anthropic's Messages API (serve/anthropic.py), driven by the real `anthropic` client on a live server.

The server runs the tiny target with a Qwen3-style thinking template (``thinking`` disabled closes
the block in the prompt, enabled leaves it open), 2 slots. Whole and streamed replies agree and
equal the OpenAI chat route's text for the same request; a tool_use/tool_result conversation
renders the prompt the OpenAI route renders for its tool_calls/tool messages; a reply that holds
a call comes back as a tool_use block (the random model never writes one, so that half runs the
route's reply builder on a written call and reads its events with the client's own accumulator);
bad inputs get Anthropic-shaped 4xx bodies; a client that leaves mid-stream frees its slot.
"""

from __future__ import annotations

import json
import random
import time

import httpx
import pytest

from localflash.serve.anthropic_wire import MessageReply
from localflash.serve.toolcalls import get_format
from localflash.testing.serve import LiveServer

anthropic = pytest.importorskip("anthropic", reason="the dev extra installs anthropic")
openai = pytest.importorskip("openai", reason="the dev extra installs openai")

THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}"
    "{% else %}{{ '<think>\n' }}{% endif %}{% endif %}"
)
OFF = {"type": "disabled"}
GREEDY = {"temperature": 0}  # this client sends no temperature of its own (Anthropic's default is 1)
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    import localflash.testing.tiny as tm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tm, "CHATML_TEMPLATE", THINK_TEMPLATE)
        target = tm.write_target(tiny_dir / "thinking.gguf", tm.TinySpec(n_layer=4, seed=0))
    s = LiveServer("-m", target, "--spec", "ngram", "-t", "1", "-c", "2048", "--parallel", "2",
                   log=tmp_path_factory.mktemp("anthropic") / "server.log")
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.text()


def _clients(server):
    return (anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120),
            openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120))


def _blocks(message) -> list[dict]:
    keys = ("type", "text", "thinking", "signature", "id", "name", "input")
    return [{k: getattr(b, k) for k in keys if hasattr(b, k)} for b in message.content]


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_streamed_and_whole_replies_agree_and_equal_the_openai_route(server):
    ac, oc = _clients(server)
    ask = dict(model="anything", max_tokens=24, extra_body=GREEDY, system="Be brief.", thinking=OFF,
               messages=[{"role": "user", "content": [{"type": "text", "text": "Write about the sea."}]}])
    whole = ac.messages.create(**ask)
    with ac.messages.stream(**ask) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    chat = oc.chat.completions.create(model=server.model, max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write about the sea."}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert _text(whole) and _text(whole) == streamed == _text(final) == chat.choices[0].message.content
    assert [b.type for b in whole.content] == ["text"] and whole.role == "assistant" and whole.model == server.model
    assert whole.stop_reason == final.stop_reason == ("max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn")
    assert whole.usage.output_tokens == final.usage.output_tokens == chat.usage.completion_tokens
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    counted = ac.messages.count_tokens(model="anything", system="Be brief.", thinking=OFF, messages=ask["messages"])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_a_thinking_template_yields_thinking_blocks(server):
    ac, _ = _clients(server)
    ask = dict(model="anything", max_tokens=16, extra_body=GREEDY, messages=[{"role": "user", "content": "Think about bread."}])
    on = ac.messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **ask)
    assert on.content[0].type == "thinking" and on.content[0].thinking and on.content[0].signature
    with ac.messages.stream(thinking={"type": "enabled", "budget_tokens": 1024}, **ask) as s:
        events = list(s)
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in on.content]
    assert any(e.type == "content_block_delta" and e.delta.type == "thinking_delta" for e in events)
    off = ac.messages.create(thinking=OFF, **ask)
    assert [b.type for b in off.content] == ["text"]


def test_a_tool_result_turn_renders_what_the_openai_route_renders(server):
    ac, oc = _clients(server)
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                                 {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C and sunny"}]}]
    reply = ac.messages.create(model="anything", max_tokens=16, extra_body=GREEDY, thinking=OFF, tools=TOOLS, messages=history)
    chat = oc.chat.completions.create(model=server.model, max_tokens=16, temperature=0, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": "toolu_1", "type": "function",
                                                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C and sunny"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": TOOLS[0]["input_schema"]}}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert _text(reply) == chat.choices[0].message.content
    shorter = ac.messages.count_tokens(model="anything", thinking=OFF, tools=TOOLS, messages=history[:1])
    assert shorter.input_tokens < chat.usage.prompt_tokens  # the tool turn is in the prompt


def test_a_call_in_the_reply_is_a_tool_use_block_streamed_and_whole(server):
    """The reply builder on text that holds a call, at random splits: the client's accumulator of the streamed events
    gives the whole message, whose tool_use block the next request sends back with a tool_result (a 200)."""
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import Message, RawMessageStreamEvent
    from pydantic import TypeAdapter

    events_of = TypeAdapter(RawMessageStreamEvent)
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    done = type("Last", (), {"prompt_tokens": 30, "cached_tokens": 0, "finish_reason": "stop",
                             "stats": type("St", (), {"generated": 20, "stop": "eog"})()})()
    rng = random.Random(0)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), 6))
        reply = MessageReply("m", get_format("hermes").stream([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]))
        events = [reply.start(done)]
        for piece in (text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])):
            events += reply.feed(piece)
        events += reply.flush() + reply.end(done)
        snapshot, bufs = None, {}
        for e in events:
            snapshot = accumulate_event(event=events_of.validate_python(e), current_snapshot=snapshot, json_bufs=bufs)
        whole = Message.model_validate(reply.whole(done))
        assert _blocks(snapshot) == _blocks(whole)
        assert [b.type for b in whole.content] == ["text", "tool_use"] and whole.content[1].input == {"city": "Paris"}
        assert whole.stop_reason == "tool_use" and whole.content[0].text == "Checking."
    ac, _ = _clients(server)
    call = whole.content[1]
    back = ac.messages.create(model="anything", max_tokens=8, extra_body=GREEDY, thinking=OFF, tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "18 C"}]}]}])
    assert back.usage.output_tokens >= 1


@pytest.mark.parametrize("body,needle", [
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),  # required
    ({"model": "m", "max_tokens": 8, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"model": "m", "max_tokens": 8, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}, "messages": [{"role": "user", "content": "hi"}]}, "tool_choice"),
    ({"model": "m", "max_tokens": 8, "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "hi"}]}, "needs tools"),
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "word " * 3000}]}, "holds"),  # longer than the context
    ({"model": "m", "max_tokens": 8, "temperature": 3, "messages": [{"role": "user", "content": "hi"}]}, "temperature"),
])
def test_bad_inputs_get_anthropic_shaped_400s(server, body, needle):
    ac, _ = _clients(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        ac.post("/v1/messages", cast_to=object, body=body)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert needle in e.value.body["error"]["message"]


def test_tool_choice_any_and_a_named_tool_force_a_tool_use_block(server):
    """tool_choice any / tool: the call is forced by the chat route's grammar in the model's call format, so even the
    random tiny model answers with a tool_use block of the named tool and stop_reason tool_use."""
    ac, _ = _clients(server)
    name = TOOLS[0]["name"]
    for choice in ({"type": "any"}, {"type": "tool", "name": name}):
        m = ac.messages.create(model="m", max_tokens=200, tools=TOOLS, tool_choice=choice, extra_body=GREEDY, thinking=OFF,
                               messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        uses = [b for b in m.content if b.type == "tool_use"]
        assert uses and uses[0].name == name and m.stop_reason == "tool_use", m


def test_not_json_is_an_anthropic_shaped_400(server):
    r = httpx.post(server.url + "/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
    ac, _ = _clients(server)
    with ac.messages.stream(model="anything", max_tokens=1500, extra_body=GREEDY, thinking=OFF,
                            messages=[{"role": "user", "content": "Tell a long story."}]) as s:
        for i, _ in enumerate(s):
            if i == 6:
                break
    deadline = time.monotonic() + 30
    while any(slot["state"] != "idle" for slot in httpx.get(server.url + "/slots").json()):
        assert time.monotonic() < deadline, "a slot is still busy after its client left"
        time.sleep(0.1)
    assert "cancelled" in server.text() or "client left" in server.text()
    after = ac.messages.create(model="anything", max_tokens=4, extra_body=GREEDY, thinking=OFF, messages=[{"role": "user", "content": "hi"}])
    assert after.usage.output_tokens >= 1
    assert json.loads(httpx.get(server.url + "/health").text)["running"] == 0
