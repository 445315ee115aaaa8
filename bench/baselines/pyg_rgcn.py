#!/usr/bin/env python3
"""PyTorch Geometric baseline: the issue's 2-layer R-GCN on a hetgnn graph directory, on a GPU.

The same model and settings as `hetgnn train`'s default R-GCN and as
dgl_rgcn.py, written with PyG's layers: per relation a mean-aggregating
bias-free linear message (SAGEConv, aggr="mean", root_weight=False,
bias=False), summed over relations (reverse ones included), plus a per-type
self-loop linear with bias; ReLU and dropout 0.5 after layer 1; learnable
embeddings for featureless types (nn.Embedding(sparse=True) with SparseAdam);
Adam; neighbour sampling per relation, seeds outward, without replacement;
each layer computed only for the nodes the next one needs.

PyG's NeighborLoader needs pyg-lib or torch-sparse, compiled extensions that
exist for few torch/CUDA pairs (none for the GPU machine's torch 2.11 +
CUDA 13). So the sampler here is pure torch and runs where the graph lives
(the GPU with --device cuda:0): per relation an in-edge CSR, and per
frontier node either every in-edge (degree <= fanout) or `fanout` of them
chosen by sorting random keys within each node's segment. Graph, features,
labels and embeddings all live on the device: the fastest way to use PyG on
one GPU when the graph fits.

Reads the graph directory format of FORMAT.md. Prints one line per epoch on
stderr and, last on stdout, one JSON object with the per-epoch figures.
bench/src/bin/train.rs runs it with `--pyg PYTHON` and reports the ratios.
Needs torch and torch_geometric (any 2.x; pure Python).
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

import torch_geometric
from torch_geometric.nn import SAGEConv


def load(path, reverse_edges, device):
    """Per relation (src, name, dst) its in-edge CSR by destination; features, labels, splits."""
    with open(os.path.join(path, "schema.json")) as f:
        schema = json.load(f)
    counts = {t: v["count"] for t, v in schema["node_types"].items()}
    rels = {}

    def add(s, name, d, src, dst):
        order = np.argsort(dst, kind="stable")
        ptr = np.zeros(counts[d] + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=counts[d]), out=ptr[1:])
        rels[(s, name, d)] = (torch.from_numpy(ptr).to(device), torch.from_numpy(src[order].astype(np.int64)).to(device))

    for r in schema["relations"]:
        e = np.load(os.path.join(path, "edges", f"{r['src']}__{r['name']}__{r['dst']}.npy")).astype(np.int64)
        add(r["src"], r["name"], r["dst"], e[0], e[1])
        if reverse_edges:
            add(r["dst"], "rev_" + r["name"], r["src"], e[1], e[0])
    feats = {}
    for t, v in schema["node_types"].items():
        if v["feature_dim"] is not None:
            feats[t] = torch.from_numpy(np.load(os.path.join(path, "nodes", t, "features.npy"))).to(device)
    target = schema["target"]
    node_dir = os.path.join(path, "nodes", target)
    labels = torch.from_numpy(np.load(os.path.join(node_dir, "labels.npy")).astype(np.int64)).to(device)
    splits = {s: torch.from_numpy(np.load(os.path.join(node_dir, f"{s}.npy")).astype(np.int64)).to(device) for s in ("train", "valid", "test")}
    return schema, counts, rels, target, feats, labels, splits


def sample_in_edges(ptr, nbr, dst, fanout, gen):
    """For each node in `dst` (global ids), up to `fanout` in-edges without replacement: (local dst index, global src id)."""
    start = ptr[dst]
    deg = ptr[dst + 1] - start
    total = int(deg.sum())
    if total == 0:
        empty = torch.empty(0, dtype=torch.long, device=dst.device)
        return empty, empty
    seg = torch.repeat_interleave(torch.arange(len(dst), device=dst.device), deg)
    seg_start = torch.cumsum(deg, 0) - deg
    pos = torch.arange(total, device=dst.device) - seg_start[seg]
    if int(deg.max()) > fanout:
        # Rank each edge within its node by a random key; keep the first `fanout`.
        key = torch.rand(total, generator=gen, device=dst.device)
        perm = torch.argsort(key)
        perm = perm[torch.argsort(seg[perm], stable=True)]
        rank = torch.arange(total, device=dst.device) - seg_start[seg[perm]]
        keep = perm[rank < fanout]
        seg, pos = seg[keep], pos[keep]
    return seg, nbr[start[seg] + pos]


def unique_keep_order(front, extra):
    """Unique ids of cat(front, extra), `front` (already unique) first; and where each of `extra` went."""
    allids = torch.cat([front, extra])
    uniq, inv = torch.unique(allids, return_inverse=True)
    first = torch.full((len(uniq),), len(allids), dtype=torch.long, device=allids.device)
    first.scatter_reduce_(0, inv, torch.arange(len(allids), device=allids.device), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return uniq[order], rank[inv[len(front):]]


def sample(rels, target, seeds, fanouts, gen):
    """Blocks from the seeds outward: per layer (input) node ids per type and per relation (edge_index, sizes)."""
    nodes = {target: seeds}
    blocks = []
    for fanout in fanouts:
        dst_nodes = nodes
        picked = {}
        for (s, name, d), (ptr, nbr) in rels.items():
            if d not in dst_nodes or len(dst_nodes[d]) == 0:
                continue
            seg, src = sample_in_edges(ptr, nbr, dst_nodes[d], fanout, gen)
            if len(seg):
                picked[(s, name, d)] = (seg, src)
        src_ids = {t: [ids] for t, ids in dst_nodes.items()}
        for (s, _, _), (_, src) in picked.items():
            src_ids.setdefault(s, []).append(src)
        src_nodes, local = {}, {}
        for t, parts in src_ids.items():
            front = dst_nodes.get(t, torch.empty(0, dtype=torch.long, device=seeds.device))
            rest = torch.cat(parts[1:]) if t in dst_nodes else torch.cat(parts)
            src_nodes[t], where = unique_keep_order(front, rest)
            local[t] = where
        edges, offsets = {}, {t: 0 for t in src_nodes}
        for (s, name, d), (seg, src) in picked.items():
            n = len(src)
            edges[(s, name, d)] = (torch.stack([local[s][offsets[s] : offsets[s] + n], seg]), (len(src_nodes[s]), len(dst_nodes[d])))
            offsets[s] += n
        blocks.append((edges, {t: len(v) for t, v in dst_nodes.items()}))
        nodes = src_nodes
    # Input layer first, as the model consumes them.
    return nodes, blocks[::-1]


class Layer(nn.Module):
    """Per relation mean then bias-free linear (SAGEConv), summed, plus a per-type self-loop with bias."""

    def __init__(self, rels, types, in_dims, out):
        super().__init__()
        self.rel = nn.ModuleDict({f"{s}__{e}__{d}": SAGEConv((in_dims[s], in_dims[d]), out, aggr="mean", root_weight=False, bias=False) for s, e, d in rels})
        self.loop = nn.ModuleDict({t: nn.Linear(in_dims[t], out) for t in types})

    def forward(self, block, h):
        edges, dst_counts = block
        out = {}
        for (s, e, d), (edge_index, size) in edges.items():
            if s not in h:
                continue
            m = self.rel[f"{s}__{e}__{d}"]((h[s], h[d][: size[1]]), edge_index, size=size)
            out[d] = out[d] + m if d in out else m
        for t, n in dst_counts.items():
            if n == 0 or t not in h:
                continue
            x = self.loop[t](h[t][:n])
            out[t] = out[t] + x if t in out else x
        return out


class Rgcn(nn.Module):
    def __init__(self, rels, types, in_dims, hidden, classes, layers, dropout):
        super().__init__()
        dims = [in_dims] + [{t: hidden for t in types}] * (layers - 1)
        outs = [hidden] * (layers - 1) + [classes]
        self.layers = nn.ModuleList([Layer(rels, types, dims[i], outs[i]) for i in range(layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, h):
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i + 1 < len(self.layers):
                h = {t: self.dropout(F.relu(x)) for t, x in h.items()}
        return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--fanouts", default="25,20", help="per relation, seeds outward (as hetgnn)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--embed-dim", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    ap.add_argument("--no-reverse-edges", action="store_true")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)

    t0 = time.perf_counter()
    schema, counts, rels, target, feats, labels, splits = load(a.data, not a.no_reverse_edges, dev)
    sync()
    load_s = time.perf_counter() - t0
    fanouts = [int(f) for f in a.fanouts.split(",")]
    types = list(counts)
    featureless = [t for t in types if t not in feats]
    # N(0, 1) rows, as hetgnn's tables and torch's default; sparse gradients for SparseAdam.
    embeds = nn.ModuleDict({t: nn.Embedding(counts[t], a.embed_dim, sparse=True) for t in featureless}).to(dev)
    in_dims = {t: (feats[t].shape[1] if t in feats else a.embed_dim) for t in types}
    model = Rgcn(list(rels), types, in_dims, a.hidden, schema["num_classes"], len(fanouts), a.dropout).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    sparse_opt = torch.optim.SparseAdam(list(embeds.parameters()), lr=a.lr) if featureless else None

    def inputs(nodes):
        return {t: (feats[t][ids] if t in feats else embeds[t](ids)) for t, ids in nodes.items() if len(ids)}

    def batches(ids, shuffle):
        if shuffle:
            ids = ids[torch.randperm(len(ids), generator=gen, device=dev)]
        for i in range(0, len(ids), a.batch):
            yield ids[i : i + a.batch]

    def accuracy(ids):
        model.eval()
        correct = 0
        with torch.no_grad():
            for seeds in batches(ids, False):
                nodes, blocks = sample(rels, target, seeds, fanouts, gen)
                out = model(blocks, inputs(nodes))[target]
                correct += (out.argmax(1) == labels[seeds]).sum().item()
        model.train()
        return correct / max(len(ids), 1)

    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    epochs = []
    for epoch in range(a.epochs):
        steps, loss_sum, sample_s = 0, 0.0, 0.0
        sync()
        t0 = time.perf_counter()
        for seeds in batches(splits["train"], True):
            ts = time.perf_counter()
            nodes, blocks = sample(rels, target, seeds, fanouts, gen)
            sync()
            sample_s += time.perf_counter() - ts
            out = model(blocks, inputs(nodes))[target]
            loss = F.cross_entropy(out, labels[seeds])
            opt.zero_grad()
            if sparse_opt is not None:
                sparse_opt.zero_grad()
            loss.backward()
            opt.step()
            if sparse_opt is not None:
                sparse_opt.step()
            loss_sum += loss.item()
            steps += 1
        sync()
        seconds = time.perf_counter() - t0
        te = time.perf_counter()
        valid, test = accuracy(splits["valid"]), accuracy(splits["test"])
        eval_s = time.perf_counter() - te
        epochs.append({"epoch": epoch, "loss": loss_sum / max(steps, 1), "seconds": seconds, "sample_s": sample_s, "steps": steps, "valid_acc": valid, "test_acc": test, "eval_s": eval_s})
        print(f"pyg epoch {epoch}: loss {loss_sum / max(steps, 1):.4f}  {seconds:.2f} s ({steps} steps, sampling {sample_s:.2f} s)  valid {valid:.4f}  test {test:.4f}", file=sys.stderr)
    print(json.dumps({
        "system": "pyg", "pyg": torch_geometric.__version__, "torch": torch.__version__, "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if cuda else None,
        "peak_device_bytes": torch.cuda.max_memory_allocated(dev) if cuda else None,
        "threads": torch.get_num_threads(), "load_s": load_s, "epochs": epochs,
    }))


if __name__ == "__main__":
    main()
