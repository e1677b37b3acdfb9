import matplotlib
import pyro
import pytest
import torch

matplotlib.use("Agg")
# Our test models are tiny: one thread avoids thread start-up and contention costs that dominate
# them on a 2-core machine (and keeps results independent of the core count).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_and_clear():
    """Every test starts seeded with an empty Pyro param store (Pyro's own test convention)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.manual_seed(0)
    yield
    pyro.clear_param_store()
