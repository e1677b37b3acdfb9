"""Read a finished study's results.json and print, per dataset and candidate method, the numbers
issue 30's goal is stated in (paired 95% intervals over the same pairs and seeds):

- held-out AUROC of the method's declared primary score minus the ensemble's (its primary score,
  MI, and its entropy AUROC), and whether the interval's lower end is above -0.02;
- accuracy and NLL against the deterministic network; NLL against temperature scaling;
- inference (batch 512) and training time as a fraction of the 5-ensemble's;
- the global KL (nats) and the ratio of mean MI off / on the data.

    python benchmarks/study_goal.py studies/2026-12-04-full-protocol-0.6/results.json \
        [--methods density mixture ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bayesattn.study.legacy import upgrade_results
from bayesattn.study.metrics import get, primary_score
from bayesattn.study.stats import paired_interval


def _vals(runs: list[dict[str, Any]], m: str, path: tuple[str, ...]) -> list[float] | None:
    if any(m not in r["methods"] for r in runs):
        return None
    out = [get(r["methods"][m], path) for r in runs]
    return None if any(v is None for v in out) else [float(v) for v in out if v is not None]


def _fmt(iv: dict[str, Any]) -> str:
    mark = "*" if iv["resolved"] else " "
    return f"{iv['mean']:+.3f} [{iv['lo']:+.3f}, {iv['hi']:+.3f}]{mark}"


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def goal_rows(block: dict[str, Any], methods: list[str]) -> list[str]:
    runs = block["runs"]
    for r in runs:  # rows of studies older than the primary score
        for row in r["methods"].values():
            if "auroc_primary" not in row:
                row["primary_score"], row["auroc_primary"] = primary_score(row)
    have = set(runs[0]["methods"])
    ens_p = _vals(runs, "ensemble", ("auroc_primary",))
    ens_e = _vals(runs, "ensemble", ("held_out", "auroc_entropy"))
    lines = [
        "| method | AUROC (score) | Δ vs ens primary | Δ vs ens entropy | Δacc vs det | "
        "ΔNLL vs det | ΔNLL vs TS | infer ×ens | train ×ens | KL global | MI out/in |",
        "|---" * 11 + "|",
    ]
    for m in methods:
        if m not in have:
            continue
        a = _vals(runs, m, ("auroc_primary",))
        assert a is not None
        score = runs[0]["methods"][m]["primary_score"]
        cells = [f"{_mean(a):.3f} ({score})"]
        cells.append(_fmt(paired_interval(a, ens_p)) if ens_p else "—")
        cells.append(_fmt(paired_interval(a, ens_e)) if ens_e else "—")
        for ref, key in (("deterministic", "accuracy"), ("deterministic", "nll"),
                         ("temp_scaled", "nll")):  # fmt: skip
            x, y = _vals(runs, m, (key,)), (_vals(runs, ref, (key,)) if ref in have else None)
            cells.append(_fmt(paired_interval(x, y)) if x and y else "—")
        for key in ("infer_ms_batch512", "train_seconds"):
            x, y = _vals(runs, m, (key,)), _vals(runs, "ensemble", (key,))
            cells.append(f"{_mean(x) / _mean(y):.2f}" if x and y else "—")
        kl = _vals(runs, m, ("kl_global",))
        cells.append(f"{_mean(kl):.1f}" if kl else "—")
        mi_in, mi_out = _vals(runs, m, ("mean_mi_in",)), _vals(runs, m, ("mean_mi_out",))
        ratio = _mean(mi_out) / _mean(mi_in) if mi_in and mi_out and _mean(mi_in) > 0 else None
        cells.append(f"{ratio:.1f}" if ratio is not None else "—")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--methods", nargs="+", default=None)
    args = ap.parse_args()
    res = upgrade_results(json.loads(args.results.read_text()))  # old names read as current
    for ds, block in res["datasets"].items():
        methods = args.methods or list(block["runs"][0]["methods"])
        print(f"\n**{ds}** ({len(block['runs'])} runs; * = resolved, the 95% interval excludes 0)\n")
        print("\n".join(goal_rows(block, methods)))


if __name__ == "__main__":
    main()
