"""Long sequences: the efficient kernels against dense attention and torch, time and peak memory.

For each length T (default 2k, 8k, 32k; B=1, E=256, H=8, one thread) and each path

* ``mean``    posterior-mean output only (``need_weights=False``; dense uses fused SDPA),
* ``weights`` posterior-mean output *and* the weights (``need_weights=True``, per head),
* ``S=8``     a Bayesian layer (``--family``, default logistic-normal: drawing is cheap, so the
              path measures attention, not a Gamma sampler), 8 weight draws in one pass,

one ``BayesianMultiheadAttention`` runs dense and with each kernel (``local`` window 64,
``local_global`` window 64 + the token at position 0, ``topk`` k=64, ``cluster_topk`` k=64,
``tiled`` exact in query tiles, ``lowrank`` r=64), and ``torch`` is ``nn.MultiheadAttention``
(its fused SDPA fast path for ``mean``), forward only under ``no_grad``.

* **Peak memory**: each (method, path, T) runs once in a **fresh subprocess**; its peak is the
  process's peak resident set (``getrusage`` maxrss, which sees torch's allocations) minus its
  resident set just before the call. The subprocess runs with glibc's mmap threshold fixed at
  64 KiB (``MALLOC_MMAP_THRESHOLD_``), so that every large block is mapped and returned on its
  own: without it, the same call measured 150 or 240 MiB from run to run (local + global at
  T = 8192, weights path); with it, the same to 0.1 MiB. (Only there: the timing subprocesses
  keep glibc's default, under which mapping every large block would slow local attention 2.5×.)
* **Time**: per (path, T), one subprocess times every method that ran, alternately
  (``_timing.interleaved``, median), so load drifts on a shared machine hit all alike. Cases too
  slow to repeat (T > 8192, S=8 above T = 2048, or a first call over ``--slow-s`` seconds) are
  timed by their single call in the memory subprocess (marked "single call").

Not run (reported as such): dense/torch cases whose predicted peak (the last measured one of that
path scaled by T²) exceeds ``--max-gib``; exact ``topk`` above ``--topk-max`` (it scores every key,
O(T²) time) and ``cluster_topk`` above ``--cluster-max`` (its gathers are slow on CPU); ``tiled`` S=8 above ``--tiled-draws-max`` (O(S·T²) draws, however little memory); the
``tiled`` weights path (its weights are the dense matrix, by request). Ratios: ``speed-up`` = baseline
time / method time, ``mem`` = method peak / baseline peak. Results: printed, and
``benchmarks/results/long_sequence.json`` with ``long_sequence.png`` (time and memory against T).

Usage: python benchmarks/long_sequence.py [--lengths 2048 8192 32768] [--max-gib 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

KERNELS: dict[str, dict | None] = {
    "torch": None,
    "dense": None,
    "local": {"window": 64},
    "local_global": {"window": 64, "global_tokens": (0,)},
    "topk": {"k": 64},
    "cluster_topk": {"k": 64},
    "tiled": {"tile": 512},
    "lowrank": {"rank": 64},
}
PATHS = ("mean", "weights", "S=8")
GIB = 1024**3


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


FAMILY = "logistic_normal"  # S=8 path; set by --family


def make_call(method: str, path: str, T: int, E: int, H: int):
    """A no-argument function running one forward pass of ``method`` on ``path``."""
    import torch

    from bayesattn.nn.attention import BayesianMultiheadAttention
    from bayesattn.nn.modes import attention_mode
    from bayesattn.nn.supports import get_support

    torch.manual_seed(0)
    x = torch.randn(1, T, E)
    if method == "torch":
        tm = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()

        def call_torch():
            with torch.no_grad():
                return tm(x, x, x, need_weights=path == "weights", average_attn_weights=False)

        return call_torch
    opts = dict(KERNELS[method] or {})
    if method == "lowrank":
        opts["max_len"] = T
    kernel = get_support(method, **opts) if method != "dense" else None
    fam = FAMILY if path == "S=8" else None
    m = BayesianMultiheadAttention(E, H, batch_first=True, family=fam, support=kernel).eval()

    def call():
        with torch.no_grad(), attention_mode("guide" if fam else "mean"):
            if path == "mean":
                return m(x, x, x, need_weights=False)
            if path == "weights":
                return m(x, x, x, need_weights=True, average_attn_weights=False)
            return m(x, x, x, need_weights=False, num_samples=8)

    return call


def run_memory(method: str, path: str, T: int, E: int, H: int) -> dict:
    """Peak memory of one call, in this (fresh) process."""
    import torch

    torch.set_num_threads(1)
    call = make_call(method, path, T, E, H)
    base = _rss()
    t0 = time.perf_counter()
    out = call()
    dt = time.perf_counter() - t0
    del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_bytes": max(peak - base, 0), "first_call_s": dt}


def run_timing(methods: list[str], path: str, T: int, E: int, H: int, repeats: int) -> dict:
    """Median ms per call of every method, timed alternately in this process."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _timing import interleaved

    torch.set_num_threads(1)
    fns = {m: make_call(m, path, T, E, H) for m in methods}
    return interleaved(fns, repeats)


def _sub(args_list: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *args_list]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if args_list[0] == "--mem":
        # a fixed mmap threshold makes the peak resident set reproducible (module docstring); not
        # for timing: mapping every large block costs page faults (local attention 2.5× slower)
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines() or [f"exit {r.returncode} (killed?)"]
        return {"error": lines[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _fmt_mem(b: float) -> str:
    return f"{b / 2**20:8.1f} MiB" if b < GIB else f"{b / GIB:8.2f} GiB"


def _skip_reason(method: str, path: str, T: int, args, last: dict) -> str | None:
    if method == "torch" and path == "S=8":
        return "n/a (no posterior)"
    if method == "topk" and T > args.topk_max:
        return f"not run (T > {args.topk_max}: scores every key)"
    if path == "S=8" and method not in args.s8_methods:
        return "not run (--s8-methods)"
    if method == "cluster_topk" and T > args.cluster_max:
        return f"not run (T > {args.cluster_max}: slow gathers on CPU)"
    if method == "tiled" and path == "weights":
        return "n/a (= dense: weights asked for)"
    if method == "tiled" and path == "S=8" and T > args.tiled_draws_max:
        return f"not run (T > {args.tiled_draws_max}: S·T² draws)"
    if method in ("dense", "torch") and (method, path) in last:
        T0, p0 = last[(method, path)]
        need = p0 * (T / T0) ** 2
        if need > args.max_gib * GIB:
            return f"not run (would need {need / GIB:.0f} GiB)"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds for T <= 2048")
    ap.add_argument("--max-gib", type=float, default=8.0, help="skip dense cases predicted above")
    ap.add_argument("--topk-max", type=int, default=8192)
    ap.add_argument("--tiled-draws-max", type=int, default=2048)
    ap.add_argument("--cluster-max", type=int, default=2048)
    ap.add_argument("--s8-methods", nargs="+", default=["dense", "local", "local_global", "tiled",
                    "lowrank"], help="methods run in the S=8 path")  # fmt: skip
    ap.add_argument("--slow-s", type=float, default=20.0, help="single-call timing above this")
    ap.add_argument("--family", default="logistic_normal", help="family of the S=8 path")
    ap.add_argument("--methods", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--out", default="long_sequence", help="results name (benchmarks/results/)")
    ap.add_argument("--quick", action="store_true", help="T = 256, 512 only (smoke run)")
    ap.add_argument("--mem", nargs=3, metavar=("METHOD", "PATH", "T"), help=argparse.SUPPRESS)
    ap.add_argument("--time", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--replot", metavar="JSON", help="only redraw the figure from a results file")
    args = ap.parse_args()
    global FAMILY
    FAMILY = args.family
    if args.replot:  # redraw the figure from a results file
        doc = json.load(open(args.replot))
        t = doc["tables"][0]
        res = {}
        for row in t["rows"]:
            r = dict(zip(t["columns"], row, strict=True))
            if r["ms"] is not None:
                res[(r["T"], r["path"], r["method"])] = {
                    "ms": r["ms"], "peak_bytes": r["peak_mib"] * 2**20
                }  # fmt: skip
        lengths = sorted({k[0] for k in res})
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _results import RESULTS_DIR

        print(_figure(res, lengths, list(KERNELS), RESULTS_DIR, args.out))
        return
    if args.mem:
        method, path, T = args.mem
        print(json.dumps(run_memory(method, path, int(T), args.embed, args.heads)))
        return
    if args.time:
        path, T, reps, *methods = args.time
        res = run_timing(methods, path, int(T), args.embed, args.heads, int(reps))
        print(json.dumps(res))
        return
    lengths = [256, 512] if args.quick else args.lengths
    methods = [m for m in KERNELS if m in args.methods]
    paths = [p for p in PATHS if p in args.paths]
    print(f"B=1, E={args.embed}, H={args.heads}, 1 thread, forward under no_grad; kernels: "
          f"{ {k: v for k, v in KERNELS.items() if v} }")  # fmt: skip
    res: dict[tuple[int, str, str], dict] = {}
    last: dict[tuple[str, str], tuple[int, int]] = {}
    common = ["--embed", str(args.embed), "--heads", str(args.heads), "--family", args.family]
    for T in lengths:
        for path in paths:
            ran = []
            for m in methods:
                why = _skip_reason(m, path, T, args, last)
                if why:
                    res[(T, path, m)] = {"skipped": why}
                    print(f"T={T:6d} {path:8s} {m:12s} {why}", flush=True)
                    continue
                r = _sub(["--mem", m, path, str(T), *common])
                res[(T, path, m)] = r
                if "error" in r:
                    print(f"T={T:6d} {path:8s} {m:12s} FAILED: {r['error']}", flush=True)
                    continue
                single = T > 8192 or (path == "S=8" and T > 2048) or r["first_call_s"] > args.slow_s
                if single:
                    r["ms"] = 1e3 * r["first_call_s"]
                    r["timing"] = "single call"
                else:
                    ran.append(m)
                if m in ("dense", "torch"):
                    last[(m, path)] = (T, max(r["peak_bytes"], 1))
                print(f"T={T:6d} {path:8s} {m:12s} peak {_fmt_mem(r['peak_bytes'])} "
                      f"(first call {r['first_call_s']:.2f} s)", flush=True)  # fmt: skip
            reps = args.repeats if T <= 2048 else (2 if T <= 8192 else 1)
            if ran:
                t = _sub(["--time", path, str(T), str(reps), *ran, *common])
                for m in ran:
                    if "error" in t:
                        res[(T, path, m)]["time_error"] = t["error"]
                    else:
                        res[(T, path, m)]["ms"] = t[m]
                print(f"T={T:6d} {path:8s} times (ms, median, interleaved): "
                      + ", ".join(f"{m} {t.get(m, float('nan')):.1f}" for m in ran), flush=True)  # fmt: skip
    report(res, lengths, paths, methods, args)


def _ratio(res, T, path, m, base, key) -> float | None:
    a, b = res.get((T, path, m), {}), res.get((T, path, base), {})
    if key not in a or key not in b or not a[key] or not b[key]:
        return None
    return b[key] / a[key] if key == "ms" else a[key] / b[key]


def report(res, lengths, paths, methods, args) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _results import RESULTS_DIR, table, write_results

    cols = ["T", "path", "method", "ms", "peak_mib", "speedup_vs_dense", "speedup_vs_torch",
            "mem_vs_dense", "mem_vs_torch", "note"]  # fmt: skip
    rows = []
    print("\nRatios (speed-up = baseline time / method time; mem = method peak / baseline peak):")
    print(f"{'T':>6} {'path':8s} {'method':12s} {'ms':>10s} {'peak':>12s} {'x dense':>8s} "
          f"{'x torch':>8s} {'mem/dense':>10s} {'mem/torch':>10s}")  # fmt: skip

    def f(x, fmt):
        return format(x, fmt) if x is not None else "-"

    for T in lengths:
        for path in paths:
            for m in methods:
                r = res.get((T, path, m), {})
                ms, pk = r.get("ms"), r.get("peak_bytes")
                sd, st = (
                    _ratio(res, T, path, m, "dense", "ms"),
                    _ratio(res, T, path, m, "torch", "ms"),
                )
                md = _ratio(res, T, path, m, "dense", "peak_bytes")
                mt = _ratio(res, T, path, m, "torch", "peak_bytes")
                note = (
                    r.get("skipped")
                    or r.get("error")
                    or r.get("time_error")
                    or r.get("timing")
                    or ""
                )
                rows.append(
                    [T, path, m, ms, None if pk is None else pk / 2**20, sd, st, md, mt, note]
                )
                print(f"{T:6d} {path:8s} {m:12s} {f(ms, '10.1f')} "
                      f"{_fmt_mem(pk) if pk is not None else '-':>12s} {f(sd, '8.2f')} "
                      f"{f(st, '8.2f')} {f(md, '10.4f')} {f(mt, '10.4f')} {note}")  # fmt: skip
    # the goal of issue 22 at T = 8k (weights path) and the 32k memory check
    goal = []
    acc = _needle_accuracy()
    if 8192 in lengths and "weights" in paths:
        print("\nGoal at T=8192 (weights path): >= 3x dense's speed, <= 1/10 its peak memory, "
              "needle accuracy >= .99 (benchmarks/results/long_task.json):")  # fmt: skip
        for m in methods:
            if m in ("dense", "torch"):
                continue
            sd, md = (
                _ratio(res, 8192, "weights", m, "dense", "ms"),
                _ratio(res, 8192, "weights", m, "dense", "peak_bytes"),
            )
            a = acc.get(m)
            ok = sd is not None and md is not None and sd >= 3 and md <= 0.1
            ok = ok and a is not None and a >= 0.99
            goal.append([m, sd, md, a, "met" if ok else "not met"])
            print(f"  {m:12s} speed-up {f(sd, '.2f')}, mem {f(md, '.4f')}, needle acc "
                  f"{f(a, '.3f')}: {'MET' if ok else 'not met'}")  # fmt: skip
    big = max(lengths)
    print(f"\nPeak memory at T={big} (limit 24 GiB):")
    for path in ("mean", "S=8"):
        for m in methods:
            pk = res.get((big, path, m), {}).get("peak_bytes")
            if pk is not None:
                print(f"  {path:5s} {m:12s} {_fmt_mem(pk)}")
    figures = _figure(res, lengths, methods, RESULTS_DIR, args.out)
    tables = [table("time and peak memory per forward pass", cols, rows)]
    if goal:
        tables.append(table("goal at T = 8192, weights path", ["method", "speedup_vs_dense",
                            "mem_vs_dense", "needle_acc_8192", "goal"], goal))  # fmt: skip
    path = write_results(
        args.out, "Long sequences: kernels against dense attention and torch", tables, figures
    )
    print(f"\nwrote {path} (timings taken on a shared machine: ratios, not absolute times)")


def _needle_accuracy() -> dict[str, float]:
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "long_task.json")
    try:
        with open(p) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    t = doc["tables"][0]
    i_T, i_k, i_a = (t["columns"].index(c) for c in ("T", "kind", "acc"))
    return {r[i_k]: r[i_a] for r in t["rows"] if r[i_T] == 8192}


def _figure(res, lengths, methods, out_dir, name) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is an optional extra
        return []
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for j, path in enumerate(("mean", "weights")):
        for m in methods:
            ts = [(T, res.get((T, path, m), {}).get("ms")) for T in lengths]
            ms = [(T, res.get((T, path, m), {}).get("peak_bytes")) for T in lengths]
            ts = [(T, v) for T, v in ts if v]
            ms = [(T, v / 2**20) for T, v in ms if v]
            style = {"marker": "o", "label": m, "color": f"C{list(KERNELS).index(m)}"}
            if ts:
                axes[0][j].plot(*zip(*ts, strict=True), **style)
            if ms:
                axes[1][j].plot(*zip(*ms, strict=True), **style)
        axes[0][j].set_title(f"{path}: time per forward")
        axes[1][j].set_title(f"{path}: peak memory")
        axes[0][j].set_ylabel("ms")
        axes[1][j].set_ylabel("MiB")
        for i in range(2):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_yscale("log")
            axes[i][j].set_xlabel("T")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / f"{name}.png", dpi=110)
    return [f"{name}.png"]


if __name__ == "__main__":
    main()
