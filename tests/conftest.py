import matplotlib
import pyro
import pytest
import torch

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _seed_and_clear():
    """Every test starts seeded with an empty Pyro param store (Pyro's own test convention)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.manual_seed(0)
    yield
    pyro.clear_param_store()
