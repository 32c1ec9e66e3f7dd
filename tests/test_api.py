"""The Python API (``localflash.load``): streaming, stop strings, cancellation, cache reuse, errors."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

import localflash
from localflash.errors import ContextOverflow, LocalflashError
from localflash.session import StopMatcher

TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{% for tc in m.tool_calls %}"
    '<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Name three colours and say why you like them."}]


@pytest.fixture(scope="module")
def demo():
    with localflash.load(pair="demo", threads=1) as llm:
        yield llm


@pytest.fixture(scope="module")
def tiny(tiny_target, tiny_drafters):
    with localflash.load(model=tiny_target, drafter=tiny_drafters["near"], spec="draft", threads=1) as llm:
        yield llm


def test_import_localflash_stays_light():
    code = "import sys, localflash; print(any(m.startswith(('localflash.api', 'localflash.llama', 'jinja2', 'numpy')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert localflash.load is localflash.api.load and localflash.Chunk.__module__ == "localflash.session"


def test_streamed_chunks_join_to_the_text_and_greedy_equals_plain_run(demo, lf):
    assert demo.name == "demo" and demo.drafter == "dflash"
    whole = demo.chat(MESSAGES, max_tokens=48)
    chunks = list(demo.chat(MESSAGES, stream=True, max_tokens=48))
    assert "".join(c.text for c in chunks) == whole.text and whole.text
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1) and chunks[-1].finish_reason == "length"
    assert sum(len(c.token_ids) for c in chunks) == whole.completion_tokens == 48 == chunks[-1].stats.generated
    assert chunks[-1].prompt_tokens == whole.prompt_tokens == demo.count_tokens(MESSAGES)
    # the same request again reuses the cached prompt (all but the token re-decoded for fresh logits)
    assert chunks[-1].cached_tokens == whole.prompt_tokens - 1
    plain = lf("run", "-p", "demo", "--spec", "none", "-t", "1", "-n", "48", MESSAGES[0]["content"])
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == whole.text + "\n"
    raw = demo.generate("The capital of France is", max_tokens=12)
    plain_raw = lf("run", "-p", "demo", "--spec", "none", "-t", "1", "-n", "12", "--raw", "The capital of France is")
    assert plain_raw.stdout == raw.text + "\n" and raw.prompt_tokens == demo.count_tokens("The capital of France is", raw=True)


def test_stop_strings_end_the_text_and_never_leak_partially(tiny):
    full = tiny.generate("Once upon a time", max_tokens=60).text
    assert len(full) > 40
    cut = len(full) // 2
    stop = full[cut : cut + 6]
    assert stop.strip() and full.find(stop) == cut, "pick a stop string that first occurs in the middle"
    streamed = ""
    chunks = list(tiny.generate("Once upon a time", stream=True, max_tokens=60, stop=["never-there", stop]))
    for c in chunks:
        streamed += c.text
        assert full[:cut].startswith(streamed)  # at no point did any part of the stop string go out
    assert streamed == full[:cut] and chunks[-1].finish_reason == "stop" and chunks[-1].stats.stop == "stop"
    done = tiny.generate("Once upon a time", max_tokens=60, stop=stop)
    assert done.text == full[:cut] and done.finish_reason == "stop"
    # a held-back tail that never completes a stop string is text: it comes out at the end
    unfinished = full[-3:] + "\x00never"
    assert tiny.generate("Once upon a time", max_tokens=60, stop=[unfinished]).text == full


def test_stop_matcher_holds_back_split_stop_strings():
    m = StopMatcher(["</answer>", "STOP"])
    assert m.push("The result is 4</") == ("The result is 4", False)
    assert m.push("ans") == ("", False)
    assert m.push("wer> and more") == ("", True)
    m = StopMatcher(["aab"])
    assert m.push("xaa") == ("x", False) and m.push("ab") == ("a", True)
    m = StopMatcher(["STOP"])
    assert m.push("ST") == ("", False) and m.push("ay") == ("STay", False) and m.flush() == ""
    assert StopMatcher(None).push("anything") == ("anything", False)


def test_cancel_stops_within_one_cycle_and_the_next_request_reuses_the_cache(tiny):
    prompt = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]
    reference = tiny.chat(prompt, max_tokens=80)
    tiny.reset()
    cancel = threading.Event()
    chunks = []
    for c in tiny.chat(prompt, stream=True, max_tokens=200, cancel=cancel):
        chunks.append(c)
        if len(chunks) == 4:
            cancel.set()  # the stream ends before another draft–verify cycle runs
    last = chunks[-1]
    assert len(chunks) == 5 and last.finish_reason == "cancelled" and last.stats.stop == "cancelled"
    assert last.stats.cycles == 3  # the prefill token, then the 3 cycles streamed before the cancel
    generated = [t for c in chunks for t in c.token_ids]
    eng = tiny.engine
    assert eng.ctx.pos_max() == len(eng.tokens) - 1  # no rejected draft rows left in the cache
    assert eng.tokens[last.prompt_tokens :] == generated[:-1]
    # the next request reuses the cached prompt and writes what a cold one writes
    again = tiny.chat(prompt, max_tokens=80)
    assert again.cached_tokens == again.prompt_tokens - 1 > 0 and again.stats.stop == "length"
    assert again.text == reference.text
    # set before the request: nothing is decoded
    pre = threading.Event()
    pre.set()
    out = list(tiny.chat(prompt, stream=True, cancel=pre))
    assert len(out) == 1 and out[0].finish_reason == "cancelled" and out[0].text == "" and out[0].stats.generated == 0


class CancelAfter:
    """An Event-like flag that reads as set from its ``n``-th check on (pins where a cancel lands)."""

    def __init__(self, n: int):
        self.n, self.checks = n, 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks >= self.n


def test_cancel_between_prefill_batches_and_from_another_thread(tiny):
    long_prompt = "word " * 1500  # about three batches of 512: prefilled batch by batch, cancel checked in between
    tiny.reset()
    chunks = list(tiny.generate(long_prompt, stream=True, max_tokens=50, cancel=CancelAfter(2)))
    assert [c.finish_reason for c in chunks] == ["cancelled"] and chunks[0].stats.generated == 0
    eng = tiny.engine
    n_batch = eng.ctx.n_batch
    assert chunks[0].prompt_tokens > 2 * n_batch
    assert len(eng.tokens) == n_batch and eng.ctx.pos_max() == n_batch - 1  # one batch in, then it stopped
    follow = threading.Event()
    got = []
    seen_one = threading.Event()

    def consume():
        for c in tiny.generate(long_prompt, stream=True, max_tokens=500, cancel=follow):
            got.append(c)
            seen_one.set()

    t = threading.Thread(target=consume)
    t.start()
    assert seen_one.wait(60)
    follow.set()
    t.join(60)
    assert got[-1].finish_reason == "cancelled" and got[-1].stats.generated < 500
    assert got[-1].cached_tokens == n_batch  # the batch prefilled before the first cancel was kept
    assert eng.ctx.pos_max() == len(eng.tokens) - 1


def test_bad_requests_raise_one_clear_error(tiny, tiny_target):
    with pytest.raises(ContextOverflow) as e:
        tiny.generate("word " * 5000, max_tokens=4)
    assert e.value.prompt_tokens > e.value.n_ctx == tiny.n_ctx and "context holds" in e.value.message
    for bad, text in [({"temperature": -1}, "temperature must be >= 0"), ({"temperature": float("nan")}, "temperature must be a finite"),
                      ({"top_p": 0}, "top_p must be in"), ({"top_k": 1.5}, "top_k must be a whole"), ({"max_tokens": 0}, "max_tokens must be"),
                      ({"stop": [3]}, "stop must be"), ({"tools": "x"}, "tools must be")]:
        with pytest.raises(LocalflashError, match=text):
            tiny.chat(MESSAGES, **bad)
    with pytest.raises(LocalflashError, match="must be a dict with a 'role'"):
        tiny.chat([{"content": "no role"}])
    with pytest.raises(LocalflashError, match="unknown option"):
        localflash.load(model=tiny_target, bogus=1)
    with localflash.load(model=tiny_target, spec="none", threads=1) as plain:
        assert plain.drafter == "none" and plain.name == Path(tiny_target).stem
    with pytest.raises(LocalflashError, match="closed"):
        plain.chat(MESSAGES)


def test_tools_and_tool_results_go_through_the_template(tiny_dir):
    import localflash.testing.tiny as tm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tm, "CHATML_TEMPLATE", TOOLS_TEMPLATE)
        path = tm.write_target(tiny_dir / "tools.gguf", tm.TinySpec(n_layer=2, seed=3))
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 °C"},
    ]
    with localflash.load(model=path, spec="none", threads=1) as llm:
        _, text = llm.session.encode(messages, tools=tools)
        assert text.startswith('<|im_start|>system\n<tools>{"type": "function", "function": {"name": "get_weather"')
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text  # arguments as an object
        assert "<tool_response>\nsunny, 21 °C\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
        assert llm.count_tokens(messages, tools=tools) > llm.count_tokens(messages)
        done = llm.chat(messages, tools=tools, max_tokens=4)
        assert done.completion_tokens == 4 and done.prompt_tokens == llm.count_tokens(messages, tools=tools)


def test_chunks_say_which_tokens_were_accepted_drafts_and_draft_max_caps_one_request(tiny_target, tiny_drafters):
    with localflash.load(model=tiny_target, drafter=tiny_drafters["near"], spec="draft", threads=1, fixed=True) as tiny:
        _provenance_sums_and_caps(tiny)


def _provenance_sums_and_caps(tiny):
    prompt = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]
    full = tiny.chat(prompt, max_tokens=64)
    stop = full.text[len(full.text) // 2 :][:4]
    runs = {}
    for name, kw in (("on", {}), ("cap 2", {"draft_max": 2}), ("off", {"draft_max": 0}), ("stop", {"stop": [stop]})):
        chunks = list(tiny.chat(prompt, stream=True, max_tokens=64, **kw))
        st = chunks[-1].stats
        assert sum(c.accepted for c in chunks) == st.accepted and sum(c.drafted for c in chunks) == st.drafted, name
        assert sum(len(c.token_chars) for c in chunks) == st.generated == sum(len(c.token_ids) for c in chunks), name
        assert all(len(c.token_chars) == len(c.token_ids) and c.accepted <= len(c.token_ids) for c in chunks), name
        runs[name] = ("".join(c.text for c in chunks), sum(sum(c.token_chars) for c in chunks), st, max(c.drafted for c in chunks))
    text, chars, st, _ = runs["on"]
    assert text == full.text and chars == len(text) and st.accepted > 0  # each token's share of the text adds up to it
    assert runs["cap 2"][0] == runs["off"][0] == text  # lossless at any draft length
    assert runs["cap 2"][3] == 2 and runs["cap 2"][2].accepted > 0
    assert runs["off"][2].drafted == runs["off"][3] == 0
    assert runs["stop"][0] == text[: text.index(stop)] and runs["stop"][1] >= len(runs["stop"][0])
    with pytest.raises(LocalflashError, match="draft_max"):
        tiny.chat(prompt, max_tokens=4, draft_max=-1)


def test_info_says_what_was_loaded_and_drafter_kind_resolves_auto_without_loading(tiny, tiny_target, tiny_drafters, tiny_dflash):
    from localflash.api import drafter_kind
    from localflash.config import config_from

    info = tiny.info()
    assert (info.name, info.pair, info.target, info.drafter, info.drafter_file) == ("target", None, tiny_target, "draft", tiny_drafters["near"])
    assert info.n_ctx == tiny.n_ctx and info.draft_max > 0 and info.adaptive and info.threads == 1
    assert info.rollback == "kv" and info.plan.n_ctx == info.n_ctx  # an attention-only target; the plan it loaded with
    auto = lambda drafter: drafter_kind(config_from(None, str(tiny_target), str(drafter) if drafter else None))  # noqa: E731
    assert (auto(tiny_dflash), auto(tiny_drafters["near"]), auto(None)) == ("dflash", "draft", "ngram")
    assert drafter_kind(config_from(None, str(tiny_target), None, spec="mtp")) == "mtp"
