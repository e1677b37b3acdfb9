"""The split of ``bayesattn.data`` and ``bayesattn.inference`` into modules kept the public API:
every old import path still works and gives the same objects, and no function grew past ~100 lines."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "bayesattn"

# the public names of bayesattn.data and bayesattn.inference before the split
DATA_ALL = [
    "DigitsData", "load_digits_data", "CORRUPTION_KINDS", "corrupt_images", "corruption_suite",
    "images_to_patches", "patches_to_images", "PAD_ID", "BOS_ID", "EOS_ID", "SPECIAL_TOKENS",
    "SequenceTask", "make_copy_task", "make_reverse_task", "make_sort_task", "make_ood_sequences",
    "OOD_SEQUENCE_KINDS", "TRANSLATION_PATTERNS", "translate_sentence", "make_translation_task",
    "train_val_test_split",
]  # fmt: skip
INFERENCE_ALL = [
    "TrainConfig", "History", "Trainer", "fit", "ScaleLatents", "kl_beta", "lr_factor",
    "lr_scheduler", "save_checkpoint", "load_checkpoint", "prepare_checkpoint_path",
    "CheckpointError",
]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "names", "home"),
    [("bayesattn.data", DATA_ALL, "bayesattn.data."), ("bayesattn.inference", INFERENCE_ALL, "")],
)
def test_old_import_paths_export_the_same_names(module, names, home):
    mod = importlib.import_module(module)
    assert mod.__all__ == names
    for name in names:
        obj = getattr(mod, name)
        where = getattr(obj, "__module__", None)
        if where is not None and home:  # defined in one of the package's modules
            assert where.startswith(home), (name, where)


def test_inference_objects_live_in_training_modules():
    import bayesattn.inference as inference
    from bayesattn.training import checkpoint, config, history, kl, trainer

    expected = {
        "TrainConfig": config,
        "History": history,
        "Trainer": trainer,
        "fit": trainer,
        "ScaleLatents": kl,
        "kl_beta": kl,
        "save_checkpoint": checkpoint,
        "load_checkpoint": checkpoint,
        "prepare_checkpoint_path": checkpoint,
        "CheckpointError": checkpoint,
    }
    for name, mod in expected.items():
        assert getattr(inference, name) is getattr(mod, name)
    # private names another module of the package imports from bayesattn.inference
    assert inference._resolve_config is config._resolve_config
    assert inference.sync_param_store is trainer.sync_param_store


def test_patch_kernel_sits_below_nn_and_data():
    """``bayesattn._patches`` imports only torch, so ``nn`` and ``data`` can both use it."""
    tree = ast.parse((PKG / "_patches.py").read_text())
    imported = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {"__future__", "torch"}, imported
    for path in (PKG / "nn").glob("*.py"):
        src = path.read_text()
        assert "from ..data" not in src and "bayesattn.data" not in src, path


def _long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.name}:{n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.end_lineno - n.lineno + 1 > limit
    ]


def test_no_function_over_100_lines_in_the_split_modules():
    files = [
        PKG / "inference.py",
        *sorted((PKG / "study").glob("*.py")),
        *sorted((PKG / "training").glob("*.py")),
        *sorted((PKG / "data").glob("*.py")),
    ]
    assert [f for p in files for f in _long_functions(p, 100)] == []
