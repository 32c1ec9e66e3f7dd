"""Plain vs speculative decoding with the target's blocks on two rpc-servers behind a slower link.

Two ``localflash rpc-server`` processes on 127.0.0.1 (CPU, one thread each) hold every block
of the demo pair's target (the output layer and the DFlash drafter stay here). Between this
process and each server sits :class:`localflash.testing.rpc.DelayProxy`, which holds every
chunk of bytes ``rtt/2`` in each direction: ``rtt`` is the round-trip time it adds. For each
added RTT the script decodes the same prompts plainly and with the drafter and prints one
Markdown row per mode: decode tok/s, τ, the bytes and client→server bursts per target pass the
proxies counted, and the load average (the machine is shared).

    .venv/bin/python benchmarks/speed/bench_rpc_link.py --rtt 0,0.2,1,5 --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
import time

PROMPTS = [
    "Write a short Python function that checks whether a number is prime.",
    "List the planets of the solar system in order from the sun.",
    "Explain in two sentences what a hash table is.",
    "Copy this list exactly, one item a line: apple, banana, cherry, date, elderberry, fig, grape, honeydew.",
]


def run(endpoints, pair: str, spec: str, max_tokens: int, proxies, fixed: int = 0) -> dict:
    from localflash.api import load

    extra = {"fixed": True, "draft_max": fixed} if fixed else {}
    with load(pair=pair, spec=spec, rpc=endpoints, threads=1, **extra) as llm:
        llm.generate("Hello", max_tokens=4)  # warm-up: graphs reserved, first-touch costs paid
        for p in proxies:
            p.reset_counts()
        t_dec = n_dec = passes = accepted = drafted = committed = cycles = 0
        for prompt in PROMPTS:
            c = llm.chat([{"role": "user", "content": prompt}], max_tokens=max_tokens)
            st = c.stats
            t_dec += st.t_decode
            n_dec += st.generated
            passes += st.cycles + 1  # + the prefill pass
            committed += st.committed
            cycles += st.cycles
            accepted += st.accepted
            drafted += st.drafted
        bytes_ = sum(p.bytes_up + p.bytes_down for p in proxies)
        bursts = sum(p.bursts for p in proxies)
        return {"tps": n_dec / t_dec if t_dec else 0.0, "tau": committed / cycles if cycles else 0.0,
                "accept": accepted / drafted if drafted else 0.0, "kib_per_pass": bytes_ / 1024 / passes,
                "bursts_per_pass": bursts / passes, "load": os.getloadavg()[0]}


def main() -> None:
    from localflash.testing.rpc import DelayProxy, RpcServer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt", default="0,0.2,1,5", help="added round-trip times in ms, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--modes", default="demo:none,demo:dflash,demo:ngram,demo-draft:draft",
                    help="PAIR:SPEC[:K], comma-separated (K: a fixed draft of K tokens, else adaptive); the first is the baseline (× plain)")
    a = ap.parse_args()
    servers = [RpcServer(threads=1, exact=False), RpcServer(threads=1, exact=False)]
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, servers {', '.join(s.endpoint for s in servers)}, "
          f"{a.max_tokens} tokens x {len(PROMPTS)} prompts, threads 1 everywhere")
    print("| added RTT | mode | decode tok/s | × plain | τ | accept | KiB / pass | bursts / pass | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for rtt in (float(x) for x in a.rtt.split(",")):
            proxies = [DelayProxy(s.endpoint, rtt / 2) for s in servers]
            eps = [p.endpoint for p in proxies]
            plain = None
            for mode in a.modes.split(","):
                pair, spec, *k = mode.split(":")
                fixed = int(k[0]) if k else 0
                r = run(eps, pair, spec, a.max_tokens, proxies, fixed)
                plain = plain or r["tps"]
                label = "plain" if spec == "none" else (f"{spec} ({pair})" if pair != "demo" else spec) + (f", fixed {fixed}" if fixed else "")
                print(f"| {rtt:g} ms | {label} | {r['tps']:.1f} | {r['tps'] / plain:.2f} | "
                      f"{r['tau']:.2f} | {r['accept']:.0%} | {r['kib_per_pass']:.0f} | {r['bursts_per_pass']:.1f} | {r['load']:.1f} |",
                      flush=True)
            for p in proxies:
                p.close()
    finally:
        for s in servers:
            s.kill()


if __name__ == "__main__":
    main()
