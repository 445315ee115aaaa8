#!/usr/bin/env python3
"""Latency of `hetgnn serve` answers with and without new nodes in the request.

    serve_new_nodes_latency.py ADDR LABEL

ADDR is a running `hetgnn serve` of a model trained on a mag-like graph
(paper features of width 128, relations `cites` and `writes`); LABEL names
the run in the output. Sends 40 sequential `/v1/predict` requests of each
kind (a stored paper; a new paper with 10 citations and 3 authors) and
prints one JSON object of p50, p90 and max milliseconds per kind. Standard
library only.
"""

import json
import random
import statistics
import sys
import time
import urllib.request


def post(addr, body):
    req = urllib.request.Request(
        f"http://{addr}/v1/predict",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t = time.perf_counter()
    urllib.request.urlopen(req).read()
    return time.perf_counter() - t


def new_paper(_):
    return {
        "ids": ["new"],
        "new_nodes": [{"type": "paper", "id": "new", "features": [random.gauss(0, 1) for _ in range(128)]}],
        "new_edges": [{"relation": "cites", "src": "new", "dst": random.randrange(36000)} for _ in range(10)]
        + [{"relation": "writes", "src": random.randrange(50000), "dst": "new"} for _ in range(3)],
    }


def main():
    addr, label = sys.argv[1], sys.argv[2]
    random.seed(0)
    post(addr, {"ids": [0]})
    out = {}
    for name, body in [("stored node, no additions", lambda i: {"ids": [i]}), ("new paper, 10 cites + 3 authors", new_paper)]:
        ms = sorted(post(addr, body(i * 97)) * 1000 for i in range(40))
        out[name] = {"p50_ms": round(statistics.median(ms), 2), "p90_ms": round(ms[int(0.9 * len(ms))], 2), "max_ms": round(ms[-1], 2)}
    print(json.dumps({label: out}))


if __name__ == "__main__":
    main()
