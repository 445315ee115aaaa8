#!/usr/bin/env python3
"""DGL serving peer: a Python HTTP server answering `POST /v1/predict` with
the R-GCN of bench/baselines/dgl_rgcn.py, loaded with the weights of a hetgnn
checkpoint, the way a DGL user would serve it (one request, one sampled
forward pass on one inference thread; a thread per connection).

The weights are mapped onto the model by `dgl_rgcn.load_hetgnn` (its
docstring lists the mapping).

Reverse relations are named `rev_<rel>` on both sides. `--check N` compares
this model's full-neighbourhood answers for the first N target nodes with
hetgnn's exact inference (`predict --inference exact --embeddings`) and
exits: the mapping is right when they agree to 1e-4.

Same request and answer JSON as `hetgnn serve` for `/v1/predict` (dense ids),
plus `GET /readyz`. Needs the environment of dgl_rgcn.py and `pip install
safetensors`.
"""

import argparse
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch
from safetensors.numpy import load_file

import dgl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dgl_rgcn import Rgcn, load, load_hetgnn  # noqa: E402


def build(data, checkpoint, fanouts, hidden):
    g, schema, target, feats, _, _, _ = load(data, True)
    # The rows' width is the checkpoint's.
    emb_path = os.path.join(checkpoint, "embeddings.safetensors")
    widths = {}
    if os.path.exists(emb_path):
        for k, v in load_file(emb_path).items():
            if k.startswith("embed.") and k.endswith(".data"):
                widths[k[len("embed."):-len(".data")]] = v.shape[1]
    in_dims = {t: (feats[t].shape[1] if t in feats else widths[t]) for t in g.ntypes if t in feats or t in widths}
    model = Rgcn(g, in_dims, hidden, schema["num_classes"], len(fanouts), 0.0)
    embeds = load_hetgnn(model, checkpoint)
    inputs = {t: (feats[t] if t in feats else embeds[t]) for t in in_dims}
    model.eval()
    return g, target, inputs, model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--checkpoint", required=True, help="a hetgnn epoch-* checkpoint directory")
    ap.add_argument("--fanouts", default="10,10", help="seeds outward, as hetgnn")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--check", type=int, default=0, help="compare N nodes with hetgnn's exact inference and exit")
    ap.add_argument("--exact", help="with --check: hetgnn's predict --inference exact --embeddings .npy")
    a = ap.parse_args()
    fanouts = [int(f) for f in a.fanouts.split(",")]
    g, target, inputs, model = build(a.data, a.checkpoint, fanouts, a.hidden)

    def forward(ids, sampler):
        _, _, blocks = sampler.sample_blocks(g, {target: ids})
        h = {t: inputs[t][blocks[0].srcnodes[t].data[dgl.NID]] for t in blocks[0].srctypes if t in inputs and blocks[0].num_src_nodes(t) > 0}
        with torch.no_grad():
            # Layer by layer, keeping the last layer's input (hetgnn's embeddings).
            for i, (layer, block) in enumerate(zip(model.layers, blocks)):
                if i + 1 == len(model.layers):
                    emb = h[target][: block.num_dst_nodes(target)]
                h = layer(block, h)
                if i + 1 < len(model.layers):
                    h = {t: torch.relu(x) for t, x in h.items()}
        return h[target], emb

    if a.check:
        full = dgl.dataloading.MultiLayerFullNeighborSampler(len(fanouts))
        ids = torch.arange(a.check)
        _, emb = forward(ids, full)
        want = np.load(a.exact)[: a.check]
        err = float(np.abs(emb.numpy() - want).max())
        print(json.dumps({"nodes": a.check, "max_abs_diff": err}))
        sys.exit(0 if err < 1e-4 else 1)

    sampler = dgl.dataloading.NeighborSampler([{et: f for et in g.canonical_etypes} for f in reversed(fanouts)])
    count = g.num_nodes(target)
    # One inference thread: concurrent DGL sampling from request threads
    # failed intermittently, torch's own threads already use every core, and
    # every thread that calls torch gets an OpenMP team of its own (a thread
    # per connection under load burned the CPU spinning).
    inference = ThreadPoolExecutor(max_workers=1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave in two writes: with Nagle's algorithm the
        # body waits for the client's delayed ACK of the headers (40 ms on
        # Linux), which timed that stall instead of DGL (before 2026-12-06).
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def reply(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/readyz":
                self.reply(200, {"ready": True})
            else:
                self.reply(404, {"error": "no such endpoint"})

        def do_POST(self):
            if self.path != "/v1/predict":
                return self.reply(404, {"error": "no such endpoint"})
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                ids = [int(i) for i in req["ids"]]
                if not ids or min(ids) < 0 or max(ids) >= count:
                    return self.reply(404, {"error": "unknown ids"})
            except (ValueError, KeyError, TypeError) as e:
                return self.reply(400, {"error": str(e)})
            try:
                logits, _ = inference.submit(forward, torch.tensor(ids), sampler).result()
            except Exception as e:  # noqa: BLE001 - answer 500 and say why
                print(f"dgl serve: {e!r}", file=sys.stderr, flush=True)
                return self.reply(500, {"error": repr(e)})
            self.reply(200, {"type": target, "ids": ids, "predictions": logits.argmax(1).tolist()})

    # socketserver's default backlog (5) would refuse connections under load.
    ThreadingHTTPServer.request_queue_size = 4096
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    print(f"dgl serve: listening on 127.0.0.1:{a.port} (dgl {dgl.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads)", file=sys.stderr, flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
