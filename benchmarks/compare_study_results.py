"""Bit-for-bit check of two study runs: every method's pooled (and per-pair) metrics in two
``results.json`` files compared exactly, timings aside (keys naming seconds or time).

Run: ``python benchmarks/compare_study_results.py BEFORE/results.json AFTER/results.json``;
prints one line per metric that differs (with both values and the difference) and a summary;
exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bayesattn.study.legacy import upgrade_results

_TIMING = ("seconds", "time", "_ms", "wall")


def _leaves(x: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of a JSON tree by its ``/``-joined path, timing keys left out."""
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            if any(t in str(k) for t in _TIMING):
                continue
            out.update(_leaves(v, f"{path}/{k}"))
        return out
    if isinstance(x, list):
        out = {}
        for i, v in enumerate(x):
            out.update(_leaves(v, f"{path}[{i}]"))
        return out
    return {path: x}


def compare(before: dict[str, Any], after: dict[str, Any], sections: tuple[str, ...]) -> list[str]:
    """Lines describing every differing leaf of ``datasets/<d>/<section>`` in the two runs."""
    diffs = []
    for ds in sorted(set(before["datasets"]) | set(after["datasets"])):
        for sec in sections:
            a = _leaves(before["datasets"].get(ds, {}).get(sec, {}), f"{ds}/{sec}")
            b = _leaves(after["datasets"].get(ds, {}).get(sec, {}), f"{ds}/{sec}")
            for k in sorted(set(a) | set(b)):
                va, vb = a.get(k, "<missing>"), b.get(k, "<missing>")
                if va != vb and not (va != va and vb != vb):  # NaN == NaN here
                    delta = (vb - va if isinstance(va, (int, float)) and isinstance(vb, (int, float))
                             else "")  # fmt: skip
                    diffs.append(f"{k}: {va!r} -> {vb!r} {delta}")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--sections", default="pooled,per_pair,paired")
    args = ap.parse_args()
    with open(args.before) as f:  # a study from before a method's rename: current names
        before = upgrade_results(json.load(f))
    with open(args.after) as f:
        after = upgrade_results(json.load(f))
    sections = tuple(args.sections.split(","))
    diffs = compare(before, after, sections)
    for line in diffs:
        print(line)
    methods = sorted({m for d in after["datasets"].values() for m in d.get("pooled", {})})
    n = sum(len(_leaves(d.get(s, {}))) for d in after["datasets"].values() for s in sections)
    print(f"{len(diffs)} of {n} metrics differ ({', '.join(sections)}; methods: "
          f"{', '.join(methods)})")  # fmt: skip
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
