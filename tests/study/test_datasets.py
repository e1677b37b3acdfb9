"""The study's data-set registry: one object per data set (loader, corruptions, far-OOD sets,
network, model defaults), found by name everywhere; a new data set is one registration."""

import ast
from pathlib import Path

import pytest
import torch

import bayesattn
from bayesattn.data import CORRUPTION_KINDS, DigitsData, corrupt_images, load_digits_data
from bayesattn.data.far_ood import far_ood_suite
from bayesattn.data.fortunes import FortunesData
from bayesattn.data.holdout import HoldoutData
from bayesattn.data.mnist1d import Mnist1dData
from bayesattn.study import (
    DATASETS,
    FULL_DATASETS,
    MODEL_DEFAULTS,
    StudyConfig,
    StudyDataset,
    get_dataset,
    register_dataset,
)
from bayesattn.study.datasets import MODEL_KEYS, base
from bayesattn.study.datasets.digits import Digits
from bayesattn.study.runs import Run

ROOT = Path(bayesattn.__file__).parent


def test_the_built_in_data_sets_in_order_with_their_defaults():
    built_in = (
        "digits",
        "mnist1d",
        "fortunes",
        "wordnet",
    )  # (a page of the docs may register more)
    assert tuple(d for d in DATASETS if d in built_in) == built_in == tuple(FULL_DATASETS)
    for name in DATASETS:
        ds = get_dataset(name)
        assert ds.name == name and ds.description.strip()
        assert set(MODEL_KEYS) | {"patch"} <= set(MODEL_DEFAULTS[name])
    assert StudyConfig().model("mnist1d")["stride"] == 4
    assert StudyConfig(epochs=3).model("fortunes")["epochs"] == 3  # a config field wins
    assert (
        get_dataset("digits").figure_prefix == ""
        and get_dataset("mnist1d").figure_prefix == "mnist1d_"
    )
    with pytest.raises(ValueError, match="unknown dataset"):
        get_dataset("nope")


def test_the_data_classes_share_a_base_and_no_longer_subclass_the_digits():
    for cls in (DigitsData, Mnist1dData, FortunesData):
        assert issubclass(cls, HoldoutData)
    assert not issubclass(Mnist1dData, DigitsData) and not issubclass(FortunesData, DigitsData)


def test_a_digits_run_is_the_loaders_split_corruptions_and_far_sets():
    """Run.load through the registry gives what the data functions give, called directly."""
    cfg = StudyConfig.quick(progress=False)
    run = Run.load(cfg, "digits", (8, 9), 3)
    d = load_digits_data(seed=3, holdout_classes=(8, 9))
    assert torch.equal(run.data.x_train, d.x_train) and torch.equal(run.data.y_test, d.y_test)
    assert set(run.corrupted) == {(k, 3) for k in CORRUPTION_KINDS}  # quick: severity 3
    for (kind, sev), x in run.corrupted.items():
        assert torch.equal(x, corrupt_images(d.x_test, kind, sev, 3))
    far = far_ood_suite(d.x_test, 3, train=(d.x_train, d.y_train))
    assert set(run.far) == set(far) and all(torch.equal(run.far[k], far[k]) for k in far)
    torch.manual_seed(0)
    net = run.network(None)
    assert type(net).__name__ == "VisionTransformer" and net.eval()(d.x_test[:2]).shape == (2, 8)


class _Shifted(Digits):
    """A data set in one class: the digits with a constant added (a new name, new defaults)."""

    name = "test_shifted_digits"
    description = "the digits + 0.5 (a test data set)"
    model_defaults = dict(Digits.model_defaults, d_model=8, nhead=2, dim_feedforward=16)
    full_protocol = False
    order = 0  # listed after the digits (same order, then by name)

    @property
    def figure_prefix(self) -> str:
        return f"{self.name}_"

    def load(self, seed, holdout_classes):
        d = super().load(seed, holdout_classes)
        return DigitsData(**{**d.__dict__, "x_train": d.x_train + 0.5})


def test_a_new_data_set_is_one_registration_and_every_part_of_the_study_knows_it(tmp_path):
    from bayesattn.cli import build_parser

    ds = _Shifted()
    try:
        register_dataset(ds)
        names = tuple(DATASETS)  # by order, then name
        assert names.index("digits") < names.index("test_shifted_digits") < names.index("mnist1d")
        assert "test_shifted_digits" not in FULL_DATASETS
        cfg = StudyConfig(dataset="test_shifted_digits", progress=False)
        assert cfg.model("test_shifted_digits")["d_model"] == 8
        run = Run.load(cfg, "test_shifted_digits", (8, 9), 0)
        assert float(run.data.x_train.min()) >= 0.5
        assert run.network(None).head.in_features == 8
        args = build_parser().parse_args(["study", "--dataset", "test_shifted_digits"])
        assert args.dataset == "test_shifted_digits"
        with pytest.raises(ValueError, match="already registered"):
            register_dataset(_Shifted())
    finally:
        base._REGISTRY.unregister("test_shifted_digits", missing_ok=True)
    assert "test_shifted_digits" not in DATASETS
    with pytest.raises(ValueError, match="dataset must be one of"):
        StudyConfig(dataset="test_shifted_digits")


def test_a_data_set_must_say_what_it_is_and_give_every_model_default():
    class NoDefaults(_Shifted):
        name = "test_no_defaults"
        model_defaults = {"d_model": 8}

    class NoDescription(_Shifted):
        name = "test_no_description"
        description = " "

    with pytest.raises(ValueError, match="missing"):
        register_dataset(NoDefaults())
    with pytest.raises(ValueError, match="description"):
        register_dataset(NoDescription())
    with pytest.raises(TypeError, match="StudyDataset"):
        register_dataset(Digits)  # the class, not an instance
    with pytest.raises(TypeError):
        StudyDataset()  # abstract
    assert "test_no_defaults" not in DATASETS and "test_no_description" not in DATASETS


def _name_switches(path: Path) -> list[str]:
    """Comparisons of a value with a data set's name (``== "digits"``, ``in ("mnist1d", …)``,
    a dict keyed by names) in one module."""
    names = {"digits", "mnist1d", "fortunes"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        consts: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            consts = [node.left, *node.comparators]
            consts += [
                e
                for c in node.comparators
                if isinstance(c, (ast.Tuple, ast.List, ast.Set))
                for e in c.elts
            ]
        elif isinstance(node, ast.Dict):
            consts = [k for k in node.keys if k is not None]
        for c in consts:
            if isinstance(c, ast.Constant) and c.value in names:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_data_set_name_is_switched_on_outside_the_registry(tmp_path):
    files = [p for p in (ROOT / "study").rglob("*.py") if "datasets" not in p.parts]
    files.append(ROOT / "cli.py")
    assert [hit for f in files for hit in _name_switches(f)] == []
    probe = tmp_path / "probe.py"  # the scan sees each kind of switch
    probe.write_text('a = d == "digits"\nb = d in ("x", "mnist1d")\nc = {"fortunes": 1}.get(d)\n')
    assert _name_switches(probe) == ["probe.py:1", "probe.py:2", "probe.py:3"]


def test_wordnet_is_one_file_in_the_registry_and_says_how_to_install_it(monkeypatch):
    from bayesattn.data import wordnet as W
    from bayesattn.study.datasets import wordnet as registered

    ds = get_dataset("wordnet")
    assert isinstance(ds, registered.WordNet) and "wordnet" in DATASETS
    assert "wordnet" in FULL_DATASETS  # the full protocol's data set of words
    assert ds.model_defaults == {**get_dataset("fortunes").model_defaults, "pretrain_epochs": 10}
    assert ds.words and get_dataset("fortunes").words and not get_dataset("digits").words
    assert get_dataset("fortunes").pretraining_texts() is None

    def missing(*a, **k):
        raise FileNotFoundError("apt-get install wordnet-base")

    monkeypatch.setattr(registered, "read_glosses", missing)
    with pytest.raises(ImportError, match="apt-get install wordnet-base"):
        ds.check_available()
    monkeypatch.undo()
    if not Path(W.WORDNET_DIR, "data.noun").is_file():
        pytest.skip("Debian's wordnet-base is not installed")
    cfg = StudyConfig.quick(progress=False)
    run = Run.load(cfg, "wordnet", (8, 9), 0)
    texts = W.unlabeled_glosses()
    assert list(ds.pretraining_texts()) == texts  # none of the ten classes' glosses
    d = W.load_wordnet_data(seed=0, holdout_classes=(8, 9), unlabeled=texts)
    assert torch.equal(run.data.x_train, d.x_train) and torch.equal(run.data.y_test, d.y_test)
    assert run.data.vocab == d.vocab and len(d.vocab) > len(W.load_wordnet_data().vocab)
    net = ds.network(run.data, cfg.model("wordnet"), 0.0, None)
    assert net(run.data.x_test[:4]).shape == (4, run.data.num_classes)
