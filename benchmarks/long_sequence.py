"""Long sequences: the efficient kernels against dense attention, time and peak memory, one run.

For each length T (default 1k, 2k, 4k, 8k, 16k; B=1, E=256, H=8, one thread) and each path

* ``mean``    posterior-mean output only (``need_weights=False``; dense uses fused SDPA),
* ``weights`` posterior-mean output *and* the weights (``need_weights=True``, per head),
* ``S=8``     Dirichlet attention posterior, 8 weight draws in one pass (``num_samples=8``),

the layer runs dense and with each kernel (``local`` window 64, ``topk`` k=64, ``lowrank`` r=64),
forward only under ``no_grad``. Every case runs in a **fresh subprocess**; peak memory is that
process's peak resident set (``getrusage`` maxrss) minus its resident set just before the call,
so one case's allocations never hide in another's. Dense cases whose predicted peak (the last
measured dense peak of that path scaled by T²) exceeds ``--max-gib`` are not run and reported as
"not run (would need N GiB)". Ratios are against dense in this run: ``speed-up`` = dense time /
kernel time, ``mem`` = kernel peak / dense peak.

Usage: python benchmarks/long_sequence.py [--lengths 1024 2048 ...] [--max-gib 6] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

KERNELS = {
    "dense": None,
    "local": {"window": 64},
    "topk": {"k": 64},
    "lowrank": {"rank": 64},
}
PATHS = ("mean", "weights", "S=8")
GIB = 1024**3


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_case(method: str, path: str, T: int, E: int, H: int, repeats: int) -> dict:
    """One measurement in this (fresh) process."""
    import torch

    from bayesattn.nn.attention import BayesianMultiheadAttention
    from bayesattn.nn.kernels import get_kernel
    from bayesattn.nn.modes import attention_mode

    torch.set_num_threads(1)
    torch.manual_seed(0)
    opts = dict(KERNELS[method] or {})
    if method == "lowrank":
        opts["max_len"] = T
    kernel = get_kernel(method, **opts) if method != "dense" else None
    fam = "dirichlet" if path == "S=8" else None
    m = BayesianMultiheadAttention(E, H, batch_first=True, family=fam, kernel=kernel).eval()
    x = torch.randn(1, T, E)

    def call():
        with torch.no_grad(), attention_mode("guide" if fam else "mean"):
            if path == "mean":
                return m(x, x, x, need_weights=False)
            if path == "weights":
                return m(x, x, x, need_weights=True, average_attn_weights=False)
            return m(x, x, x, need_weights=False, num_samples=8)

    base = _rss()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"time_s": min(times), "peak_bytes": max(peak - base, 0)}


def _subprocess(method, path, T, args) -> dict:
    cmd = [sys.executable, __file__, "--case", method, path, str(T), "--embed", str(args.embed)]
    cmd += ["--heads", str(args.heads), "--repeats", str(args.repeats if T <= 2048 else 1)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _fmt_mem(b: float) -> str:
    return f"{b / 2**20:8.1f} MiB" if b < GIB else f"{b / GIB:8.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls for T <= 2048 (min kept)")
    ap.add_argument("--max-gib", type=float, default=6.0, help="skip dense cases predicted above")
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--quick", action="store_true", help="T = 256, 512 only (smoke run)")
    ap.add_argument("--case", nargs=3, metavar=("METHOD", "PATH", "T"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        method, path, T = args.case
        res = run_case(method, path, int(T), args.embed, args.heads, args.repeats)
        print(json.dumps(res))
        return
    lengths = [256, 512] if args.quick else args.lengths
    print(f"B=1, E={args.embed}, H={args.heads}, 1 thread, forward under no_grad; kernels: "
          f"{ {k: v for k, v in KERNELS.items() if v} }")  # fmt: skip
    results: dict = {}
    dense_last: dict = {}  # path -> (T, peak)
    paths = [p for p in PATHS if p in args.paths]
    for T in lengths:
        for path in paths:
            for method in KERNELS:
                if method == "dense" and path in dense_last:
                    T0, p0 = dense_last[path]
                    need = p0 * (T / T0) ** 2
                    if need > args.max_gib * GIB:
                        results[(T, path, method)] = {"skipped": need}
                        print(f"T={T:6d} {path:8s} {method:8s} not run (would need "
                              f"{need / GIB:.1f} GiB)", flush=True)  # fmt: skip
                        continue
                r = _subprocess(method, path, T, args)
                results[(T, path, method)] = r
                if "error" in r:
                    print(f"T={T:6d} {path:8s} {method:8s} FAILED: {r['error']}", flush=True)
                    continue
                if method == "dense":
                    dense_last[path] = (T, max(r["peak_bytes"], 1))
                print(f"T={T:6d} {path:8s} {method:8s} {r['time_s'] * 1e3:10.1f} ms "
                      f"{_fmt_mem(r['peak_bytes'])}", flush=True)  # fmt: skip

    print("\nRatios against dense in this run (speed-up = dense time / kernel time; "
          "mem = kernel peak / dense peak):")  # fmt: skip
    hdr = f"{'T':>6} {'path':8s} " + " ".join(f"{m:>24s}" for m in KERNELS if m != "dense")
    print(hdr)
    for T in lengths:
        for path in paths:
            d = results.get((T, path, "dense"), {})
            cells = []
            for m in KERNELS:
                if m == "dense":
                    continue
                r = results.get((T, path, m), {})
                if "time_s" not in r:
                    cells.append(f"{'failed':>24s}")
                elif "time_s" in d:
                    sp = d["time_s"] / r["time_s"]
                    mem = r["peak_bytes"] / max(d["peak_bytes"], 1)
                    cells.append(f"{sp:8.2f}x  mem {mem:9.4f}")
                else:
                    need = d.get("skipped")
                    note = f"dense n/r ({need / GIB:.0f} GiB)" if need else "no dense"
                    cells.append(f"{note:>24s}")
            print(f"{T:6d} {path:8s} " + " ".join(cells))
    print("\nGrowth of the kernels' peak memory per doubling of T (2.0 = linear):")
    for path in paths:
        for m in KERNELS:
            if m == "dense":
                continue
            peaks = [results.get((T, path, m), {}).get("peak_bytes") for T in lengths]
            growth = [
                f"{b / a:.2f}" if a and b else "-" for a, b in zip(peaks, peaks[1:], strict=False)
            ]
            print(f"  {path:8s} {m:8s} " + " ".join(growth))


if __name__ == "__main__":
    main()
