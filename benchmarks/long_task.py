"""Needle retrieval at T >= 2k: dense attention against the local, top-k and low-rank kernels.

One-layer CLS classifiers (``TransformerClassifier``, d_model 32, 2 heads) learn
:func:`bayesattn.data.long.make_retrieval_task` (a needle among ``T`` noise tokens; which needle is
the label; a quarter of the needles sit within 32 tokens of the start). Training is a length
curriculum: ``--pretrain-steps`` at ``--pretrain-length`` (cheap), then ``--steps`` at the full
length ``T``; the model is evaluated at ``T``. Each attention kind is trained with the same seed,
data, steps and optimiser, in its own subprocess (so its peak memory is its own), and scored on a
held-out set at ``T``:

* accuracy, NLL, ECE (15 bins) and Brier of the posterior-mean predictions;
* accuracy on needles near the start vs far from it (what a local window can and cannot reach);
* cost at ``T``: ms per training step and per evaluated example, and the process's peak RSS
  above its resident set before the full-length steps (``getrusage``).

``--family dirichlet`` trains Bayesian attention (hybrid ELBO, analytic KL) instead and scores
the posterior predictive of ``--samples`` draws.

Results (both lengths, every kind): ``benchmarks/results/long_task.json`` and
``long_task_distance.png`` (accuracy against the needle's distance from the CLS token).

Usage: python benchmarks/long_task.py [--lengths 2048 8192] [--steps 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

KINDS = {
    "dense": None,
    "local": {"window": 64},
    "local_global": {"window": 64, "global_tokens": (0,)},  # position 0: the CLS token
    "topk": {"k": 16},
    "cluster_topk": {"k": 16},
    "tiled": {"tile": 512},
    "lowrank": {"rank": 64},
}
DISTANCE_BINS = 8  # accuracy against the needle's distance from the CLS token


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build(kind: str, task, family: str | None, seed: int):
    import torch

    from bayesattn.nn.blocks import AttentionConfig
    from bayesattn.nn.networks import TransformerClassifier

    kw = dict(KINDS[kind] or {})
    if kind == "lowrank":
        kw["max_len"] = task.x.shape[1] + 1  # + the CLS token
    cfg = AttentionConfig(family=family, support=None if kind == "dense" else kind, support_kwargs=kw)
    torch.manual_seed(seed)
    return TransformerClassifier(
        task.num_classes,
        vocab_size=task.vocab_size,
        d_model=32,
        nhead=2,
        num_layers=1,
        dim_feedforward=64,
        dropout=0.0,
        max_len=task.x.shape[1],
        pooling="cls",
        norm_first=False,
        attention=cfg,
    )


def run_kind(kind: str, args) -> dict:
    import torch
    from tqdm import tqdm

    from bayesattn import calibration as C
    from bayesattn.data.long import make_retrieval_task
    from bayesattn.nn.modes import attention_mode

    torch.set_num_threads(1)
    short = make_retrieval_task(args.train, length=args.pretrain_length, seed=args.seed)
    train = make_retrieval_task(args.train, length=args.length, seed=args.seed + 2)
    test = make_retrieval_task(args.test, length=args.length, seed=args.seed + 1)
    net = build(kind, train, args.family, args.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)

    def step(data) -> None:
        idx = torch.randint(0, len(data), (args.batch,), generator=g)
        xb, yb = data.x[idx], data.y[idx]
        if args.family:
            loss, _ = net.elbo_loss(xb, yb, num_data=len(data))
            loss = loss / len(data)
        else:
            loss = torch.nn.functional.cross_entropy(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()

    net.train()
    for _ in tqdm(range(args.pretrain_steps), desc=f"{kind} T={args.pretrain_length}",
                  disable=not args.progress, leave=False):  # fmt: skip
        step(short)
    base = _rss()
    t0 = time.perf_counter()
    for _ in tqdm(range(args.steps), desc=f"{kind} T={args.length}", disable=not args.progress,
                  leave=False):  # fmt: skip
        step(train)
    train_ms = 1e3 * (time.perf_counter() - t0) / max(args.steps, 1)
    net.eval()
    t0 = time.perf_counter()
    probs = []
    with torch.no_grad():
        for s in range(0, len(test), args.batch):
            xb = test.x[s : s + args.batch]
            if args.family:
                with attention_mode("guide"):
                    p = net(xb, num_samples=args.samples).softmax(-1).mean(0)
            else:
                p = net(xb).softmax(-1)
            probs.append(p)
    eval_ms = 1e3 * (time.perf_counter() - t0) / len(test)
    p = torch.cat(probs).double()
    y = test.y
    near = test.pos < test.meta["near"]
    correct = (p.argmax(-1) == y).double()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    edges = torch.linspace(0, args.length, DISTANCE_BINS + 1)
    by_dist = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        sel = (test.pos >= a) & (test.pos < b)
        by_dist.append(float(correct[sel].mean()) if bool(sel.any()) else float("nan"))
    return {
        "acc_by_distance": by_dist,
        "acc": float(correct.mean()),
        "acc_near": float(correct[near].mean()),
        "acc_far": float(correct[~near].mean()),
        "nll": C.negative_log_likelihood(p, y),
        "ece": C.expected_calibration_error(p, y),
        "brier": C.brier_score(p, y),
        "train_ms_per_step": train_ms,
        "eval_ms_per_example": eval_ms,
        "peak_mib": max(peak - base, 0) / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--lengths", type=int, nargs="+", default=None,
                    help="run each length in turn (e.g. 2048 8192); one results file")  # fmt: skip
    ap.add_argument("--out", default="long_task", help="results name (benchmarks/results/)")
    ap.add_argument("--pretrain-length", type=int, default=128, help="curriculum: short first")
    ap.add_argument("--pretrain-steps", type=int, default=150)
    ap.add_argument("--steps", type=int, default=5, help="training steps at --length")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--train", type=int, default=2048)
    ap.add_argument("--test", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", default=None, help="posterior family (default: deterministic)")
    ap.add_argument("--samples", type=int, default=8, help="posterior draws at evaluation")
    ap.add_argument("--kinds", nargs="*", default=list(KINDS))
    ap.add_argument("--merge-from", nargs="+", default=[], metavar="JSON",
                    help="earlier results files whose rows are kept (kinds run now replace "
                         "theirs); with --kinds and nothing after it, only merges")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="T=256, 30 steps (smoke run)")
    ap.add_argument("--progress", action="store_true", help="tqdm bars from the subprocesses")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.length, args.pretrain_length, args.test = 256, 64, 64
        args.pretrain_steps, args.steps, args.train = 20, 2, 256
    if args.one:
        print(json.dumps(run_kind(args.one, args)))
        return
    lengths = args.lengths or [args.length]
    all_rows: dict[int, dict] = {}
    for f in args.merge_from:
        for T, kr in _read(f).items():
            all_rows.setdefault(T, {}).update(kr)
    for T in lengths if args.kinds else []:
        all_rows.setdefault(T, {}).update(_run_length(T, args))
    _write(all_rows, args)


def _read(path: str) -> dict[int, dict]:
    """Rows of an earlier results file, as ``{T: {kind: result}}``."""
    with open(path) as fh:
        doc = json.load(fh)
    main, dist = doc["tables"][0], doc["tables"][1]
    out: dict[int, dict] = {}
    for row in main["rows"]:
        r = dict(zip(main["columns"], row, strict=True))
        out.setdefault(r.pop("T"), {})[r.pop("kind")] = r
    for row in dist["rows"]:
        out[row[0]][row[1]]["acc_by_distance"] = row[2:]
    return out


def _run_length(T: int, args) -> dict:
    args.length = T
    print(
        f"needle retrieval, T={T}: {args.pretrain_steps} steps at T={args.pretrain_length}"
        f" then {args.steps} at T={T}, batch {args.batch}, "
        f"family={args.family or 'none (posterior mean)'}, seed {args.seed}, 1 thread"
    )
    rows = {}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    skip = ("--progress", "--lengths", "--length", "--out")
    argv, it = [], iter(sys.argv[1:])
    for a in it:  # drop the multi-length options; each subprocess runs one length
        if a in skip[1:]:
            while True:
                nxt = next(it, None)
                if nxt is None or nxt.startswith("--"):
                    if nxt is not None:
                        argv.append(nxt)
                    break
        elif a != "--progress":
            argv.append(a)
    for kind in args.kinds:
        cmd = [sys.executable, __file__, "--one", kind, "--length", str(T)] + argv
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(f"{kind}: FAILED\n{r.stderr[-2000:]}")
            continue
        rows[kind] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"  {kind} done", flush=True)
    cols = ["acc", "acc_near", "acc_far", "nll", "ece", "brier"]
    cost = ["train_ms_per_step", "eval_ms_per_example", "peak_mib"]
    print(f"\n{'kind':12s} " + " ".join(f"{c:>8s}" for c in cols)
          + f" {'ms/step':>9s} {'ms/ex':>8s} {'peak MiB':>9s} {'step vs dense':>13s}")  # fmt: skip
    d = rows.get("dense")
    for kind, r in rows.items():
        rel = f"{r['train_ms_per_step'] / d['train_ms_per_step']:12.2f}x" if d else "-"
        print(f"{kind:12s} " + " ".join(f"{r[c]:8.3f}" for c in cols)
              + f" {r[cost[0]]:9.1f} {r[cost[1]]:8.2f} {r[cost[2]]:9.1f} {rel:>13s}")  # fmt: skip
    return rows


def _write(all_rows: dict[int, dict], args) -> None:
    """benchmarks/results/<out>.json and a figure of accuracy against needle distance."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _results import RESULTS_DIR, table, write_results

    cols = ["T", "kind", "acc", "acc_near", "acc_far", "nll", "ece", "brier",
            "train_ms_per_step", "eval_ms_per_example", "peak_mib"]  # fmt: skip
    rows = [[T, k] + [r[c] for c in cols[2:]] for T, kr in all_rows.items() for k, r in kr.items()]
    dist_cols = ["T", "kind"] + [f"bin{i}" for i in range(DISTANCE_BINS)]
    drows = [[T, k] + r["acc_by_distance"] for T, kr in all_rows.items() for k, r in kr.items()]
    figures = []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(all_rows), figsize=(5 * len(all_rows), 3.6), squeeze=False)
        for ax, (T, kr) in zip(axes[0], all_rows.items(), strict=True):
            centres = [(i + 0.5) * T / DISTANCE_BINS for i in range(DISTANCE_BINS)]
            for k, r in kr.items():
                ax.plot(centres, r["acc_by_distance"], marker="o", label=k)
            ax.set_xlabel("needle distance from the CLS token")
            ax.set_ylabel("accuracy")
            ax.set_title(f"needle retrieval, T = {T}")
            ax.set_ylim(0, 1.05)
        axes[0][-1].legend(fontsize=8)
        fig.tight_layout()
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        name = f"{args.out}_distance.png"
        fig.savefig(RESULTS_DIR / name, dpi=110)
        figures.append(name)
    except ImportError:  # pragma: no cover - matplotlib is an optional extra
        pass
    path = write_results(
        args.out,
        "Needle retrieval at long T: accuracy and cost of each attention kind",
        [
            table("accuracy and cost (chance = 1/num_values)", cols, rows),
            table(
                f"accuracy by needle distance ({DISTANCE_BINS} equal bins of [0, T))",
                dist_cols,
                drows,
            ),  # fmt: skip
        ],
        figures,
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
