"""Timing shared by the benchmark scripts (imported as ``from _timing import interleaved``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms per function, timing the candidates alternately so load drifts hit all alike."""
    for f in fns.values():
        f()
        f()
    acc: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            acc[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in acc.items()}
