#!/usr/bin/env python3
"""Bitcoin OTC trust ratings as a hetgnn graph directory with edge targets.

Input: SNAP's soc-sign-bitcoinotc.csv (Kumar et al., "Edge Weight Prediction
in Weighted Signed Networks", ICDM 2016; https://snap.stanford.edu/data/soc-sign-bitcoin-otc.html),
rows `source,target,rating,time` with ratings from -10 to +10. Output: one
featureless node type `user` (ids as in the file, 0 unused), one relation
`user__rates__user` whose edges carry a class (1: a positive rating, 0: a
negative one) and a value (rating / 10), split by time: the earliest 80% of
ratings train, the next 10% validate, the latest 10% test. The graph has no
node labels (labels.npy all -1, empty node splits): it is for edge tasks.

    python3 bench/data/bitcoin_otc.py soc-sign-bitcoinotc.csv OUT_DIR
"""

import json
import os
import sys

import numpy as np


def main():
    src_csv, out = sys.argv[1], sys.argv[2]
    rows = np.loadtxt(src_csv, delimiter=",", dtype=np.float64, ndmin=2)
    src, dst, rating, time = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2], rows[:, 3]
    users = int(max(src.max(), dst.max())) + 1
    n = len(src)
    os.makedirs(os.path.join(out, "nodes", "user"), exist_ok=True)
    os.makedirs(os.path.join(out, "edges", "user__rates__user"), exist_ok=True)
    np.save(os.path.join(out, "nodes", "user", "labels.npy"), np.full(users, -1, dtype=np.int64))
    for s in ("train", "valid", "test"):
        np.save(os.path.join(out, "nodes", "user", f"{s}.npy"), np.zeros(0, dtype=np.int64))
    np.save(os.path.join(out, "edges", "user__rates__user.npy"), np.stack([src, dst]).astype(np.int64))
    e = os.path.join(out, "edges", "user__rates__user")
    np.save(os.path.join(e, "labels.npy"), (rating > 0).astype(np.int64))
    np.save(os.path.join(e, "values.npy"), (rating / 10.0).astype(np.float32))
    order = np.argsort(time, kind="stable")
    a, b = int(n * 0.8), int(n * 0.9)
    for name, part in (("train", order[:a]), ("valid", order[a:b]), ("test", order[b:])):
        np.save(os.path.join(e, f"{name}.npy"), np.sort(part).astype(np.int64))
    schema = {
        "name": "bitcoin-otc",
        "target": "user",
        "num_classes": 1,
        "node_types": {"user": {"count": users, "feature_dim": None}},
        "relations": [{"src": "user", "name": "rates", "dst": "user", "count": n, "num_classes": 2, "values": True}],
    }
    with open(os.path.join(out, "schema.json"), "w") as f:
        json.dump(schema, f, indent=2)
    print(f"{out}: {users} users, {n} ratings ({(rating > 0).mean():.3f} positive)")


if __name__ == "__main__":
    main()
