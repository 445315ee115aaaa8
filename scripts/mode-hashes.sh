#!/usr/bin/env bash
# Each mode's reference run on a small generated graph, embedded in one
# process: prints "<run> <final_model_sha256>" per line. A refactor keeps
# every line (DESIGN.md, determinism): run it with the binary before and after
# and compare the outputs.
#
#   scripts/mode-hashes.sh [BIN] > hashes.txt
#   diff hashes.txt scripts/mode-hashes.reference
#
# scripts/mode-hashes.reference is the output on the project's 2-core x86-64
# CPU machine (2026-12-05, commit 84afe49; the same with release and test
# builds). The matrix kernels chosen at run time (AVX2 or AVX-512) sum in
# different orders, so another CPU may print other hashes: compare before
# and after on one machine.
#
# The settings use the keys of [training] as they were before 0.5, which a
# newer binary still reads (with a warning), so one script serves both.
set -euo pipefail
bin=$(realpath "${1:-target/release/hetgnn}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$bin" generate --scale 0.003 --out g >/dev/null 2>&1
for m in metis meta block-row; do
  "$bin" partition --data g --parts 2 --method "$m" --out "p-$m" >/dev/null 2>&1
done
"$bin" partition --data g --parts 2 --method metis --halo-features --out p-halo >/dev/null 2>&1
common=(--epochs 2 --hidden 16 --batch 128 --fanouts 5,5)
run() {
  local name=$1
  shift
  "$bin" train "${common[@]}" --report "$name.json" "$@" >/dev/null 2>"$name.err" ||
    { echo "$name failed:" >&2; cat "$name.err" >&2; exit 1; }
  printf '%s %s\n' "$name" "$(grep -o '"final_model_sha256": "[0-9a-f]*"' "$name.json" | cut -d'"' -f4)"
}
run single --data g
run single-hgt --data g --model hgt --heads 2
run data-parallel --mode data-parallel --partitions p-metis
run data-parallel-dag --mode data-parallel --partitions p-metis --set 'training.sampling="dag"'
run data-parallel-random --mode data-parallel --partitions p-metis --set 'training.seed_assignment="random"'
run raf --mode raf --partitions p-meta
run raf-local --mode raf --partitions p-meta --set 'training.raf_embeddings="local"'
run model-averaging --mode model-averaging --partitions p-halo --set training.sync_every=2
run hopgnn --mode hopgnn --partitions p-metis
run hopgnn-gradient --mode hopgnn --partitions p-metis --set 'training.hop_migrate="gradient"' --set training.hop_time_steps=1
run full-graph --mode full-graph --partitions p-block-row
run full-graph-stale --mode full-graph --partitions p-block-row --set 'training.staleness="fixed"' --set training.skip_gradients=true
run single-cache --data g --cache-bytes 64KiB --cache-policy hotness
run data-parallel-cache --mode data-parallel --partitions p-metis --cache-bytes 64KiB
run raf-cache --mode raf --partitions p-meta --cache-bytes 64KiB
