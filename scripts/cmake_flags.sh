#!/usr/bin/env bash
# Print the CMAKE_ARGS for building llama-cpp-python here.
# GGML_NATIVE=ON (the default) enables AMX on CPUs that have it, and the first
# decode of a quantized model then segfaults in ggml_backend_amx_mul_mat; so we
# turn native off and name the ISA extensions this CPU really has.
# CUDA=1 adds the CUDA backend for CUDA_ARCH (86: RTX 3090, 89: 4090, 120: 5090, 90: H100/H200).
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
if [[ "${CUDA:-0}" == "1" ]]; then
  flags+=" -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-86}"
fi
echo "$flags"
