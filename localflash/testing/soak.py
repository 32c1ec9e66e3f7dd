"""The soak's requests (benchmarks/serve/soak_serve.py, leak_probe.py): each sends one kind of request and says what is wrong.

Both APIs: the OpenAI routes (an ``openai`` client) and the Anthropic ``/v1/messages`` route (an
``anthropic`` client), streamed, whole and left mid-stream; greedy replies kept in a dict shared by the
clients must come back identical (the Anthropic route's text equals the OpenAI chat route's for the
same prompt). :class:`Agent` is an agent conversation resent whole every turn, growing by a tool call
and a tool result of ~300 tokens.
"""

from __future__ import annotations

import json
import random

GREEDY = {"temperature": 0}  # the anthropic client takes no temperature argument of its own here
TOPICS = ["the sea", "a mountain", "bread", "a library", "rain", "a city at night", "bicycles", "tea"]


def tool_result(c: int, k: int, turn: int) -> str:
    """~300 tokens of code, as a read_file tool returns it."""
    return "".join(f"def f{c}_{k}_{turn}_{i}(x, y):\n    return x * {i} + y - {turn}  # step {i}\n" for i in range(12))


class Agent:
    """One client's agent conversation: resent whole every turn, growing by a reply, a tool call and its result."""

    TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]

    def __init__(self, c: int, rng: random.Random):
        self.c, self.rng, self.k = c, rng, -1
        self.new()

    def new(self) -> None:
        self.k += 1
        self.route = self.rng.choice(["openai", "openai_stream", "anthropic", "anthropic_stream"])
        self.turns = 0
        task = f"Agent {self.c}.{self.k}: fix the failing tests; read the files you need."
        self.messages = [{"role": "user", "content": task}]  # Anthropic shape; to_openai() converts

    def to_openai(self) -> list[dict]:
        out = [{"role": "system", "content": "You are a coding agent."}]
        for m in self.messages:
            if isinstance(m["content"], str):
                out.append(m)
            elif m["role"] == "assistant":
                text, call = m["content"]
                out.append({"role": "assistant", "content": text["text"], "tool_calls": [{
                    "id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["input"])}}]})
            else:
                res = m["content"][0]
                out.append({"role": "tool", "tool_call_id": res["tool_use_id"], "content": res["content"]})
        return out

    def turn(self, client, ac, model: str, max_tokens: int, slot_ctx: int, agent: dict, lock) -> str | None:
        if self.route.startswith("openai"):
            tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
                     for t in self.TOOLS]
            ask = dict(model=model, messages=self.to_openai(), tools=tools, temperature=0, max_tokens=max_tokens)
            if self.route == "openai_stream":
                parts, finish, usage = [], None, None
                for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **ask):
                    for c in ch.choices:
                        parts.append(c.delta.content or "")
                        finish = c.finish_reason or finish
                    usage = ch.usage or usage
                text = "".join(parts)
            else:
                r = client.chat.completions.create(**ask)
                text, finish, usage = r.choices[0].message.content or "", r.choices[0].finish_reason, r.usage
            if finish not in ("stop", "length", "tool_calls") or usage is None:
                return f"odd finish {finish!r} or no usage"
            prompt, cached = usage.prompt_tokens, (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
        else:
            ask = dict(model="any", system="You are a coding agent.", messages=self.messages, tools=self.TOOLS, extra_body=GREEDY, max_tokens=max_tokens)
            if self.route == "anthropic_stream":
                with ac.messages.stream(**ask) as s:
                    text = "".join(s.text_stream)
                    final = s.get_final_message()
            else:
                final = ac.messages.create(**ask)
                text = "".join(b.text for b in final.content if b.type == "text")
            if final.stop_reason not in ("end_turn", "max_tokens", "tool_use", "stop_sequence"):
                return f"odd stop_reason {final.stop_reason!r}"
            cached = final.usage.cache_read_input_tokens or 0
            prompt = final.usage.input_tokens + cached
        with lock:
            agent["turns"] += 1
            agent["conversations"] += self.turns == 0
            agent["longest_prompt"] = max(agent["longest_prompt"], prompt)
            agent["prompt_tokens"] += prompt
            agent["cached_tokens"] += cached
        self.turns += 1
        if prompt > slot_ctx // 2:
            self.new()
            return None
        call = {"type": "tool_use", "id": f"toolu_{self.c}_{self.k}_{self.turns}", "name": "read_file", "input": {"path": f"src/m{self.turns}.py"}}
        self.messages.append({"role": "assistant", "content": [{"type": "text", "text": text or "Reading."}, call]})
        self.messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                           "content": tool_result(self.c, self.k, self.turns)}]})
        return None


def one_message(ac, kind: str, prompt: str, max_tokens: int, greedy: dict) -> str | None:
    """One Anthropic /v1/messages request (whole, streamed, or left after 3 events); greedy text equals the OpenAI route's."""
    ask = dict(model="any", max_tokens=max_tokens, extra_body=GREEDY, messages=[{"role": "user", "content": prompt}])
    if kind == "msg_disconnect":
        with ac.messages.stream(**{**ask, "max_tokens": 400}) as s:
            for j, _ in enumerate(s):
                if j == 3:
                    break
        return None
    if kind == "msg_stream":
        with ac.messages.stream(**ask) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        if "".join(b.text for b in final.content if b.type == "text") != text:
            return "streamed text differs from the final message"
    else:
        final = ac.messages.create(**ask)
        text = "".join(b.text for b in final.content if b.type == "text")
    if not text or final.stop_reason not in ("end_turn", "max_tokens"):
        return f"empty or odd stop_reason {final.stop_reason!r}"
    want = greedy.setdefault(prompt, text)
    return None if text == want else f"greedy reply changed (messages route): {text!r} != {want!r}"


def one(client, model: str, kind: str, prompt: str, max_tokens: int, greedy: dict) -> str | None:
    """Send one request of ``kind``; return what is wrong with its answer, or None."""
    messages = [{"role": "user", "content": prompt}]
    base = dict(model=model, messages=messages, temperature=0, max_tokens=max_tokens)
    if kind == "completion":
        r = client.completions.create(model=model, prompt=prompt + "\n", temperature=0.8, seed=1, max_tokens=max_tokens)
        c = r.choices[0]
        if c.finish_reason == "stop" and not c.text and r.usage.completion_tokens == 0:
            return None  # the model's first sampled token ended the text: an empty completion is its answer
        return None if c.text and c.finish_reason in ("stop", "length") else f"empty or odd: {c!r} {r.usage!r}"
    if kind == "disconnect":
        s = client.chat.completions.create(stream=True, **{**base, "max_tokens": 400})
        for j, _ in enumerate(s):
            if j == 2:
                break
        s.close()
        return None
    if kind in ("chat", "chat_stream"):
        text, finish = _chat(client, base, kind == "chat_stream")
        if not text or finish not in ("stop", "length"):
            return f"empty or odd finish {finish!r}"
        want = greedy.setdefault(prompt, text)
        return None if text == want else f"greedy reply changed: {text!r} != {want!r}"
    # stop strings: cut the known greedy reply at a word of its second half
    want = greedy.get(prompt)
    if want is None:
        want = greedy.setdefault(prompt, _chat(client, base, False)[0])
    words = [w for w in want[len(want) // 2:].split() if len(w) > 2]
    if not words:
        return None
    stop = words[0]
    text, finish = _chat(client, {**base, "stop": [stop]}, kind == "stop_stream")
    if stop in text:
        return f"stop string {stop!r} in the reply"
    return None if text == want[: want.index(stop)] and finish == "stop" else f"cut wrong: {text!r} (stop {stop!r}, finish {finish})"


def _chat(client, args: dict, stream: bool) -> tuple[str, str | None]:
    if not stream:
        r = client.chat.completions.create(**args)
        return r.choices[0].message.content or "", r.choices[0].finish_reason
    parts, finish = [], None
    for ch in client.chat.completions.create(stream=True, **args):
        for c in ch.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(parts), finish
