#!/usr/bin/env python3
"""How far two trainers' gradient sum drifts from one process's, in PyTorch.

Data-parallel training adds each trainer's gradient of its share of a batch;
one process computes the gradient of the whole batch at once. The two are the
same sum taken in another order, so they differ only by rounding. This script
measures what that rounding alone does to a run: two copies of the R-GCN of
dgl_rgcn.py (same initial weights, learnable rows under Adam or, with
--lazy-rows, SparseAdam; dropout 0) take the same steps on the same sampled
neighbours. Copy A runs the batch as one process does: one set of blocks, the
mean loss, one backward pass. Copy B runs it as `parts` trainers do: every
parts-th example, each share with blocks of its own (the same neighbour picks,
restricted to what its examples reach), its loss over the batch's size,
back-propagated alone, the gradients added as a reducer adds them. It prints the
largest loss difference relative to the loss per epoch; with --threads 1
torch's kernels are deterministic (several threads make even two identical
copies drift: try --parts 1), and --dtype float64 shows the drift is rounding
(it vanishes).

    python3 bench/baselines/split_drift.py --data G --task edge-classification \\
        --target-relations author__writes__paper --epochs 2

Needs the environment of dgl_rgcn.py. Prints one JSON object on stdout.
"""

import argparse
import copy
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dgl_rgcn import EdgeDecoder, Rgcn, load  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--task", default="edge-classification", choices=["edge-classification", "node-classification"])
    ap.add_argument("--target-relations", default="author__writes__paper")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--fanouts", default="25,20")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--embed-dim", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--eps", type=float, default=1e-8, help="Adam's eps")
    ap.add_argument("--parts", type=int, default=2, help="pieces of copy B's batch (trainers)")
    ap.add_argument("--lazy-rows", action="store_true", help="learnable rows as sparse nn.Embedding under torch's SparseAdam (only the rows a step touched move, as hetgnn's and DGL's SparseAdam)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    dgl.seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)

    g, schema, target, feats, labels, _, splits = load(a.data, True)
    feats = {t: f.to(dtype) for t, f in feats.items()}
    fanouts = [int(f) for f in a.fanouts.split(",")]
    sampler = dgl.dataloading.NeighborSampler([{et: f for et in g.canonical_etypes} for f in reversed(fanouts)])
    featureless = [t for t in g.ntypes if t not in feats]
    in_dims = {t: (feats[t].shape[1] if t in feats else a.embed_dim) for t in g.ntypes}
    edges = a.task == "edge-classification"
    if edges:
        src_t, name, dst_t = a.target_relations.split("__")
        etype, rev = (src_t, name, dst_t), (dst_t, "rev_" + name, src_t)
        edir = os.path.join(a.data, "edges", a.target_relations)
        y_all = torch.from_numpy(np.load(os.path.join(edir, "labels.npy")))
        train = torch.from_numpy(np.load(os.path.join(edir, "train.npy")))
        classes = next(r for r in schema["relations"] if (r["src"], r["name"], r["dst"]) == etype)["num_classes"]
        out = a.hidden
    else:
        train, classes, out = splits["train"], schema["num_classes"], schema["num_classes"]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gnn = Rgcn(g, in_dims, a.hidden, out, len(fanouts), 0.0)
            self.embeds = nn.ModuleDict({t: nn.Embedding(g.num_nodes(t), a.embed_dim, sparse=a.lazy_rows) for t in featureless})
            for e in self.embeds.values():
                nn.init.normal_(e.weight, 0.0, 1.0)
            self.decoder = EdgeDecoder(a.hidden, classes) if edges else None

        def forward(self, blocks):
            h = {}
            for t in blocks[0].srctypes:
                ids = blocks[0].srcnodes[t].data[dgl.NID]
                if len(ids):
                    h[t] = feats[t][ids] if t in feats else self.embeds[t](ids)
            return self.gnn(blocks, h)

    one = Net().to(dtype)
    split = copy.deepcopy(one)

    class Opt:
        """Adam over the dense parameters; the rows under Adam too, or under SparseAdam with --lazy-rows."""

        def __init__(self, net):
            rows = list(net.embeds.parameters()) if a.lazy_rows else []
            ids = {id(p) for p in rows}
            self.opts = [torch.optim.Adam([p for p in net.parameters() if id(p) not in ids], lr=a.lr, eps=a.eps)]
            if rows:
                self.opts.append(torch.optim.SparseAdam(rows, lr=a.lr, eps=a.eps))

        def zero_grad(self):
            for o in self.opts:
                o.zero_grad()

        def step(self):
            for o in self.opts:
                o.step()

    opts = [Opt(one), Opt(split)]

    def restrict(frontiers, seeds):
        """The blocks of a share's seeds on picks drawn for the whole batch."""
        blocks = []
        for frontier in frontiers:
            block = dgl.to_block(dgl.in_subgraph(frontier, seeds), seeds)
            blocks.insert(0, block)
            seeds = {t: block.srcnodes[t].data[dgl.NID] for t in block.srctypes}
        return blocks

    def loss_sum(net, batch, blocks):
        """The summed loss of `batch`'s examples on `blocks`."""
        h = net(blocks)
        if edges:
            pair = dgl.edge_subgraph(g, {etype: batch}, relabel_nodes=True)
            # The blocks' outputs are the pair's nodes in order (seeds_of).
            u, v = pair.edges(etype=etype)
            return F.cross_entropy(net.decoder(h[src_t][u], h[dst_t][v]), y_all[batch], reduction="sum")
        return F.cross_entropy(h[target], labels[batch], reduction="sum")

    def seeds_of(batch):
        if edges:
            pair = dgl.edge_subgraph(g, {etype: batch}, relabel_nodes=True)
            return {t: pair.nodes[t].data[dgl.NID] for t in pair.ntypes if pair.num_nodes(t) > 0}
        return {target: batch}

    steps, per_epoch = [], []
    for epoch in range(a.epochs):
        perm = train[torch.randperm(len(train))]
        worst = 0.0
        for i in range(0, len(perm), a.batch):
            batch = perm[i:i + a.batch]
            graph = g
            if edges:
                # The batch's edges and their reverses leave the graph sampled on.
                bu, bv = g.find_edges(batch, etype=etype)
                _, _, every = g.edge_ids(bu, bv, return_uv=True, etype=etype)
                graph = dgl.remove_edges(dgl.remove_edges(g, every, etype=etype), every, etype=rev)
            # One process's draw: blocks seeds outward, as NeighborSampler draws them.
            frontiers, blocks, seeds = [], [], seeds_of(batch)
            for fan in fanouts:
                frontier = graph.sample_neighbors(seeds, {et: fan for et in graph.canonical_etypes})
                block = dgl.to_block(frontier, seeds)
                frontiers.append(frontier)
                blocks.insert(0, block)
                seeds = {t: block.srcnodes[t].data[dgl.NID] for t in block.srctypes}
            n = len(batch)
            # A: one process.
            opts[0].zero_grad()
            la = loss_sum(one, batch, blocks) / n
            la.backward()
            opts[0].step()
            # B: `parts` trainers, each its share's blocks, gradients added.
            opts[1].zero_grad()
            lb = 0.0
            for k in range(a.parts):
                share = batch[k::a.parts]
                piece = loss_sum(split, share, restrict(frontiers, seeds_of(share))) / n
                piece.backward()
                lb += piece.item()
            opts[1].step()
            diff = abs(la.item() - lb) / max(abs(la.item()), 1e-2)
            steps.append({"epoch": epoch, "loss": la.item(), "loss_split": lb, "relative_diff": diff})
            worst = max(worst, diff)
        per_epoch.append(worst)
        print(f"epoch {epoch}: largest relative loss difference {worst:.2e} ({len(steps)} steps so far)", file=sys.stderr)
    first = next((i for i, s in enumerate(steps) if s["relative_diff"] > 1e-5), None)
    print(json.dumps({
        "task": a.task, "dtype": a.dtype, "parts": a.parts, "eps": a.eps, "seed": a.seed, "lazy_rows": a.lazy_rows,
        "torch": torch.__version__, "dgl": dgl.__version__,
        "first_step_beyond_1e-5": first, "largest_by_epoch": per_epoch, "steps": steps,
    }))


if __name__ == "__main__":
    main()
