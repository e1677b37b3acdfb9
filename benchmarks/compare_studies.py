"""Compare two study folders' ``results.json`` bit for bit, timings aside: every run's every
method row, every pooled, paired, curve, per-pair and wins entry (times, figure paths and
``first_run`` removed by :func:`bayesattn.study.merge.without_times`).

    python benchmarks/compare_studies.py BEFORE_DIR AFTER_DIR

Prints, per data set and method, whether the pooled metrics are equal, and exits 1 on any
difference (listing the first paths that differ)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bayesattn.study.legacy import upgrade_results
from bayesattn.study.merge import without_times

#: what may differ between two studies of the same code: where they were written, how long
#: they took, how they ran and which environment ran them
_FREE_TOP = ("files", "seconds", "environment", "config_hash")
_FREE_CONFIG = ("out", "progress", "jobs")


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'after' if k in b else 'before'}")
            else:
                _diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b and not (a != a and b != b):  # NaN equals NaN here
        out.append(f"{path}: {a!r} != {b!r}")


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The paths where two results differ, timings aside."""
    a, b = ({k: v for k, v in r.items() if k not in _FREE_TOP} for r in (before, after))
    for r in (a, b):
        r["config"] = {k: v for k, v in r["config"].items() if k not in _FREE_CONFIG}
    out: list[str] = []
    _diff(without_times(a), without_times(b), "", out)
    return out


def main(argv: list[str]) -> int:
    before, after = (  # a study from before a method's rename: current names
        upgrade_results(json.loads((Path(d) / "results.json").read_text())) for d in argv[1:3]
    )
    for ds, block in before["datasets"].items():
        for m in block["pooled"]:
            other = after["datasets"].get(ds, {}).get("pooled", {}).get(m)
            same = other is not None and not compare(
                {"config": {}, "x": without_times(block["pooled"][m])},
                {"config": {}, "x": without_times(other)},
            )
            print(f"{ds:10} {m:18} pooled metrics {'equal' if same else 'DIFFER'}")
    diffs = compare(before, after)
    print(f"{len(diffs)} differences (timings aside) in the whole results.json")
    for d in diffs[:20]:
        print("  ", d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
