#!/usr/bin/env bash
# Put cuBLAS (headers + libcublas/libcublasLt) where scripts/cmake_flags.sh looks for it when the
# CUDA toolkit has none (a toolkit assembled from NVIDIA's pip wheels ships nvcc and cudart only).
# It downloads NVIDIA's cuBLAS wheel for the toolkit's CUDA version (`pip download --no-deps`:
# nothing is installed, no package code runs) and unzips its include/ and lib/ into
# $CACHE/cuda/cublas-<major>. Does nothing when the toolkit or an installed wheel has cuBLAS.
#   CUDA 13.x: nvidia-cublas==13.x.*   CUDA 12.x: nvidia-cublas-cu12==12.x.*   (~420 MB wheel)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
dir=$(CUDA=1 bash "$ROOT/scripts/cmake_flags.sh" --cublas-dir)
say() { echo "[get_cublas $(date +%H:%M:%S)] $*" >&2; }
if [[ -z $dir ]]; then say "the CUDA toolkit has cuBLAS: nothing to do"; exit 0; fi
major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1/p' | head -1)
minor=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\2/p' | head -1)
if [[ -f $dir/include/cublas_v2.h && -f $dir/lib/libcublas.so.$major && -f $dir/lib/libcublasLt.so.$major ]]; then
  say "cuBLAS present in $dir"; exit 0
fi
case $major in
  12) req="nvidia-cublas-cu12==12.$minor.*"; sub=nvidia/cublas ;;
  *) req="nvidia-cublas==$major.$minor.*"; sub=nvidia/cu$major ;;
esac
PY=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PY ]] || PY=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say "pip download --no-deps $req"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$req"
whl=$(ls "$tmp"/*.whl)
mkdir -p "$dir"
"$PY" - "$whl" "$sub" "$dir" <<'PY'
import shutil, sys, zipfile
from pathlib import Path
whl, sub, out = sys.argv[1], sys.argv[2].rstrip("/") + "/", Path(sys.argv[3])
with zipfile.ZipFile(whl) as z:
    for m in z.namelist():
        if m.startswith(sub) and not m.endswith("/") and m[len(sub):].split("/")[0] in ("include", "lib"):
            dst = out / m[len(sub):]
            dst.parent.mkdir(parents=True, exist_ok=True)
            with z.open(m) as src, dst.open("wb") as f:
                shutil.copyfileobj(src, f, 8 << 20)
PY
say "cuBLAS from $(basename "$whl") in $dir:"
ls -l "$dir"/lib >&2
