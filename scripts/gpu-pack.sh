#!/usr/bin/env bash
# Packs what a GPU machine needs to test hetgnn and take its GPU figures when
# the machine has the CUDA driver and libraries but no Rust: the CUDA builds
# of hetgnn, the train, cache, gather and sample benchmarks, the models' test
# binaries and, with CORES=1, the core-bound benchmarks of the `cores` step
# (bytegnn, full_graph, hopgnn), stripped and xz-compressed into gpu-pack/
# (ignored by git). A device call carries at most 64 MiB: without the `cores`
# binaries the pack is about 53 MB (each binary holds candle's kernels), with
# them about 69 MB, so those go on a visit of their own.
#
#   scripts/gpu-pack.sh          # builds with scripts/build-cuda.sh first
#   CORES=1 scripts/gpu-pack.sh  # the `cores` step's binaries too
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target/cuda}"
export CARGO_TARGET_DIR="$target"
# hetgnn with its host profiler (HETGNN_PROFILE; src/profile.rs).
scripts/build-cuda.sh -p hetgnn -p bench --features hetgnn/profile
scripts/build-cuda.sh -p models --lib --tests

# The newest test binary of a name (cargo leaves one per build, named by hash).
newest() { ls -t "$target/release/deps/$1"-* | grep -v '\.d$' | head -n 1; }

rm -rf gpu-pack && mkdir -p gpu-pack
cp "$target/release/hetgnn" "$target/release/train" "$target/release/cache" "$target/release/gather" "$target/release/sample" gpu-pack/
if [ "${CORES:-0}" = 1 ]; then
    cp "$target/release/bytegnn" "$target/release/full_graph" "$target/release/hopgnn" gpu-pack/
fi
cp "$(newest cuda_tests)" gpu-pack/cuda_tests
cp "$(newest models)" gpu-pack/models_unit
for f in gpu-pack/*; do
    # hetgnn keeps its symbol table, for the profiler's function names.
    case "$f" in */hetgnn) strip --strip-debug "$f" ;; *) strip "$f" ;; esac
    xz -T0 -6 "$f"
done
git rev-parse HEAD > gpu-pack/COMMIT
du -sh gpu-pack
echo "carry gpu-pack to the device and run: bash scripts/gpu-figures.sh" >&2
