#!/usr/bin/env python3
"""DistDGL baseline: dgl_rgcn.py's R-GCN trained data-parallel across machines.

DGL's own distributed training, written as its examples write it: the graph
partitioned by `dgl.distributed.partition_graph` (METIS), one graph server
and one trainer per machine, trainers reading features and neighbourhoods
through `DistGraph`, learnable rows of featureless types in `DistEmbedding`
with DGL's distributed sparse Adam, dense gradients averaged by torch DDP
(gloo). The global batch is hetgnn's (`--batch` split evenly between the
trainers), so both systems take the same number of steps per epoch.

Three roles, so that a harness can place each process on its machine:

    distdgl_rgcn.py partition --data G --parts N --out P
    distdgl_rgcn.py server  --part-config P/mag.json --ip-config ips.txt --machine I --machines N
    distdgl_rgcn.py trainer --part-config P/mag.json --ip-config ips.txt --machine I --machines N \
        --master ADDR:PORT [--epochs E --batch B --seed S]

`ips.txt` holds one `address port` line per machine. Trainer 0 prints one
JSON object (per-epoch seconds and the test accuracy over every trainer's
test nodes) as its last stdout line. Needs dgl 2.1 with torch 2.2.1, as
dgl_rgcn.py.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dgl_rgcn import Rgcn, load  # noqa: E402

GRAPH = "mag"


def partition(a):
    g, schema, target, feats, labels, _, splits = load(a.data, True)
    for t, f in feats.items():
        g.nodes[t].data["feat"] = f
    g.nodes[target].data["label"] = labels
    n = g.num_nodes(target)
    for s, ids in splits.items():
        mask = torch.zeros(n, dtype=torch.bool)
        mask[ids] = True
        g.nodes[target].data[f"{s}_mask"] = mask
    dgl.distributed.partition_graph(g, GRAPH, a.parts, a.out, part_method="metis", balance_edges=True)
    with open(os.path.join(a.out, "target.json"), "w") as f:
        json.dump({"target": target, "classes": schema["num_classes"],
                   "dims": {t: int(v.shape[1]) for t, v in feats.items()}}, f)


def normal_init(shape, dtype):
    """N(0, 1) rows, as hetgnn's tables (sent to the servers: a module-level function)."""
    return torch.randn(shape, dtype=dtype)


def env(a, role):
    os.environ.update({
        "DGL_ROLE": role, "DGL_NUM_SAMPLER": str(a.samplers), "DGL_NUM_SERVER": "1",
        # Every sampler process is a client of the servers too (as launch.py counts them).
        "DGL_NUM_CLIENT": str(a.machines * (1 + a.samplers)), "DGL_CONF_PATH": a.part_config,
        "DGL_IP_CONFIG": a.ip_config, "DGL_GRAPH_FORMAT": "csc",
    })
    if role == "server":
        os.environ["DGL_SERVER_ID"] = str(a.machine)
    else:
        os.environ["DGL_DIST_MODE"] = "distributed"
        os.environ["DGL_GROUP_ID"] = "0"


def server(a):
    env(a, "server")
    dgl.distributed.initialize(a.ip_config)


def trainer(a):
    env(a, "client")
    torch.manual_seed(a.seed)
    dgl.seed(a.seed)
    np.random.seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dgl.distributed.initialize(a.ip_config)
    addr, port = a.master.rsplit(":", 1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://{addr}:{port}", world_size=a.machines, rank=a.machine)
    with open(os.path.join(os.path.dirname(a.part_config), "target.json")) as f:
        meta = json.load(f)
    target = meta["target"]
    g = dgl.distributed.DistGraph(GRAPH, part_config=a.part_config)
    pb = g.get_partition_book()
    nids = {s: dgl.distributed.node_split(g.nodes[target].data[f"{s}_mask"], pb, ntype=target, force_even=True)
            for s in ("train", "test")}
    fanouts = [int(f) for f in a.fanouts.split(",")]
    sampler = dgl.dataloading.NeighborSampler([{et: f for et in g.canonical_etypes} for f in reversed(fanouts)])
    featureless = [t for t in g.ntypes if t not in meta["dims"]]
    embeds = {t: dgl.distributed.DistEmbedding(g.num_nodes(t), a.embed_dim, f"emb_{t}", init_func=normal_init)
              for t in featureless}
    in_dims = {t: meta["dims"].get(t, a.embed_dim) for t in g.ntypes}
    model = Rgcn(g, in_dims, a.hidden, meta["classes"], len(fanouts), a.dropout)
    # Layers of types a batch does not reach get no gradient (as in DGL's own RGCN example).
    model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    sparse_opt = dgl.distributed.optim.SparseAdam(list(embeds.values()), lr=a.lr) if embeds else None
    batch = max(a.batch // a.machines, 1)

    def inputs(block):
        h = {}
        for t in block.srctypes:
            ids = block.srcnodes[t].data[dgl.NID]
            if len(ids) == 0:
                continue
            h[t] = g.nodes[t].data["feat"][ids] if t in meta["dims"] else embeds[t](ids)
        return h

    def loader(ids, shuffle):
        return dgl.dataloading.DistNodeDataLoader(g, {target: ids}, sampler, batch_size=batch, shuffle=shuffle, drop_last=False)

    # Every trainer takes as many steps as the one with fewest (DDP needs them equal).
    steps_t = torch.tensor([(len(nids["train"]) + batch - 1) // batch])
    torch.distributed.all_reduce(steps_t, op=torch.distributed.ReduceOp.MIN)
    steps = int(steps_t.item())
    epochs = []
    for epoch in range(a.epochs):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        loss_sum, done = 0.0, 0
        # Where a step's time goes: sampling (the loader, over RPC), input
        # rows (features and embedding rows pulled), compute, the optimisers.
        split = {"sample_s": 0.0, "gather_s": 0.0, "compute_s": 0.0, "update_s": 0.0}
        it = iter(loader(nids["train"], True))
        while done < steps:
            t = time.perf_counter()
            try:
                _, seeds, blocks = next(it)
            except StopIteration:
                break
            split["sample_s"] += time.perf_counter() - t
            t = time.perf_counter()
            h = inputs(blocks[0])
            y = g.nodes[target].data["label"][seeds[target]]
            split["gather_s"] += time.perf_counter() - t
            t = time.perf_counter()
            out = model(blocks, h)[target]
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            if sparse_opt is not None:
                # Without it DGL's sparse optimizer keeps every earlier step's
                # rows and gradients and applies them again at each step.
                sparse_opt.zero_grad()
            loss.backward()
            split["compute_s"] += time.perf_counter() - t
            t = time.perf_counter()
            opt.step()
            if sparse_opt is not None:
                sparse_opt.step()
            split["update_s"] += time.perf_counter() - t
            loss_sum += loss.item()
            done += 1
        torch.distributed.barrier()
        seconds = time.perf_counter() - t0
        model.eval()
        correct = torch.zeros(2, dtype=torch.int64)
        with torch.no_grad():
            for _, seeds, blocks in loader(nids["test"], False):
                out = model(blocks, inputs(blocks[0]))[target]
                y = g.nodes[target].data["label"][seeds[target]]
                correct[0] += int((out.argmax(1) == y).sum())
                correct[1] += len(y)
        model.train()
        torch.distributed.all_reduce(correct)
        row = {"epoch": epoch, "loss": loss_sum / max(done, 1), "seconds": seconds, "steps": done,
               "test_acc": correct[0].item() / max(correct[1].item(), 1), **split}
        epochs.append(row)
        if a.machine == 0:
            print(f"distdgl epoch {epoch}: loss {row['loss']:.4f}  {seconds:.2f} s ({done} steps)  test {row['test_acc']:.4f}",
                  file=sys.stderr)
    if a.machine == 0:
        print(json.dumps({"system": "distdgl", "dgl": dgl.__version__, "torch": torch.__version__,
                          "machines": a.machines, "threads": torch.get_num_threads(), "epochs": epochs}))
    torch.distributed.barrier()
    dgl.distributed.exit_client()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("role", choices=["partition", "server", "trainer"])
    ap.add_argument("--data")
    ap.add_argument("--parts", type=int)
    ap.add_argument("--out")
    ap.add_argument("--part-config")
    ap.add_argument("--ip-config")
    ap.add_argument("--machine", type=int, default=0)
    ap.add_argument("--machines", type=int, default=1)
    ap.add_argument("--master", default="127.0.0.1:29500")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024, help="global: split evenly between the trainers")
    ap.add_argument("--fanouts", default="25,20")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--embed-dim", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--samplers", type=int, default=0, help="sampler processes per trainer (DGL_NUM_SAMPLER)")
    a = ap.parse_args()
    {"partition": partition, "server": server, "trainer": trainer}[a.role](a)


if __name__ == "__main__":
    main()
