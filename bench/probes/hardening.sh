#!/usr/bin/env bash
# Probes of issue 51's classes ("hardening, second round"), as a hostile or
# careless operator would run them: prints PASS or FAIL per probe and a count.
# Bounded: every command runs under `timeout`, everything it creates lives in
# one temporary directory removed at exit, ports are on 127.0.0.1.
#
#   cargo build --release && bash bench/probes/hardening.sh [path/to/hetgnn]
#
# Probes that need root (a read-only or full tmpfs) are skipped without it.
set -u
H=$(realpath "${1:-target/release/hetgnn}")
[ -x "$H" ] || { echo "no binary at $H: cargo build --release first"; exit 2; }
W=$(mktemp -d /tmp/hetgnn-probes.XXXXXX)
MOUNTS=()
cleanup() {
    # Every process still working in the probe directory (launchers, nodes).
    for c in /proc/[0-9]*/cwd; do
        case "$(readlink "$c" 2>/dev/null)" in "$W"*) p=${c#/proc/}; kill -KILL "${p%/cwd}" 2>/dev/null ;; esac
    done
    for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done
    rm -rf "$W"
}
trap cleanup EXIT
cd "$W" || exit 2
pass=0 fail=0
result() { # name, 0 = pass
    if [ "$2" = 0 ]; then echo "PASS $1"; pass=$((pass + 1)); else echo "FAIL $1${3:+: $3}"; fail=$((fail + 1)); fi
}
run() { timeout 120 "$H" "$@" >"$W/out" 2>"$W/err"; }
has() { grep -q -- "$1" "$W/err"; }

run generate --scale 0.002 --out g && run train --data g --epochs 1 --hidden 8 --checkpoint ck --report r.json \
    || { echo "setup failed: $(tail -2 "$W/err")"; exit 2; }
labels=$(md5sum < g/nodes/paper/labels.npy)

# Class 2: outputs written in place.
ln g/nodes/paper/labels.npy hl.npy
run predict --checkpoint ck --data g --out hl.npy --force
result "2 predict --out hard-linked to the graph's labels is refused" $([ $? = 1 ] && has "hard link" && [ "$(md5sum < g/nodes/paper/labels.npy)" = "$labels" ]; echo $?)
ln g/schema.json hl.json
run train --data g --epochs 1 --hidden 8 --report hl.json --force
result "2 train --report hard-linked to schema.json is refused" $([ $? = 1 ] && has "hard link" && run inspect g; echo $?)
ln r.json hl.png
run plot r.json --out hl.png --force
result "2 plot --out hard-linked to its report is refused" $([ $? = 1 ] && has "hard link"; echo $?)
run predict --checkpoint ck --data g --out sub/dir/p.npy
result "2 predict creates the output's missing directories" $([ $? = 0 ] && [ -s sub/dir/p.npy ]; echo $?)
if [ "$(id -u)" = 0 ]; then
    mkdir ro full && mount -t tmpfs -o ro,size=1m tmpfs ro && MOUNTS+=("$W/ro") \
        && mount -t tmpfs -o size=8k tmpfs full && MOUNTS+=("$W/full")
    run train --data g --epochs 1 --hidden 8 --report ro/r.json
    result "2 a read-only report location is refused before training" $([ $? = 1 ] && has "cannot write in" && ! grep -q "epoch" "$W/out"; echo $?)
    run predict --checkpoint ck --data g --out full/p.npy
    result "2 a full disk names the file and leaves no partial output" $([ $? = 1 ] && has "full/p.npy" && [ -z "$(ls -A full)" ]; echo $?)
else
    echo "SKIP 2 read-only and full locations (needs root to mount a tmpfs)"
fi

# Class 4: runs that share state.
timeout 60 "$H" train --data g --epochs 200 --hidden 8 --checkpoint ck2 >/dev/null 2>&1 &
first=$!
for _ in $(seq 50); do [ -s ck2/.lock ] && break; sleep 0.1; done
run train --data g --epochs 1 --hidden 8 --checkpoint ck2
result "4 a second run on one checkpoint directory is refused naming the first" $([ $? = 1 ] && has "in use by process [0-9]* (.*--epochs 200"; echo $?)
kill $first 2>/dev/null; wait $first 2>/dev/null

# Class 5: launch and the cluster.
run partition --data g --parts 2 --out parts && run certs init --out certs --nodes n0,n1
p0=$((20000 + RANDOM % 20000))
cat > c.toml <<TOML
[cluster]
certs_dir = "certs"
[[cluster.nodes]]
id = "n0"
addr = "127.0.0.1:$p0"
[[cluster.nodes]]
id = "n1"
addr = "127.0.0.1:$((p0 + 1))"
[training]
mode = "data-parallel"
partitions = "parts"
epochs = 500
hidden = 8
TOML
# The launcher is started without `timeout` so that $! is the launcher itself.
nodes_gone() { for _ in $(seq 100); do pgrep -f "$H node --config c.toml" >/dev/null || return 0; sleep 0.1; done; return 1; }
for sig in TERM INT; do
    "$H" launch --config c.toml >/dev/null 2>&1 &
    l=$!
    sleep 4
    kill -$sig $l
    wait $l
    rc=$?
    want=$([ $sig = TERM ] && echo 143 || echo 130)
    result "5 launch interrupted by SIG$sig exits $want and stops its nodes" $([ $rc = "$want" ] && nodes_gone; echo $?) "exit $rc"
done
"$H" launch --config c.toml >/dev/null 2>&1 &
l=$!
sleep 4
kill -STOP $(pgrep -f "node --config c.toml --node n1") 2>/dev/null
kill -KILL $l
result "5 a stopped node dies with its launcher (kill -9)" $(nodes_gone; echo $?)
sed "s/127.0.0.1:$((p0 + 1))/127.0.0.1:0/" c.toml > c0.toml
run launch --config c0.toml
result "5 a node at port 0 is refused at once" $([ $? = 1 ] && has "port 0"; echo $?)

# Class 6: small ones.
touch afile; ln -s loop2 loop1; ln -s loop1 loop2
run train --data afile
result "6 a data path that is a regular file is named as such" $([ $? = 1 ] && has "is a regular file"; echo $?)
run train --data loop1
result "6 a symlink loop is named as such" $([ $? = 1 ] && has "loop of symbolic links"; echo $?)
cp -r g esc && sed -i 's/"name": *"[^"]*"/"name":"evil\\u001b[31m\\nx"/' esc/schema.json
run inspect esc
result "6 a graph name with terminal escapes is refused, printed escaped" $([ $? = 1 ] && ! grep -q $'\e' "$W/err"; echo $?)

# Class 1: memory and limits.
HETGNN_MEMORY_BYTES=abc run train --data g --epochs 1
result "1 a malformed HETGNN_MEMORY_BYTES is refused" $([ $? = 1 ] && has "HETGNN_MEMORY_BYTES"; echo $?)
(ulimit -n 16; exec timeout 60 "$H" train --data g --epochs 1 --hidden 8) >/dev/null 2>"$W/err"
result "1 ulimit -n 16 is refused with what to do" $([ $? = 1 ] && has "open-file limit"; echo $?)
(ulimit -v 4000000; exec timeout 30 "$H" generate --like mag --scale 1000 --out huge) >/dev/null 2>"$W/err"
rc=$?
result "1 generate --scale 1000 is refused before allocating" $([ $rc = 1 ] && has "memory"; echo $?) "exit $rc"
HETGNN_MEMORY_BYTES=4000000000 run train --data g --epochs 1 --embed-dim 65536
result "1 learnable rows over a 4 GB budget are refused, parts listed" $([ $? = 1 ] && has "learnable rows and optimizer"; echo $?)
run train --data g --epochs 2 --embed-dim 1024 --report mem.json
peak=$(grep -o '"peak_memory_bytes": [0-9]*' mem.json | grep -o '[0-9]*$')
est=$(grep -o '"memory_estimate_bytes": [0-9]*' mem.json | grep -o '[0-9]*$')
result "1 the measured peak stays under the estimate" $([ -n "$peak" ] && [ -n "$est" ] && [ "$peak" -le "$est" ]; echo $?) "peak $peak, estimate $est"

# Class 3: a graph known by its content.
# The same shape and id ranges, another graph: cites reversed (rows swapped), schema.json unchanged.
cp -r g g2 && python3 - g2/edges/paper__cites__paper.npy <<'PY'
import sys
p = sys.argv[1]
d = open(p, "rb").read()
start = 10 + int.from_bytes(d[8:10], "little")
half = (len(d) - start) // 2
open(p, "wb").write(d[:start] + d[start + half:] + d[start:start + half])
PY
run inspect g2 || echo "probe setup: the reversed graph does not validate: $(tail -1 "$W/err")"
run train --data g2 --epochs 2 --hidden 8 --checkpoint ck --resume
result "3 --resume on a graph with a rewritten relation is refused" $([ $? = 1 ] && has "content"; echo $?)
run predict --checkpoint ck --data g2 --out p3.npy
result "3 predict on a graph with a rewritten relation is refused" $([ $? = 1 ] && has "content"; echo $?)
run train --mode data-parallel --partitions parts --data g2 --epochs 1 --hidden 8
result "3 data-parallel training on partitions of another graph than --data is refused" $([ $? = 1 ] && has "was cut from a graph"; echo $?)
run train --mode data-parallel --partitions parts --epochs 1 --hidden 8 --checkpoint ckd \
    && run predict --checkpoint ckd --data g2 --out p4.npy
result "3 predict with a data-parallel checkpoint on another graph is refused" $([ $? = 1 ] && has "content"; echo $?)
run partition --data g --parts 2 --seed 7 --out parts7
cp -r parts parts-edit && sed -i 's/"halo_features": false/"halo_features": true/' parts-edit/manifest.json
run train --mode model-averaging --partitions parts-edit --epochs 1 --hidden 8
result "3 an edited partition manifest is refused" $([ $? = 1 ] && has "was edited"; echo $?)
cp -r parts parts-mixed && cp parts7/owners/paper.npy parts-mixed/owners/paper.npy
run train --mode data-parallel --partitions parts-mixed --epochs 1 --hidden 8
result "3 an owners file copied from another partitioning is refused" $([ $? = 1 ] && has "differs from the file"; echo $?)

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
