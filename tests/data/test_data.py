"""Tests for bayesattn.data: embedded digits, corruptions, patches and sequence tasks."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from bayesattn import data as D
from bayesattn.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SequenceTask,
    corrupt_images,
    corruption_suite,
    images_to_patches,
    load_digits_data,
    make_copy_task,
    make_ood_sequences,
    make_reverse_task,
    make_sort_task,
    make_translation_task,
    patches_to_images,
    train_val_test_split,
    translate_sentence,
)

sklearn_datasets = pytest.importorskip("sklearn.datasets")


@pytest.fixture(scope="module")
def digits() -> D.DigitsData:
    return load_digits_data(seed=0)


@pytest.fixture(scope="module")
def raw_targets() -> np.ndarray:
    return np.asarray(sklearn_datasets.load_digits().target)


# --------------------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------------------

SPLITS = ("train", "val", "test")


def test_digits_deterministic_and_seed_dependent(digits: D.DigitsData) -> None:
    again = load_digits_data(seed=0)
    other = load_digits_data(seed=1)
    for name in SPLITS:
        assert torch.equal(getattr(digits, f"x_{name}"), getattr(again, f"x_{name}"))
        assert torch.equal(getattr(digits, f"y_{name}"), getattr(again, f"y_{name}"))
    assert not torch.equal(digits.x_train, other.x_train)
    assert torch.equal(digits.x_ood_classes, other.x_ood_classes)  # OOD pool is not shuffled


def test_digits_types_ranges_and_labels(digits: D.DigitsData) -> None:
    assert digits.classes == (0, 1, 2, 3, 4, 5, 6, 7)
    assert digits.holdout_classes == (8, 9)
    assert digits.num_classes == 8
    assert digits.class_names == tuple("01234567")
    assert digits.label_map == {c: c for c in range(8)}
    for name in SPLITS:
        x, y = getattr(digits, f"x_{name}"), getattr(digits, f"y_{name}")
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.shape[1:] == (8, 8) and x.shape[0] == y.shape[0]
        assert x.min() >= 0.0 and x.max() <= 1.0
        assert set(y.tolist()) == set(range(8))
    assert digits.x_train.max() == 1.0  # 16 / 16
    assert digits.x_ood_classes.dtype == torch.float32
    assert digits.y_ood_classes.dtype == torch.int64


def test_digits_split_sizes_and_stratification(
    digits: D.DigitsData, raw_targets: np.ndarray
) -> None:
    sizes = {name: len(getattr(digits, f"y_{name}")) for name in SPLITS}
    in_dist = int(np.isin(raw_targets, digits.classes).sum())
    assert sum(sizes.values()) == in_dist
    for c in digits.classes:
        n_c = int((raw_targets == c).sum())
        label = digits.label_map[c]
        n_test = int((digits.y_test == label).sum())
        n_val = int((digits.y_val == label).sum())
        n_train = int((digits.y_train == label).sum())
        assert n_test == round(0.2 * n_c)
        assert n_val == round(0.15 * n_c)
        assert n_train == n_c - n_test - n_val
    assert sizes["test"] == pytest.approx(0.2 * in_dist, abs=len(digits.classes))
    assert sizes["val"] == pytest.approx(0.15 * in_dist, abs=len(digits.classes))


def test_digits_splits_are_disjoint(digits: D.DigitsData) -> None:
    def rows(x: torch.Tensor) -> set[bytes]:
        return {r.numpy().tobytes() for r in x.reshape(len(x), -1)}

    train, val, test = rows(digits.x_train), rows(digits.x_val), rows(digits.x_test)
    # a few digits are exact pixel duplicates of each other; allow a handful of collisions
    assert len(train & test) <= 3 and len(train & val) <= 3 and len(val & test) <= 3


def test_digits_holdout_classes_never_in_distribution(
    digits: D.DigitsData, raw_targets: np.ndarray
) -> None:
    assert set(digits.y_ood_classes.tolist()) == {8, 9}
    assert len(digits.y_ood_classes) == int(np.isin(raw_targets, (8, 9)).sum())
    for name in SPLITS:
        assert getattr(digits, f"y_{name}").max() < digits.num_classes

    custom = load_digits_data(seed=3, holdout_classes=(0, 5))
    assert custom.classes == (1, 2, 3, 4, 6, 7, 8, 9)
    assert custom.label_map == {1: 0, 2: 1, 3: 2, 4: 3, 6: 4, 7: 5, 8: 6, 9: 7}
    assert set(custom.y_ood_classes.tolist()) == {0, 5}
    total = sum(len(getattr(custom, f"y_{name}")) for name in SPLITS)
    assert total == int(np.isin(raw_targets, custom.classes).sum())
    # in-distribution images of the remapped label k are the original class classes[k]
    images = torch.from_numpy(sklearn_datasets.load_digits().images.astype(np.float32) / 16)
    x0 = custom.x_test[custom.y_test == 0][0]
    match = (images == x0).all(dim=(1, 2))
    assert set(raw_targets[match.numpy()].tolist()) == {1}


def test_digits_no_holdout() -> None:
    full = load_digits_data(seed=0, holdout_classes=())
    assert full.num_classes == 10 and full.x_ood_classes.shape == (0, 8, 8)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"val_fraction": -0.1}, ValueError, r"val_fraction must be in \[0, 1\); got -0.1"),
        ({"test_fraction": 1.0}, ValueError, r"test_fraction must be in \[0, 1\); got 1.0"),
        ({"val_fraction": "a"}, TypeError, r"val_fraction must be a real number; got 'a' \(str\)"),
        (
            {"val_fraction": 0.5, "test_fraction": 0.5},
            ValueError,
            r"val_fraction \+ test_fraction must be < 1, got 0.5 \+ 0.5",
        ),
        (
            {"val_fraction": 0.499, "test_fraction": 0.5},
            ValueError,
            r"leave no training samples for class 0",
        ),
        ({"holdout_classes": (8, 10)}, ValueError, r"holdout_classes must contain digits 0..9"),
        ({"holdout_classes": (8, 8)}, ValueError, r"must not repeat a class, got \[8, 8\]"),
        ({"holdout_classes": "89"}, TypeError, r"holdout_classes must be an iterable of ints"),
        (
            {"holdout_classes": tuple(range(9))},
            ValueError,
            r"leave at least 2 in-distribution classes",
        ),
        ({"seed": -1}, ValueError, r"seed must be a non-negative int; got -1"),
        ({"seed": 1.5}, TypeError, r"seed must be an int; got 1.5 \(float\)"),
        ({"seed": True}, TypeError, r"seed must be an int; got True \(bool\)"),
    ],
)
def test_digits_bad_arguments(kwargs: dict, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        load_digits_data(**kwargs)


def test_digits_missing_sklearn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"pip install bayesattn\[examples\]"):
        load_digits_data()


# --------------------------------------------------------------------------------------
# corruptions
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", D.CORRUPTION_KINDS)
def test_corruption_shape_range_determinism(digits: D.DigitsData, kind: str) -> None:
    x = digits.x_test
    before = x.clone()
    out = corrupt_images(x, kind, 3, seed=0)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert torch.equal(x, before)  # input untouched
    assert torch.equal(out, corrupt_images(x, kind, 3, seed=0))
    assert not torch.equal(out, corrupt_images(x, kind, 3, seed=1))
    assert not torch.equal(out, x)


@pytest.mark.parametrize("kind", D.CORRUPTION_KINDS)
def test_corruption_severity_is_monotone(digits: D.DigitsData, kind: str) -> None:
    x = digits.x_test
    change = [(corrupt_images(x, kind, s, seed=0) - x).abs().mean().item() for s in range(1, 6)]
    assert all(a < b for a, b in zip(change, change[1:], strict=False)), change


def test_occlusion_patch_size_grows() -> None:
    x = torch.ones(5, 8, 8)
    for severity, side in zip(range(1, 6), (2, 3, 4, 5, 6), strict=True):
        out = corrupt_images(x, "occlusion", severity, seed=7)
        zeros = (out == 0).sum(dim=(1, 2))
        assert zeros.tolist() == [side * side] * 5
        # the zeroed pixels form a square
        for img in out:
            r, c = torch.nonzero(img == 0, as_tuple=True)
            assert r.max() - r.min() + 1 == side and c.max() - c.min() + 1 == side


def test_rotation_preserves_centred_blob_and_float64() -> None:
    x = torch.zeros(2, 8, 8, dtype=torch.float64)
    x[:, 3:5, 3:5] = 1.0  # centred square: a rotation keeps most of it in place
    out = corrupt_images(x, "rotation", 1, seed=0)
    assert out.dtype == torch.float64
    assert out[:, 3:5, 3:5].mean() > 0.6


def test_corruption_suite_matches_corrupt_images(digits: D.DigitsData) -> None:
    x = digits.x_val[:20]
    suite = corruption_suite(x, seed=4)
    assert list(suite) == [(k, s) for k in D.CORRUPTION_KINDS for s in (1, 3, 5)]
    for (kind, severity), out in suite.items():
        assert torch.equal(out, corrupt_images(x, kind, severity, seed=4))
    small = corruption_suite(x, kinds=["noise"], severities=[2])
    assert list(small) == [("noise", 2)]


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (("blur", 1), ValueError, r"kind must be one of .*got 'blur'"),
        (("noise", 0), ValueError, r"severity must be an int in \[1, 5\]; got 0"),
        (("noise", 6), ValueError, r"severity must be an int in \[1, 5\]; got 6"),
        (("noise", 2.0), TypeError, r"severity must be an int; got 2.0 \(float\)"),
    ],
)
def test_corrupt_images_bad_arguments(args: tuple, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        corrupt_images(torch.rand(2, 8, 8), *args)


def test_corrupt_images_bad_inputs() -> None:
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor; got ndarray"):
        corrupt_images(np.zeros((2, 8, 8)), "noise", 1)
    with pytest.raises(ValueError, match=r"x must have 3 dims; got shape \(8, 8\)"):
        corrupt_images(torch.rand(8, 8), "noise", 1)
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor; got dtype torch.int64"):
        corrupt_images(torch.zeros(2, 8, 8, dtype=torch.int64), "noise", 1)
    with pytest.raises(ValueError, match=r"seed must be a non-negative int; got -3"):
        corrupt_images(torch.rand(2, 8, 8), "noise", 1, seed=-3)
    with pytest.raises(ValueError, match=r"kinds must be a non-empty sequence"):
        corruption_suite(torch.rand(2, 8, 8), kinds="noise")
    with pytest.raises(ValueError, match=r"severities must be a non-empty sequence of ints"):
        corruption_suite(torch.rand(2, 8, 8), severities=())
    with pytest.raises(ValueError, match=r"severity must be an int in \[1, 5\]; got 9"):
        corruption_suite(torch.rand(2, 8, 8), severities=(1, 9))


# --------------------------------------------------------------------------------------
# patches
# --------------------------------------------------------------------------------------


def test_patches_shape_order_and_round_trip(digits: D.DigitsData) -> None:
    x = digits.x_train[:10]
    patches = images_to_patches(x, patch_size=2)
    assert patches.shape == (10, 16, 4)
    assert torch.equal(patches_to_images(patches), x)
    assert torch.equal(patches_to_images(patches, image_size=8), x)
    assert torch.equal(patches_to_images(images_to_patches(x, 4)), x)
    assert images_to_patches(x, 4).shape == (10, 4, 16)
    assert images_to_patches(x, 1).shape == (10, 64, 1)

    grid = torch.arange(64.0).reshape(1, 8, 8)
    p = images_to_patches(grid, 2)
    assert p[0, 0].tolist() == [0, 1, 8, 9]
    assert p[0, 1].tolist() == [2, 3, 10, 11]
    assert p[0, 4].tolist() == [16, 17, 24, 25]  # second patch row


def test_patches_rectangular() -> None:
    x = torch.rand(3, 4, 6)
    p = images_to_patches(x, 2)
    assert p.shape == (3, 6, 4)
    assert torch.equal(patches_to_images(p, image_size=(4, 6)), x)


def test_patches_errors() -> None:
    with pytest.raises(ValueError, match=r"\(H, W\) = \(8, 8\) is not divisible by patch_size=3"):
        images_to_patches(torch.rand(2, 8, 8), 3)
    with pytest.raises(ValueError, match=r"patch_size must be a positive int; got 0"):
        images_to_patches(torch.rand(2, 8, 8), 0)
    with pytest.raises(ValueError, match=r"x must have 3 dims; got shape \(2, 1, 8, 8\)"):
        images_to_patches(torch.rand(2, 1, 8, 8), 2)
    with pytest.raises(ValueError, match=r"patch dimension must be a perfect square p \* p, got 3"):
        patches_to_images(torch.rand(2, 16, 3))
    with pytest.raises(ValueError, match=r"num_patches=6 is not a square grid"):
        patches_to_images(torch.rand(2, 6, 4))
    with pytest.raises(ValueError, match=r"image_size=\(8, 6\) does not match 6 patches"):
        patches_to_images(torch.rand(2, 6, 4), image_size=(8, 6))
    with pytest.raises(TypeError, match=r"image_size must be an int or \(H, W\) tuple, got 'a'"):
        patches_to_images(torch.rand(2, 16, 4), image_size="a")


def _patches_by_loops(x: torch.Tensor, p: int) -> torch.Tensor:
    """Reference: ``(N, C, H, W)`` -> ``(N, G, C*p*p)``, patch grid row-major, features (c, a, b)."""
    n, c, h, w = x.shape
    out = torch.empty(n, (h // p) * (w // p), c * p * p, dtype=x.dtype)
    for i in range(h // p):
        for j in range(w // p):
            for ch in range(c):
                for a in range(p):
                    for b in range(p):
                        pixel = x[:, ch, i * p + a, j * p + b]  # (N,)
                        out[:, i * (w // p) + j, ch * p * p + a * p + b] = pixel
    return out


@pytest.mark.parametrize(
    ("channels", "height", "width", "p"), [(1, 8, 8, 2), (3, 8, 8, 2), (3, 8, 12, 4), (2, 6, 4, 1)]
)
def test_one_patch_implementation_matches_loops_and_unfold(channels, height, width, p) -> None:
    """``images_to_patches`` and ``VisionTransformer.patchify`` share one kernel
    (:func:`bayesattn._patches.patchify`); both agree with explicit loops and ``F.unfold``."""
    from bayesattn._patches import patchify
    from bayesattn.nn.networks import VisionTransformer

    x = torch.rand(5, channels, height, width, generator=torch.Generator().manual_seed(0))
    ref = _patches_by_loops(x, p)  # (N, G, C*p*p)
    unfold = torch.nn.functional.unfold(x, kernel_size=p, stride=p).transpose(1, 2)
    assert torch.equal(ref, unfold)
    assert torch.equal(patchify(x, p), ref)
    if channels == 1:
        assert torch.equal(images_to_patches(x[:, 0], p), ref)
    if height == width:
        vit = VisionTransformer(
            2, image_size=height, patch_size=p, in_channels=channels, d_model=8, nhead=2,
            num_layers=1,
        )  # fmt: skip
        assert torch.equal(vit.patchify(x), ref)
        if channels == 1:
            assert torch.equal(vit.patchify(x[:, 0]), ref)


# --------------------------------------------------------------------------------------
# algorithmic sequence tasks
# --------------------------------------------------------------------------------------


def _words(row: torch.Tensor) -> list[int]:
    """Token ids of a tgt row between BOS and EOS, checking the framing."""
    ids = row.tolist()
    assert ids[0] == BOS_ID
    end = ids.index(EOS_ID)
    assert all(i == PAD_ID for i in ids[end + 1 :])
    return ids[1:end]


EXPECTED = {
    make_copy_task: lambda s: list(s),
    make_reverse_task: lambda s: list(reversed(s)),
    make_sort_task: lambda s: sorted(s),
}


@pytest.mark.parametrize("task_fn", list(EXPECTED))
@pytest.mark.parametrize("min_length", [None, 2])
def test_algorithmic_targets(task_fn, min_length: int | None) -> None:
    task = task_fn(200, length=7, vocab_size=6, seed=3, min_length=min_length)
    assert task.src.shape == (200, 7) and task.tgt.shape == (200, 9)
    assert task.src.dtype == torch.int64 and task.tgt.dtype == torch.int64
    assert task.src_vocab == ["<pad>", "<bos>", "<eos>", "0", "1", "2", "3", "4", "5"]
    assert task.tgt_vocab == task.src_vocab
    lengths = task.src_lengths()
    if min_length is None:
        assert (lengths == 7).all()
    else:
        assert lengths.min() == 2 and lengths.max() == 7  # lengths actually vary
    mask = task.src_padding_mask()
    assert mask.dtype == torch.bool and mask.shape == (200, 7)
    for i in range(len(task)):
        src = task.src[i].tolist()
        n_tok = int(lengths[i])
        assert all(3 <= t < 9 for t in src[:n_tok])
        assert src[n_tok:] == [PAD_ID] * (7 - n_tok)
        assert mask[i].tolist() == [False] * n_tok + [True] * (7 - n_tok)
        words = _words(task.tgt[i])
        assert words == EXPECTED[task_fn](src[:n_tok])
        # alignments point at identical tokens and form a permutation
        pairs = task.alignments[i]
        assert sorted(sp for sp, _ in pairs) == list(range(n_tok))
        assert sorted(tp for _, tp in pairs) == list(range(n_tok))
        assert all(src[sp] == words[tp] for sp, tp in pairs)


def test_copy_reverse_alignments_exact() -> None:
    copy = make_copy_task(5, length=6, seed=1, min_length=3)
    rev = make_reverse_task(5, length=6, seed=1, min_length=3)
    for i in range(5):
        n_tok = int(copy.src_lengths()[i])
        assert copy.alignments[i] == [(t, t) for t in range(n_tok)]
        n_tok = int(rev.src_lengths()[i])
        assert sorted(rev.alignments[i], key=lambda p: p[1]) == [
            (n_tok - 1 - t, t) for t in range(n_tok)
        ]
    a = copy.alignment_matrix()
    assert a.shape == (5, 7, 6)
    assert torch.equal(a.sum(dim=(1, 2)), copy.src_lengths().float())


def test_sort_alignment_is_stable() -> None:
    task = make_sort_task(300, length=8, vocab_size=3, seed=0)
    for i in range(len(task)):
        src = task.src[i].tolist()
        by_tgt = sorted(task.alignments[i], key=lambda p: p[1])
        for (sp_a, _), (sp_b, _) in zip(by_tgt, by_tgt[1:], strict=False):
            if src[sp_a] == src[sp_b]:
                assert sp_a < sp_b


def test_algorithmic_determinism_and_decode() -> None:
    a = make_copy_task(50, seed=0)
    b = make_copy_task(50, seed=0)
    c = make_copy_task(50, seed=1)
    assert torch.equal(a.src, b.src) and torch.equal(a.tgt, b.tgt)
    assert not torch.equal(a.src, c.src)
    assert a.decode(a.tgt[0]) == a.decode(a.src[0], which="src")
    assert a.decode([BOS_ID, 3, 4, EOS_ID, 5]) == ["0", "1"]
    assert a.decode([BOS_ID, 3, EOS_ID, PAD_ID], strip_special=False) == [
        "<bos>",
        "0",
        "<eos>",
        "<pad>",
    ]
    assert a.encode("0 1 9") == [3, 4, 12]
    assert len(a) == 50 and a.src_vocab_size == 13 and a.tgt_vocab_size == 13


def test_sequence_task_errors() -> None:
    task = make_copy_task(4, length=3, vocab_size=2)
    with pytest.raises(ValueError, match=r"which must be 'src' or 'tgt', got 'x'"):
        task.decode([3], which="x")
    with pytest.raises(ValueError, match=r"token id 99 is outside the tgt vocabulary of 5"):
        task.decode([99])
    with pytest.raises(ValueError, match=r"ids must be 1-D, got shape \(4, 5\)"):
        task.decode(task.tgt)
    with pytest.raises(ValueError, match=r"tokens \['7'\] are not in the src vocabulary"):
        task.encode(["0", "7"])
    with pytest.raises(TypeError, match=r"src must have dtype torch.int64, got torch.float32"):
        SequenceTask(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), ["a"], ["b"])
    with pytest.raises(ValueError, match=r"same number of rows, got 2 and 3"):
        SequenceTask(
            torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long), [], []
        )
    with pytest.raises(ValueError, match=r"alignments must have 2 entries, got 1"):
        SequenceTask(
            torch.zeros(2, 3, dtype=torch.long),
            torch.zeros(2, 3, dtype=torch.long),
            [],
            [],
            alignments=[[]],
        )
    no_align = SequenceTask(
        torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), [], []
    )
    with pytest.raises(ValueError, match=r"this task has no alignments"):
        no_align.alignment_matrix()


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n": 0}, ValueError, r"n must be a positive int; got 0"),
        ({"n": 2.5}, TypeError, r"n must be an int; got 2.5 \(float\)"),
        ({"length": 0}, ValueError, r"length must be a positive int; got 0"),
        ({"vocab_size": 0}, ValueError, r"vocab_size must be a positive int; got 0"),
        ({"min_length": 9}, ValueError, r"min_length must be <= length=8, got 9"),
        ({"min_length": 0}, ValueError, r"min_length must be a positive int; got 0"),
        ({"seed": "0"}, TypeError, r"seed must be an int; got '0' \(str\)"),
    ],
)
def test_algorithmic_bad_arguments(kwargs: dict, exc: type[Exception], match: str) -> None:
    args = {"n": 4} | kwargs
    with pytest.raises(exc, match=match):
        make_reverse_task(**args)


# --------------------------------------------------------------------------------------
# OOD sequences
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_fn", [make_copy_task, "reverse", "sort"])
def test_ood_longer(task_fn) -> None:
    train = make_copy_task(10, length=6, vocab_size=5)
    ood = make_ood_sequences(task_fn, 100, "longer", length=6, vocab_size=5, seed=2)
    assert ood.src.shape == (100, 12) and ood.tgt.shape == (100, 14)
    lengths = ood.src_lengths()
    assert lengths.min() >= 7 and lengths.max() <= 12
    assert ood.src_vocab == train.src_vocab
    assert ood.meta["ood"] == "longer"
    custom = make_ood_sequences(task_fn, 10, "longer", length=6, ood_length=8)
    assert custom.src.shape == (10, 8) and custom.src_lengths().min() >= 7


def test_ood_unseen_tokens() -> None:
    ood = make_ood_sequences(
        make_reverse_task,
        200,
        "unseen_tokens",
        length=6,
        vocab_size=5,
        num_unseen_tokens=3,
        seed=1,
        min_length=2,
    )
    first_unseen = 3 + 5
    assert len(ood.src_vocab) == first_unseen + 3
    assert ood.src_vocab[:first_unseen] == make_reverse_task(1, vocab_size=5).src_vocab
    assert ood.meta["train_vocab_size"] == first_unseen
    for i in range(len(ood)):
        n_tok = int(ood.src_lengths()[i])
        src = ood.src[i].tolist()[:n_tok]
        assert any(t >= first_unseen for t in src)
        assert all(3 <= t < first_unseen + 3 for t in src)
        assert _words(ood.tgt[i]) == src[::-1]
    all_unseen = make_ood_sequences("copy", 50, "unseen_tokens", unseen_fraction=1.0)
    assert (all_unseen.src >= 13).all()


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        (("copy", 5, "wider"), {}, ValueError, r"kind must be one of .*got 'wider'"),
        (("shuffle", 5), {}, ValueError, r"task_fn must be one of .*got 'shuffle'"),
        ((make_translation_task, 5), {}, ValueError, r"task_fn must be make_copy_task"),
        (("copy", 5), {"ood_length": 8}, ValueError, r"ood_length must be > length=8, got 8"),
        (
            ("copy", 5, "unseen_tokens"),
            {"num_unseen_tokens": 0},
            ValueError,
            r"num_unseen_tokens must be a positive int; got 0",
        ),
        (
            ("copy", 5, "unseen_tokens"),
            {"unseen_fraction": 1.5},
            ValueError,
            r"unseen_fraction must be in \[0, 1\]; got 1.5",
        ),
    ],
)
def test_ood_bad_arguments(args: tuple, kwargs: dict, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        make_ood_sequences(*args, **kwargs)


# --------------------------------------------------------------------------------------
# translation
# --------------------------------------------------------------------------------------

CASES = [
    ("i have seen the house", "ich habe das haus gesehen"),
    ("he has seen the dog", "er hat den hund gesehen"),
    ("you have bought the car", "du hast das auto gekauft"),
    ("we have found the cat", "wir haben die katze gefunden"),
    ("she has read the book today", "sie hat heute das buch gelesen"),
    ("they have sold the house yesterday", "sie haben gestern das haus verkauft"),
    ("i know that you have seen the dog", "ich weiß , dass du den hund gesehen hast"),
    ("he knows that we have bought the car", "er weiß , dass wir das auto gekauft haben"),
    ("they think that she has found the key", "sie glauben , dass sie den schlüssel gefunden hat"),
    ("you say that i can see the man", "du sagst , dass ich den mann sehen kann"),
    ("i can see the house", "ich kann das haus sehen"),
    ("you must read the letter", "du musst den brief lesen"),
    ("we should visit the city tomorrow", "wir sollen morgen die stadt besuchen"),
    ("she can call the woman", "sie kann die frau anrufen"),
]


@pytest.mark.parametrize(("english", "german"), CASES)
def test_translate_sentence_cases(english: str, german: str) -> None:
    de, alignment = translate_sentence(english.split())
    assert " ".join(de) == german
    assert translate_sentence(english) == (de, alignment)
    en = english.split()
    # every English word aligned exactly once, injective, in range
    assert sorted(sp for sp, _ in alignment) == list(range(len(en)))
    tps = [tp for _, tp in alignment]
    assert len(set(tps)) == len(tps) and all(0 <= tp < len(de) for tp in tps)
    assert [tp for tp in range(len(de)) if tp not in tps] == ([2] if "," in de else [])


def test_translation_alignment_details() -> None:
    de, align = translate_sentence("i have seen the house")
    assert align == [(0, 0), (1, 1), (2, 4), (3, 2), (4, 3)]  # participle -> final position
    de, align = translate_sentence("i know that you have seen the dog")
    mapping = dict(align)
    assert de[mapping[4]] == "hast" and mapping[4] == len(de) - 1  # finite verb last
    assert de[mapping[5]] == "gesehen" and mapping[5] == len(de) - 2
    assert de[mapping[2]] == "dass"
    de, align = translate_sentence("i can see the house today")
    assert dict(align) == {0: 0, 1: 1, 2: 5, 3: 3, 4: 4, 5: 2}


@pytest.mark.parametrize(
    ("english", "match"),
    [
        ("he have seen the house", r"expected 'has' after 'he' at position 1, got 'have'"),
        ("i has seen the house", r"expected 'have' after 'i' at position 1, got 'has'"),
        ("he know that i have seen the dog", r"expected 'knows' after 'he' at position 1"),
        ("i have see the house", r"expected a past participle at position 2, got 'see'"),
        ("i can seen the house", r"expected an infinitive at position 2, got 'seen'"),
        ("i have seen a house", r"expected 'the' at position 3, got 'a'"),
        ("i have seen the moon", r"expected an object noun at position 4, got 'moon'"),
        ("i have seen the house now", r"expected an adverb .* at position 5, got 'now'"),
        ("i have seen the house today today", r"expected end of sentence at position 6"),
        ("i know you have seen the dog", r"expected 'that' at position 2, got 'you'"),
        ("i will see the house", r"expected 'have'/'has' or a modal .* got 'will'"),
        ("dogs have seen the house", r"expected a subject .* at position 0, got 'dogs'"),
        ("i", r"at position 1, got end of sentence"),
    ],
)
def test_translate_sentence_errors(english: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        translate_sentence(english)


def test_translate_sentence_type_error() -> None:
    with pytest.raises(TypeError, match=r"english_tokens must be a string or a sequence"):
        translate_sentence([1, 2])


def test_translation_task_contents() -> None:
    task = make_translation_task(600, seed=0)
    assert task.src.shape == (600, 9) and task.tgt.shape == (600, 12)
    assert task.src_vocab[:3] == ["<pad>", "<bos>", "<eos>"]
    assert task.src_vocab[3:] == sorted(task.src_vocab[3:])
    assert task.tgt_vocab[3:] == sorted(task.tgt_vocab[3:])
    assert "gesehen" in task.tgt_vocab and "seen" in task.src_vocab
    assert "gesehen" not in task.src_vocab
    assert len(set(task.src_text)) == 600  # unique by default
    kinds = {"perfect": 0, "modal": 0, "subordinate": 0}
    for i in range(len(task)):
        en, de = task.src_text[i].split(), task.tgt_text[i].split()
        assert task.decode(task.src[i], which="src") == en
        assert _words(task.tgt[i]) == task.encode(de, which="tgt")
        assert translate_sentence(en) == (de, task.alignments[i])
        if "that" in en:
            kinds["subordinate"] += 1
        elif en[1] in ("have", "has"):
            kinds["perfect"] += 1
            assert dict(task.alignments[i])[2] == len(de) - 1  # participle is last
        else:
            kinds["modal"] += 1
            assert dict(task.alignments[i])[2] == len(de) - 1  # infinitive is last
    assert kinds == {"perfect": 200, "modal": 200, "subordinate": 200}
    a = task.alignment_matrix()
    assert a.shape == (600, 11, 9)
    assert torch.equal(a.sum(dim=1), (~task.src_padding_mask()).float())  # one per word


def test_translation_task_determinism_and_patterns() -> None:
    a = make_translation_task(100, seed=5)
    b = make_translation_task(100, seed=5)
    c = make_translation_task(100, seed=6)
    assert a.src_text == b.src_text and torch.equal(a.tgt, b.tgt)
    assert a.src_text != c.src_text
    assert a.src_vocab == c.src_vocab and a.tgt_vocab == c.tgt_vocab

    perfect = make_translation_task(50, seed=0, patterns=("perfect",))
    assert perfect.src.shape == (50, 6) and perfect.tgt.shape == (50, 8)
    assert all(t.split()[1] in ("have", "has") for t in perfect.src_text)
    assert perfect.src_vocab == a.src_vocab

    # a pattern with too few distinct sentences hands its share to the others
    big = make_translation_task(4000, seed=0)
    assert len(set(big.src_text)) == 4000
    repeats = make_translation_task(1200, seed=0, patterns=("perfect",), unique=False)
    assert len(set(repeats.src_text)) < 1200


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"patterns": ("future",)}, ValueError, r"patterns must be drawn from .*got 'future'"),
        ({"patterns": ()}, ValueError, r"patterns must be a non-empty sequence"),
        ({"patterns": "perfect"}, ValueError, r"patterns must be a non-empty sequence"),
        (
            {"patterns": ("modal", "modal")},
            ValueError,
            r"patterns must not repeat a pattern, got \('modal', 'modal'\)",
        ),
        (
            {"n": 2000, "patterns": ("perfect",)},
            ValueError,
            r"n=2000 exceeds the 1170 distinct sentences",
        ),
        ({"n": 0}, ValueError, r"n must be a positive int; got 0"),
        ({"seed": -2}, ValueError, r"seed must be a non-negative int; got -2"),
    ],
)
def test_translation_task_bad_arguments(kwargs: dict, exc: type[Exception], match: str) -> None:
    args = {"n": 10} | kwargs
    with pytest.raises(exc, match=match):
        make_translation_task(**args)


# --------------------------------------------------------------------------------------
# splitting
# --------------------------------------------------------------------------------------


def test_train_val_test_split() -> None:
    task = make_translation_task(101, seed=0)
    train, val, test = train_val_test_split(task, seed=0)
    assert (len(train), len(val), len(test)) == (81, 10, 10)
    texts = train.src_text + val.src_text + test.src_text
    assert sorted(texts) == sorted(task.src_text)
    assert not set(train.src_text) & set(test.src_text)
    for part in (train, val, test):
        assert part.src_vocab == task.src_vocab and part.tgt_vocab == task.tgt_vocab
        for i in range(len(part)):
            j = task.src_text.index(part.src_text[i])
            assert torch.equal(part.src[i], task.src[j]) and torch.equal(part.tgt[i], task.tgt[j])
            assert part.alignments[i] == task.alignments[j]
    again = train_val_test_split(task, seed=0)[0]
    other = train_val_test_split(task, seed=1)[0]
    assert again.src_text == train.src_text and other.src_text != train.src_text

    copy = make_copy_task(20)
    tr, va, te = train_val_test_split(copy, fractions=(0.5, 0.5, 0.0))
    assert (len(tr), len(va), len(te)) == (10, 10, 0)
    assert te.src.shape == (0, 8) and te.alignments == []


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (("task",), TypeError, r"task must be a SequenceTask, got str"),
        ((None, (0.5, 0.5)), ValueError, r"fractions must be 3 numbers .*got \(0.5, 0.5\)"),
        ((None, (0.5, 0.4, 0.2)), ValueError, r"non-negative and sum to 1, got \(0.5, 0.4, 0.2\)"),
        ((None, (1.2, -0.1, -0.1)), ValueError, r"non-negative and sum to 1"),
        ((None, (0.8, 0.1, 0.1), -1), ValueError, r"seed must be a non-negative int; got -1"),
    ],
)
def test_split_bad_arguments(args: tuple, exc: type[Exception], match: str) -> None:
    task = make_copy_task(10)
    call_args = tuple(task if a is None else a for a in args)
    with pytest.raises(exc, match=match):
        train_val_test_split(*call_args)
