"""The notebooks in ``notebooks/`` run top to bottom at toy size, and are stored with the outputs
of a full-size run made from their current code.

Each notebook's first code cell defines ``SMOKE = False``; the smoke test switches it to ``True``
(tiny data, epochs and sample counts) and executes the notebook in a fresh ``python3`` kernel with
nbclient, in a temporary working directory and with the non-interactive Agg backend. Any cell
error fails the test.

The stored outputs come from ``make notebooks`` (``notebooks/execute.py``), which records the
library version and a hash of the code cells in the notebook's metadata: a notebook whose code
changed since (or that was never executed, or was executed in SMOKE mode) fails
``test_notebook_outputs_come_from_its_code``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

#: whole programs (``make test-fast`` skips them; CI runs them)
pytestmark = pytest.mark.slow

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL = "python3"
TIMEOUT = 300  # seconds per cell
MAX_BYTES = 1_000_000  # a stored notebook stays small: modest figures, no embedded data


def _executor():
    """``notebooks/execute.py`` (not a package): its ``code_hash`` is the one the records hold."""
    spec = importlib.util.spec_from_file_location("_nb_execute", NOTEBOOK_DIR / "execute.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4, f"expected the study notebooks in {NOTEBOOK_DIR}"


def _runs_this_interpreter(argv0: str) -> bool:
    # jupyter_client replaces a bare "python"/"python3"/"pythonX.Y" by sys.executable
    bare = {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}
    return argv0 in bare or Path(argv0).resolve() == Path(sys.executable).resolve()


def _ensure_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the ``python3`` kernel run *this* interpreter (the one with bayesattn installed).

    ipykernel normally provides that spec (in ``<venv>/share/jupyter``, or as jupyter_client's
    native kernel). If it is missing, or a user/system spec of that name points at another
    interpreter, install one into a temporary prefix and put it first on ``JUPYTER_PATH``.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        if _runs_this_interpreter(KernelSpecManager().get_kernel_spec(KERNEL).argv[0]):
            return
    except NoSuchKernel:
        pass
    from ipykernel.kernelspec import install

    prefix = tmp_path / "jupyter-prefix"
    install(kernel_name=KERNEL, prefix=str(prefix))
    paths = [str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")]
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(p for p in paths if p))
    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    assert _runs_this_interpreter(spec.argv[0]), spec.argv


def _first_code_cell(nb):
    for cell in nb.cells:
        if cell.cell_type == "code":
            return cell
    raise AssertionError("notebook has no code cell")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    nb = nbformat.read(path, as_version=4)
    params = _first_code_cell(nb)
    assert "SMOKE = False" in params.source, (
        f"{path.name}: the first code cell must define the parameter `SMOKE = False`"
    )
    params.source = params.source.replace("SMOKE = False", "SMOKE = True", 1)
    _executor().clear_outputs(nb)

    _ensure_kernel(tmp_path, monkeypatch)
    monkeypatch.setenv("MPLBACKEND", "Agg")  # inherited by the kernel: no GUI, no inline figures
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet debugpy at kernel start
    workdir = tmp_path / "run"
    workdir.mkdir()
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(workdir)}},
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:  # show the failing cell's traceback
        pytest.fail(f"{path.name} failed in SMOKE mode:\n{err}", pytrace=False)
    # every code cell ran, none left an error output
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert not errors


def stale_reasons(nb) -> list[str]:
    """Why a notebook's stored outputs do not come from a full-size run of its current code
    (empty: they do)."""
    ex = _executor()
    record = nb.metadata.get(ex.METADATA_KEY)
    if not record:
        return ["no execution record in its metadata (run `make notebooks`)"]
    reasons = []
    if record.get("code_sha256") != ex.code_hash(nb):
        reasons.append("its code changed since its outputs were made (run `make notebooks`)")
    if record.get("smoke", True):
        reasons.append("its outputs come from a SMOKE run")
    if not record.get("version"):
        reasons.append("the record does not say which bayesattn version made the outputs")
    code = [c for c in nb.cells if c.cell_type == "code"]
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    if unrun:
        reasons.append(f"code cells {unrun} were not executed")
    errors = [i for i, c in enumerate(code) for o in c.outputs if o.get("output_type") == "error"]
    if errors:
        reasons.append(f"code cells {errors} hold errors")
    return reasons


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_outputs_come_from_its_code(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL
    reasons = stale_reasons(nb)
    assert not reasons, f"{path.name}: " + "; ".join(reasons)
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert figures >= 1, f"{path.name}: no stored figure"
    size = path.stat().st_size
    assert size < MAX_BYTES, f"{path.name} is {size / 1e6:.2f} MB (limit {MAX_BYTES / 1e6:.0f} MB)"


def test_stale_notebooks_are_detected():
    """The check above can fail: editing one code cell, or removing the record, is caught."""
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    assert stale_reasons(nb) == []
    code = next(c for c in reversed(nb.cells) if c.cell_type == "code")
    code.source += "\nprint('changed')"
    assert any("code changed" in r for r in stale_reasons(nb))
    del nb.metadata["bayesattn"]
    assert stale_reasons(nb) == ["no execution record in its metadata (run `make notebooks`)"]


def test_code_hash_ignores_outputs_and_markdown():
    ex = _executor()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("x = 1")]
    )
    h = ex.code_hash(nb)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="1")]
    nb.cells[0].source = "# other title"
    assert ex.code_hash(nb) == h
    nb.cells[1].source = "x = 2"
    assert ex.code_hash(nb) != h
