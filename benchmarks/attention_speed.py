"""Speed of BayesianMultiheadAttention against torch.nn.MultiheadAttention, in one process.

Prints ratios (ours / baseline, lower is better):
  * posterior-mean mode vs torch MHA on the same shapes (need_weights=False: fused SDPA path; and
    need_weights=True), forward only and forward+backward;
  * the stochastic layer (Dirichlet posterior) with S samples drawn in one vectorised pass
    (``num_samples=S``: projections computed once) vs S separate calls.

Usage: python benchmarks/attention_speed.py [--quick] [--threads N] [--lengths 64 256 1024]
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import torch
from _results import table, write_results
from _timing import interleaved

from bayesattn import attention_mode
from bayesattn.nn.attention import BayesianMultiheadAttention


def _fwd_bwd(m, x) -> None:
    m(x, x, x, need_weights=False)[0].sum().backward()


def _separate(m, x, S: int) -> None:
    # an eval-mode layer returns its posterior mean (torch's eval()); the guide draws
    with attention_mode("guide"):
        for _ in range(S):
            m(x, x, x, need_weights=False)


def _vectorised(m, x, S: int) -> None:
    with attention_mode("guide"):
        m(x, x, x, need_weights=False, num_samples=S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small shapes, few repeats (smoke run)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--lengths", type=int, nargs="*", default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument(
        "--families",
        nargs="+",
        default=["dirichlet", "logistic_normal", "weibull", "concrete"],
        help="posterior families for the stochastic-layer table",
    )
    ap.add_argument("--stoch-lengths", type=int, nargs="+", default=[64])
    ap.add_argument("--skip-mean", action="store_true", help="only the stochastic-layer table")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, E, H = (4, 64, 4) if args.quick else (args.batch, args.embed, args.heads)
    lengths = args.lengths or ([32, 64] if args.quick else [64, 256, 1024])
    if args.quick:
        args.stoch_lengths = [32]
    reps = 3 if args.quick else 10
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, B={B}, E={E}, H={H}")

    ref = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    ours = BayesianMultiheadAttention(E, H, batch_first=True).eval()
    ours.load_state_dict(ref.state_dict())

    mean_rows: dict[str, list[list[object]]] = {
        "forward, need_weights=False": [],
        "forward, need_weights=True": [],
        "forward+backward": [],
    }
    print("\n## posterior-mean mode vs torch.nn.MultiheadAttention (ratio = ours / torch)")
    print(f"{'T':>6} {'weights':>8} {'pass':>9} {'torch ms':>10} {'ours ms':>10} {'ratio':>7}")
    for T in [] if args.skip_mean else lengths:
        x = torch.randn(B, T, E)
        r = max(3, reps // (T // 64 + 1))
        for need_w in (False, True):
            with torch.no_grad():
                res = interleaved(
                    {
                        "torch": partial(ref, x, x, x, need_weights=need_w),
                        "ours": partial(ours, x, x, x, need_weights=need_w),
                    },
                    r,
                )
            print(
                f"{T:>6} {str(need_w):>8} {'fwd':>9} {res['torch']:>10.2f} {res['ours']:>10.2f} "
                f"{res['ours'] / res['torch']:>7.3f}"
            )
            mean_rows[f"forward, need_weights={need_w}"].append(_row(T, res["torch"], res["ours"]))
        xg = x.clone().requires_grad_(True)
        res = interleaved(
            {"torch": partial(_fwd_bwd, ref, xg), "ours": partial(_fwd_bwd, ours, xg)}, r
        )
        print(
            f"{T:>6} {'False':>8} {'fwd+bwd':>9} {res['torch']:>10.2f} {res['ours']:>10.2f} "
            f"{res['ours'] / res['torch']:>7.3f}"
        )
        mean_rows["forward+backward"].append(_row(T, res["torch"], res["ours"]))

    print("\n## stochastic layer: S samples in one pass vs S separate calls (speed-up = sep/vec)")
    print(
        f"{'family':>16} {'T':>6} {'S':>3} {'separate ms':>12} {'vectorised ms':>14} {'speed-up':>9}"
    )
    stoch_rows = []
    for fam, T, S in itertools.product(args.families, args.stoch_lengths, (1, 8)):
        stoch = BayesianMultiheadAttention(E, H, batch_first=True, family=fam).eval()
        stoch.load_state_dict(ref.state_dict())
        x = torch.randn(B, T, E)
        with torch.no_grad():
            res = interleaved(
                {
                    "sep": partial(_separate, stoch, x, S),
                    "vec": partial(_vectorised, stoch, x, S),
                },
                max(3, reps // 2),
            )
        print(
            f"{fam:>16} {T:>6} {S:>3} {res['sep']:>12.2f} {res['vec']:>14.2f} "
            f"{res['sep'] / res['vec']:>9.2f}x"
        )
        stoch_rows.append(
            [
                fam,
                T,
                S,
                round(res["sep"], 3),
                round(res["vec"], 3),
                round(res["sep"] / res["vec"], 3),
            ]
        )
    shapes = f"B={B}, E={E}, H={H}"
    tables = [
        table(
            f"Posterior-mean mode against torch.nn.MultiheadAttention, {name} ({shapes})",
            ["T", "torch ms", "ours ms", "ratio ours/torch"],
            rows,
        )
        for name, rows in mean_rows.items()
        if rows
    ]
    tables.append(
        table(
            f"Stochastic layer: S samples in one vectorised pass against S separate calls ({shapes})",
            ["family", "T", "S", "separate ms", "vectorised ms", "speed-up separate/vectorised"],
            stoch_rows,
        )
    )
    path = write_results(
        "attention_speed", "BayesianMultiheadAttention against torch.nn.MultiheadAttention", tables
    )
    print(f"wrote {path}")


def _row(T: int, torch_ms: float, ours_ms: float) -> list[object]:
    return [T, round(torch_ms, 3), round(ours_ms, 3), round(ours_ms / torch_ms, 3)]


if __name__ == "__main__":
    main()
