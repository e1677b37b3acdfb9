"""MNIST-1D against the mnist1d package's own generator; far-OOD sets and 1-D corruptions."""

import numpy as np
import pytest
import torch

from bayesattn.data.far_ood import corrupt_sequences, far_ood_suite
from bayesattn.data.mnist1d import generate_mnist1d, load_mnist1d_data

mdata = pytest.importorskip("mnist1d.data")
N = 400  # a small generation keeps the test fast; the default is the package's 5000


def test_generator_is_the_packages_make_dataset_and_leaves_global_rng_alone():
    args = mdata.get_dataset_args()
    args.num_samples = N
    state = np.random.get_state()[1].copy()
    x, y = generate_mnist1d(num_samples=N)
    assert np.array_equal(np.random.get_state()[1], state)
    ref = mdata.make_dataset(args)
    np.testing.assert_allclose(x, np.concatenate([ref["x"], ref["x_test"]]), rtol=1e-6)
    assert np.array_equal(y, np.concatenate([ref["y"], ref["y_test"]]))
    assert x.shape == (N, 40) and x.dtype == np.float32 and not x.flags.writeable


def test_loader_splits_the_generated_rows_with_the_pair_held_out():
    x, y = generate_mnist1d(num_samples=N)
    d = load_mnist1d_data(seed=3, holdout_classes=(0, 7), num_samples=N)
    assert d.num_classes == 8 and set(d.y_ood_classes.tolist()) == {0, 7}
    rows = {tuple(r) for r in x.round(5)}
    for split in (d.x_train, d.x_val, d.x_test, d.x_ood_classes):
        assert split.shape[1:] == (40,) and split.dtype == torch.float32
        assert all(tuple(r) in rows for r in split.numpy().round(5))
    assert len(d.x_train) + len(d.x_val) + len(d.x_test) + len(d.x_ood_classes) == N
    original = torch.tensor(d.classes)[d.y_train]
    assert not bool(torch.isin(original, torch.tensor([0, 7])).any())
    again = load_mnist1d_data(seed=3, holdout_classes=(0, 7), num_samples=N)
    assert torch.equal(again.x_train, d.x_train)
    with pytest.raises(ValueError, match="holdout_classes"):
        load_mnist1d_data(holdout_classes=(3, 3), num_samples=N)


def test_far_ood_sets():
    x = torch.rand(6, 4, 5) * 0.8 + 0.1
    far = far_ood_suite(x, seed=0)
    lo, hi = float(x.min()), float(x.max())
    torch.testing.assert_close(far["inverted"], lo + hi - x)
    assert far["uniform"].shape == x.shape
    assert lo <= float(far["uniform"].min()) and float(far["uniform"].max()) <= hi
    flat, perm = x.reshape(6, -1), far["permuted"].reshape(6, -1)
    torch.testing.assert_close(perm.sort(1).values, flat.sort(1).values)  # same values per row
    assert not torch.equal(perm, flat)
    assert torch.equal(far_ood_suite(x, seed=0)["permuted"], far["permuted"])
    with pytest.raises(ValueError, match="at least one"):
        far_ood_suite(torch.zeros(0, 3))


def test_sequence_corruptions():
    x = torch.randn(5, 40)
    occ = corrupt_sequences(x, "occlusion", 3, seed=0)
    assert int((occ == 0).sum(1).min()) >= 12  # 30% of 40 steps zeroed
    shifted = corrupt_sequences(x, "shift", 2, seed=0)
    for a, b in zip(x, shifted, strict=True):
        assert torch.equal(torch.roll(a, 4), b) or torch.equal(torch.roll(a, -4), b)
    n1 = corrupt_sequences(x, "noise", 1, seed=0) - x
    n5 = corrupt_sequences(x, "noise", 5, seed=0) - x
    torch.testing.assert_close(n5, n1 * 8)  # common random numbers, sd 0.1 -> 0.8
    with pytest.raises(ValueError, match="kind"):
        corrupt_sequences(x, "rotation", 1)
