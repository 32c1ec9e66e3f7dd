#!/usr/bin/env python3
"""How far two runs of the same work drift apart on this machine (the noise floor of bench ratios).

Plain decoding against the pair's speculative engine forced to draft nothing
(so it does the same target work), alternating, two prompts, each twice:

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/conformance/check_noise.py qwen-coder

Not a test: it prints tok/s per run.
"""

from __future__ import annotations

import sys

from localflash.bench import rig as bl  # noqa: E402
from localflash.bench.prompts import spec_bench_groups  # noqa: E402


def main() -> None:
    from localflash.config import config_from
    from localflash.engine import open_engine
    from localflash.speculative.sampling import SamplingParams
    from localflash.speculative.stats import Stats

    pair = sys.argv[1] if len(sys.argv) > 1 else "demo"
    plain = open_engine(config_from(pair, None, None, threads=1, spec="none"))
    idle = open_engine(config_from(pair, None, None, threads=1))
    idle.policy.choose = lambda limit: 0  # same engine, never drafts
    for p in spec_bench_groups(1)[:2]:
        for name, eng in (("plain", plain), ("no-draft", idle), ("plain", plain), ("no-draft", idle)):
            toks = bl.render(eng.target, p.text)[1]
            eng.reset()
            st = Stats()
            for _ in eng.generate(toks, 64, SamplingParams(temperature=0.0), st):
                pass
            print(f"{p.category:15s} {name:9s} {st.decode_tps:6.2f} tok/s", flush=True)


if __name__ == "__main__":
    main()
