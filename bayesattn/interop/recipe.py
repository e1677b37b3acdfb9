r"""An :class:`~bayesattn.nn.config.AttentionConfig` as the recipe of a conversion:
``convert(model, config=AttentionConfig.last_layer())`` and ``convert_hf(model, config=...)``.

The config says which attention modules get a family (``layers``: ``"all"``, ``"last"`` or
indices into the model's attention modules in ``named_modules`` order, among the roles in
``which``: a torch ``TransformerDecoderLayer``'s ``multihead_attn`` or a transformers module
with ``is_cross_attention`` is ``"cross"``, every other one ``"self"``), which family with which
options (``family``, ``family_kwargs``: the guide's settings, e.g.
:meth:`~bayesattn.nn.config.AttentionConfig.last_layer`'s ``input_dependent=True,
model_location="attention"``) and which prior (``prior``,
``prior_kwargs``; transformers models take the uniform prior only). ``support`` and ``read``
are for networks built from the config; a conversion refuses them, and a config that selects no
family (``AttentionConfig()``, :meth:`AttentionConfig.recommended`: plain softmax) is a
``ValueError``: it would convert nothing into Bayesian attention.

The config replaces the arguments ``family``/``prior``/``layers`` (and ``convert_hf``'s family
options): giving both with different values is a ``ValueError`` naming them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ..families import get_family
from ..nn.config import AttentionConfig

__all__ = ["UNSET", "torch_recipe", "hf_recipe", "role", "roles", "candidates"]


class _Unset:
    """The default of an argument that a ``config`` may set (not given by the caller)."""

    def __repr__(self) -> str:
        return "<from config, else the default>"


UNSET: Any = _Unset()


def role(path: str, module: nn.Module) -> str:
    """``"cross"`` for a cross-attention module (torch's ``multihead_attn``, a transformers
    module with ``is_cross_attention``), else ``"self"``."""
    cross = path.rpartition(".")[2] == "multihead_attn" or getattr(
        module, "is_cross_attention", False
    )
    return "cross" if cross else "self"


def _check(config: Any, where: str) -> AttentionConfig:
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"{where}: config must be an AttentionConfig; got {type(config).__name__}")
    if config.support is not None or config.read != "softmax":
        raise ValueError(
            f"{where}: AttentionConfig(support={config.support!r}, read={config.read!r}) is for "
            "networks built from the config; a conversion keeps the model's dense softmax "
            "attention (support=None, read='softmax')"
        )
    if config.family is None:
        raise ValueError(
            f"{where}: config selects no Bayesian attention (AttentionConfig(family=None), as "
            "AttentionConfig() and AttentionConfig.recommended() are); use "
            "AttentionConfig.last_layer() (or a family, e.g. AttentionConfig('dirichlet')) for "
            "Bayesian attention, or keep the model as it is and read it with "
            "bayesattn.posthoc.DensityRead(model) for the recommended uncertainty"
        )
    return config


def _conflicts(where: str, given: dict[str, tuple[Any, Any]]) -> None:
    """A ``ValueError`` naming every argument given with a value other than the config's."""
    bad = [
        f"{k}={v!r} (config has {c!r})"
        for k, (v, c) in given.items()
        if v is not UNSET and not _same(v, c)
    ]
    if bad:
        raise ValueError(
            f"{where}: config= sets family, prior, layers (and the family options); the "
            f"argument(s) {', '.join(bad)} conflict with it: give either the config or the "
            "arguments"
        )


def _same(v: Any, c: Any) -> bool:
    if isinstance(v, Sequence) and not isinstance(v, str):
        return isinstance(c, Sequence) and not isinstance(c, str) and list(v) == list(c)
    return bool(v == c) if isinstance(v, (str, dict, type(None))) else False


def _layers(config: AttentionConfig) -> Any:
    return config.layers if isinstance(config.layers, str) else list(config.layers)


def roles(config: AttentionConfig | None) -> set[str] | None:
    """The attention roles a conversion considers (``None``: every module)."""
    if config is None or set(config.which) >= {"self", "cross"}:
        return None
    return set(config.which)


def candidates(model: nn.Module, names: list[str], which: set[str] | None) -> list[str]:
    """The attention module paths (of ``names``) in the roles ``which``; ``layers`` indexes
    these."""
    if which is None:
        return names
    return [n for n in names if role(n, model.get_submodule(n)) in which]


def torch_recipe(config: Any, family: Any, prior: Any, layers: Any) -> tuple[Any, Any, Any]:
    """``(family, prior, layers)`` for :func:`bayesattn.convert`: the config's when given (the
    family and prior built per layer, ``None`` for the uniform prior), else the arguments with
    their defaults."""
    if config is None:
        return (
            None if family is UNSET else family,
            None if prior is UNSET else prior,
            "all" if layers is UNSET else layers,
        )
    cfg = _check(config, "convert")
    uniform = cfg.prior == "uniform" and not cfg.prior_kwargs
    _conflicts("convert", {"family": (family, cfg.family), "layers": (layers, cfg.layers),
                           "prior": (prior, None if uniform else cfg.prior)})  # fmt: skip

    def fam(path: str, mha: Any) -> Any:
        H = mha.num_heads
        return get_family(str(cfg.family), num_heads=H, head_dim=mha.embed_dim // H,
                          **cfg.family_kwargs)  # fmt: skip

    def pri(path: str, mha: Any) -> Any:
        return cfg.build_prior(mha.num_heads, mha.embed_dim // mha.num_heads)

    return (None if cfg.family is None else fam), (None if uniform else pri), _layers(cfg)


def hf_recipe(
    config: Any, family: Any, layers: Any, family_kwargs: dict[str, Any]
) -> tuple[Any, Any, dict[str, Any]]:
    """``(family, layers, family_kwargs)`` for :func:`bayesattn.interop.hf.convert_hf`."""
    if config is None:
        return ("dirichlet" if family is UNSET else family,
                "all" if layers is UNSET else layers, family_kwargs)  # fmt: skip
    cfg = _check(config, "convert_hf")
    if cfg.prior != "uniform" or cfg.prior_kwargs:
        raise ValueError(
            f"convert_hf: AttentionConfig(prior={cfg.prior!r}): a transformers model's "
            "attention takes its mask as the only prior; use prior='uniform'"
        )
    _conflicts("convert_hf", {"family": (family, cfg.family), "layers": (layers, cfg.layers),
               "family options": (family_kwargs or UNSET, cfg.family_kwargs)})  # fmt: skip
    return cfg.family, _layers(cfg), dict(cfg.family_kwargs)
