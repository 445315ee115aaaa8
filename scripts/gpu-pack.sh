#!/usr/bin/env bash
# Packs what a GPU machine needs to test hetgnn and take its GPU figures when
# the machine has the CUDA driver and libraries but no Rust: the CUDA builds
# of hetgnn, the train, cache, gather and sample benchmarks, the core-bound benchmarks of
# the `cores` step (bytegnn, full_graph, hopgnn) and the models' test binaries,
# stripped and xz-compressed into gpu-pack/ (ignored by git; ~35 MB, small
# enough to carry to a lent device machine). scripts/gpu-figures.sh runs them
# there.
#
#   scripts/gpu-pack.sh          # builds with scripts/build-cuda.sh first
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
cp "$target/release/bytegnn" "$target/release/full_graph" "$target/release/hopgnn" gpu-pack/
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
