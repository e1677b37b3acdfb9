"""Machine-readable benchmark results, shared by the benchmark scripts and the docs.

Every benchmark that ``make bench`` runs writes ``benchmarks/results/<name>.json``::

    {
      "benchmark": "attention_speed",            # the script's name
      "title": "BayesianMultiheadAttention vs torch.nn.MultiheadAttention",
      "meta": {"date": ..., "machine": ..., "processor": ..., "threads": ..., "python": ...,
               "torch": ..., "bayesattn": ..., "argv": [...]},
      "tables": [{"title": str, "columns": [str, ...], "rows": [[cell, ...], ...]}],
      "figures": ["attention_speed.png", ...]    # files beside the JSON, optional
    }

Cells are numbers or strings; ratios are "ours / baseline" (lower is better) unless the column
says otherwise. The docs render these files as tables (``docs/benchmarks.md``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bayesattn._validation import atomic_write_text

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_meta() -> dict[str, Any]:
    """Where and when a benchmark ran: date, machine, threads and library versions."""
    import bayesattn

    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "bayesattn": bayesattn.__version__,
        "argv": sys.argv[1:],
        "script": Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "",
    }


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """One table of a result file; every row must have one cell per column."""
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"table {title!r}: row {list(r)} has {len(r)} cells, columns {len(columns)}")
    return {"title": title, "columns": list(columns), "rows": [list(r) for r in rows]}


def write_results(
    name: str,
    title: str,
    tables: Sequence[dict[str, Any]],
    figures: Sequence[str] = (),
    out_dir: Path | None = None,
) -> Path:
    """Write ``<out_dir>/<name>.json`` atomically (default ``benchmarks/results/``)."""
    out = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "title": title,
        "meta": machine_meta(),
        "tables": list(tables),
        "figures": list(figures),
    }
    return atomic_write_text(out / f"{name}.json", json.dumps(doc, indent=1, default=float) + "\n")
