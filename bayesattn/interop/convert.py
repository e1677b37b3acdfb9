r"""Swap ``torch.nn.MultiheadAttention`` for Bayesian attention inside any ``nn.Module``, and back.

:func:`convert` walks ``model.named_modules()``, replaces each selected
``torch.nn.MultiheadAttention`` by a :class:`~bayesattn.nn.attention.BayesianMultiheadAttention`
with the same configuration and the same parameter values, and names the layer's Pyro sites by its
module path (``"encoder.layers.3.self_attn.latent"``), so twelve converted layers give twelve
distinct sites even when the root is a plain ``nn.Module``. In ``"mean"`` mode (and for layers
left deterministic) the converted model computes exactly what the original did; with a uniform
prior, torch's encoder layers keep their fused fast path for deterministic layers and for Bayesian
ones in ``"mean"`` mode, and call our ``forward`` when weights are drawn.

:func:`unconvert` turns every Bayesian layer back into a ``torch.nn.MultiheadAttention`` with the
posterior-mean weights (uniform prior only).

A module used at several paths (``ModuleList([mha, mha])``, ALBERT-style sharing) is converted
once and the one new layer put at every path, so its parameters stay shared (its Pyro site is
named by its first path). Subclasses of ``nn.MultiheadAttention`` that keep torch's ``forward``
are converted like it; a subclass with its own ``forward`` is left alone with a warning naming it
(and refused when named in ``layers``).

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
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

import pyro
from torch import nn

from ..families import AttentionFamily, FamilyName, get_family
from ..nn.attention import (
    BayesianMultiheadAttention,
    TorchMultiheadAttention,
    mha_constructor_args,
)
from ..nn.config import AttentionConfig
from ..priors import KeyRelevancePrior
from .recipe import UNSET, candidates, roles, torch_recipe

__all__ = ["convert", "unconvert", "bayesian_attention_modules"]

LayerSelector = str | Sequence[str] | Sequence[int] | Callable[[str, nn.Module], bool]


def select_layers(layers: LayerSelector, names: list[str], model: nn.Module) -> set[str]:
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
    argument: Literal["family", "prior"],
    path: str,
    mha: BayesianMultiheadAttention | TorchMultiheadAttention,
) -> Any:
    """A fresh family/prior for the layer at ``path`` (never shared between layers)."""
    if spec is None:
        return None
    H, Dh = mha.num_heads, mha.embed_dim // mha.num_heads
    if isinstance(spec, str):
        if argument == "prior":
            raise TypeError("prior must be a KeyRelevancePrior, a callable or None; got a str")
        return get_family(cast(FamilyName, spec), num_heads=H, head_dim=Dh)  # checks the name
    if isinstance(spec, (AttentionFamily, KeyRelevancePrior)):
        return copy.deepcopy(spec)
    if callable(spec):
        return spec(path, mha)
    raise TypeError(f"{argument} must be a name, an instance, a callable or None; got {spec!r}")


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    *head, last = path.split(".")
    parent = model.get_submodule(".".join(head)) if head else model
    return parent, last


def _reconvert(
    rebuilt: list[tuple[BayesianMultiheadAttention, str, Any, Any]], new_prior: bool
) -> None:
    """Give already-Bayesian layers their new family (and prior, with ``new_prior``); the
    replaced ones' values leave Pyro's param store."""
    for layer, path, fam, pri in rebuilt:
        _forget_params(layer.family, f"{path}.family")  # the old family's, kept by Pyro's store
        layer.family = fam
        if new_prior:
            _forget_params(layer.prior, f"{path}.prior")
            layer.prior = pri
        _name_sites(layer, path)


def _forget_params(module: nn.Module | None, prefix: str) -> None:
    """Drop ``module``'s parameters (named ``prefix[.sub]$$$name``, as a ``PyroModule`` at
    ``prefix`` names them) from Pyro's param store: a re-converted layer's new family must not
    pick up the values the store kept for the family it replaces."""
    if module is None:
        return
    store = pyro.get_param_store()
    for name, _ in module.named_parameters():
        *sub, leaf = name.split(".")
        key = f"{'.'.join([prefix, *sub])}$$${leaf}"
        if key in store:
            del store[key]


def _name_sites(layer: BayesianMultiheadAttention, path: str) -> None:
    """Pyro sites of ``layer`` (and its submodules) are named from its module path."""
    layer._pyro_set_supermodule(path, layer._pyro_context)


def convert(
    model: nn.Module,
    family: str | AttentionFamily | Callable | None = UNSET,
    prior: KeyRelevancePrior | Callable | None = UNSET,
    layers: LayerSelector = UNSET,
    *,
    config: AttentionConfig | None = None,
) -> nn.Module:
    """Replace ``torch.nn.MultiheadAttention`` modules of ``model`` by Bayesian ones, in place.

    Args:
        model: any ``nn.Module`` (or an ``nn.MultiheadAttention`` itself, then a new module is
            returned).
        family: family name (``"dirichlet"``, ``"logistic_normal"``, ``"weibull"``,
            ``"concrete"``), an :class:`~bayesattn.families.AttentionFamily` (deep-copied
            per layer), a callable ``(path, mha) -> AttentionFamily | None``, or ``None``
            (deterministic drop-ins).
        prior: a :class:`~bayesattn.priors.KeyRelevancePrior` (deep-copied per layer), a callable
            ``(path, mha) -> KeyRelevancePrior | None``, or ``None`` (uniform: outputs unchanged).
        layers: ``"all"``, ``"last"``, a list of module paths or of indices into the model's
            attention modules (in ``named_modules`` order), or a predicate ``(path, module) -> bool``.
        config: an :class:`~bayesattn.nn.config.AttentionConfig` as the recipe instead of
            ``family``/``prior``/``layers`` (:mod:`bayesattn.interop.recipe`), e.g.
            ``AttentionConfig.last_layer()``: logistic-normal weights in the last attention
            module, guide and weight model centred on the softmax. Arguments that conflict with
            it are a ``ValueError``.

    Defaults (without ``config``): ``family=None``, ``prior=None``, ``layers="all"``.

    Returns:
        ``model`` (converted in place), or the new layer if ``model`` was an attention module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    family, prior, layers = torch_recipe(config, family, prior, layers)
    if _convertible(model):
        return _convert_one(cast(TorchMultiheadAttention, model), family, prior, "")
    names = [n for n, m in model.named_modules() if _convertible(m) or _is_bayesian(m)]
    foreign = _foreign_subclasses(model)
    _refuse_named_subclasses(foreign, layers)
    if not names:
        _nothing_to_convert(foreign)
    _warn_foreign_subclasses(foreign, layers)
    chosen = select_layers(layers, candidates(model, names, roles(config)), model)
    if not chosen:
        raise ValueError(
            f"layers={layers!r} selected none of the model's {len(names)} attention modules "
            f"{names}: nothing would be converted"
        )
    # build every new layer/family first, change the model only when all were built: a call that
    # raises (a family callable, a bad prior) leaves the model as it was
    rebuilt, swaps = _build_layers(model, [n for n in names if n in chosen], family, prior)
    _swap_in(model, rebuilt, swaps, prior)
    return model


#: a converted layer given a new family and prior: (layer, path, family, prior)
_Rebuilt = tuple[BayesianMultiheadAttention, str, Any, Any]
#: a torch layer and its Bayesian replacement: (path, old, new)
_Swap = tuple[str, nn.Module, BayesianMultiheadAttention]


def _build_layers(
    model: nn.Module, paths: list[str], family: Any, prior: Any
) -> tuple[list[_Rebuilt], list[_Swap]]:
    """What :func:`convert` will change, built without changing ``model``: a new family/prior
    for each already converted layer of ``paths``, a Bayesian layer for each torch one."""
    rebuilt: list[_Rebuilt] = []
    swaps: list[_Swap] = []
    for path in paths:
        old = model.get_submodule(path)
        if isinstance(old, BayesianMultiheadAttention):  # re-convert: new family/prior
            fam = _build(family, "family", path, old)
            pri = _build(prior, "prior", path, old) if prior is not None else old.prior
            rebuilt.append((old, path, fam, pri))
            continue
        new = _convert_one(cast(TorchMultiheadAttention, old), family, prior, path)
        swaps.append((path, old, new))
    return rebuilt, swaps


def _swap_in(model: nn.Module, rebuilt: list[_Rebuilt], swaps: list[_Swap], prior: Any) -> None:
    """Apply :func:`_build_layers`'s changes to ``model``: new families/priors set, torch layers
    replaced at every path they hold (a shared module stays shared), Pyro sites named."""
    # every path of each module (a shared module appears once in ``names``, at its first path)
    paths: dict[int, list[str]] = {}
    for n, m in model.named_modules(remove_duplicate=False):
        if _convertible(m) or _is_bayesian(m):
            paths.setdefault(id(m), []).append(n)
    _reconvert(rebuilt, prior is not None)
    for path, old, new in swaps:
        for p in paths[id(old)]:  # shared modules stay shared
            parent, last = _parent(model, p)
            setattr(parent, last, new)
        _name_sites(new, path)


def _nothing_to_convert(foreign: dict[str, str]) -> None:
    extra = (
        "; its only attention modules are subclasses with their own forward, which cannot "
        f"be converted: {_listed(foreign)}"
        if foreign
        else ""
    )
    raise ValueError(
        f"model has no torch.nn.MultiheadAttention (or Bayesian) modules: nothing to "
        f"convert{extra}"
    )


def _is_bayesian(m: nn.Module) -> bool:
    return isinstance(m, BayesianMultiheadAttention)


def _convertible(m: nn.Module) -> bool:
    """torch's attention module, or a subclass that keeps torch's ``forward``."""
    return isinstance(m, TorchMultiheadAttention) and (
        type(m).forward is TorchMultiheadAttention.forward
    )


def _foreign_subclasses(model: nn.Module) -> dict[str, str]:
    """``{path: class name}`` of the subclasses of ``nn.MultiheadAttention`` with their own
    ``forward``."""
    return {
        n: type(m).__qualname__
        for n, m in model.named_modules()
        if isinstance(m, TorchMultiheadAttention) and not _convertible(m)
    }


def _listed(foreign: dict[str, str]) -> str:
    return ", ".join(f"{p} ({c})" for p, c in foreign.items())


def _refuse_named_subclasses(foreign: dict[str, str], layers: LayerSelector) -> None:
    """A ``TypeError`` when ``layers`` names a subclass with its own ``forward``."""
    if not isinstance(layers, str) and not callable(layers):
        named = [p for p in layers if isinstance(p, str) and p in foreign]
        if named:
            raise TypeError(
                f"convert: {named[0]!r} is a {foreign[named[0]]}, a subclass of "
                "torch.nn.MultiheadAttention with its own forward; it cannot be converted"
            )


def _warn_foreign_subclasses(foreign: dict[str, str], layers: LayerSelector) -> None:
    """Subclasses of ``nn.MultiheadAttention`` with their own ``forward`` are not converted:
    refused when ``layers`` names one, else a warning names them."""
    if not foreign:
        return
    _refuse_named_subclasses(foreign, layers)
    listed = _listed(foreign)
    warnings.warn(
        f"convert: left unchanged {len(foreign)} subclass(es) of torch.nn.MultiheadAttention "
        f"with their own forward (their computation is not torch's): {listed}",
        UserWarning,
        stacklevel=3,
    )


def _convert_one(
    old: TorchMultiheadAttention,
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
    done: dict[int, TorchMultiheadAttention] = {}  # a shared layer stays shared
    for path, layer in list(model.named_modules(remove_duplicate=False)):
        if isinstance(layer, BayesianMultiheadAttention):
            if id(layer) not in done:
                done[id(layer)] = layer.to_torch()
            parent, last = _parent(model, path)
            setattr(parent, last, done[id(layer)])
    return model


def bayesian_attention_modules(model: nn.Module) -> dict[str, BayesianMultiheadAttention]:
    """``{module path: layer}`` for every Bayesian attention layer (with a family) of ``model``."""
    return {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, BayesianMultiheadAttention) and m.family is not None
    }
