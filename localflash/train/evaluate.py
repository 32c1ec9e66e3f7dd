"""τ (tokens committed per target pass) of a drafter on prompts, with the real engine.

Loads through :func:`localflash.engine.open_engine`, renders prompts as
``localflash run`` does and decodes greedily, so the numbers are the ones a
user gets. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localflash.speculative.stats import Stats


@dataclass
class TauReport:
    kind: str  # dflash | ngram | ...
    label: str
    stats: Stats = field(default_factory=Stats)
    per_prompt: list[float] = field(default_factory=list)
    skipped: int = 0

    @property
    def tau(self) -> float:
        return self.stats.tau


def measure_tau(
    target: str | Path,
    prompts: list[str],
    drafter: str | Path | None = None,
    kind: str = "dflash",
    max_tokens: int = 128,
    draft_max: int | None = None,
    adaptive: bool = False,
    threads: int = 0,
    ctx: int = 4096,
    thinking: bool = False,
    label: str | None = None,
    on_prompt: Callable[[int, int], None] | None = None,
) -> TauReport:
    """Greedy generation over ``prompts``; the merged statistics and each prompt's τ."""
    from localflash.config import config_from
    from localflash.engine import open_engine
    from localflash.speculative.sampling import SamplingParams
    from localflash.train.data import chat_tokens

    cfg = config_from(None, str(target), str(drafter) if drafter else None, spec=kind, draft_max=draft_max,
                      ctx=ctx, threads=threads, adaptive=adaptive)
    engine = open_engine(cfg)
    report = TauReport(kind, label or kind)
    greedy = SamplingParams(temperature=0.0)
    try:
        for k, text in enumerate(prompts):
            tokens = chat_tokens(engine.target, text, thinking)
            if len(tokens) + max_tokens + 16 > ctx:
                report.skipped += 1
            else:
                st = Stats()
                for _ in engine.generate(tokens, max_tokens, greedy, st):
                    pass
                report.stats.merge(st)
                report.per_prompt.append(st.tau)
            if on_prompt:
                on_prompt(k + 1, len(prompts))
    finally:
        engine.close()
    return report
