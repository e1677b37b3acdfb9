"""Every tensor the library makes follows its inputs' device and dtype (checked on CPU).

A GPU is not needed to catch a tensor made on the wrong device: the passes below run with
``torch.set_default_device("meta")`` while the modules and inputs stay on the CPU, so a tensor
made without ``device=`` (``torch.zeros(n)``, ``torch.arange(T)``, ``torch.tensor(c)``) lands on
``meta``: on a GPU it would have landed on the CPU. The modules are in float64 (``.double()``,
float64 inputs), so a floating tensor made without ``dtype=`` is float32. A
``TorchDispatchMode`` sees the output of every operator and records those on ``meta`` or of a
floating dtype other than float64, with the library line that made them.

Why not the modules themselves on ``meta`` (``module.to("meta")``)? The library refuses meta
tensors on purpose everywhere but deterministic dense attention (a support, a family or a GP read
looks at the values: top-k, sampling, k-means; ``BayesianMultiheadAttention`` raises a
``ValueError`` saying so), so meta modules can check that path only; it is checked below too.
A bfloat16 pass checks that the posterior mean keeps a low-precision dtype end to end.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import bayesattn
from bayesattn import attention_mode, convert
from bayesattn.families import get_family
from bayesattn.functional.supports import cluster_topk_support
from bayesattn.nn import AttentionConfig
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.networks import CausalLM, Seq2Seq, TransformerClassifier, VisionTransformer
from bayesattn.nn.supports import get_support
from bayesattn.priors import build_prior
from bayesattn.uncertainty import predict

FAMILIES = ["dirichlet", "logistic_normal", "weibull", "concrete", None]
SUPPORTS: dict[str, dict[str, Any]] = {
    "dense": {},
    "local": {"window": 2},
    "local_global": {"window": 2, "global_tokens": (0,)},
    "topk": {"k": 3},
    "cluster_topk": {"k": 3},
    "tiled": {"tile": 3},
    "lowrank": {"rank": 2, "max_len": 8},
}
PRIORS: dict[str, dict[str, Any]] = {
    "uniform": {},
    "alibi": {},
    "causal": {},
    "local": {"window": 2},
    "learned": {"max_distance": 4},
    "contextual": {},
}
E, H, T, B = 8, 2, 6, 2

# Deliberate float32 the check allows: (file, function, why).
ALLOWED = {
    # the k-means start positions: float32 linspace truncated to key indices; it never meets the
    # data, and any other dtype rounds a few positions differently (other seeded results)
    ("cluster_topk.py", "_kmeans"),
}


#: the library's own folder: a frame is the library's when its file is under it (not a path that
#: merely holds "/bayesattn/", such as a virtual environment inside a checkout called bayesattn)
LIBRARY = str(Path(bayesattn.__file__).resolve().parent) + os.sep


def _origin() -> tuple[str, str, str]:
    """The innermost library frame of the current stack: (file, function, 'path:line')."""
    for f in reversed(traceback.extract_stack()):
        path = str(Path(f.filename).resolve())
        if path.startswith(LIBRARY):
            name = path[len(LIBRARY):]
            return name.rsplit(os.sep, 1)[-1], f.name, f"bayesattn/{name}:{f.lineno} {f.name}"
    return "", "", "(outside the library)"


class _Strays(TorchDispatchMode):
    """Records every operator output on ``meta`` or of a floating dtype other than ``dtype``."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.found: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        outs = tree_flatten(out)[0]
        if "scaled_dot_product" in str(func):  # its logsumexp is float32 by design: the output
            outs = outs[:1]
        for t in outs:
            if not isinstance(t, torch.Tensor):
                continue
            wrong_dtype = t.is_floating_point() and t.dtype != self.dtype
            if t.device.type == "meta" or wrong_dtype:
                file, fn, where = _origin()
                if (file, fn) not in ALLOWED:
                    self.found.setdefault(where, f"{func} -> {t.device.type} {t.dtype}")
        return out


@contextmanager
def _strict(dtype: torch.dtype = torch.float64) -> Iterator[_Strays]:
    """Tensors made without ``device=`` land on ``meta``; every stray is recorded."""
    strays = _Strays(dtype)
    torch.set_default_device("meta")
    try:
        with strays:
            yield strays
    finally:
        torch.set_default_device(None)


def _check(run: Callable[[], Any], dtype: torch.dtype = torch.float64) -> Any:
    error: Exception | None = None
    with _strict(dtype) as strays:
        try:
            out = run()
        except RuntimeError as e:  # a stray met the inputs: say where it was made
            error = e
    assert not strays.found and error is None, (
        "tensors made off the inputs' device/dtype:\n"
        + "\n".join(f"  {where}: {what}" for where, what in strays.found.items())
        + (f"\nand then: {error}" if error else "")
    )
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            assert t.device.type == "cpu"
            assert not t.is_floating_point() or t.dtype == dtype, t.dtype
    return out


def _layer(family: str | None, support: str = "dense", prior: str = "uniform") -> nn.Module:
    torch.manual_seed(0)
    return BayesianMultiheadAttention(
        E, H, batch_first=True,
        family=get_family(family, H, E // H) if family else None,
        support=get_support(None if support == "dense" else support, **SUPPORTS[support]),
        prior=build_prior(prior, H, E // H, **PRIORS[prior]),
    ).double()  # fmt: skip


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("support", list(SUPPORTS))
@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_layer_follows_device_and_dtype(family: str | None, support: str):
    m, x = _layer(family, support), _x(B, T, E)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, -2:] = True
    causal = _causal()
    for mode in ("mean", "guide"):
        with attention_mode(mode):
            _check(lambda: m(x, x, x, key_padding_mask=pad))  # noqa: B023
            if support not in ("lowrank", "cluster_topk"):  # no causal/attn_mask there
                _check(lambda: m(x, x, x, is_causal=True, attn_mask=causal))  # noqa: B023
    with attention_mode("guide"):
        _check(lambda: m(x, x, x, num_samples=3, need_weights=False))


def _causal() -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).triu(1)


@pytest.mark.parametrize("prior", list(PRIORS))
def test_priors_follow_device_and_dtype(prior: str):
    m, x = _layer("dirichlet", prior=prior), _x(B, T, E)
    for mode in ("mean", "guide", "model", "elbo"):
        with attention_mode(mode):
            _check(lambda: m(x, x, x))  # noqa: B023


def _networks() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    cfg = AttentionConfig("logistic_normal", prior="alibi")
    tok = torch.randint(3, 11, (B, T))
    kw: dict[str, Any] = dict(d_model=E, nhead=H, dim_feedforward=16, attention=cfg)
    return {
        "classifier": (TransformerClassifier(3, vocab_size=11, max_len=T, **kw), (tok,)),
        "vit": (VisionTransformer(3, image_size=4, patch_size=2, **kw), (_x(B, 1, 4, 4),)),
        "seq2seq": (Seq2Seq(11, 11, max_len=T, **kw), (tok, tok)),
        "causal_lm": (CausalLM(11, max_len=T, **kw), (tok,)),
        "last_layer": (
            TransformerClassifier(
                3,
                vocab_size=11,
                max_len=T,
                pooling="cls",
                **{**kw, "attention": AttentionConfig.last_layer()},
            ),
            (tok,),
        ),  # fmt: skip
    }


@pytest.mark.parametrize("name", list(_networks()))
def test_networks_and_predict_follow_device_and_dtype(name: str):
    net, inputs = _networks()[name]
    net = net.double()
    net.train()
    with attention_mode("guide"):
        _check(lambda: net(*inputs, num_samples=2))
    net.eval()
    with attention_mode("mean"):
        _check(lambda: net(*inputs))
    y = inputs[1] if name == "seq2seq" else None
    res = _check(lambda: predict(net, inputs[0], num_samples=3, y=y))
    assert res.probs.dtype == torch.float64


def test_posterior_mean_keeps_bfloat16():
    torch.manual_seed(0)
    net = VisionTransformer(3, image_size=4, patch_size=2, d_model=E, nhead=H,
                            attention=AttentionConfig("dirichlet")).to(torch.bfloat16).eval()  # fmt: skip
    x = torch.randn(B, 1, 4, 4, dtype=torch.bfloat16)
    with attention_mode("mean"):
        out = _check(lambda: net(x), dtype=torch.bfloat16)
    assert torch.isfinite(out.float()).all()


def test_meta_modules_run_the_deterministic_path():
    """Modules moved to ``meta``: the deterministic dense path runs there (shapes only)."""
    x = torch.randn(B, T, E, device="meta")
    m = BayesianMultiheadAttention(E, H, batch_first=True).to("meta")
    out, w = m(x, x, x)
    assert out.device.type == "meta" and out.shape == (B, T, E) and w.device.type == "meta"
    net = VisionTransformer(3, image_size=4, patch_size=2, d_model=E, nhead=H).to("meta").eval()
    out = net(torch.randn(B, 1, 4, 4, device="meta"))
    assert out.device.type == "meta" and out.shape == (B, 3)
    bayes = _layer("dirichlet").to("meta")
    with pytest.raises(ValueError, match="meta"):
        bayes(x.double(), x.double(), x.double())


@pytest.mark.parametrize("name", ["seq2seq", "causal_lm"])
def test_generation_follows_device_and_dtype(name: str):
    net, inputs = _networks()[name]
    net = net.double().eval()
    prompt = inputs[0][:, :2]
    res = _check(lambda: net.generate(prompt, max_len=3, num_samples=2))
    assert res.probs.dtype == torch.float64


def test_gp_read_and_converted_model_follow_device_and_dtype():
    torch.manual_seed(0)
    cfg = AttentionConfig("dirichlet", read="sparse_gp", read_kwargs={"num_inducing": 3})
    net = TransformerClassifier(3, input_dim=E, d_model=E, nhead=H, attention=cfg).double()
    x = _x(B, T, E)
    net.train()
    _check(lambda: net(x, num_samples=2))
    _check(lambda: predict(net.eval(), x, num_samples=2))
    layer = nn.TransformerEncoderLayer(E, H, 16, 0.0, batch_first=True)
    torch_net = nn.Sequential(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False))
    converted = convert(torch_net, family="dirichlet").double().eval()
    for mode in ("mean", "guide"):
        with attention_mode(mode):
            _check(lambda: converted(x))  # noqa: B023


def test_empty_cluster_topk_follows_device_and_dtype():
    q, k = _x(B, T, 4), _x(B, 0, 4)  # no keys: the support falls back to top-k
    pad = torch.zeros(B, 0, dtype=torch.bool)
    out = _check(lambda: cluster_topk_support(q, k, 3, key_padding_mask=pad).log_prior)
    assert out.shape == (B, T, 0)


def test_the_check_sees_strays():
    """The harness itself: a tensor made without device= or dtype= is reported."""
    x = _x(3)
    with pytest.raises(AssertionError, match="meta"):
        _check(lambda: x + torch.zeros(3))
    with pytest.raises(AssertionError, match="float32"):
        _check(lambda: x + torch.zeros(3, device="cpu"))
