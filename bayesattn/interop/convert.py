r"""Swap ``torch.nn.MultiheadAttention`` for Bayesian attention inside any ``nn.Module``, and back.

:func:`convert` walks ``model.named_modules()``, replaces each selected
``torch.nn.MultiheadAttention`` by a :class:`~bayesattn.nn.attention.BayesianMultiheadAttention`
with the same configuration and the same parameter values, and names the layer's Pyro sites by its
module path (``"encoder.layers.3.self_attn.latent"``), so twelve converted layers give twelve
distinct sites even when the root is a plain ``nn.Module``. In ``"mean"`` mode (and for layers
left deterministic) the converted model computes exactly what the original did; with a uniform
prior, torch's encoder layers keep their fused fast path for deterministic layers and call our
``forward`` for Bayesian ones.

:func:`unconvert` turns every Bayesian layer back into a ``torch.nn.MultiheadAttention`` with the
posterior-mean weights (uniform prior only).

Example:
    >>> model = torch.nn.TransformerEncoder(
    ...     torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2,
    ...     enable_nested_tensor=False)
    >>> model = convert(model, family="dirichlet")
    >>> sorted(bayesian_attention_modules(model))
    ['layers.0.self_attn', 'layers.1.self_attn']
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, cast

from torch import nn

from .._deprecation import renamed_kwargs
from ..families import AttentionFamily, FamilyName, get_family
from ..nn.attention import BayesianMultiheadAttention, mha_constructor_args
from ..priors import KeyRelevancePrior

__all__ = ["convert", "unconvert", "bayesian_attention_modules"]

LayerSelector = str | Sequence[str] | Sequence[int] | Callable[[str, nn.Module], bool]


def _select(layers: LayerSelector, names: list[str], model: nn.Module) -> set[str]:
    """Module paths (among ``names``, in model order) chosen by ``layers``."""
    if isinstance(layers, str):
        if layers == "all":
            return set(names)
        if layers == "last":
            return set(names[-1:])
        raise ValueError(f"layers must be 'all', 'last', a list or a callable; got {layers!r}")
    if callable(layers):
        return {n for n in names if layers(n, model.get_submodule(n))}
    chosen: set[str] = set()
    for item in layers:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise TypeError(f"layers entries must be ints or module paths; got {item!r}")
        if isinstance(item, int):
            if not -len(names) <= item < len(names):
                raise ValueError(
                    f"layers index {item} out of range for {len(names)} attention modules"
                )
            chosen.add(names[item])
        elif item not in names:
            raise ValueError(f"layers entry {item!r} is not an attention module; have {names}")
        else:
            chosen.add(item)
    return chosen


def _build(
    spec: Any,
    kind: str,
    path: str,
    mha: BayesianMultiheadAttention | nn.MultiheadAttention,
) -> Any:
    """A fresh family/prior for the layer at ``path`` (never shared between layers)."""
    if spec is None:
        return None
    H, Dh = mha.num_heads, mha.embed_dim // mha.num_heads
    if isinstance(spec, str):
        if kind == "prior":
            raise TypeError("prior must be a KeyRelevancePrior, a callable or None; got a str")
        return get_family(cast(FamilyName, spec), num_heads=H, head_dim=Dh)  # checks the name
    if isinstance(spec, (AttentionFamily, KeyRelevancePrior)):
        return copy.deepcopy(spec)
    if callable(spec):
        return spec(path, mha)
    raise TypeError(f"{kind} must be a name, an instance, a callable or None; got {spec!r}")


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    *head, last = path.split(".")
    parent = model.get_submodule(".".join(head)) if head else model
    return parent, last


def _name_sites(layer: BayesianMultiheadAttention, path: str) -> None:
    """Pyro sites of ``layer`` (and its submodules) are named from its module path."""
    layer._pyro_set_supermodule(path, layer._pyro_context)


@renamed_kwargs(posterior="family")
def convert(
    model: nn.Module,
    family: str | AttentionFamily | Callable | None = None,
    prior: KeyRelevancePrior | Callable | None = None,
    layers: LayerSelector = "all",
) -> nn.Module:
    """Replace ``torch.nn.MultiheadAttention`` modules of ``model`` by Bayesian ones, in place.

    Args:
        model: any ``nn.Module`` (or an ``nn.MultiheadAttention`` itself, then a new module is
            returned).
        family: family name (``"dirichlet"``, ``"logistic_normal"``, ``"weibull"``,
            ``"concrete"``), an :class:`~bayesattn.families.AttentionFamily` (deep-copied
            per layer), a callable ``(path, mha) -> AttentionFamily | None``, or ``None``
            (deterministic drop-ins). ``posterior=`` is its deprecated spelling (until 0.4).
        prior: a :class:`~bayesattn.priors.KeyRelevancePrior` (deep-copied per layer), a callable
            ``(path, mha) -> KeyRelevancePrior | None``, or ``None`` (uniform: outputs unchanged).
        layers: ``"all"``, ``"last"``, a list of module paths or of indices into the model's
            attention modules (in ``named_modules`` order), or a predicate ``(path, module) -> bool``.

    Returns:
        ``model`` (converted in place), or the new layer if ``model`` was an attention module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    if type(model) is nn.MultiheadAttention:
        return _convert_one(model, family, prior, "")
    names = [
        n
        for n, m in model.named_modules()
        if type(m) is nn.MultiheadAttention or isinstance(m, BayesianMultiheadAttention)
    ]
    if not names:
        raise ValueError("model has no torch.nn.MultiheadAttention (or Bayesian) modules")
    chosen = _select(layers, names, model)
    for path in names:
        if path not in chosen:
            continue
        old = model.get_submodule(path)
        if isinstance(old, BayesianMultiheadAttention):  # re-convert: new family/prior
            old.family = _build(family, "family", path, old)
            if prior is not None:
                old.prior = _build(prior, "prior", path, old)
            _name_sites(old, path)
            continue
        if not isinstance(old, nn.MultiheadAttention):  # pragma: no cover - names has only MHAs
            raise TypeError(f"{path} is not an attention module; got {type(old).__name__}")
        new = _convert_one(old, family, prior, path)
        parent, last = _parent(model, path)
        setattr(parent, last, new)
        _name_sites(new, path)
    return model


def _convert_one(
    old: nn.MultiheadAttention,
    family: str | AttentionFamily | Callable | None,
    prior: KeyRelevancePrior | Callable | None,
    path: str,
) -> BayesianMultiheadAttention:
    args = mha_constructor_args(old)  # same shapes, device and dtype
    new = BayesianMultiheadAttention(
        **args,
        prior=_build(prior, "prior", path, old),
        family=_build(family, "family", path, old),
    )
    new.load_state_dict(old.state_dict())  # exact copies of every parameter
    if new.family is not None:
        new.family.to(device=args["device"])
    new.train(old.training)
    return new


def unconvert(model: nn.Module) -> nn.Module:
    """Replace every :class:`BayesianMultiheadAttention` of ``model`` by the plain
    ``torch.nn.MultiheadAttention`` of its posterior mean (same parameters), in place.

    Raises ``TypeError`` for a layer with a non-uniform prior (no torch equivalent).
    """
    if isinstance(model, BayesianMultiheadAttention):
        return model.to_torch()
    layers = [
        (n, m) for n, m in model.named_modules() if isinstance(m, BayesianMultiheadAttention)
    ]
    for path, layer in layers:
        parent, last = _parent(model, path)
        setattr(parent, last, layer.to_torch())
    return model


def bayesian_attention_modules(model: nn.Module) -> dict[str, BayesianMultiheadAttention]:
    """``{module path: layer}`` for every Bayesian attention layer (with a family) of ``model``."""
    return {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, BayesianMultiheadAttention) and m.family is not None
    }
