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


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread in every test (tiny models: intra-op threads only add contention on a
    loaded 2-core machine, e.g. a (4, 3, 16) layer norm takes ~14 ms with 2 threads, ~10 µs with
    1), restored afterwards, so a test that changes it cannot slow the ones after it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _registries_restored():
    """Whatever a test registers (a docs snippet's ``@register_support``, a user family) is gone
    after it: the registries of families, priors, supports and study methods are restored, so no
    test sees another's entries (the order of the suite does not matter)."""
    from bayesattn.families import FAMILIES
    from bayesattn.nn.supports import SUPPORTS
    from bayesattn.priors import PRIORS
    from bayesattn.study import methods

    regs = (FAMILIES, PRIORS, SUPPORTS, methods._REGISTRY)
    saved = [dict(r._entries) for r in regs]
    defaults = list(methods._DEFAULT)
    yield
    for r, entries in zip(regs, saved, strict=True):
        r._entries.clear()
        r._entries.update(entries)
    methods._DEFAULT[:] = defaults


@pytest.fixture
def figures():
    """Collect matplotlib figures made in a test (append them) and close them afterwards."""
    import matplotlib.pyplot as plt

    made: list = []
    yield made
    for fig in made:
        plt.close(fig)
