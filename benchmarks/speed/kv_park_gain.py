#!/usr/bin/env python3
"""What parking idle slots' KV (speculative/kv_park.py) gives the running slot, in-process, parking off and on in turn.

A unified pool of 8,192 cells, 4 slots (``load(model=..., spec="none", parallel=4, ctx=8192, threads=2)``). Every
slot first holds a ~L-token conversation (raw prompts of made-up words, one token generated each). Then slot 0's
prompt is resent and decodes N tokens (its L-token history reused), 4 times with parking off and 4 with it on,
alternating (ABBA): off, the idle slots' conversations are first put back in the pool (each resent for one
token, parking off); on, they are parked at the request's first step. Prints slot 0's decode tok/s each time and
the medians. MODEL (env) names the target (default Qwen2.5-Coder 1.5B Q4_K_M from ~/.cache/localflash).

    .venv/bin/python benchmarks/speed/kv_park_gain.py 1500 32
"""
import os, sys, time
os.environ.setdefault("GOMP_SPINCOUNT", "3000")
from localflash import load
M = os.path.expanduser(os.environ.get("MODEL", "~/.cache/localflash/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
L = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
N = int(sys.argv[2]) if len(sys.argv) > 2 else 32
llm = load(model=M, spec="none", parallel=4, ctx=8192, threads=2)
park = llm.pool.park
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon".split()
def text(i):
    n = 0; out = []
    while True:
        out.append(f"{words[(n * 7 + i) % len(words)]}{n % 97}")
        n += 1
        if n % 50 == 0 and len(llm.target.tokenize(" ".join(out))) >= L:
            return " ".join(out)
prompts = [text(i) for i in range(4)]
def run(slot, max_tokens):
    last = None
    for ch in llm.generate(prompts[slot], slot=slot, max_tokens=max_tokens, stream=True):
        last = ch
    return last.stats
t = time.time()
for s in (1, 2, 3, 0):
    run(s, 1)  # caches of ~L tokens in every slot
print(f"prefill {time.time() - t:.1f} s; pool {llm.pool.kv.describe()}", flush=True)
res = {"off": [], "on": []}
for rep in range(4):
    for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
        if mode == "off":  # idle caches back in the pool: each idle slot's conversation resent (restored, 1 token)
            park.on = park.pending = False
            for s in (1, 2, 3):
                if park.parked(llm.pool.slots[s]):
                    run(s, 1)
        else:
            park.on = park.pending = True
        st = run(0, N)
        res[mode].append(st.decode_tps)
        d = llm.pool.kv.describe()
        print(f"{mode}: {st.decode_tps:.2f} tok/s decode ({st.generated} tok, cached {st.cached_tokens}); parked {d.get('parked')} in_use {d['in_use']}", flush=True)
for k, v in res.items():
    v = sorted(v)
    print(f"parking {k}: median {v[len(v)//2]:.2f} tok/s {v}")
