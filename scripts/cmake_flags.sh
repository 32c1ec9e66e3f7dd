#!/usr/bin/env bash
# Print the CMAKE_ARGS for building llama-cpp-python here.
# GGML_NATIVE=ON (the default) enables AMX on CPUs that have it, and the first
# decode of a quantized model then segfaults in ggml_backend_amx_mul_mat; so we
# turn native off and name the ISA extensions this CPU really has.
# CUDA=1 adds the CUDA backend for CUDA_ARCH (86: RTX 3090, 89: 4090, 120: 5090, 90: H100/H200).
# RPC=1 (the default; RPC=0 leaves it out) adds llama.cpp's RPC backend (libggml-rpc: the client that
# puts layers on other machines' rpc-server, and the server, started by `localflash rpc-server`).
#
# CUDA and cuBLAS: ggml-cuda links cuBLAS (CUDA::cublas, CUDA::cublasLt) and, for its VMM memory
# pool, the driver library (CUDA::cuda_driver). A full toolkit has both. A toolkit assembled from
# NVIDIA's pip wheels (nvidia-cuda-nvcc, nvidia-cuda-runtime, ...) may have neither; then:
#   cuBLAS: taken from an installed `nvidia-cublas` wheel (site-packages/nvidia/cu13 or, for
#           CUDA 12, nvidia/cublas), from $CUBLAS_DIR, or else from $CACHE/cuda/cublas-<major>,
#           which scripts/get_cublas.sh fills (the Makefile runs it before a CUDA build);
#   driver: libcuda.so(.1) from the toolkit's stubs, ldconfig or /usr/local/nvidia; with none
#           (a build machine without a GPU) the VMM pool is compiled out (-DGGML_CUDA_NO_VMM=ON:
#           ggml-cuda then reaches the driver only through cudart at run time).
# `bash scripts/cmake_flags.sh --cublas-dir` prints only the cuBLAS folder the flags use ("" if
# the toolkit has its own).
set -euo pipefail
flags="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
cpu=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $cpu " == *" $1 "* ]]; }
if has avx512f; then
  flags+=" -DGGML_AVX512=ON"
  has avx512_vnni && flags+=" -DGGML_AVX512_VNNI=ON"
  has avx512vbmi && flags+=" -DGGML_AVX512_VBMI=ON"
  has avx512_bf16 && flags+=" -DGGML_AVX512_BF16=ON"
fi
has avx_vnni && flags+=" -DGGML_AVX_VNNI=ON"
[[ "${RPC:-1}" == "1" ]] && flags+=" -DGGML_RPC=ON"

cublas_dir=""
if [[ "${CUDA:-0}" == "1" ]]; then
  flags+=" -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-86}"
  # the toolkit nvcc belongs to (TOP= in its dry run), its major version
  top=$(echo 'int main(){}' >/tmp/.lf_nvcc_probe.cu && nvcc -v --dryrun -c /tmp/.lf_nvcc_probe.cu -o /dev/null 2>&1 |
        sed -n 's/^#\$ TOP=//p' | head -1 || true)
  top=${top:+$(cd "$top" 2>/dev/null && pwd -P)}
  major=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1)
  major=${major:-13}
  tk_has_cublas=0
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$top" /usr/local/cuda /usr; do
    [[ -n $d ]] || continue
    if [[ -f $d/include/cublas_v2.h || -f $d/targets/x86_64-linux/include/cublas_v2.h ]]; then tk_has_cublas=1; break; fi
  done
  if (( ! tk_has_cublas )); then
    if [[ -n ${CUBLAS_DIR:-} ]]; then
      cublas_dir=$CUBLAS_DIR
    else
      for py in ${PYTHON:-} python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        for sp in $("$py" -c 'import site, sys; print(*site.getsitepackages(), site.getusersitepackages(), *sys.path)' 2>/dev/null); do
          for c in "$sp/nvidia/cu$major" "$sp/nvidia/cublas"; do
            if [[ -z $cublas_dir && -f $c/include/cublas_v2.h ]] && ls "$c"/lib/libcublas.so* >/dev/null 2>&1; then cublas_dir=$c; fi
          done
        done
        [[ -n $cublas_dir ]] && break
      done
      cache=${LOCALFLASH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localflash}
      cublas_dir=${cublas_dir:-$cache/cuda/cublas-$major}
    fi
    lib=$cublas_dir/lib
    flags+=" -DCUDA_cublas_LIBRARY=$lib/libcublas.so.$major -DCUDA_cublasLt_LIBRARY=$lib/libcublasLt.so.$major"
    flags+=" -DCMAKE_CUDA_FLAGS=-I$cublas_dir/include -DCMAKE_CXX_FLAGS=-I$cublas_dir/include"
  fi
  driver=""
  for c in "$top"/lib64/stubs/libcuda.so "$top"/lib/stubs/libcuda.so "$top"/targets/x86_64-linux/lib/stubs/libcuda.so \
           /usr/lib/x86_64-linux-gnu/libcuda.so /usr/lib64/libcuda.so /usr/local/nvidia/lib64/libcuda.so /usr/local/nvidia/lib/libcuda.so; do
    [[ -f $c ]] && { driver=found; break; }
  done
  if [[ -z $driver ]]; then  # only the versioned name (a driver install without the -dev symlink): name it for CMake
    so1=$(ldconfig -p 2>/dev/null | sed -n 's/.*libcuda\.so\.1 (libc6,x86-64) => //p' | head -1)
    for c in "$so1" /usr/local/nvidia/lib64/libcuda.so.1 /usr/local/nvidia/lib/libcuda.so.1; do
      [[ -n $c && -f $c ]] && { driver=$c; break; }
    done
    if [[ -n $driver ]]; then flags+=" -DCUDA_cuda_driver_LIBRARY=$driver"; else flags+=" -DGGML_CUDA_NO_VMM=ON"; fi
  fi
fi
if [[ ${1:-} == --cublas-dir ]]; then echo "$cublas_dir"; exit 0; fi
echo "$flags"
