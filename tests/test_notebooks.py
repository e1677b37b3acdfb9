"""The notebooks in ``notebooks/`` run top to bottom at toy size and are stored without outputs.

Each notebook's first code cell defines ``SMOKE = False``; the test switches it to ``True`` (tiny
data, epochs and sample counts) and executes the notebook in a fresh ``python3`` kernel with
nbclient, in a temporary working directory and with the non-interactive Agg backend. Any cell
error fails the test.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL = "python3"
TIMEOUT = 300  # seconds per cell


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name}: code cells {dirty} hold outputs or execution counts; clear them before "
        "committing (Jupyter: Edit > Clear Outputs of All Cells)"
    )
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL
