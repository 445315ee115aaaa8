#!/usr/bin/env bash
# Builds hetgnn with CUDA (`--features cuda`) without a system CUDA toolkit:
# nvcc, the CUDA headers and the libraries candle links against come from
# PyPI's CUDA 13.0 wheels (drivers 580 and newer) in a virtual environment.
# The driver library (libcuda.so.1) is linked against a stub made from
# cuda.h; the real one comes from the driver where the binary runs.
#
#   scripts/build-cuda.sh [cargo build arguments]     # e.g. -p models --tests
#
# Environment: HETGNN_CUDA_VENV (default ~/.cache/hetgnn/cuda-venv),
# CUDA_COMPUTE_CAP (default 90: H100/H200; 80 for A100, 89 for L4/RTX 40xx).
set -euo pipefail

venv="${HETGNN_CUDA_VENV:-$HOME/.cache/hetgnn/cuda-venv}"
cap="${CUDA_COMPUTE_CAP:-90}"
if [ ! -x "$venv/bin/python" ]; then
    echo "creating $venv" >&2
    python3 -m venv "$venv"
fi
# One release throughout: nvcc 13.0 with a newer NVVM emits PTX its ptxas refuses.
"$venv/bin/python" -m pip install -q \
    "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-crt==13.0.88" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-nvrtc==13.0.*" \
    "nvidia-cublas==13.0.*" "nvidia-curand==10.4.0.*"
cuda="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"

# Unversioned names for the linker, and the driver stub.
link="$venv/link"
mkdir -p "$link"
for lib in cublas cublasLt curand nvrtc cudart; do
    so="$(ls "$cuda/lib/lib$lib.so."* 2>/dev/null | grep -v -e alt -e builtins | head -n 1 || true)"
    if [ -z "$so" ]; then
        echo "lib$lib.so.* is missing from $cuda/lib: the wheels' layout changed?" >&2
        exit 1
    fi
    ln -sf "$so" "$link/lib$lib.so"
done
# The driver stub, made afresh from the pinned headers each time: every entry
# point cuda.h declares, under its versioned name too (cuda.h #defines
# cuMemAlloc as cuMemAlloc_v2 and so on), each returning CUDA_ERROR_UNKNOWN,
# though only the real driver is ever loaded. The profiler entry points live
# in a header the wheels do not ship.
{
    { grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$cuda/include/cuda.h"
      gcc -E -I"$cuda/include" "$cuda/include/cuda.h" | grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\('
      printf '%s\n' 'cuProfilerInitialize(' 'cuProfilerStart(' 'cuProfilerStop('
    } | tr -d ' (\t' | sort -u | awk '{ print "int " $1 "(void) { return 999; }" }' > "$link/stub.c"
    gcc -shared -fPIC -o "$link/libcuda.so" -Wl,-soname,libcuda.so.1 "$link/stub.c"
}

export PATH="$cuda/bin:$PATH" CUDA_ROOT="$cuda" CUDA_PATH="$cuda" CUDA_HOME="$cuda"
export CUDA_COMPUTE_CAP="$cap" LIBRARY_PATH="$link${LIBRARY_PATH:+:$LIBRARY_PATH}"
cargo build --release --features cuda "$@"
echo "built for compute capability $cap; to run it where the libraries are not installed:" >&2
echo "  export LD_LIBRARY_PATH=$cuda/lib" >&2
