"""The shared argument checks and seeded-RNG helpers of :mod:`bayesattn._validation`: each error is
the right kind (``TypeError`` for a wrong kind of value, ``ValueError`` for a bad value) and names
the argument and the value or shape seen; integer-like numpy scalars are accepted where ints are,
bools are not; ``seeded`` restores the global RNG and reproduces its draws."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from bayesattn import _validation as V
from bayesattn.data import corrupt_images
from bayesattn.data.long import make_retrieval_task
from bayesattn.functional import check_finite as public_check_finite
from bayesattn.functional.supports import local_attention
from bayesattn.nn.supports import TopKSupport
from bayesattn.training.config import TrainConfig

# ---------------------------------------------------------------------------------------------
# ints and seeds
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_check_int_accepts_python_and_numpy_ints(v):
    out = V.check_int("n", v, 1)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize(
    ("v", "seen"),
    [(True, "True (bool)"), (2.0, "2.0 (float)"), ("3", "'3' (str)"), (None, "None (NoneType)")],
)
def test_check_int_refuses_bools_floats_and_strings(v, seen):
    with pytest.raises(TypeError, match=re.escape(f"n must be an int; got {seen}")) as info:
        V.check_int("n", v, 1)
    assert isinstance(info.value, ValueError)  # the library's historical ValueError still catches
    with pytest.raises(TypeError, match=re.escape("n must be an int; got tensor(3) (Tensor)")):
        V.check_int("n", torch.tensor(3))  # a 0-d tensor is not an int (as before)


@pytest.mark.parametrize(
    ("minimum", "maximum", "v", "msg"),
    [
        (1, None, 0, "n must be a positive int; got 0"),
        (0, None, -1, "n must be a non-negative int; got -1"),
        (2, None, 1, "n must be an int >= 2; got 1"),
        (None, 4, 5, "n must be an int <= 4; got 5"),
        (1, 5, 6, "n must be an int in [1, 5]; got 6"),
        (1, 5, 0, "n must be an int in [1, 5]; got 0"),
    ],
)
def test_check_int_range_messages(minimum, maximum, v, msg):
    with pytest.raises(ValueError, match=re.escape(msg)) as info:
        V.check_int("n", v, minimum, maximum)
    assert not isinstance(info.value, TypeError)
    assert V.check_int("n", minimum if minimum is not None else maximum, minimum, maximum) in (
        minimum,
        maximum,
    )


def test_check_int_allow_none():
    assert V.check_int("batch_size", None, 1, allow_none=True) is None
    with pytest.raises(
        ValueError, match=re.escape("batch_size must be a positive int or None; got 0")
    ):
        V.check_int("batch_size", 0, 1, allow_none=True)
    with pytest.raises(TypeError, match=re.escape("batch_size must be an int or None; got 1.5")):
        V.check_int("batch_size", 1.5, 1, allow_none=True)
    with pytest.raises(TypeError, match="batch_size must be an int; got None"):
        V.check_int("batch_size", None, 1)


def test_check_seed():
    assert V.check_seed(np.int64(7)) == 7 and V.check_seed(0) == 0
    with pytest.raises(ValueError, match=re.escape("seed must be a non-negative int; got -1")):
        V.check_seed(-1)
    with pytest.raises(TypeError, match=re.escape("data_seed must be an int; got True (bool)")):
        V.check_seed(True, "data_seed")


# ---------------------------------------------------------------------------------------------
# reals, fractions, probabilities
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", [0.5, 1, np.float32(0.5), np.float64(0.5), np.int64(1)])
def test_check_real_accepts_python_and_numpy_reals(v):
    out = V.check_real("x", v, gt=0.0, le=1.0)
    assert out == float(v) and type(out) is float


@pytest.mark.parametrize(
    ("kw", "v", "msg"),
    [
        (dict(ge=0.0, lt=1.0), 1.0, "x must be in [0, 1); got 1.0"),
        (dict(gt=0.0, lt=1.0), 0.0, "x must be in (0, 1); got 0.0"),
        (dict(gt=0.0, le=1.0), 1.5, "x must be in (0, 1]; got 1.5"),
        (dict(ge=0.0, le=1.0), -0.1, "x must be in [0, 1]; got -0.1"),
        (dict(gt=0.0), -2, "x must be finite and > 0; got -2"),
        (dict(ge=0.0), float("inf"), "x must be finite and >= 0; got inf"),
        (dict(gt=0.0, ge=1.0, lt=2.0), 0.5, "x must be finite and > 0 and >= 1 and < 2; got 0.5"),
        ({}, float("nan"), "x must be finite; got nan"),
    ],
)
def test_check_real_bound_messages(kw, v, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        V.check_real("x", v, **kw)


@pytest.mark.parametrize(("v", "seen"), [(True, "True (bool)"), ("0.5", "'0.5' (str)")])
def test_check_real_refuses_bools_and_strings(v, seen):
    with pytest.raises(TypeError, match=re.escape(f"x must be a real number; got {seen}")):
        V.check_real("x", v, ge=0.0)


# ---------------------------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------------------------


def test_check_tensor_type_ndim_and_layout():
    x = torch.zeros(2, 3)
    assert V.check_tensor("x", x, 2) is x
    with pytest.raises(TypeError, match="x must be a torch.Tensor; got ndarray"):
        V.check_tensor("x", np.zeros((2, 3)))
    with pytest.raises(ValueError, match=re.escape("x must have 3 dims; got shape (2, 3)")):
        V.check_tensor("x", x, 3)
    with pytest.raises(
        ValueError, match=re.escape("x must have shape (B, T, D); got shape (2, 3)")
    ):
        V.check_tensor("x", x, 3, layout="(B, T, D)")
    with pytest.raises(TypeError, match=re.escape("x must be a torch.Tensor (B, T, D); got list")):
        V.check_tensor("x", [1.0], 3, layout="(B, T, D)")


def test_check_float_tensor():
    x = torch.zeros(2, 3)
    assert V.check_float_tensor("w", x, 2) is x
    with pytest.raises(TypeError, match="w must be a floating-point tensor; got dtype torch.int64"):
        V.check_float_tensor("w", torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(
        ValueError, match=re.escape("w must have at least 2 dims (..., Tq, Tk); got shape (3,)")
    ):
        V.check_float_tensor("w", torch.zeros(3), 2, layout="(..., Tq, Tk)")
    with pytest.raises(
        ValueError, match=re.escape("w must have shape (N, D); got shape (2, 3, 1)")
    ):
        V.check_float_tensor("w", torch.zeros(2, 3, 1), ndim=2, layout="(N, D)")


def test_check_finite_counts_what_it_saw():
    assert public_check_finite is V.check_finite  # the public name in functional is the same one
    V.check_finite("x", torch.tensor([1.0, -2.0]))
    V.check_finite("ids", torch.tensor([1, 2]))  # integer tensors cannot hold NaN
    bad = torch.tensor([1.0, float("nan"), float("-inf"), float("inf")])
    with pytest.raises(
        ValueError, match=re.escape("x must be finite; got 1 NaN and 2 Inf")
    ) as info:
        V.check_finite("x", bad)
    assert "(4,)" in str(info.value)
    # a finite tensor whose sum overflows is still finite
    V.check_finite("x", torch.full((4,), 3e38))


# ---------------------------------------------------------------------------------------------
# seeded randomness
# ---------------------------------------------------------------------------------------------


def test_seeded_reproduces_and_restores_the_global_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with V.seeded(5):
        a = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    with V.seeded(np.int64(5)):
        b = torch.rand(4)
    with V.seeded(6):
        c = torch.rand(4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a, torch.rand(4, generator=torch.Generator().manual_seed(5)))


def test_seeded_restores_the_rng_after_an_error_and_none_is_a_no_op():
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="boom"), V.seeded(1):
        torch.rand(3)
        raise RuntimeError("boom")
    assert torch.equal(torch.get_rng_state(), before)
    with V.seeded(None):
        torch.rand(3)  # draws from, and advances, the global RNG
    assert not torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(("seed", "seen"), [(True, "True (bool)"), (1.0, "1.0 (float)")])
def test_seeded_refuses_non_int_seeds(seed, seen):
    before = torch.get_rng_state()
    with pytest.raises(TypeError, match=re.escape(f"seed must be an int or None; got {seen}")):
        with V.seeded(seed):
            pass
    assert torch.equal(torch.get_rng_state(), before)


def test_torch_generator_is_seeded_and_leaves_the_global_rng_alone():
    before = torch.get_rng_state()
    a = torch.rand(5, generator=V.torch_generator(3))
    b = torch.rand(5, generator=V.torch_generator(3))
    assert torch.equal(a, b) and torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------------------------------------
# call sites: the migrated modules report through the shared checks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "exc", "msg"),
    [
        (lambda: make_retrieval_task(0), ValueError, "n must be a positive int; got 0"),
        (lambda: make_retrieval_task(2, length=1), ValueError, "length must be an int >= 2; got 1"),
        (
            lambda: make_retrieval_task(2, near_fraction=2.0),
            ValueError,
            "near_fraction must be in [0, 1]; got 2.0",
        ),
        (
            lambda: corrupt_images(torch.rand(2, 8, 8), "noise", 6),
            ValueError,
            "severity must be an int in [1, 5]; got 6",
        ),
        (lambda: TopKSupport(k=0), ValueError, "k must be a positive int; got 0"),
        (
            lambda: local_attention(
                torch.zeros(1, 4, 2), torch.zeros(1, 4, 2), torch.zeros(1, 4, 2), window=-1
            ),
            ValueError,
            "window must be a non-negative int; got -1",
        ),
        (
            lambda: TrainConfig(epochs=0),
            ValueError,
            "TrainConfig.epochs must be a positive int; got 0",
        ),
        (lambda: TrainConfig(lr=float("nan")), ValueError, "TrainConfig.lr must be finite and > 0"),
        (lambda: TrainConfig(kl_weight=2.0), ValueError, "TrainConfig.kl_weight must be in (0, 1]"),
        (lambda: TrainConfig(seed=1.5), TypeError, "TrainConfig.seed must be an int; got 1.5"),
    ],
)
def test_call_sites_use_the_shared_messages(call, exc, msg):
    with pytest.raises(exc, match=re.escape(msg)):
        call()
