"""Re-execute the notebooks at full size and store their outputs (``make notebooks``).

Each notebook is cleared, executed top to bottom in a fresh ``python3`` kernel with nbclient (one
torch thread, in a temporary working directory), and written back with its outputs and a
provenance record in its metadata::

    "bayesattn": {"version": "0.x", "code_sha256": "<hash of the code cells>",
                  "executed": "<UTC date>", "seconds": 123.4, "smoke": false}

``tests/cross_cutting/test_notebooks.py`` recomputes :func:`code_hash` and fails when a notebook's code changed
since its outputs were made. Usage::

    python notebooks/execute.py                 # all notebooks, one after the other
    python notebooks/execute.py 02_digits_uncertainty.ipynb
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KERNEL = "python3"
CELL_TIMEOUT = 3600  # seconds per cell
METADATA_KEY = "bayesattn"
# stored figures stay small: modest resolution (the inline backend's PNGs)
FIGURE_RC = {"figure.dpi": 80, "savefig.dpi": 80}


def code_hash(nb: Any) -> str:
    """SHA-256 of the notebook's code cells' sources, in order (outputs and markdown excluded)."""
    sources = [c["source"] for c in nb["cells"] if c["cell_type"] == "code"]
    return hashlib.sha256(json.dumps(sources).encode("utf-8")).hexdigest()


def clear_outputs(nb: Any) -> None:
    """Remove outputs, execution counts and per-cell execution metadata in place."""
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
            c.metadata.pop("execution", None)


def execute(path: Path) -> float:
    """Run one notebook at full size and write it back with outputs; returns the seconds taken."""
    import nbclient
    import nbformat

    import bayesattn

    nb = nbformat.read(path, as_version=4)
    clear_outputs(nb)
    # Figures: small PNGs, set before the first cell through the inline backend's rc.
    rc_cell = nbformat.v4.new_code_cell(
        "import matplotlib as _mpl\n"
        f"_mpl.rcParams.update({FIGURE_RC!r})\n"
        "%config InlineBackend.rc = " + repr(FIGURE_RC)
    )
    nb.cells.insert(0, rc_cell)
    env_keep = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MPLBACKEND")}
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend renders the figures
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="bayesattn-nb-") as workdir:  # files it writes
            nbclient.NotebookClient(
                nb,
                timeout=CELL_TIMEOUT,
                kernel_name=KERNEL,
                record_timing=False,
                resources={"metadata": {"path": workdir}},
            ).execute()
    finally:
        for k, v in env_keep.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - t0
    nb.cells.pop(0)
    for i, c in enumerate(c for c in nb.cells if c.cell_type == "code"):
        c.execution_count = i + 1
        for o in c.outputs:
            if "execution_count" in o:
                o["execution_count"] = i + 1
    nb.metadata[METADATA_KEY] = {
        "version": bayesattn.__version__,
        "code_sha256": code_hash(nb),
        "executed": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "smoke": False,
    }
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("notebooks", nargs="*", help="notebook files (default: all in notebooks/)")
    args = ap.parse_args(argv)
    paths = [Path(p) if Path(p).exists() else HERE / p for p in args.notebooks]
    for path in paths or sorted(HERE.glob("*.ipynb")):
        print(f"executing {path.name} ...", flush=True)
        seconds = execute(path)
        size = path.stat().st_size
        print(f"  {path.name}: {seconds:.0f} s, {size / 1024:.0f} KiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
