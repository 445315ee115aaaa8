#!/usr/bin/env python3
"""DGL baseline: the issue's 2-layer R-GCN on a hetgnn graph directory.

The same model and settings as `hetgnn train`'s default R-GCN, written the way
a DGL user writes it: per relation a mean-aggregating bias-free linear message
(GraphConv, norm="right"), summed over relations (reverse ones included), plus
a per-type self-loop linear with bias; ReLU and dropout 0.5 after layer 1;
learnable embeddings for featureless types (sparse Adam, or dense with
--dense-embeddings); Adam; neighbor sampling per relation, seeds outward;
each layer computed only for the nodes the next one needs (DGL's blocks).

Reads the graph directory format of FORMAT.md, so both systems train on
identical data. With --task edge-classification or edge-regression and
--target-relations, the last layer writes hidden-wide rows and a decoder
(concatenated ends through a hidden layer with ReLU, as hetgnn's
`edge_decoder = "mlp"`) predicts each edge's class or value from its ends;
training edges come from the edge split files, and each batch's edges and
their reverses (and parallel copies: edges with the same ends) are removed
from the graph its neighbourhoods are sampled on
(`dgl.remove_edges` on a copy per batch: DGL 2.1's `exclude="reverse_types"`
and `exclude="self"` left the model at the majority class on every graph
tried, while this learns; the copies' time is reported as `exclusion_s` and
left out of `seconds`, so the comparison does not charge DGL for them). Evaluation embeds the validation and test edges'
ends over their full 2-hop neighbourhoods (exact, as hetgnn's inference).
With --task multi-label, one logit per label of label_sets.npy, binary
cross-entropy summed over labels and averaged over nodes, micro/macro F1
and average precision reported. Prints one line per epoch on stderr and, last on stdout, one
JSON object with the per-epoch figures. bench/src/bin/train.rs runs it with
`--dgl PYTHON` and reports the ratios; it needs dgl 2.1 with torch 2.2.1 (its newest torch):

    python3 -m venv ~/.cache/hetgnn/dgl-venv
    ~/.cache/hetgnn/dgl-venv/bin/pip install torch==2.2.1 dgl==2.1.0 "numpy<2" torchdata==0.7.1 pandas pydantic pyyaml
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
import dgl.nn as dglnn


def load(path, reverse_edges):
    """The graph, target type, features, labels and splits of a graph directory."""
    with open(os.path.join(path, "schema.json")) as f:
        schema = json.load(f)
    data = {}
    for r in schema["relations"]:
        e = np.load(os.path.join(path, "edges", f"{r['src']}__{r['name']}__{r['dst']}.npy"))
        src, dst = torch.from_numpy(e[0].copy()), torch.from_numpy(e[1].copy())
        data[(r["src"], r["name"], r["dst"])] = (src, dst)
        if reverse_edges:
            data[(r["dst"], "rev_" + r["name"], r["src"])] = (dst, src)
    counts = {t: v["count"] for t, v in schema["node_types"].items()}
    g = dgl.heterograph(data, num_nodes_dict=counts)
    target = schema["target"]
    feats = {}
    for t, v in schema["node_types"].items():
        if v["feature_dim"] is not None:
            feats[t] = torch.from_numpy(np.load(os.path.join(path, "nodes", t, "features.npy")))
    node_dir = os.path.join(path, "nodes", target)
    labels = torch.from_numpy(np.load(os.path.join(node_dir, "labels.npy")))
    splits = {s: torch.from_numpy(np.load(os.path.join(node_dir, f"{s}.npy"))) for s in ("train", "valid", "test")}
    values = None
    if schema.get("values"):
        values = torch.from_numpy(np.load(os.path.join(node_dir, "values.npy")))
    if schema.get("label_sets"):
        g.label_sets = torch.from_numpy(np.load(os.path.join(node_dir, "label_sets.npy")).astype(np.float32))
    return g, schema, target, feats, labels, values, splits


def label_metrics(logits, y):
    """Micro and macro F1 (labels predicted where the logit is above 0) and the
    average precision of every (node, label) probability pooled, ties as one
    threshold (scikit-learn's average_precision_score on the flattened arrays)."""
    guess, truth = logits > 0, y > 0.5
    tp = (guess & truth).sum(0).double()
    fp = (guess & ~truth).sum(0).double()
    fn = (~guess & truth).sum(0).double()
    micro = (2 * tp.sum() / max((2 * tp + fp + fn).sum().item(), 1)).item()
    seen = (tp + fp + fn) > 0
    macro = (2 * tp[seen] / (2 * tp + fp + fn)[seen]).mean().item() if seen.any() else 0.0
    score = torch.sigmoid(logits).flatten().numpy()
    pos = truth.flatten().numpy()
    order = np.argsort(-score, kind="stable")
    score, pos = score[order], pos[order]
    last = np.r_[np.diff(score) != 0, True]  # the end of each run of tied scores
    tps = np.cumsum(pos)[last]
    seen_n = (np.arange(len(score)) + 1)[last]
    gained = np.diff(np.r_[0, tps])
    ap = float((gained / max(pos.sum(), 1) * tps / seen_n).sum())
    exact = (guess == truth).all(1).double().mean().item()
    return {"micro_f1": micro, "macro_f1": macro, "average_precision": ap, "acc": exact}


class Layer(nn.Module):
    """Per relation mean then bias-free linear, summed, plus a per-type self-loop with bias."""

    def __init__(self, g, in_dims, out):
        super().__init__()
        self.rel = nn.ModuleDict(
            {
                f"{s}__{e}__{d}": dglnn.GraphConv(in_dims[s], out, norm="right", weight=True, bias=False, allow_zero_in_degree=True)
                for s, e, d in g.canonical_etypes
            }
        )
        self.loop = nn.ModuleDict({t: nn.Linear(in_dims[t], out) for t in g.ntypes})

    def forward(self, block, h):
        out = {}
        for s, e, d in block.canonical_etypes:
            if s not in h or block.num_edges((s, e, d)) == 0:
                continue
            rel = block[(s, e, d)]
            m = self.rel[f"{s}__{e}__{d}"](rel, (h[s], h[d][: block.num_dst_nodes(d)]))
            out[d] = out[d] + m if d in out else m
        for t in block.dsttypes:
            n = block.num_dst_nodes(t)
            if n == 0 or t not in h:
                continue
            x = self.loop[t](h[t][:n])
            out[t] = out[t] + x if t in out else x
        return out


class EdgeDecoder(nn.Module):
    """[h_u ; h_v] through a hidden layer with ReLU, then one output per class (or one value)."""

    def __init__(self, hidden, outputs):
        super().__init__()
        self.hidden = nn.Linear(2 * hidden, hidden)
        self.out = nn.Linear(hidden, outputs)

    def forward(self, hu, hv):
        return self.out(F.relu(self.hidden(torch.cat([hu, hv], 1))))


def edge_metrics(pred, y, classes):
    """Accuracy, macro F1 and (two classes) ROC-AUC of logits `pred`, or RMSE / MAE / R² of values."""
    if classes is None:
        p, y = pred[:, 0].double(), y.double()
        sse = ((p - y) ** 2).sum().item()
        sst = ((y - y.mean()) ** 2).sum().item()
        n = max(len(y), 1)
        return {"rmse": (sse / n) ** 0.5, "mae": (p - y).abs().sum().item() / n, "r2": 1.0 - sse / sst if sst > 0 else 0.0}
    guess = pred.argmax(1)
    out = {"acc": (guess == y).double().mean().item()}
    f1s = []
    for c in range(classes):
        tp = ((guess == c) & (y == c)).sum().item()
        fp = ((guess == c) & (y != c)).sum().item()
        fn = ((guess != c) & (y == c)).sum().item()
        if tp + fp + fn > 0:
            f1s.append(2 * tp / (2 * tp + fp + fn))
    out["macro_f1"] = sum(f1s) / max(len(f1s), 1)
    if classes == 2:
        score = torch.softmax(pred, 1)[:, 1].numpy()
        pos = y.numpy() == 1
        order = score.argsort(kind="stable")
        ranks = np.empty(len(score))
        sorted_scores = score[order]
        i = 0
        while i < len(score):  # mean rank of ties
            j = i
            while j + 1 < len(score) and sorted_scores[j + 1] == sorted_scores[i]:
                j += 1
            ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
            i = j + 1
        p, n = pos.sum(), (~pos).sum()
        out["roc_auc"] = float((ranks[pos].sum() - p * (p + 1) / 2.0) / (p * n)) if p and n else None
    return out


class Rgcn(nn.Module):
    def __init__(self, g, in_dims, hidden, classes, layers, dropout):
        super().__init__()
        dims = [in_dims] + [{t: hidden for t in g.ntypes}] * (layers - 1)
        outs = [hidden] * (layers - 1) + [classes]
        self.layers = nn.ModuleList([Layer(g, dims[i], outs[i]) for i in range(layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, h):
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i + 1 < len(self.layers):
                h = {t: self.dropout(F.relu(x)) for t, x in h.items()}
        return h


def load_hetgnn(model, checkpoint):
    """Copies a hetgnn checkpoint's layers into `model` (an Rgcn) and returns
    its learnable rows by type (torch tensors).

    Layer mapping (`params.safetensors` -> this model):
    `param.layer{l}.rel.{src}__{rel}__{dst}.weight` [in, out] -> the relation's
    GraphConv weight [in, out]; `param.layer{l}.self.{type}.weight` [in, out]
    and `.bias` -> the type's self-loop Linear (its weight is the transpose);
    `embed.{type}.data` (`embeddings.safetensors`) -> the input rows of a
    featureless type. Exits when a parameter of the checkpoint has no place
    here (another model or head)."""
    from safetensors.numpy import load_file

    params = load_file(os.path.join(checkpoint, "params.safetensors"))
    emb_path = os.path.join(checkpoint, "embeddings.safetensors")
    rows = {}
    if os.path.exists(emb_path):
        for k, v in load_file(emb_path).items():
            if k.startswith("embed.") and k.endswith(".data"):
                rows[k[len("embed."):-len(".data")]] = torch.from_numpy(v.copy())
    loaded = 0
    with torch.no_grad():
        for l, layer in enumerate(model.layers):
            for name, conv in layer.rel.items():
                w = params.get(f"param.layer{l}.rel.{name}.weight")
                if w is not None:
                    conv.weight.copy_(torch.from_numpy(w))
                    loaded += 1
            for t, lin in layer.loop.items():
                w = params.get(f"param.layer{l}.self.{t}.weight")
                if w is not None:
                    lin.weight.copy_(torch.from_numpy(w).T)
                    lin.bias.copy_(torch.from_numpy(params[f"param.layer{l}.self.{t}.bias"]))
                    loaded += 2
    expected = sum(1 for k in params if k.startswith("param."))
    if loaded != expected:
        sys.exit(f"loaded {loaded} of the checkpoint's {expected} parameters: the layer mapping is wrong")
    return rows


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
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    ap.add_argument("--no-reverse-edges", action="store_true")
    ap.add_argument("--dense-embeddings", action="store_true", help="nn.Embedding + Adam instead of DGL's sparse embeddings")
    ap.add_argument("--task", default="node-classification",
                    choices=["node-classification", "node-regression", "edge-classification", "edge-regression", "multi-label"],
                    help="node-regression: one output per node, MSE on values.npy, RMSE/MAE/R² reported; multi-label: one logit per label of label_sets.npy, "
                    "binary cross-entropy summed over labels and averaged over nodes (as hetgnn), micro/macro F1 and average precision reported; edge-*: see above")
    ap.add_argument("--target-relations", default="", help="edge tasks: one canonical src__name__dst relation")
    ap.add_argument("--hash-per-edge", action="store_true")
    ap.add_argument("--init-from", help="node tasks: start from a hetgnn checkpoint's weights and learnable rows (the same initial model as hetgnn's run)")
    ap.add_argument("--hash-batches", action="store_true", help="edge tasks: hetgnn's batches (each edge pair in a random step per epoch, copies together, binomial sizes, loss over the mean size)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    dgl.seed(a.seed)
    np.random.seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)

    t0 = time.perf_counter()
    g, schema, target, feats, labels, values, splits = load(a.data, not a.no_reverse_edges)
    regression = a.task == "node-regression"
    multi = a.task == "multi-label"
    if regression and values is None:
        sys.exit(f"{a.data}: no values.npy for node regression")
    if multi and not hasattr(g, "label_sets"):
        sys.exit(f"{a.data}: no label_sets.npy for multi-label")
    sets = g.label_sets if multi else None
    load_s = time.perf_counter() - t0
    if a.task.startswith("edge-"):
        if a.init_from:
            sys.exit("--init-from is for node tasks")
        return train_edges(a, g, schema, feats, load_s)
    fanouts = [int(f) for f in a.fanouts.split(",")]
    # DGL lists fanouts from the input layer up; hetgnn from the seeds outward.
    sampler = dgl.dataloading.NeighborSampler([{et: f for et in g.canonical_etypes} for f in reversed(fanouts)])

    featureless = [t for t in g.ntypes if t not in feats]
    if a.dense_embeddings:
        # N(0, 1) rows, as hetgnn's tables and torch's default.
        embeds = nn.ModuleDict({t: nn.Embedding(g.num_nodes(t), a.embed_dim) for t in featureless})
    else:
        init = lambda t: nn.init.normal_(t, 0.0, 1.0)  # noqa: E731
        embeds = {t: dglnn.NodeEmbedding(g.num_nodes(t), a.embed_dim, f"emb_{t}", init_func=init) for t in featureless}
    in_dims = {t: (feats[t].shape[1] if t in feats else a.embed_dim) for t in g.ntypes}
    outputs = 1 if regression else sets.shape[1] if multi else schema["num_classes"]
    model = Rgcn(g, in_dims, a.hidden, outputs, len(fanouts), a.dropout)
    params = list(model.parameters()) + (list(embeds.parameters()) if a.dense_embeddings else [])
    opt = torch.optim.Adam(params, lr=a.lr)
    sparse_opt = None if a.dense_embeddings or not embeds else dgl.optim.SparseAdam(list(embeds.values()), lr=a.lr)
    if a.init_from:
        rows = load_hetgnn(model, a.init_from)
        if set(rows) != set(featureless):
            sys.exit(f"{a.init_from}: learnable rows for {sorted(rows)}, the graph's featureless types are {sorted(featureless)}")
        with torch.no_grad():
            for t, r in rows.items():
                w = embeds[t].weight
                if tuple(w.shape) != tuple(r.shape):
                    sys.exit(f"{a.init_from}: {t}'s rows are {tuple(r.shape)}, this model's {tuple(w.shape)}")
                w[:] = r

    def inputs(block):
        h = {}
        for t in block.srctypes:
            ids = block.srcnodes[t].data[dgl.NID]
            if len(ids) == 0:
                continue
            if t in feats:
                h[t] = feats[t][ids]
            else:
                h[t] = embeds[t](ids)
        return h

    def loader(ids, shuffle):
        return dgl.dataloading.DataLoader(g, {target: ids}, sampler, batch_size=a.batch, shuffle=shuffle, drop_last=False, num_workers=0)

    def errors(ids):
        """RMSE, MAE and R² of the model's values on `ids`."""
        model.eval()
        preds, ys = [], []
        with torch.no_grad():
            for _, seeds, blocks in loader(ids, False):
                preds.append(model(blocks, inputs(blocks[0]))[target][:, 0].double())
                ys.append(values[seeds[target]].double())
        model.train()
        p, y = torch.cat(preds), torch.cat(ys)
        sse = ((p - y) ** 2).sum().item()
        sst = ((y - y.mean()) ** 2).sum().item()
        n = max(len(y), 1)
        return {"rmse": (sse / n) ** 0.5, "mae": (p - y).abs().sum().item() / n, "r2": 1.0 - sse / sst if sst > 0 else 0.0}

    def label_figures(ids):
        model.eval()
        outs, ys = [], []
        with torch.no_grad():
            for _, seeds, blocks in loader(ids, False):
                outs.append(model(blocks, inputs(blocks[0]))[target])
                ys.append(sets[seeds[target]])
        model.train()
        return label_metrics(torch.cat(outs), torch.cat(ys))

    def accuracy(ids):
        model.eval()
        correct = 0
        with torch.no_grad():
            for _, seeds, blocks in loader(ids, False):
                out = model(blocks, inputs(blocks[0]))[target]
                correct += (out.argmax(1) == labels[seeds[target]]).sum().item()
        model.train()
        return correct / max(len(ids), 1)

    epochs = []
    for epoch in range(a.epochs):
        steps, loss_sum, sample_s = 0, 0.0, 0.0
        t0 = time.perf_counter()
        it = iter(loader(splits["train"], True))
        while True:
            ts = time.perf_counter()
            try:
                _, seeds, blocks = next(it)
            except StopIteration:
                break
            sample_s += time.perf_counter() - ts
            out = model(blocks, inputs(blocks[0]))[target]
            if regression:
                loss = F.mse_loss(out[:, 0], values[seeds[target]])
            elif multi:
                y = sets[seeds[target]]
                loss = F.binary_cross_entropy_with_logits(out, y, reduction="sum") / len(y)
            else:
                loss = F.cross_entropy(out, labels[seeds[target]])
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
        row = {"epoch": epoch, "loss": loss_sum / max(steps, 1), "seconds": seconds, "sample_s": sample_s, "steps": steps}
        if regression:
            valid, test = errors(splits["valid"]), errors(splits["test"])
            row["regression"] = {"valid": valid, "test": test}
            valid, test = valid["rmse"], test["rmse"]
        elif multi:
            valid, test = label_figures(splits["valid"]), label_figures(splits["test"])
            row["valid_acc"], row["test_acc"] = valid["acc"], test["acc"]
            for k in ("micro_f1", "macro_f1", "average_precision"):
                row[k] = [valid[k], test[k]]
            valid, test = valid["micro_f1"], test["micro_f1"]
        else:
            valid, test = accuracy(splits["valid"]), accuracy(splits["test"])
            row["valid_acc"], row["test_acc"] = valid, test
        row["eval_s"] = time.perf_counter() - te
        epochs.append(row)
        print(f"dgl epoch {epoch}: loss {loss_sum / max(steps, 1):.4f}  {seconds:.2f} s ({steps} steps)  valid {valid:.4f}  test {test:.4f}", file=sys.stderr)
    print(json.dumps({
        "system": "dgl", "dgl": dgl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "embeddings": "dense" if a.dense_embeddings else "sparse", "load_s": load_s, "epochs": epochs,
    }))


def train_edges(a, g, schema, feats, load_s):
    """Edge classification or regression on the split edges of --target-relations."""
    src_t, name, dst_t = a.target_relations.split("__")
    etype, rev = (src_t, name, dst_t), (dst_t, "rev_" + name, src_t)
    if a.no_reverse_edges:
        sys.exit("edge tasks here exclude the reverse edges: keep them")
    rel = next(r for r in schema["relations"] if (r["src"], r["name"], r["dst"]) == etype)
    edir = os.path.join(a.data, "edges", a.target_relations)
    regression = a.task == "edge-regression"
    classes = None if regression else rel["num_classes"]
    if regression:
        y_all = torch.from_numpy(np.load(os.path.join(edir, "values.npy")))
    else:
        y_all = torch.from_numpy(np.load(os.path.join(edir, "labels.npy")))
    splits = {s: torch.from_numpy(np.load(os.path.join(edir, f"{s}.npy"))) for s in ("train", "valid", "test")}
    fanouts = [int(f) for f in a.fanouts.split(",")]
    base = dgl.dataloading.NeighborSampler([{et: f for et in g.canonical_etypes} for f in reversed(fanouts)])
    full = dgl.dataloading.as_edge_prediction_sampler(dgl.dataloading.MultiLayerFullNeighborSampler(len(fanouts)))

    featureless = [t for t in g.ntypes if t not in feats]
    init = lambda t: nn.init.normal_(t, 0.0, 1.0)  # noqa: E731
    embeds = {t: dglnn.NodeEmbedding(g.num_nodes(t), a.embed_dim, f"emb_{t}", init_func=init) for t in featureless}
    in_dims = {t: (feats[t].shape[1] if t in feats else a.embed_dim) for t in g.ntypes}
    model = Rgcn(g, in_dims, a.hidden, a.hidden, len(fanouts), a.dropout)
    decoder = EdgeDecoder(a.hidden, 1 if regression else classes)
    opt = torch.optim.Adam(list(model.parameters()) + list(decoder.parameters()), lr=a.lr)
    sparse_opt = dgl.optim.SparseAdam(list(embeds.values()), lr=a.lr) if embeds else None

    def inputs(block):
        h = {}
        for t in block.srctypes:
            ids = block.srcnodes[t].data[dgl.NID]
            if len(ids) == 0:
                continue
            h[t] = feats[t][ids] if t in feats else embeds[t](ids)
        return h

    def loader(ids, sampler, shuffle):
        return dgl.dataloading.DataLoader(g, {etype: ids}, sampler, batch_size=a.batch, shuffle=shuffle, drop_last=False, num_workers=0)

    def decode(pair, blocks, ids=None):
        h = model(blocks, inputs(blocks[0]))
        u, v = pair.edges(etype=etype)
        if ids is None:
            ids = pair.edges[etype].data[dgl.EID]
        return decoder(h[src_t][u], h[dst_t][v]), y_all[ids]

    def evaluate(ids):
        model.eval()
        decoder.eval()
        preds, ys = [], []
        with torch.no_grad():
            for _, pair, blocks in loader(ids, full, False):
                p, y = decode(pair, blocks)
                preds.append(p)
                ys.append(y)
        model.train()
        decoder.train()
        return edge_metrics(torch.cat(preds), torch.cat(ys), classes)

    epochs = []
    for epoch in range(a.epochs):
        steps, loss_sum, sample_s, exclusion_s = 0, 0.0, 0.0, 0.0
        t0 = time.perf_counter()
        perm = splits["train"][torch.randperm(len(splits["train"]))]
        batches = [perm[i:i + a.batch] for i in range(0, len(perm), a.batch)]
        if a.hash_batches:
            tu, tv = g.find_edges(splits["train"], etype=etype)
            _, inv = torch.unique(tu.long() * g.num_nodes(dst_t) + tv.long(), return_inverse=True)
            if a.hash_per_edge:
                inv = torch.arange(len(inv))
            bucket = torch.randint(len(batches), (int(inv.max()) + 1,))[inv]
            batches = [splits["train"][bucket == b] for b in range(len(batches))]
        nominal = len(perm) / len(batches)
        for ids in batches:
            ts = time.perf_counter()
            # The batch's edges, their parallel copies (same ends: the same label
            # in a graph whose labels follow the ends) and the reverses of all
            # (edge i of rev reverses edge i) leave the graph, as hetgnn's steps do.
            bu, bv = g.find_edges(ids, etype=etype)
            _, _, every = g.edge_ids(bu, bv, return_uv=True, etype=etype)
            sub = dgl.remove_edges(dgl.remove_edges(g, every, etype=etype), every, etype=rev)
            exclusion_s += time.perf_counter() - ts
            ts = time.perf_counter()
            pair = dgl.edge_subgraph(g, {etype: ids}, relabel_nodes=True)
            seeds = {t: pair.nodes[t].data[dgl.NID] for t in pair.ntypes if pair.num_nodes(t) > 0}
            _, _, blocks = base.sample_blocks(sub, seeds)
            sample_s += time.perf_counter() - ts
            p, y = decode(pair, blocks, ids)
            loss = F.mse_loss(p[:, 0], y) if regression else F.cross_entropy(p, y)
            if a.hash_batches:
                loss = loss * (len(ids) / nominal)
            opt.zero_grad()
            if sparse_opt is not None:
                sparse_opt.zero_grad()
            loss.backward()
            opt.step()
            if sparse_opt is not None:
                sparse_opt.step()
            loss_sum += loss.item()
            steps += 1
        seconds = time.perf_counter() - t0 - exclusion_s
        te = time.perf_counter()
        valid, test = evaluate(splits["valid"]), evaluate(splits["test"])
        row = {"epoch": epoch, "loss": loss_sum / max(steps, 1), "seconds": seconds, "sample_s": sample_s, "steps": steps,
               "exclusion_s": exclusion_s, "eval_s": time.perf_counter() - te}
        if regression:
            row["regression"] = {"valid": valid, "test": test}
            shown = (valid["rmse"], test["rmse"])
        else:
            row["valid_acc"], row["test_acc"] = valid["acc"], test["acc"]
            row["macro_f1"] = [valid["macro_f1"], test["macro_f1"]]
            row["roc_auc"] = [valid.get("roc_auc"), test.get("roc_auc")]
            shown = (valid["acc"], test["acc"])
        epochs.append(row)
        print(f"dgl epoch {epoch}: loss {row['loss']:.4f}  {seconds:.2f} s ({steps} steps)  valid {shown[0]:.4f}  test {shown[1]:.4f}", file=sys.stderr)
    print(json.dumps({
        "system": "dgl", "dgl": dgl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "embeddings": "sparse", "load_s": load_s, "task": a.task, "epochs": epochs,
    }))


if __name__ == "__main__":
    main()
