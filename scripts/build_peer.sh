#!/usr/bin/env bash
# Build llama.cpp's own speculative driver and CLI -- the "C++ peer" that
# localflash is measured against -- from the llama.cpp vendored in the same
# llama-cpp-python 0.3.36 sdist that localflash runs on, with the same CPU
# flags (scripts/cmake_flags.sh). Output: peer/bin/ (ignored by git).
#
#   scripts/build_peer.sh                 # llama-speculative-simple, llama-bench, llama-cli
#   JOBS=4 scripts/build_peer.sh          # more parallel compile jobs (default 2)
#   TARGETS="llama-speculative-simple" scripts/build_peer.sh
#   CUDA=1 CUDA_ARCH=90 scripts/build_peer.sh   # a CUDA peer (same flags as `make install CUDA=1`)
#
# The sdist is fetched once with `pip download` into the cache dir
# (~/.cache/localflash/sdist); LLAMA_SDIST=/path/to/llama_cpp_python-0.3.36.tar.gz
# uses a copy you already have. Static binaries: peer/bin runs without the build tree.
# Idempotent: a rerun rebuilds only what changed. Takes ~10-20 min on 2 busy cores.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=0.3.36
CACHE=${LOCALFLASH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localflash}
PEER=${PEER_DIR:-$ROOT/peer}
JOBS=${JOBS:-2}
TARGETS=${TARGETS:-"llama-speculative-simple llama-bench llama-cli"}
PIP=${PIP:-"$ROOT/.venv/bin/python -m pip"}
[[ -x $ROOT/.venv/bin/python ]] || PIP="python3 -m pip"

say() { echo "[build_peer $(date +%H:%M:%S)] $*"; }

sdist=${LLAMA_SDIST:-$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz}
if [[ ! -f $sdist ]]; then
  say "downloading the llama-cpp-python $VERSION sdist into $CACHE/sdist"
  mkdir -p "$CACHE/sdist"
  $PIP download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/sdist"
  sdist=$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz
fi

src=$PEER/src/llama_cpp_python-$VERSION/vendor/llama.cpp
if [[ ! -f $src/CMakeLists.txt ]]; then
  say "unpacking $(basename "$sdist") into $PEER/src"
  mkdir -p "$PEER/src"
  tar -xzf "$sdist" -C "$PEER/src"
fi

# Same ISA flags as the Python package (GGML_NATIVE=OFF: native enables AMX, which crashes here).
flags=$(CUDA=${CUDA:-0} CUDA_ARCH=${CUDA_ARCH:-86} bash "$ROOT/scripts/cmake_flags.sh")
flags=${flags//-DLLAVA_BUILD=OFF/}  # a llama-cpp-python option, unknown to llama.cpp itself
say "cmake flags: $flags"
# shellcheck disable=SC2086
cmake -S "$src" -B "$PEER/build" -DCMAKE_BUILD_TYPE=Release $flags \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  >"$PEER/cmake-configure.log" 2>&1 || { tail -30 "$PEER/cmake-configure.log"; exit 1; }

mkdir -p "$PEER/bin"
for t in $TARGETS; do
  say "building $t with -j$JOBS"
  start=$SECONDS
  if cmake --build "$PEER/build" --config Release --target "$t" -j "$JOBS" >"$PEER/build-$t.log" 2>&1; then
    cp -f "$PEER/build/bin/$t" "$PEER/bin/$t"
    say "built $t in $((SECONDS - start)) s -> $PEER/bin/$t"
  else
    tail -30 "$PEER/build-$t.log"
    say "FAILED: $t (full log: $PEER/build-$t.log)"
    [[ $t == llama-speculative-simple ]] && exit 1
  fi
done

# Record exactly what was built, for docs/benchmarks.md.
{
  echo "llama-cpp-python sdist: $(basename "$sdist") sha256 $(sha256sum "$sdist" | cut -d' ' -f1)"
  echo "llama.cpp: vendor/llama.cpp of that sdist (no git metadata in the sdist)"
  echo "cmake flags: $flags -DBUILD_SHARED_LIBS=OFF"
  echo "compiler: $(c++ --version | head -1)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$PEER/BUILD_INFO"
"$PEER/bin/llama-speculative-simple" --version 2>&1 | tail -2 >>"$PEER/BUILD_INFO" || true
say "done: $(ls "$PEER/bin" | tr '\n' ' ')"
