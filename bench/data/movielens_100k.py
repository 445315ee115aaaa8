#!/usr/bin/env python3
"""MovieLens 100K ratings as a hetgnn graph directory with edge targets.

Input: the `ml-100k` folder of GroupLens (F. M. Harper and J. A. Konstan,
"The MovieLens Datasets: History and Context", ACM TiiS 5(4), 2015;
https://grouplens.org/datasets/movielens/100k/): `u.data` (user, movie,
rating 1-5, time), `u.user` (user, age, gender, occupation, zip) and
`u.item` (movie, title, release date, ..., 19 genre flags). GroupLens allows
research use and no redistribution: the data is not in this repository.

Output: node types `user` (943; features: age / 100, gender one-hot,
occupation one-hot, 24 columns) and `movie` (1,682; features: the 19 genre
flags and (release year - 1900) / 100, 20 columns); one relation
`user__rates__movie` (100,000 edges) whose edges carry a value (the rating)
and a class (rating - 1, five classes), split at random (seeded) into 80%
train, 10% valid, 10% test. No node labels: the graph is for edge tasks.

With `--user-age`, the graph is for node regression instead: the target type
is `user`, each user's age is its value (and left out of its features, which
keep gender and occupation, 23 columns), users split at random (seeded) into
80% train, 10% valid, 10% test; the edges carry their targets as before.

    python3 bench/data/movielens_100k.py ml-100k OUT_DIR [--user-age]
"""

import json
import os
import sys

import numpy as np


def main():
    src, out = sys.argv[1], sys.argv[2]
    user_age = "--user-age" in sys.argv[3:]
    ratings = np.loadtxt(os.path.join(src, "u.data"), dtype=np.int64, ndmin=2)
    user, movie, rating = ratings[:, 0] - 1, ratings[:, 1] - 1, ratings[:, 2]
    with open(os.path.join(src, "u.user"), encoding="latin-1") as f:
        users = [line.rstrip("\n").split("|") for line in f if line.strip()]
    with open(os.path.join(src, "u.item"), encoding="latin-1") as f:
        movies = [line.rstrip("\n").split("|") for line in f if line.strip()]
    n_users, n_movies, n = len(users), len(movies), len(rating)
    assert user.max() < n_users and movie.max() < n_movies, "ids beyond u.user / u.item"
    occupations = sorted({u[3] for u in users})
    uf = np.zeros((n_users, 3 + len(occupations)), dtype=np.float32)
    for u in users:
        i = int(u[0]) - 1
        uf[i, 0] = int(u[1]) / 100.0
        uf[i, 1 + (u[2] == "F")] = 1.0
        uf[i, 3 + occupations.index(u[3])] = 1.0
    mf = np.zeros((n_movies, 20), dtype=np.float32)
    for m in movies:
        i = int(m[0]) - 1
        mf[i, :19] = [float(x) for x in m[5:24]]
        year = m[2][-4:]
        mf[i, 19] = (int(year) - 1900) / 100.0 if year.isdigit() else 0.0
    ages = (uf[:, 0] * 100.0).astype(np.float32)
    if user_age:
        uf = uf[:, 1:]
    for t, feats in (("user", uf), ("movie", mf)):
        d = os.path.join(out, "nodes", t)
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "features.npy"), feats)
        np.save(os.path.join(d, "labels.npy"), np.full(len(feats), -1, dtype=np.int64))
        splits = {s: np.zeros(0, dtype=np.int64) for s in ("train", "valid", "test")}
        if user_age and t == "user":
            np.save(os.path.join(d, "values.npy"), ages)
            order = np.random.default_rng(0).permutation(n_users)
            a, b = int(n_users * 0.8), int(n_users * 0.9)
            splits = {"train": order[:a], "valid": order[a:b], "test": order[b:]}
        for s, part in splits.items():
            np.save(os.path.join(d, f"{s}.npy"), np.sort(part).astype(np.int64))
    e = os.path.join(out, "edges", "user__rates__movie")
    os.makedirs(e, exist_ok=True)
    np.save(os.path.join(out, "edges", "user__rates__movie.npy"), np.stack([user, movie]).astype(np.int64))
    np.save(os.path.join(e, "labels.npy"), (rating - 1).astype(np.int64))
    np.save(os.path.join(e, "values.npy"), rating.astype(np.float32))
    order = np.random.default_rng(0).permutation(n)
    a, b = int(n * 0.8), int(n * 0.9)
    for name, part in (("train", order[:a]), ("valid", order[a:b]), ("test", order[b:])):
        np.save(os.path.join(e, f"{name}.npy"), np.sort(part).astype(np.int64))
    schema = {
        "name": "movielens-100k",
        "target": "user" if user_age else "movie",
        "num_classes": 1,
        "node_types": {
            "user": {"count": n_users, "feature_dim": int(uf.shape[1])},
            "movie": {"count": n_movies, "feature_dim": int(mf.shape[1])},
        },
        "relations": [
            {"src": "user", "name": "rates", "dst": "movie", "count": n, "num_classes": 5, "values": True}
        ],
    }
    if user_age:
        schema["values"] = True
    with open(os.path.join(out, "schema.json"), "w") as f:
        json.dump(schema, f, indent=2)
    print(f"{out}: {n_users} users, {n_movies} movies, {n} ratings (mean {rating.mean():.3f})")


if __name__ == "__main__":
    main()
