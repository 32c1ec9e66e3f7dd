"""``localflash chat``: non-tty stdin, a pseudo-terminal with Ctrl-C, overflow, thinking phases, transcripts."""

from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from localflash.api import LLM
from localflash.cli.chat import ChatSession
from localflash.cli.chat_ui import PlainUI
from localflash.config import config_from
from localflash.engine import open_engine
from localflash.speculative.sampling import SamplingParams
from localflash.phases import PhaseGate, PhaseTracker, diff_stats, initial_phase
from localflash.speculative.stats import Stats

THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}"
    "{% else %}{{ '<think>\n' }}{% endif %}{% endif %}"
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@pytest.fixture(scope="session")
def tiny_thinking(tiny_dir) -> Path:
    """The tiny target with a Qwen3-style template: ``enable_thinking`` pre-opens ``<think>``."""
    import localflash.testing.tiny as tm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tm, "CHATML_TEMPLATE", THINK_TEMPLATE)
        return tm.write_target(tiny_dir / "thinking.gguf", tm.TinySpec(n_layer=4, seed=0))


class RecordingUI(PlainUI):
    """PlainUI on string buffers; can raise SIGINT (really, via the OS) after N streamed pieces."""

    def __init__(self, lines=()):
        super().__init__(io.StringIO("\n".join(lines) + ("\n" if lines else "")), io.StringIO(), io.StringIO())
        self.sigint_after: list[int] = []  # piece counts at which to send SIGINT
        self.pieces = 0

    def push(self, text: str) -> None:
        super().push(text)
        self.pieces += 1
        for n in self.sigint_after:
            if self.pieces == n:
                os.kill(os.getpid(), signal.SIGINT)

    @property
    def notices(self) -> str:
        return self.err.file.getvalue()

    @property
    def shown(self) -> str:
        return self.info_console.file.getvalue()


@pytest.fixture(scope="module")
def engine_pool():
    """Engines shared by this module's sessions (loading costs more than the tests); reset on reuse."""
    pool = {}

    def get(target, drafter, spec, ctx):
        key = (str(target), str(drafter), spec, ctx)
        if key not in pool:
            cfg = config_from(None, str(target), str(drafter) if drafter else None, spec=spec, ctx=ctx, threads=1)
            engine = open_engine(cfg)
            pool[key] = (engine, engine.policy)
        engine, policy = pool[key]
        engine.reset()
        engine.policy, engine.drafting = policy, True  # undo what an earlier session switched
        return engine

    yield get
    for engine, _ in pool.values():
        engine.close()


@pytest.fixture
def sessions(engine_pool):
    """Factory for in-process chat sessions on pooled engines (each session starts with an empty cache)."""

    def make(target=None, drafter=None, spec="auto", ctx=4096, max_tokens=16, temp=0.0, draft="auto", system=None, thinking=None, engine=None):
        if engine is None:
            engine = engine_pool(target, drafter, spec, ctx)
        else:
            engine.reset()  # a new conversation on the same engine, from an empty cache
        return ChatSession(LLM(engine), RecordingUI(), SamplingParams(temperature=temp), max_tokens=max_tokens, system=system, thinking=thinking, draft_mode=draft)

    return make


# -- pure pieces -------------------------------------------------------------------

def test_phase_tracker_follows_split_tags():
    t = PhaseTracker("answer")
    assert t.feed("Sure. <thi") == "answer"
    assert t.feed("nk>let me see </") == "think"
    assert t.feed("think>The answer") == "answer"
    assert t.seen_think
    t2 = PhaseTracker("think")
    assert t2.feed("a</think>b<think>c</think>d<think>") == "think"
    assert initial_phase("<|im_start|>assistant\n<think>\n") == "think"
    assert initial_phase("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "answer"
    assert initial_phase("<|im_start|>assistant\n") == "answer"


def test_phase_gate_turns_a_losing_phase_off_and_probes_back_on():
    gate = PhaseGate(min_cycles=12, probe_after=64)
    plain = 0.01  # seconds per plain token: 100 tok/s
    notes = [gate.observe("think", 1, 0.02, plain) for _ in range(12)]  # 50 tok/s while drafting
    assert notes[:-1] == [None] * 11 and "drafting off in the think phase: 0.50× plain" == notes[-1]
    assert not gate.wants("think") and gate.wants("answer")  # phases are independent
    for _ in range(63):
        assert gate.observe("think", 1, plain, plain) is None
    assert not gate.wants("think")
    gate.observe("think", 1, plain, plain)  # the 64th plain token starts a probe
    assert gate.wants("think")
    notes = [gate.observe("think", 3, 0.015, plain) for _ in range(12)]  # 200 tok/s: pays
    assert notes[-1] == "drafting back on in the think phase: 2.00× plain" and gate.wants("think")
    # a failed probe turns it off again without a notice
    for _ in range(12):
        gate.observe("answer", 1, 0.05, plain)
    for _ in range(64):
        gate.observe("answer", 1, plain, plain)
    assert [gate.observe("answer", 1, 0.0098, plain) for _ in range(12)][-1] is None  # 1.02×: not enough to turn back on
    assert not gate.wants("answer")
    # no plain-cost measurement yet: no judgement
    fresh = PhaseGate(min_cycles=2)
    assert [fresh.observe("answer", 1, 1.0, None) for _ in range(5)] == [None] * 5 and fresh.wants("answer")


def test_diff_stats_is_the_cycle_in_between():
    a = Stats()
    a.record_cycle(4, 2, 3)
    before = Stats(**{k: (list(v) if isinstance(v, list) else v) for k, v in a.__dict__.items()})
    a.record_cycle(4, 4, 5)
    a.t_target, a.t_draft = 0.5, 0.25
    d = diff_stats(a, before, 0.8)
    assert (d.cycles, d.drafted, d.accepted, d.committed) == (1, 4, 4, 5)
    assert d.accept_hist == [0, 0, 0, 0, 1] and d.pos_tries == [1, 1, 1, 1] and d.pos_hits == [1, 1, 1, 1]
    assert (d.t_target, d.t_draft, d.t_decode) == (0.5, 0.25, 0.8)


# -- in-process sessions -------------------------------------------------------------

@pytest.mark.parametrize("kind", ["ngram", "draft", "dflash"])
def test_ctrl_c_keeps_what_was_streamed_and_the_cache_matches(sessions, tiny_target, tiny_drafters, tiny_dflash, kind):
    drafter = {"ngram": None, "draft": tiny_drafters["near"], "dflash": tiny_dflash}[kind]
    s = sessions(tiny_target, drafter, spec=kind, max_tokens=200, draft="on")
    s.ui.sigint_after = [6]
    r1 = s.turn("Tell me a long story about a lighthouse.")
    assert r1.interrupted and 0 < r1.stats.generated < 200
    assert "reply interrupted: kept the" in s.ui.notices
    eng = s.llm.engine
    # the cache holds the prompt and every streamed token but the last (which the next prompt re-decodes)
    assert eng.tokens[r1.prompt_tokens :] == r1.tokens[:-1]
    assert eng.ctx.pos_max() == len(eng.tokens) - 1  # no rejected draft rows left behind
    if kind == "dflash":
        assert eng.drafter.n_injected == len(eng.tokens)
    assert s.conv.messages[-1]["content"] == r1.text == eng.target.detokenize(r1.tokens)
    assert s.conv.messages[-1]["meta"]["interrupted"] is True
    s.ui.sigint_after = []
    r2 = s.turn("And then?")
    assert not r2.interrupted and r2.stats.generated == 200
    # a fresh session given the same history (the cache rebuilt from scratch) writes the same reply:
    # the cache the interrupted session reused was consistent
    fresh = sessions(max_tokens=200, draft="on", engine=s.llm.engine)
    fresh.conv.messages = [{"role": m["role"], "content": m["content"]} for m in s.conv.messages[:2]]
    assert fresh.turn("And then?").text == r2.text


def test_second_ctrl_c_stops_at_once_and_clears_the_cache(sessions, tiny_target, tiny_drafters):
    s = sessions(tiny_target, tiny_drafters["near"], spec="draft", max_tokens=200, draft="on")
    s.ui.sigint_after = [4, 4]  # two Ctrl-C in a row
    r1 = s.turn("Count to a hundred.")
    assert r1.interrupted and "the cache was cleared" in s.ui.notices
    assert s.llm.engine.tokens == [] and s.llm.engine.ctx.pos_max() == -1
    s.ui.sigint_after = []
    r2 = s.turn("Again please.")
    fresh = sessions(max_tokens=200, draft="on", engine=s.llm.engine)
    fresh.conv.messages = [{"role": m["role"], "content": m["content"]} for m in s.conv.messages[:2]]
    assert fresh.turn("Again please.").text == r2.text


def test_history_overflow_drops_oldest_turns_never_the_system_prompt(sessions, tiny_target, tmp_path):
    s = sessions(tiny_target, spec="ngram", ctx=256, max_tokens=16, system="You are a terse assistant.")
    words = "the quick brown fox jumps over the lazy dog and keeps running far away "
    for i in range(6):
        s.turn(f"Turn {i}: " + words * 2)
    assert "context full: dropped the oldest turn" in s.ui.notices and "the system prompt stays" in s.ui.notices
    assert s.conv.first > 0 and s.conv.dropped >= 1 and s.conv.first == 2 * s.conv.dropped  # whole turns, oldest first
    # only as many as needed: with one more old turn the last prompt would not have fitted
    from localflash.prompt import render_chat, tokenize_prompt

    system = [{"role": "system", "content": "You are a terse assistant."}]
    kept = [{"role": m["role"], "content": m["content"]} for m in s.conv.messages[s.conv.first - 2 : -1]]
    longer = tokenize_prompt(s.llm.target, render_chat(s.llm.target, system + kept))
    assert len(longer) + s.conv.reserve() > 256
    tokens, text = s.conv.build_prompt("one more")
    assert text.startswith("<|im_start|>system\nYou are a terse assistant.<|im_end|>")
    assert "Turn 0" not in text and "Turn 5" in text
    assert len(tokens) + s.conv.reserve() <= 256
    s.command(f"/save {tmp_path / 't.json'}")
    saved = json.loads((tmp_path / "t.json").read_text())
    msgs = saved["messages"]
    assert msgs[0] == {"role": "system", "content": "You are a terse assistant.", "in_context": True}
    assert msgs[1]["content"].startswith("Turn 0") and msgs[1]["in_context"] is False
    assert msgs[-1]["role"] == "assistant" and msgs[-1]["in_context"] is True
    assert saved["dropped_turns"] == s.conv.dropped and len(msgs) == 1 + 12
    # a single message bigger than the context: one error line, the session goes on
    n_before = len(s.conv.messages)
    assert s.turn(words * 40) is None
    assert "error: this message needs" in s.ui.notices and len(s.conv.messages) == n_before
    assert s.turn("short again") is not None


def test_thinking_phases_have_their_own_stats_and_policy(sessions, tiny_thinking, tiny_drafters):
    s = sessions(tiny_thinking, tiny_drafters["near"], spec="draft", max_tokens=24, draft="on")
    assert s.conv.can_think
    s.command("/think on")
    r1 = s.turn("Why is the sky blue?")
    assert set(r1.phases) == {"think"} and r1.phases["think"].cycles > 0
    s.command("/think off")
    r2 = s.turn("Answer now.")
    assert set(r2.phases) == {"answer"}
    assert set(s.phase_total) == {"think", "answer"}
    assert s.phase_total["think"].generated + s.phase_total["answer"].generated == s.total.generated - 2  # first tokens come from prefill
    think, answer = s.conv.session.policies["think"], s.conv.session.policies["answer"]
    assert think is not answer and think.verify is answer.verify  # own acceptance, shared costs
    s.command("/stats")
    assert re.search(r"^\s+think\s+\d+\s", s.ui.shown, re.M) and re.search(r"^\s+answer\s+\d+\s", s.ui.shown, re.M)
    assert "thinking on" in s.ui.notices and "thinking off" in s.ui.notices


def test_draft_auto_starts_from_the_bench_verdict(engine_pool, tiny_target, tiny_drafters):
    engine = engine_pool(tiny_target, tiny_drafters["near"], "draft", 4096)
    from localflash.speculative.adapt import DraftPolicy

    p = engine.policy
    engine.policy = DraftPolicy(p.max_draft, p.adaptive, p.draft_cost_grows)  # leave the pooled one untouched
    verdict = {"speedup": 0.6, "position_acceptance": [0.9, 0.5, 0.25]}
    s = ChatSession(LLM(engine), RecordingUI(), SamplingParams(), max_tokens=8, draft_mode="auto", verdict=verdict)
    assert not s.conv.gate.start_on and not engine.drafting  # the bench said drafting loses here
    assert engine.policy.accept_rate(0) > engine.policy.accept_rate(1) > engine.policy.accept_rate(2)
    s.header()
    assert "bench verdict on this rig: draft 0.60× plain → drafting starts off" in s.ui.notices
    ok = ChatSession(LLM(engine), RecordingUI(), SamplingParams(), max_tokens=8, draft_mode="auto", verdict={"speedup": 1.4})
    assert ok.conv.gate.start_on and engine.drafting


# -- the real command: non-tty stdin --------------------------------------------------

def test_chat_over_piped_stdin_runs_every_command(lf, tiny_target, tiny_drafters, tmp_path):
    transcript = tmp_path / "chat.json"
    lines = [
        "Hello there, who are you?",
        "/temp 0",
        "What is two plus two?",
        "/draft off",
        "/draft on",
        "/draft sideways",
        "/draft auto",
        "/draft",
        "/system Answer in one word.",
        "/system",
        "/think on",
        "/stats",
        "/reset",
        "What is two plus two?",
        "//slash at the start",
        f"/save {transcript}",
        "/temp -1",
        "/temp abc",
        "/bogus",
        "/help",
        "/quit",
        "This line comes after /quit and is never read",
    ]
    # drafting on and a fixed length before the commands: /stats then has drafts to show whatever the step costs
    # (auto and the adaptive length decide on timings, which a loaded machine can make say "off")
    r = lf("chat", "-m", tiny_target, "--drafter", tiny_drafters["near"], "-n", "16", "-t", "1", "--seed", "3",
           "--draft", "on", "--fixed", input="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    err, out = r.stderr, r.stdout
    for notice in [
        "temperature 0 (greedy)", "drafting off", "drafting on", "/draft takes on, off or auto", "drafting auto",
        "system prompt set (19 characters)", "this model's chat template has no thinking switch",
        "conversation cleared", "saved 4 messages to", "/temp must be >= 0", "/temp needs a number", "unknown command /bogus",
    ]:
        assert notice in err, notice
    assert len(re.findall(r"^16 tok · [\d.]+ tok/s", err, re.M)) == 4  # four replies, each 16 tokens, none after /quit
    assert "drafting: draft auto" in out and "system prompt: 'Answer in one word.'" in out
    assert "acceptance per draft position" in out and "drafts accepted per cycle" in out and "session" in out
    assert "/draft on|off|auto" in out  # /help
    saved = json.loads(transcript.read_text())
    assert saved["format"] == "localflash-chat-transcript" and saved["target"] == str(tiny_target)
    assert saved["settings"]["temperature"] == 0.0 and saved["settings"]["draft"] == "auto" and saved["settings"]["max_tokens"] == 16
    roles = [(m["role"], m["content"]) for m in saved["messages"]]
    assert roles[0] == ("system", "Answer in one word.")
    assert [r for r, _ in roles] == ["system", "user", "assistant", "user", "assistant"]  # /reset forgot the first turns
    assert roles[1][1] == "What is two plus two?" and roles[3][1] == "/slash at the start"
    for m in saved["messages"][2::2]:
        st = m["stats"]
        assert st["tokens"] == 16 and st["stop"] == "length" and st["temperature"] == 0.0
        assert st["accepted"] <= st["drafted"] and m["content"]
    assert saved["stats"]["session"]["tokens"] == 64


def test_chat_greedy_replies_repeat_across_runs(lf, tiny_target):
    """Two runs, same input: same greedy replies, on stdout only (notices stay on stderr)."""
    feed = "Name three colours.\nAnd three animals.\n"
    a = lf("chat", "-m", tiny_target, "--spec", "ngram", "--temp", "0", "-n", "12", "-t", "1", input=feed)
    b = lf("chat", "-m", tiny_target, "--spec", "none", "--temp", "0", "-n", "12", "-t", "1", input=feed)
    assert a.returncode == 0 and b.returncode == 0
    assert a.stdout == b.stdout and a.stdout.count("\n") >= 2
    assert "localflash chat" not in a.stdout and "localflash chat" in a.stderr


# -- the real command: a pseudo-terminal ------------------------------------------------

class Pty:
    def __init__(self, argv, env):
        import fcntl
        import pty
        import struct
        import termios

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            os.execve(argv[0], argv, env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.raw = b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", errors="replace"))

    def expect(self, pattern: str, timeout: float = 60, start: int = 0) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if re.search(pattern, self.text[start:]):
                return True
            r, _, _ = select.select([self.fd], [], [], 0.05)
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                self.raw += chunk
        return bool(re.search(pattern, self.text[start:]))

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def finish(self, timeout: float = 30) -> int:
        """Drain the output until the child exits; its exit code."""
        end = time.time() + timeout
        open_ = True
        while time.time() < end:
            r, _, _ = select.select([self.fd], [], [], 0.05) if open_ else ([], [], [])
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the child closed its side
                    chunk = b""
                if chunk:
                    self.raw += chunk
                else:
                    open_ = False
            elif not open_:
                time.sleep(0.05)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        raise TimeoutError("chat did not exit:\n" + self.text[-2000:])


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_chat_in_a_terminal_live_status_ctrl_c_and_ctrl_d(lf_env, tiny_target, tmp_path):
    transcript = tmp_path / "pty.json"
    argv = [sys.executable, "-m", "localflash.cli", "chat", "-m", str(tiny_target), "--spec", "ngram",
            "--temp", "0", "-c", "4096", "-n", "4000", "-t", "1"]
    env = {**lf_env, "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    p = Pty(argv, env)
    try:
        assert p.expect(r"you› "), p.text
        p.send(b"Tell me a very long story.\r")
        # the live status line under the streaming text
        assert p.expect(r"tok/s · avg [\d.]+ · τ [\d.]+ · accept \d+% \(\d+/\d+\) · ctx \d+/4096 \(\d+%\) · ngram"), p.text
        p.send(b"\x03")  # Ctrl-C mid-reply
        assert p.expect(r"reply interrupted: kept the \d+ tokens shown"), p.text
        mark = p.text.rfind("reply interrupted")
        assert p.expect(r"you› ", start=mark), p.text
        p.send(b"Go on.\r")  # the next turn streams again
        assert p.expect(r"tok/s · avg", start=mark), p.text
        p.send(b"\x03")
        assert p.expect(r"reply interrupted", start=mark), p.text
        mark = p.text.rfind("reply interrupted")
        assert p.expect(r"you› ", start=mark), p.text
        p.send(f"/save {transcript}\r".encode())
        assert p.expect(r"saved 4 messages", start=mark), p.text
        # Ctrl-D at the prompt leaves cleanly. A ^D typed before readline has switched the
        # terminal to raw mode is eaten by the line discipline, so press it until it lands.
        code = None
        for _ in range(10):
            p.send(b"\x04")
            try:
                code = p.finish(timeout=1)
                break
            except TimeoutError:
                continue
        assert code == 0, p.text[-2000:]
    finally:
        try:
            os.kill(p.pid, signal.SIGKILL)
            os.waitpid(p.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    assert "Traceback" not in p.text
    final = re.findall(r"(\d+) tok · [\d.]+ tok/s \(session", p.text)
    assert len(final) == 2 and all(0 < int(n) < 4000 for n in final)
    saved = json.loads(transcript.read_text())
    replies = [m for m in saved["messages"] if m["role"] == "assistant"]
    assert len(replies) == 2 and all(m["stats"]["interrupted"] and m["content"] for m in replies)
    assert [int(n) for n in final] == [m["stats"]["tokens"] for m in replies]
