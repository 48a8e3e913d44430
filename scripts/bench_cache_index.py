"""Index benchmark: lookup p50/p99 and memory per entry at N entries in one tenant.

    python scripts/bench_cache_index.py --n 1000000 --lib usearch [--redis] [--ef 64,128,256]

Vectors are synthetic unit vectors (384-d) in clusters, queries are perturbed copies of stored
rows (a paraphrase lands near its original). With --redis the timed lookup is what the worker
does after embedding: the index search plus one pipelined HGETALL of the candidates from Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import time
from typing import Any

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(1, n // 20), dim)).astype(np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    step = 100_000
    for start in range(0, n, step):
        m = min(step, n - start)
        rows = centers[rng.integers(0, len(centers), m)] + 0.6 * rng.standard_normal(
            (m, dim)
        ).astype(np.float32)
        out[start : start + m] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out


def time_searches(
    args: argparse.Namespace,
    search: Any,
    queries: np.ndarray,
    keys: np.ndarray,
    picks: np.ndarray,
) -> dict[str, Any]:
    """`--repeat` passes over the queries: p50/p99 per pass (the median of each reported) and
    recall@1 (the query's own original ranked first)."""
    p50s, p99s = [], []
    recall = 0
    for _ in range(args.repeat):
        times = []
        recall = 0
        for i, q in enumerate(queries):
            t = time.perf_counter()
            res = search(q)
            times.append((time.perf_counter() - t) * 1000)
            if args.lib == "hnswlib":
                top = int(res[0][0][0])
            else:
                top = res[0][0] if res else -1
            recall += top == int(keys[picks[i]])
        p50s.append(statistics.median(times))
        p99s.append(float(np.percentile(times, 99)))
    return {
        "search_p50_ms": round(statistics.median(p50s), 3),
        "search_p99_ms": round(statistics.median(p99s), 3),
        "search_p99_ms_runs": [round(x, 3) for x in p99s],
        "recall_at_1": round(recall / args.queries, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--lib", choices=["usearch", "hnswlib", "numpy"], default="usearch")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--redis", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--ef",
        default="",
        help="usearch: comma-separated expansion_search values to time on the one build "
        "(default: the index's own); --redis uses the last",
    )
    args = ap.parse_args()
    vecs = make_vectors(args.n, args.dim)
    keys = np.arange(1, args.n + 1, dtype=np.int64)
    base = rss_mb()
    t0 = time.perf_counter()
    if args.lib == "usearch":
        from shared.cache.index import AnnIndex

        index = AnnIndex(args.dim)
        index.add_many(keys, vecs)
        search = lambda q: index.search(q, 4, 0.0)  # noqa: E731
    elif args.lib == "hnswlib":
        import hnswlib

        h = hnswlib.Index(space="ip", dim=args.dim)
        h.init_index(max_elements=args.n, M=16, ef_construction=128)
        h.add_items(vecs, keys)
        h.set_ef(64)
        search = lambda q: h.knn_query(q, k=4)  # noqa: E731
    else:
        from shared.cache.index import ExactIndex

        ex = ExactIndex(args.dim, capacity=args.n)
        for k, v in zip(keys, vecs, strict=True):
            ex.add(int(k), v)
        search = lambda q: ex.search(q, 4, 0.0)  # noqa: E731
    build_s = time.perf_counter() - t0
    mem_mb = rss_mb() - base
    rng = np.random.default_rng(1)
    picks = rng.integers(0, args.n, args.queries)
    queries = vecs[picks] + 0.05 * rng.standard_normal((args.queries, args.dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for q in queries[:100]:
        search(q)
    efs = [int(x) for x in args.ef.split(",") if x] if args.lib == "usearch" else []
    out = {
        "lib": args.lib,
        "n": args.n,
        "build_s": round(build_s, 1),
        "index_mem_mb": round(mem_mb, 1),
        "bytes_per_entry": round(mem_mb * 2**20 / args.n),
        "maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    for ef in efs or [None]:
        if ef is not None:
            index.expansion_search = ef
        result = time_searches(args, search, queries, keys, picks)
        if ef is None:
            out.update(result)
        else:
            out[f"ef{ef}"] = result
    if args.redis and args.lib == "usearch":
        out.update(asyncio.run(redis_lookup(index, vecs, queries, args.n)))
    print(json.dumps(out))


async def redis_lookup(
    index: object, vecs: np.ndarray, queries: np.ndarray, n: int
) -> dict[str, float]:
    """Index search + one pipelined HGETALL of the candidates, as CacheStore.candidates does."""
    import redis.asyncio as aioredis

    from shared.cache.store import CacheStore
    from shared.keys import Keys

    prefix = f"ftbench{os.getpid()}"
    r = aioredis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)
    keys = Keys(prefix)
    store = CacheStore(r, keys, dim=vecs.shape[1], ttl_s=3600, max_entries=n + 1, ann_min_entries=1)
    # Reuse the built index as the store's partition; write the entries the queries can hit.
    from shared.cache.index import Partition

    part = Partition(vecs.shape[1], 1)
    part.index = index  # type: ignore[assignment]
    store.index._parts[("t", "p")] = part
    exp = time.time() + 3600
    store.index._expires = dict.fromkeys(range(1, n + 1), exp)
    store.index._where = dict.fromkeys(range(1, n + 1), ("t", "p"))
    # Only the entries the queries reach are written: Redis is shared with other work here.
    reach = {key for q in queries for key, _ in index.search(q, 4, 0.0)}  # type: ignore[attr-defined]
    fields = {
        "t": "t",
        "q": "question text here",
        "a": "answer " * 40,
        "ct": 60,
        "ck": "",
        "ctx": "",
    }
    async with r.pipeline(transaction=False) as pipe:
        for key in reach:
            pipe.hset(keys.cache_entry(str(key)), mapping=fields)
        await pipe.execute()
    p50s, p99s = [], []
    for _ in range(3):
        times = []
        for q in queries:
            t = time.perf_counter()
            await store.candidates("t", "p", q, k=4, min_score=0.0)
            times.append((time.perf_counter() - t) * 1000)
        p50s.append(statistics.median(times))
        p99s.append(float(np.percentile(times, 99)))
    cursor = 0
    while True:
        cursor, found = await r.scan(cursor, match=f"{prefix}:*", count=10000)
        if found:
            await r.delete(*found)
        if cursor == 0:
            break
    await r.aclose()
    return {
        "lookup_with_redis_p50_ms": round(statistics.median(p50s), 3),
        "lookup_with_redis_p99_ms": round(statistics.median(p99s), 3),
    }


if __name__ == "__main__":
    main()
