#!/usr/bin/env bash
# GPU device check for a machine with one NVIDIA GPU and no network (see benchmarks/device/device_check.py
# for what it measures). Builds llama-cpp-python 0.3.36 with CUDA for the GPU it finds, installs
# it into a private folder, generates random-weight GGUFs with real shapes (an 8B-class Q4_K_M target +
# DFlash drafter; the Qwen3.6-27B-shaped hybrid qwen35 Q4_K_M target with its MTP block, measured first with
# that block as drafter (stage 27b-mtp), then with a DFlash drafter (27b)) and writes $OUT/device_check.json,
# then the host cost per cycle at Qwen3.6 shapes (benchmarks/speed/bench_host.py, block 16, greedy/top-k 40/top-p
# 0.95, variants HOST_VARIANTS: $OUT/bench_host.json) in the last HOST_S (100) seconds. Whole run: 9 minutes
# (BUDGET_S=540) from start to JSON, the CUDA build included (a wheel built earlier on the same machine is
# reused); stages that do not fit are skipped and listed in the JSON.
#
#   benchmarks/device/device_check.sh --pack           # HERE (with network): gather what the GPU machine needs
#                                            # into out/device-carry/ (slim sdist ~6 MB + 3 wheels)
#   benchmarks/device/device_check.sh                  # THERE: build, generate, measure (carry out/device-carry)
#   benchmarks/device/device_check.sh --cpu-dry-run    # anywhere: every stage with tiny models on the CPU, no build
#
# Why a slim sdist: the device machine gets only the repo's working tree plus carried folders
# (64 MiB in all), and the 0.3.36 sdist is 77 MB, most of it vocab test files and docs that the
# build never reads. --pack drops those (a 38 MB .git pack, vocab GGUFs, docs, tests, the web UI,
# media, and the sources of GPU backends other than CUDA). Without a carried sdist the script uses, in order: $LLAMA_SDIST (a path),
# the cache dir's sdist (~/.cache/localflash/sdist), or `pip download` when an index is reachable.
# A wheel already built for the same flags (in $WHEEL_DIR) is reused.
#
# Env: OUT (default out/device), BUDGET_S (540), HOST_S (100), CUDA_ARCH (default: from nvidia-smi), JOBS (nproc),
#      TARGETS ("8b,27b-mtp,27b", in that order: cheapest proof first), HOST_VARIANTS (bench_host.py --variants,
#      default "host,graph,graph+target"), PYTHON (python3). scripts/cmake_flags.sh finds cuBLAS in the toolkit or in an
#      installed nvidia-cublas wheel (the GPU image's python has one) and the driver under /usr/local/nvidia.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
VERSION=0.3.36
START=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
DEADLINE=$((START + BUDGET_S))
OUT=${OUT:-$ROOT/out/device}
CARRY=$ROOT/out/device-carry
CACHE=${LOCALFLASH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localflash}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
# bench_host.py's variants: host (every row read on the host), graph (DFlash drafts as ids from llama.cpp's graph),
# graph+target (the target's verify rows sampled in the graph too: what a GPU build does, only ids cross the bus);
# three, as before graph+target came (its bytes of logits to host per cycle, per path, are in bench_host.txt/json);
# bench_host's historical "before" variant is left to the CPU runs
HOST_VARIANTS=${HOST_VARIANTS:-host,graph,graph+target}
say() { echo "[device_check.sh $(date +%H:%M:%S) +$(($(date +%s) - START))s] $*" >&2; }

if [[ ${1:-} == --pack ]]; then
  PIP=("$ROOT/.venv/bin/python" -m pip)
  [[ -x $ROOT/.venv/bin/python ]] || PIP=(python3 -m pip)
  mkdir -p "$CARRY" "$CACHE/sdist"
  sdist=$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz
  [[ -f $sdist ]] || "${PIP[@]}" download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/sdist"
  tmp=$(mktemp -d)
  tar -xzf "$sdist" -C "$tmp"
  d=$tmp/llama_cpp_python-$VERSION
  rm -rf "$d"/.git "$d"/vendor/llama.cpp/{models,docs,media,benches,tests,tools/ui} "$d"/{docs,examples,tests,docker}
  find "$d"/vendor/llama.cpp/tools/mtmd -type f \( -name '*.mp4' -o -name '*.webp' -o -name '*.jpg' -o -name '*.png' -o -name '*.mp3' \) -delete
  for b in vulkan opencl sycl hexagon metal et cann musa webgpu zdnn openvino virtgpu; do  # backends this build never enables
    rm -rf "$d/vendor/llama.cpp/ggml/src/ggml-$b"
  done
  tar -czf "$CARRY/llama_cpp_python-$VERSION-slim.tar.gz" -C "$tmp" "llama_cpp_python-$VERSION"
  rm -rf "$tmp"
  # pure-Python packages the GPU image lacks (it has numpy, pyyaml, tqdm, requests, jinja2, typer, rich);
  # nvidia-ml-py (pynvml) lets the planner see the card and the MTP stage read this process's device memory
  "${PIP[@]}" download --no-deps --only-binary=:all: -d "$CARRY" gguf==0.19.0 diskcache==5.6.3 "nvidia-ml-py>=12"
  du -sh "$CARRY"/* >&2
  say "packed: run it there with carry [\"out/device-carry\"]"
  exit 0
fi

if [[ ${1:-} == --cpu-dry-run ]]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  rc=0
  "$PY" benchmarks/device/device_check.py --cpu-dry-run --out "$OUT/device_check_dry.json" --deadline "$DEADLINE" --targets "${TARGETS:-8b,27b-mtp,27b}" || rc=$?
  # bench_host.py runs at real shapes only (a 248,320 x 5,120 vocabulary is no dry run): check its command line here,
  # and that every variant the device run asks for is one it names
  help=$("$PY" benchmarks/speed/bench_host.py --help) || rc=1
  for v in ${HOST_VARIANTS//,/ }; do
    grep -qF -- "$v" <<<"$help" || { say "bench_host.py --help names no variant $v"; rc=1; }
  done
  exit $rc
fi

# 1. the GPU
if ! command -v nvidia-smi >/dev/null; then
  say "no nvidia-smi: this script needs an NVIDIA GPU (try --cpu-dry-run)"; exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt" >&2
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
ARCH=${CUDA_ARCH:-$cc}

# 2. llama-cpp-python with CUDA, private to this run
SITE=${SITE:-/tmp/lf-site}
mkdir -p "$SITE"
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
for whl in "$CARRY"/gguf-*.whl "$CARRY"/diskcache-*.whl "$CARRY"/nvidia_ml_py-*.whl; do
  if [[ -f $whl ]]; then "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$whl"; fi
done
flags=$(CUDA=1 CUDA_ARCH=$ARCH bash scripts/cmake_flags.sh)
key=$(echo "$flags" | sha1sum | cut -c1-12)
WHEEL_DIR=${WHEEL_DIR:-$CACHE/wheels/$key}
mkdir -p "$WHEEL_DIR"
if ! ls "$WHEEL_DIR"/llama_cpp_python-$VERSION-*.whl >/dev/null 2>&1; then
  src=${LLAMA_SDIST:-}
  for cand in "$CARRY/llama_cpp_python-$VERSION-slim.tar.gz" "$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz"; do
    [[ -z $src && -f $cand ]] && src=$cand
  done
  if [[ -z $src ]]; then
    say "no sdist carried or cached; trying pip download"
    "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/sdist" ||
      { say "no sdist: run benchmarks/device/device_check.sh --pack where an index is reachable and carry out/device-carry, or set LLAMA_SDIST"; exit 1; }
    src=$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz
  fi
  say "building llama-cpp-python $VERSION for sm_$ARCH from $(basename "$src") with: $flags"
  export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
  CMAKE_ARGS="$flags" "$PY" -m pip wheel --no-deps --no-build-isolation -w "$WHEEL_DIR" "$src" >"$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log" >&2; say "build failed (log: $OUT/build.log)"; exit 1; }
  say "built $(ls "$WHEEL_DIR")"
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$WHEEL_DIR"/llama_cpp_python-$VERSION-*.whl
"$PY" -c "import llama_cpp, gguf; print('llama_cpp', llama_cpp.__version__, 'gpu offload', bool(llama_cpp.llama_supports_gpu_offload()))" >&2

# 3. measure, within what is left of the budget
left=$((DEADLINE - $(date +%s)))
say "$left s left for the measurements"
(( left > 60 )) || { say "no time left after the build: rerun (the wheel is cached in $WHEEL_DIR)"; exit 1; }
# the host-cost benchmark (benchmarks/speed/bench_host.py, Qwen3.6 vocabulary and width, block 16) gets the last HOST_S seconds
HOST_S=${HOST_S:-100}
rc=0
PYTHONUNBUFFERED=1 "$PY" benchmarks/device/device_check.py --out "$OUT/device_check.json" --models-dir "${MODELS_DIR:-/tmp/lf-device-models}" \
  --deadline "$((DEADLINE - HOST_S))" --targets "${TARGETS:-8b,27b-mtp,27b}" || rc=$?
left=$((DEADLINE - $(date +%s) - 5))
if (( left > 30 )); then
  say "bench_host.py with $left s left"
  PYTHONUNBUFFERED=1 timeout "$left" "$PY" benchmarks/speed/bench_host.py --blocks 16 --sampling greedy,topk40,topp95 --tokens 64 --repeat 1 \
    --variants "$HOST_VARIANTS" \
    --work "${MODELS_DIR:-/tmp/lf-device-models}/bench_host" --json "$OUT/bench_host.json" >"$OUT/bench_host.txt" 2>&1 ||
    say "bench_host.py stopped (exit $?; output so far in $OUT/bench_host.txt)"
else
  say "no time left for bench_host.py"
fi
exit $rc
