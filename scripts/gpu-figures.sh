#!/usr/bin/env bash
# Runs on a machine with an NVIDIA GPU, its driver and CUDA 13 libraries (no
# Rust needed), from the repository root, with gpu-pack/ made by
# scripts/gpu-pack.sh beside it. In order, each step's output in $OUT
# (default gpu-out/):
#   1. gpu.txt: nvidia-smi, and where the CUDA libraries were found;
#   2. cuda_tests.txt: every op and every model on cuda:0 against the CPU;
#   3. train.txt, train.json: the train benchmark (R-GCN, mag-like at
#      $SCALES, default 0.05,0.1,1, $EPOCHS epochs, default 2) with --device
#      cuda:0 against PyTorch Geometric's R-GCN on the same GPU
#      (bench/baselines/pyg_rgcn.py with the machine's python3), with the
#      GPU memory of each process sampled every 100 ms (train_gpu_mem.csv); then
#      with the CPU for the same-machine ratio (train_cpu.json);
#   4. train_cache.txt, train_cache.json: the train benchmark on cuda:0 at
#      the largest of $SCALES with a device cache of $CACHE_BYTES (default
#      8GiB, enough for every feature and learnable row of S=1: they are then
#      read and updated on the GPU, with no pre-sampling), against PyG again;
#   5. gather.txt, gather.json: a batch's feature rows picked out of a table
#      on cuda:0 against the bytes-over-bandwidth floor;
#   6. cache.txt, cache.json: the device-cache benchmark with --device cuda:0;
#   7. sample.txt, sample.json: 100 batches of mag-like S=1 (fanouts 25,20,
#      batch 1024) sampled with every pick drawn on cuda:0, each checked
#      against the CPU sampler's batch, against 8 CPU threads.
# Not by default: `profile` trains one epoch at the largest of $SCALES with
# every row on cuda:0, once with HETGNN_SYNC_TIMING=1 (profile_sync.txt/json:
# each phase of a step charged its device time), once under the host
# profiler (profile_host.txt, .svg: each thread's busiest functions) and,
# with NCU=1, once under Nsight Compute for $NCU_KERNELS kernels of
# mid-epoch steps (profile_ncu.txt: time per kernel name); with
# HETGNN_PROFILE_WALL=1 in the environment the host profile is of the
# training thread's wall time. `cores` (a pack made with CORES=1) runs, on the machine's CPU cores (no
# GPU), the timing targets that a 2-core machine cannot show because its node
# processes outnumber its cores (issues 23-25): DAG sampling against the
# pipeline (bytegnn-*.json), full-graph staleness at 1 Gbit/s on 4 nodes
# (full_graph.json) and HopGNN against its baselines (hopgnn.json). Each
# generates and partitions its graph on first use; one round each, so run
# the step twice for ranges (STEP_TIMEOUT=240 bounds each of the four).
# A step that fails or outlasts $STEP_TIMEOUT seconds (default 300) is
# reported and the next one runs.
#
#   bash scripts/gpu-figures.sh [steps...]    # steps: gpu tests train train_cpu train_cache gather cache sample (default), profile, cores
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
steps="${*:-gpu tests train train_cpu train_cache gather cache sample}"
scales="${SCALES:-0.05,0.1,1}"
epochs="${EPOCHS:-2}"
bin=/tmp/hetgnn-gpu
mkdir -p "$bin"
for f in gpu-pack/*.xz; do
    xz -dc "$f" > "$bin/$(basename "$f" .xz)" && chmod +x "$bin/$(basename "$f" .xz)"
done

# cuBLAS, cuRAND, NVRTC and the runtime, version 13: a system toolkit's or a
# Python wheel's (PyTorch's CUDA 13 builds bring them).
libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    if ls "$d"/libnvrtc.so.13* >/dev/null 2>&1 || ls "$d"/libcublas.so.13* >/dev/null 2>&1; then
        libs="$libs${libs:+:}$d"
    fi
done
# The driver's libcuda.so.1, where the loader's cache does not list it.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/local/cuda/compat; do
        [ -e "$d/libcuda.so.1" ] && libs="$libs${libs:+:}$d" && break
    done
fi
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Generated graphs: the benches' built-in path is this machine's checkout.
export HETGNN_BENCH_DATA="${HETGNN_BENCH_DATA:-$PWD/target/bench-data}"

step() { case " $steps " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
run() {
    local name="$1"; shift
    echo "== $name: $*" >&2
    timeout "${STEP_TIMEOUT:-300}" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.txt"
    echo "== $name: exit $rc" >&2
}

if step gpu; then
    { nvidia-smi; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; echo "commit $(cat gpu-pack/COMMIT 2>/dev/null)"
      nproc; python3 -c 'import torch, torch_geometric; print("torch", torch.__version__, "pyg", torch_geometric.__version__)'
      ldd "$bin/hetgnn" | grep -E 'cuda|cublas|curand|nvrtc'; } > "$out/gpu.txt" 2>&1
    sed -n '1,12p;/^LD_LIBRARY_PATH/,$p' "$out/gpu.txt"
fi
if step tests; then
    # Required: without it the tests pass unchecked where cuda:0 cannot be opened.
    HETGNN_REQUIRE_GPU=1 run cuda_tests "$bin/cuda_tests" --test-threads 1
    run models_unit "$bin/models_unit" kernels_compile
fi
if step train; then
    # Per process: the benchmark's children (train) and PyG's (python3) apart.
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits -lms 100 > "$out/train_gpu_mem.csv" 2>&1 &
    smi=$!
    run train "$bin/train" --device cuda:0 --scales "$scales" --epochs "$epochs" --pyg python3 --out "$out/train.json"
    kill "$smi" 2>/dev/null
    echo "peak GPU memory per process (MiB, CUDA context included):"
    awk -F', *' 'NF == 3 && $2 != "[No data]" && $3 ~ /^[0-9]+$/ { k = $1 " " $2; if ($3 > m[k]) m[k] = $3 } END { for (k in m) print "  " k ": " m[k] }' "$out/train_gpu_mem.csv"
fi
if step train_cpu; then
    run train_cpu "$bin/train" --device cpu --scales "$scales" --epochs "$epochs" --out "$out/train_cpu.json"
fi
if step train_cache; then
    largest="$(tr ',' '\n' <<< "$scales" | sort -g | tail -n 1)"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits -lms 100 > "$out/train_cache_gpu_mem.csv" 2>&1 &
    smi=$!
    run train_cache "$bin/train" --device cuda:0 --scales "$largest" --epochs "$epochs" --pyg python3 \
        --set "training.cache_bytes=\"${CACHE_BYTES:-8GiB}\"" --out "$out/train_cache.json"
    kill "$smi" 2>/dev/null
    echo "peak GPU memory per process (MiB, CUDA context included):"
    awk -F', *' 'NF == 3 && $2 != "[No data]" && $3 ~ /^[0-9]+$/ { k = $1 " " $2; if ($3 > m[k]) m[k] = $3 } END { for (k in m) print "  " k ": " m[k] }' "$out/train_cache_gpu_mem.csv"
fi
if step gather; then
    run gather "$bin/gather" --device cuda:0 --out "$out/gather.json"
fi
if step cache; then
    run cache "$bin/cache" --device cuda:0 --hetgnn "$bin/hetgnn" --out "$out/cache.json"
fi
if step sample; then
    run sample "$bin/sample" --scale 1 --fanouts 25,20 --batch 1024 --batches 100 --threads 8 --device cuda:0 --out "$out/sample.json"
fi
if step profile; then
    largest="$(tr ',' '\n' <<< "$scales" | sort -g | tail -n 1)"
    data="$HETGNN_BENCH_DATA/mag-v1-s$largest-seed0"
    [ -e "$data/schema.json" ] || "$bin/hetgnn" generate --like mag --scale "$largest" --seed 0 --out "$data" --force
    train=("$bin/hetgnn" train --data "$data" --device cuda:0 --epochs 1 --cache-bytes "${CACHE_BYTES:-8GiB}" --force)
    HETGNN_SYNC_TIMING=1 run profile_sync "${train[@]}" --report "$out/profile_sync.json"
    HETGNN_PROFILE="$out/profile_host" run profile_host "${train[@]}" --report "$out/profile_host.json"
    [ -n "${NCU:-}" ] && run profile_ncu ncu --launch-skip "${NCU_SKIP:-20000}" --launch-count "${NCU_KERNELS:-2000}" --print-summary per-kernel \
        --metrics gpu__time_duration.sum "${train[@]}" --report "$out/profile_ncu.json"
fi
if step cores; then
    nproc > "$out/cores.txt"
    run bytegnn_0.05 "$bin/bytegnn" --hetgnn "$bin/hetgnn" --graph mag-0.05 --nodes 2,4 --epochs 2 --out "$out/bytegnn-mag-0.05.json"
    run bytegnn_0.1 "$bin/bytegnn" --hetgnn "$bin/hetgnn" --graph mag-0.1 --nodes 2,4 --epochs 2 --out "$out/bytegnn-mag-0.1.json"
    run full_graph "$bin/full_graph" --hetgnn "$bin/hetgnn" --graph mag-0.05 --nodes 4 --settings none --epochs 1 \
        --timed none,fixed1-g,variation0.1-g --bandwidth 1Gbit/s --timed-epochs 10 --sampled-epochs 0 --out "$out/full_graph.json"
    run hopgnn "$bin/hopgnn" --hetgnn "$bin/hetgnn" --graph mag-0.05 --nodes 4 --runs random,owner,hop,hop-grad,hop-merged \
        --epochs 3 --out "$out/hopgnn.json"
fi
