"""The chat page at ``/`` in a real browser (Debian's chromium through Playwright) against a live server.

The demo pair at one thread with a fixed draft length (the adaptive one turns
drafting off on a CPU), one KV stream a slot (in a unified pool a slot's cells interleave with the
other slots' and the attention sums them in cell order, so a reply's rounding would depend on what
the earlier tests left in the other slots: config.EXACT_UNIFIED): the page's greedy reply equals `localflash run`, its
tinted tokens are exactly the server's accepted drafts (from /metrics), Esc
stops the server within a cycle, drafting off drafts nothing, and an API-key
server gets its key from the page. Everything is driven from the keyboard.
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import urlparse

import httpx
import pytest

from localflash.testing.browser import launch, missing
from localflash.testing.serve import LiveServer

if (why := missing()) is not None:
    pytest.skip(f"browser test not run: {why}", allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402

PROMPT = "Write a short Python function that checks whether a number is prime."
DEMO = ("--pair", "demo", "-t", "1", "--fixed", "--draft-max", "4", "--kv-pool", "split")
PAGE_REQUESTS = {("GET", p) for p in ("/", "/style.css", "/app.js", "/reply.js", "/markdown.js", "/v1/localflash/info")} | {
    ("POST", "/v1/chat/completions")}
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
PREDICTED = "llamacpp:tokens_predicted_total"


@pytest.fixture(scope="module")
def demo_server():
    s = LiveServer(*DEMO)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


class Page:
    """One browser tab on the chat page; remembers every request it made and every script error."""

    def __init__(self, browser, url: str, **context):
        self.ctx = browser.new_context(**context)
        self.page = self.ctx.new_page()
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status) of each response
        self.bodies: list[dict] = []
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" and "401" not in m.text else None)
        self.page.on("request", self._request)
        self.page.on("response", lambda r: self.requests.append((r.request.method, urlparse(r.url).path, r.status)))
        self.page.goto(url + "/")

    def _request(self, r):
        if r.method == "POST":
            self.bodies.append(json.loads(r.post_data))

    def press(self, selector: str, key: str = "Enter") -> None:
        """Focus an element and press a key on it (keyboard only)."""
        self.page.focus(selector)
        self.page.keyboard.press(key)

    def wait_ready(self) -> None:
        self.page.wait_for_function("() => window.localflashPage.state.info !== null")

    def settings(self, **fields) -> None:
        """Open the settings dialog, type the values, toggle checkboxes, Enter closes it."""
        self.press("#settings-btn")
        for name, value in fields.items():
            el = f"#set-{name}"
            if isinstance(value, bool):
                if self.page.is_checked(el) != value:
                    self.press(el, " ")
            else:
                self.page.fill(el, str(value))
        self.press("#set-max_tokens")
        self.page.wait_for_selector("#settings", state="hidden")
        applied = "(f) => Object.entries(f).every(([k, v]) => window.localflashPage.state.settings[k] === v)"
        self.page.wait_for_function(applied, arg=fields, timeout=10_000)

    def send(self, text: str) -> None:
        self.page.focus("#input")
        self.page.keyboard.type(text)
        self.page.keyboard.press("Enter")

    def last_reply(self, state: str = "done", timeout: float = 180_000):
        return self.page.wait_for_selector(f".msg.assistant:last-of-type[data-state={state}]", timeout=timeout)

    def close(self) -> None:
        self.ctx.close()


def counters(server: LiveServer) -> dict[str, float]:
    return {name: server.metric(name)[""] for name in (ACCEPTED, DRAFTED, PREDICTED)}


def test_reply_equals_localflash_run_and_its_tinted_tokens_are_the_accepted_drafts(demo_server, browser, lf):
    info = httpx.get(demo_server.url + "/v1/localflash/info").json()
    assert info["id"] == "demo" and info["pair"] == "demo" and info["drafter"] == "dflash"
    slots = httpx.get(demo_server.url + "/slots").json()
    assert info["draft_max"] == 4 and not info["adaptive"] and info["n_ctx"] == (4096 if slots[0]["kv_pool"] == "unified" else 4096 // len(slots))  # what one request may use
    assert info["slots"] == {"parallel": len(slots), "queue": 16} and info["plan"]["n_ctx"] == 4096
    assert "/v1/localflash/info" in httpx.get(demo_server.url + "/openapi.json").json()["paths"]

    tab = Page(browser, demo_server.url, viewport={"width": 1280, "height": 860})
    try:
        tab.wait_ready()
        assert tab.page.inner_text("#model-name") == "demo"
        tab.settings(temperature=0, max_tokens=64)
        before = counters(demo_server)
        tab.send(PROMPT)
        tab.page.wait_for_selector(".msg.assistant[data-state=streaming]")
        reply = tab.last_reply()
        after = counters(demo_server)
        accepted, drafted, predicted = (int(after[k] - before[k]) for k in (ACCEPTED, DRAFTED, PREDICTED))

        # the Markdown view: a code block, no HTML from the model
        assert reply.query_selector(".code pre code") is not None
        tinted_md = {e.get_attribute("data-i") for e in reply.query_selector_all(".body .t.d")}
        # the token view: the reply's text as it streamed, one span per token
        tab.press(".msg.assistant .tool.view")
        raw = reply.wait_for_selector(".raw")
        text = raw.text_content()
        run = lf("run", *DEMO, "-n", "64", "--temp", "0", PROMPT)
        assert run.returncode == 0, run.stderr
        assert text == run.stdout.removesuffix("\n") and text
        tokens, tinted = raw.query_selector_all(".t"), raw.query_selector_all(".t.d")
        assert len(tokens) == predicted == 64
        assert accepted > 0 and len(tinted) == accepted == int(reply.get_attribute("data-accepted"))
        assert tinted_md <= {e.get_attribute("data-i") for e in tinted} and tinted_md  # the same tokens, minus Markdown syntax
        assert int(reply.get_attribute("data-drafted")) == drafted
        assert f"{accepted} of {drafted} drafts accepted" in reply.query_selector(".foot").inner_text()
        figs = tab.page.evaluate("""Object.fromEntries([...document.querySelectorAll('#session-figs div')]
                                     .map(d => [d.querySelector('dt').textContent, d.querySelector('dd').textContent]))""")
        assert figs["replies"] == "1" and figs["tokens"] == "64" and figs["accepted"] == f"{accepted}/{drafted}"
        assert reply.query_selector(".mini svg") is not None and tab.page.query_selector("#reply-chart rect.chart-bar")

        # phone width: nothing wider than the window; dark mode changes the colours
        tab.page.set_viewport_size({"width": 390, "height": 844})
        assert tab.page.evaluate("document.scrollingElement.scrollWidth") <= 390
        light = tab.page.evaluate("getComputedStyle(document.body).backgroundColor")
        tab.page.emulate_media(color_scheme="dark")
        assert tab.page.evaluate("getComputedStyle(document.body).backgroundColor") != light

        assert {(m, p) for m, p, _ in tab.requests} <= PAGE_REQUESTS and all(s == 200 for _, _, s in tab.requests), tab.requests
        assert tab.bodies[0]["temperature"] == 0 and tab.bodies[0]["max_tokens"] == 64 and "speculative.n_max" not in tab.bodies[0]
        assert not tab.errors, tab.errors
    finally:
        tab.close()


def test_esc_stops_the_server_within_a_cycle_and_drafting_off_drafts_nothing(demo_server, browser, lf):
    tab = Page(browser, demo_server.url, viewport={"width": 1000, "height": 800})
    try:
        tab.wait_ready()
        tab.settings(temperature=0, max_tokens=900)
        seen = len(demo_server.log.read_text())
        tab.send("Count from 1 to 1000, one number per line.")
        tab.page.wait_for_function("() => document.querySelector('.msg.assistant')?.dataset.tokens >= 24", timeout=120_000)
        tab.page.keyboard.press("Escape")
        reply = tab.last_reply("stopped", timeout=30_000)
        deadline = time.monotonic() + 30
        while "client left" not in (new := demo_server.log.read_text()[seen:]):
            assert time.monotonic() < deadline, new
            time.sleep(0.05)
        line = [ln for ln in new.splitlines() if "client left" in ln][-1]
        m = re.search(r"generated (\d+) tok.*cancelled.*stopped (\d+) cycle", line)
        assert m and int(m.group(1)) < 900 and int(m.group(2)) <= 1, line
        assert "stopped" in reply.query_selector(".foot").inner_text()
        assert int(reply.get_attribute("data-tokens")) <= int(m.group(1))  # the page never shows more than the server made

        # edit the last message (↑ in the empty box), turn drafting off, send again: no token was drafted
        tab.settings(drafting=False, max_tokens=48)
        tab.page.focus("#input")
        tab.page.keyboard.press("ArrowUp")
        box = tab.page.wait_for_selector(".msg.user textarea.edit-box")
        assert box.input_value().startswith("Count from 1")
        box.fill(PROMPT)
        before = counters(demo_server)
        box.press("Enter")
        reply = tab.last_reply()
        after = counters(demo_server)
        turns = tab.page.evaluate("() => window.localflashPage.state.turns.map(t => [t.role, t.content || t.reply.state])")
        sent = [b["messages"] for b in tab.bodies]
        assert [e.inner_text() for e in tab.page.query_selector_all(".msg.user .body")] == [PROMPT], (turns, sent)  # the edit replaced the turn
        assert len(tab.page.query_selector_all(".msg.assistant")) == 1
        assert tab.bodies[-1]["speculative.n_max"] == 0 and tab.bodies[-1]["messages"] == [{"role": "user", "content": PROMPT}]
        assert after[DRAFTED] == before[DRAFTED] and after[ACCEPTED] == before[ACCEPTED]
        assert reply.query_selector_all(".t.d") == [] and reply.get_attribute("data-drafted") == "0"
        tab.press(".msg.assistant .tool.view")
        plain = lf("run", "--pair", "demo", "-t", "1", "--spec", "none", "-n", "48", "--temp", "0", PROMPT)
        assert reply.wait_for_selector(".raw").text_content() == plain.stdout.removesuffix("\n")  # lossless: what plain decoding writes

        tab.ctx.grant_permissions(["clipboard-read", "clipboard-write"])
        tab.press(".msg.assistant .tool.copy")
        tab.page.wait_for_selector("#toast.show")
        assert tab.page.evaluate("navigator.clipboard.readText()") == plain.stdout.removesuffix("\n")
        tab.press("#clear-btn")
        assert tab.page.query_selector_all(".msg") == [] and tab.page.is_visible("#welcome")
        assert {(m, p) for m, p, _ in tab.requests} <= PAGE_REQUESTS, tab.requests
        assert not tab.errors, tab.errors
    finally:
        tab.close()


def test_an_api_key_server_gets_the_key_from_the_page_and_it_stays_in_the_tab(tiny_target, browser):
    s = LiveServer("-m", str(tiny_target), "--spec", "none", "-c", "512", "-t", "1", "--api-key", "sesame")
    try:
        assert httpx.get(s.url + "/").status_code == 200 and httpx.get(s.url + "/v1/localflash/info").status_code == 401
        tab = Page(browser, s.url)
        try:
            tab.page.wait_for_selector("#keydlg[open]")
            tab.page.keyboard.type("wrong")
            tab.page.keyboard.press("Enter")
            tab.page.wait_for_selector("#key-error:not([hidden])")
            tab.page.fill("#key-input", "sesame")
            tab.page.keyboard.press("Enter")
            tab.wait_ready()
            assert tab.page.inner_text("#model-name") == "target"
            tab.settings(max_tokens=8)
            tab.send("Hello")
            reply = tab.last_reply()
            assert reply.get_attribute("data-tokens") == "8" and reply.query_selector(".body").inner_text()
            assert tab.page.evaluate("sessionStorage.getItem('localflash.key')") == "sesame"
            assert tab.page.evaluate("localStorage.length") == 0 and tab.ctx.cookies() == []
            statuses = {(m, p): st for m, p, st in tab.requests}
            assert statuses[("POST", "/v1/chat/completions")] == 200 and statuses[("GET", "/v1/localflash/info")] == 200
        finally:
            tab.close()
        fresh = Page(browser, s.url)  # another tab: the key did not leave the first
        try:
            fresh.page.wait_for_selector("#keydlg[open]")
        finally:
            fresh.close()
    finally:
        assert s.stop() == 0


def test_markdown_renderer_escapes_html_and_tints_every_character(demo_server, browser):
    tab = Page(browser, demo_server.url)
    try:
        tab.wait_ready()
        cases = {
            "a <script>alert(1)</script> & <b>b</b>": "<p>a &lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;b&lt;/b&gt;</p>",
            "**bold** *em* `x<y` ~~gone~~": "<p><strong>bold</strong> <em>em</em> <code>x&lt;y</code> <del>gone</del></p>",
            "[ok](https://example.org) [no](javascript:alert(1)) <img src=x onerror=alert(1)>":
                '<p><a href="https://example.org" target="_blank" rel="noopener noreferrer">ok</a> no &lt;img src=x onerror=alert(1)&gt;</p>',
            "# T\n\n- a\n  - b\n\n1. c\n   ```py\n   x = 1\n   ```": "<h1>T</h1><ul><li><p>a</p><ul><li><p>b</p></li></ul></li></ul><ol><li><p>c</p>"
                '<div class="code"><div class="code-head"><span>py</span><button type="button" class="copy-code" title="Copy the code">Copy</button>'
                "</div><pre><code>x = 1</code></pre></div></li></ol>",
            "| h | i |\n|---|--:|\n| 1 | 2 |": '<div class="table"><table><thead><tr><th>h</th><th class="al-right">i</th></tr></thead>'
                '<tbody><tr><td>1</td><td class="al-right">2</td></tr></tbody></table></div>',
            "> quote\nline two\n\n---": "<blockquote><p>quote</p></blockquote><p>line two</p><hr>",
        }
        got = tab.page.evaluate("""cases => Object.keys(cases).map(src => {
            const lp = window.localflashPage;
            return lp.markdown(src, 0, src.length, (a, b) => lp.esc(src.slice(a, b)));
        })""", cases)
        assert dict(zip(cases, got)) == cases
        # a tint that marks every character: all visible text of a reply goes through it
        marked = tab.page.evaluate("""src => {
            const lp = window.localflashPage, div = document.createElement('div');
            div.innerHTML = lp.markdown(src, 0, src.length, (a, b) => `<i>${lp.esc(src.slice(a, b))}</i>`);
            div.querySelectorAll('.code-head').forEach(e => e.remove());  // the page's own label and button
            return [div.textContent, [...div.querySelectorAll('i')].map(e => e.textContent).join('')];
        }""", "Some **bold** and `code` in\n- a list\n\n```\nfenced <code>\n```")
        assert marked[0] == marked[1] == "Some bold and code ina listfenced <code>"
        think = tab.page.evaluate("""() => {
            const lp = window.localflashPage, el = document.createElement('article');
            el.innerHTML = '<div class="body"></div><div class="foot"></div>';
            const r = new lp.Reply(el);
            r.add({choices: [{delta: {content: '<think>Let me see.</think>\\n\\nIt is 4.'}}], localflash: {drafted: 3, accepted: 2, chars: [7, 11, 8, 2, 8]}});
            r.state = 'done';
            lp.renderReply(r);
            return [el.querySelector('details.think .md').textContent, el.querySelector('.body > p').textContent,
                    [...el.querySelectorAll('.t.d')].map(e => e.textContent).join('|')];
        }""")
        assert think == ["Let me see.", "It is 4.", "Let me see."]
        opened = tab.page.evaluate("""() => {  // a template that opened <think> itself: the reply starts inside it
            const lp = window.localflashPage, el = document.createElement('article');
            el.innerHTML = '<div class="body"></div><div class="foot"></div>';
            const r = new lp.Reply(el);
            r.add({choices: [{delta: {content: 'Hmm.'}}], localflash: {drafted: 0, accepted: 0, chars: [4], phase: 'think'}});
            r.add({choices: [{delta: {content: '</think>Yes.'}}], localflash: {drafted: 0, accepted: 0, chars: [8, 4], phase: 'answer'}});
            r.state = 'done';
            lp.renderReply(r);
            return [el.querySelector('details.think .md').textContent, el.querySelector('.body > p').textContent, r.answer()];
        }""")
        assert opened == ["Hmm.", "Yes.", "Yes."]
    finally:
        tab.close()
