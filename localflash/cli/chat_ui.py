"""The terminal side of ``localflash chat``: Ctrl-C handling, plain and live (Rich) output."""

from __future__ import annotations

import signal
import sys
import threading

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text


# -- Ctrl-C ----------------------------------------------------------------------

class StopFlag:
    """While active, the first SIGINT only sets ``hit``; a second one raises KeyboardInterrupt."""

    def __init__(self):
        self.hit = False
        self._prev = None

    def is_set(self) -> bool:  # the session's cancel check between cycles
        return self.hit

    def _on_sigint(self, signum, frame):
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __enter__(self):
        self.hit = False
        if threading.current_thread() is threading.main_thread():
            self._prev = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc):
        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)
            self._prev = None
        return False


# -- output -------------------------------------------------------------------------

class PlainUI:
    """Non-terminal I/O: one input line per message, replies on stdout, the rest on stderr."""

    live = False

    def __init__(self, stdin=None, stdout=None, stderr=None):
        self.stdin = stdin or sys.stdin
        self.out = stdout or sys.stdout
        self.err = Console(file=stderr or sys.stderr, highlight=False, soft_wrap=True)
        self.info_console = Console(file=self.out, highlight=False)

    def read(self, continuation: bool = False) -> str | None:
        if self.stdin.isatty():  # --plain on a terminal: still say that input is wanted
            self.err.file.write("   … " if continuation else "you› ")
            self.err.file.flush()
        line = self.stdin.readline()
        return None if line == "" else line.rstrip("\n")

    def notice(self, text: str, style: str = "yellow") -> None:
        self.err.print(Text(text, style=style))

    def info(self, renderable) -> None:
        self.info_console.print(renderable)

    def start_reply(self) -> None:
        pass

    def push(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def status(self, line: Text) -> None:
        pass

    def end_reply(self, final: Text) -> None:
        self.out.write("\n")
        self.out.flush()
        self.err.print(final)


class LiveUI:
    """Terminal I/O: a Rich Live region holds the reply's unfinished line and the status line.

    Finished lines are printed above the region as they complete, so the
    region stays small however long the reply gets.
    """

    live = True

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self._live: Live | None = None
        self._line = ""
        self._status = Text("")
        try:  # line editing and history for input()
            import readline  # noqa: F401
        except ImportError:  # pragma: no cover - Windows
            pass

    def read(self, continuation: bool = False) -> str | None:
        prompt = Text("   … " if continuation else "you› ", style="bold cyan")
        while True:
            try:
                return self.console.input(prompt)
            except EOFError:
                self.console.print()
                return None
            except KeyboardInterrupt:
                self.console.print()
                self.notice("(Ctrl-D or /quit leaves; Ctrl-C stops a reply)", "dim")

    def notice(self, text: str, style: str = "yellow") -> None:
        (self._live.console if self._live else self.console).print(Text(text, style=style))

    def info(self, renderable) -> None:
        self.console.print(renderable)

    def _region(self):
        return Group(Text(self._line), self._status)

    def start_reply(self) -> None:
        self._line = ""
        self._status = Text("…", style="dim")
        self._live = Live(self._region(), console=self.console, refresh_per_second=8, transient=True)
        self._live.start()

    def push(self, text: str) -> None:
        buf = self._line + text
        lines = buf.split("\n")
        for done in lines[:-1]:
            self._live.console.print(Text(done), soft_wrap=True)
        rest = lines[-1]
        limit = max(40, self.console.width * max(4, self.console.height - 4))
        if len(rest) > limit:  # a very long line without breaks: print the wrapped part above
            cut = rest.rfind(" ", 0, limit)
            cut = cut if cut > 0 else limit
            self._live.console.print(Text(rest[:cut]), soft_wrap=True)
            rest = rest[cut:].lstrip(" ")
        self._line = rest
        self._live.update(self._region())

    def status(self, line: Text) -> None:
        self._status = line
        if self._live:
            self._live.update(self._region())

    def end_reply(self, final: Text) -> None:
        if self._live:
            self._live.stop()
            self._live = None
        if self._line:
            self.console.print(Text(self._line), soft_wrap=True)
        self._line = ""
        self.console.print(final)
