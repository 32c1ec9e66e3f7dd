"""Post-install check: one generated token from a quantized model, in a child process.

A llama.cpp built with GGML_NATIVE=ON on an AMX CPU loads models fine and then
segfaults on the first decode; running the decode in a child turns that crash
into one clear message instead of a dead interpreter. Run: python -m localflash.testing.smoke
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys
from localflash.llama import Model, Context, ContextOptions
from localflash.llama.quantize import quantize
from localflash.testing.tiny import write_target
d = sys.argv[1]
q = quantize(write_target(d + "/tiny.gguf", n_layer=2, n_embd=64), d + "/tiny-q4_0.gguf", "Q4_0")
m = Model(q)
c = Context(m, ContextOptions(n_ctx=64))
toks = m.tokenize("Hello")
c.decode(toks, 0, "last")
print(int(c.logits(-1).argmax()))
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-c", CHILD, d], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        cause = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
        last = (r.stderr.strip().splitlines() or [""])[-1]
        print(f"smoke test FAILED ({cause}): {last}", file=sys.stderr)
        print("hint: rebuild llama-cpp-python with the flags of scripts/cmake_flags.sh (GGML_NATIVE=OFF)", file=sys.stderr)
        return 1
    print(f"smoke test ok: generated token {r.stdout.strip()} from a Q4_0 model ({Path(sys.executable).parent.parent})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
