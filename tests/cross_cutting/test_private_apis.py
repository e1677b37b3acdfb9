"""Guards for the private APIs of dependencies that bayesattn still calls.

We keep two private torch functions for speed/memory (``benchmarks/private_apis.py`` measures
what they buy): ``torch._softmax(x, dim, half_to_float, out=x)`` (in-place softmax in the
inference paths of ``nn/supports/dense.py`` and ``functional/supports/results.py``) and
``torch._standard_gamma`` (the reparameterised Gamma draws of
``distributions.MaskedDirichlet``/``MaskedGamma``). These tests call
them exactly as the library does and compare with the public equivalents, so a torch release that
renames, re-signs or changes them fails here, loudly, rather than somewhere deep in a model.
Pyro's private ``_Subsample`` is no longer used (``pyro.poutine.util.site_is_subsample``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pyro
import pytest
import torch

import bayesattn

PKG = Path(bayesattn.__file__).parent

#: every private attribute of a dependency the package may use: (module alias, name) -> where
ALLOWED_PRIVATE = {
    ("torch", "_softmax"): {"nn/supports/dense.py", "functional/supports/results.py"},
    ("torch", "_standard_gamma"): {"distributions.py"},
    ("torch", "_assert_async"): {"_validation.py"},  # data checks inside torch.compile graphs
}


def _private_uses() -> dict[tuple[str, str], set[str]]:
    """``torch._x`` / ``pyro._x`` attribute uses and ``from torch/pyro... import _x`` in bayesattn."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("torch", "pyro")
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.setdefault((node.value.id, node.attr), set()).add(rel)
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                "torch",
                "pyro",
            ):
                for a in node.names:
                    if a.name.startswith("_"):
                        found.setdefault((node.module, a.name), set()).add(rel)
    return found


def test_no_other_private_dependency_apis():
    uses = _private_uses()
    extra = {k: v for k, v in uses.items() if k not in ALLOWED_PRIVATE}
    assert not extra, f"private APIs of torch/pyro used without a guard test here: {extra}"
    for key, files in uses.items():
        assert files <= ALLOWED_PRIVATE[key], f"{key} now also used in {files}: add it here"


def test_private_use_scan_sees_private_names():
    """The scan above can fail: it finds the kept uses (a scan that found nothing would pass)."""
    uses = _private_uses()
    assert set(uses) == set(ALLOWED_PRIVATE)


@pytest.mark.parametrize("shape", [(3, 5), (2, 4, 6, 7)])
def test_torch_private_softmax_in_place_matches_softmax(shape):
    x = torch.randn(shape) * 3
    x[..., 0] = float("-inf")  # masked key, as in attention
    expect = torch.softmax(x, dim=-1)
    buf = x.clone()
    out = torch._softmax(buf, -1, False, out=buf)
    assert out.data_ptr() == buf.data_ptr(), "torch._softmax(out=) no longer writes in place"
    torch.testing.assert_close(out, expect, atol=0, rtol=0)
    # keyword form (the documented native signature: self, dim, half_to_float, out)
    y = torch._softmax(x, dim=-1, half_to_float=False)
    torch.testing.assert_close(y, expect, atol=0, rtol=0)


def test_torch_private_standard_gamma_matches_public_gamma():
    conc = (torch.rand(4, 3, 6) * 5 + 0.05).requires_grad_()
    torch.manual_seed(1)
    g = torch._standard_gamma(conc)
    torch.manual_seed(1)
    pub = torch.distributions.Gamma(conc, torch.ones(()), validate_args=False).rsample()
    assert g.shape == conc.shape and g.dtype == conc.dtype
    torch.testing.assert_close(g, pub, atol=0, rtol=0)  # same RNG stream, same draws
    # reparameterised: the same implicit gradient as the public rsample
    (dg,) = torch.autograd.grad(g.sum(), conc)
    (dp,) = torch.autograd.grad(pub.sum(), conc)
    torch.testing.assert_close(dg, dp, atol=0, rtol=0)
    assert torch.isfinite(dg).all() and (dg != 0).any()


def test_torch_private_assert_async_passes_and_raises():
    """``assert_in_graph`` in ``_validation.py`` uses ``torch._assert_async(cond, msg)`` inside
    compiled graphs (no data-dependent Python branch there); in eager it raises at once."""
    torch._assert_async(torch.isfinite(torch.ones(3)).all(), "x must be finite")
    with pytest.raises(RuntimeError):
        torch._assert_async(torch.isfinite(torch.tensor([1.0, float("nan")])).all(), "x finite")


def test_scale_latents_skips_subsample_sites():
    """``ScaleLatents`` uses Pyro's public ``site_is_subsample``: plates' subsample sites keep
    their scale, latent sites are scaled."""
    from bayesattn.training import ScaleLatents

    def model():
        with pyro.plate("data", 10, subsample_size=5):
            pyro.sample("z", pyro.distributions.Normal(0.0, 1.0))

    tr = pyro.poutine.trace(ScaleLatents(0.25)(model)).get_trace()
    assert tr.nodes["z"]["scale"] == pytest.approx(0.25 * 2.0)  # β × the plate's N / n
    assert tr.nodes["data"]["scale"] == 1.0
    assert pyro.poutine.util.site_is_subsample(tr.nodes["data"])
