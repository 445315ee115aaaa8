#!/usr/bin/env python3
"""DGL baseline for link prediction: the same 2-layer R-GCN encoder as
dgl_rgcn.py (last layer hidden wide, no classifier), a dot-product decoder,
uniform negatives (k per positive edge, destination type of the relation),
binary cross-entropy over positive and negative scores, and MRR / Hits@K of
each held-out edge against fixed negatives, with every node embedded by
full-neighbourhood inference.

The split and the evaluation negatives are hetgnn's (bench/src/bin/link.rs
writes them to --split with graphs::link): the target relation keeps only
its training edges in the graph, reverse relations included, and the
edges of a batch are excluded from its sampled neighbourhoods (DGL's
exclude="reverse_types"), as hetgnn does. Prints one line per epoch on
stderr and, last on stdout, one JSON object. Needs dgl 2.1 with torch 2.2.1
(see dgl_rgcn.py for the install commands).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import dgl
import dgl.nn as dglnn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dgl_rgcn import Rgcn  # noqa: E402  the same encoder as the node-classification baseline


def load(path, split, reverse_edges):
    """The training graph (held-out target edges removed), features, the
    target relations and the split's arrays."""
    with open(os.path.join(path, "schema.json")) as f:
        schema = json.load(f)
    with open(os.path.join(split, "relations.json")) as f:
        targets = json.load(f)
    train = np.load(os.path.join(split, "train.npy"))
    data = {}
    for r in schema["relations"]:
        name = f"{r['src']}__{r['name']}__{r['dst']}"
        if name in targets:
            keep = train[0] == targets.index(name)
            src, dst = torch.from_numpy(train[1][keep].copy()), torch.from_numpy(train[2][keep].copy())
        else:
            e = np.load(os.path.join(path, "edges", f"{name}.npy"))
            src, dst = torch.from_numpy(e[0].copy()), torch.from_numpy(e[1].copy())
        data[(r["src"], r["name"], r["dst"])] = (src, dst)
        if reverse_edges:
            data[(r["dst"], "rev_" + r["name"], r["src"])] = (dst, src)
    counts = {t: v["count"] for t, v in schema["node_types"].items()}
    g = dgl.heterograph(data, num_nodes_dict=counts)
    feats = {}
    for t, v in schema["node_types"].items():
        if v["feature_dim"] is not None:
            feats[t] = torch.from_numpy(np.load(os.path.join(path, "nodes", t, "features.npy")))
    arrays = {s: np.load(os.path.join(split, f"{s}.npy")) for s in ("valid", "test", "valid_neg", "test_neg")}
    return g, schema, feats, targets, arrays


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", required=True, help="directory written by bench/src/bin/link.rs")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024, help="positive edges per step")
    ap.add_argument("--negatives", type=int, default=5)
    ap.add_argument("--fanouts", default="25,20", help="per relation, seeds outward (as hetgnn)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--embed-dim", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    dgl.seed(a.seed)
    np.random.seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)

    t0 = time.perf_counter()
    g, schema, feats, targets, arrays = load(a.data, a.split, True)
    load_s = time.perf_counter() - t0
    if len(targets) != 1:
        sys.exit("the baseline predicts one target relation")
    s_t, rel, d_t = targets[0].split("__")
    etype = (s_t, rel, d_t)
    rev = (d_t, "rev_" + rel, s_t)
    fanouts = [int(f) for f in a.fanouts.split(",")]
    sampler = dgl.dataloading.NeighborSampler([{et: f for et in g.canonical_etypes} for f in reversed(fanouts)])
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        sampler, exclude="reverse_types", reverse_etypes={etype: rev, rev: etype}, negative_sampler=dgl.dataloading.negative_sampler.Uniform(a.negatives)
    )

    featureless = [t for t in g.ntypes if t not in feats]
    init = lambda t: torch.nn.init.normal_(t, 0.0, 1.0)  # noqa: E731
    embeds = {t: dglnn.NodeEmbedding(g.num_nodes(t), a.embed_dim, f"emb_{t}", init_func=init) for t in featureless}
    in_dims = {t: (feats[t].shape[1] if t in feats else a.embed_dim) for t in g.ntypes}
    model = Rgcn(g, in_dims, a.hidden, a.hidden, len(fanouts), a.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    sparse_opt = dgl.optim.SparseAdam(list(embeds.values()), lr=a.lr) if embeds else None

    def rows(t, ids):
        return feats[t][ids] if t in feats else embeds[t](ids)

    def inputs(block):
        return {t: rows(t, block.srcnodes[t].data[dgl.NID]) for t in block.srctypes if block.num_src_nodes(t) > 0}

    def score(graph, h):
        with graph.local_scope():
            graph.ndata["h"] = {t: h[t] for t in graph.ntypes if t in h}
            graph.apply_edges(dgl.function.u_dot_v("h", "h", "s"), etype=etype)
            return graph.edges[etype].data["s"].squeeze(-1)

    def embed_all():
        """Every node's last-layer rows: full neighbourhoods, no dropout."""
        model.eval()
        with torch.no_grad():
            h = {t: rows(t, torch.arange(g.num_nodes(t))) for t in g.ntypes}
            for i, layer in enumerate(model.layers):
                h = layer(g, h)
                if i + 1 < len(model.layers):
                    h = {t: F.relu(x) for t, x in h.items()}
        model.train()
        return h

    def rank(h, edges, negs):
        src, dst = torch.from_numpy(edges[1]), torch.from_numpy(edges[2])
        hs, hd = h[s_t][src], h[d_t][dst]
        pos = (hs * hd).sum(1)
        neg = torch.einsum("nw,nkw->nk", hs, h[d_t][torch.from_numpy(negs)])
        above = (neg > pos[:, None]).sum(1).double()
        tied = (neg >= pos[:, None]).sum(1).double()
        r = 1.0 + 0.5 * (above + tied)
        return {"mrr": (1.0 / r).mean().item(), "hits1": (r <= 1).double().mean().item(), "hits10": (r <= 10).double().mean().item(), "hits100": (r <= 100).double().mean().item()}

    train_eids = torch.arange(g.num_edges(etype))
    epochs = []
    for epoch in range(a.epochs):
        steps, loss_sum, sample_s = 0, 0.0, 0.0
        t0 = time.perf_counter()
        loader = dgl.dataloading.DataLoader(g, {etype: train_eids}, sampler, batch_size=a.batch, shuffle=True, drop_last=False, num_workers=0)
        it = iter(loader)
        while True:
            ts = time.perf_counter()
            try:
                _, pos_graph, neg_graph, blocks = next(it)
            except StopIteration:
                break
            sample_s += time.perf_counter() - ts
            h = model(blocks, inputs(blocks[0]))
            pos, neg = score(pos_graph, h), score(neg_graph, h)
            logits = torch.cat([pos, neg])
            labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            opt.zero_grad()
            if sparse_opt is not None:
                sparse_opt.zero_grad()
            loss.backward()
            opt.step()
            if sparse_opt is not None:
                sparse_opt.step()
            loss_sum += loss.item()
            steps += 1
        seconds = time.perf_counter() - t0
        te = time.perf_counter()
        h = embed_all()
        valid, test = rank(h, arrays["valid"], arrays["valid_neg"]), rank(h, arrays["test"], arrays["test_neg"])
        eval_s = time.perf_counter() - te
        epochs.append({"epoch": epoch, "loss": loss_sum / max(steps, 1), "seconds": seconds, "sample_s": sample_s, "steps": steps, "valid": valid, "test": test, "eval_s": eval_s})
        print(f"dgl epoch {epoch}: loss {loss_sum / max(steps, 1):.4f}  {seconds:.2f} s ({steps} steps)  valid MRR {valid['mrr']:.4f}  test MRR {test['mrr']:.4f}", file=sys.stderr)
    print(json.dumps({"system": "dgl", "dgl": dgl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(), "load_s": load_s, "epochs": epochs}))


if __name__ == "__main__":
    main()
