r"""The torch surface of :class:`~bayesattn.nn.attention.BayesianMultiheadAttention`: what makes it
a drop-in for ``torch.nn.MultiheadAttention`` outside its forward. :class:`TorchSurface` (a base
of the layer) decides when torch's fused fast path may skip our ``forward``
(``_qkv_same_embed_dim``), merges masks as torch's encoder layer asks, initialises the parameters
as torch does and converts to torch's layer (:meth:`TorchSurface.to_torch`, also what
``torch.jit.script`` compiles); :func:`mha_constructor_args` rebuilds either layer with the same
shapes.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor, nn

from ..priors import KeyRelevancePrior, UniformPrior
from .mha_checks import merge_masks
from .modes import default_mode

__all__ = ["PRIOR_FAMILY_KEY", "TorchMultiheadAttention", "TorchSurface", "mha_constructor_args"]

#: torch's own class, bound at import: code that swaps ``torch.nn.MultiheadAttention`` for ours
#: (the drop-in recipe) still gets torch's layer from :meth:`TorchSurface.to_torch`
TorchMultiheadAttention = nn.MultiheadAttention

#: ``state_dict`` keys of the parts torch's layer does not have
PRIOR_FAMILY_KEY = re.compile(r"(^|\.)(prior|family|support|kernel|gp_read)\.")


class TorchSurface(nn.Module):
    """The torch-facing half of a Bayesian attention layer (see the module docstring); the
    layer sets the attributes below in its constructor."""

    embed_dim: int
    num_heads: int
    prior: KeyRelevancePrior
    _same_embed: bool
    in_proj_weight: Tensor
    q_proj_weight: Tensor
    k_proj_weight: Tensor
    v_proj_weight: Tensor
    in_proj_bias: Tensor | None
    out_proj: nn.Linear
    bias_k: Tensor | None
    bias_v: Tensor | None

    def _matches_torch(self) -> bool:
        """True when torch's fused kernels compute exactly this layer *now*: uniform prior, every
        key, no GP read, weights not recorded, no sampled projections, and deterministic (no
        family) or in ``"mean"`` mode (set, or eval mode's default: :func:`default_mode`). Only then may torch's layers skip our ``forward``. (Read
        straight from the instance dicts: torch asks on every call, and
        ``PyroModule.__getattr__`` is slow.)"""
        d = self.__dict__
        mods = d["_modules"]
        if (
            d.get("record_weights")
            or d["_pyro_samples"]
            or mods.get("support", d.get("support")) is not None
            or mods.get("gp_read", d.get("gp_read")) is not None
            or not isinstance(mods.get("prior"), UniformPrior)
        ):
            return False
        if mods.get("family", d.get("family")) is None:
            return True
        # the mode is read from context variables: inside torch.compile stay on our forward
        return not torch.compiler.is_compiling() and default_mode(d["training"]) == "mean"

    @property
    def _qkv_same_embed_dim(self) -> bool:
        """torch's attribute, read by ``torch.nn.TransformerEncoderLayer``/``TransformerEncoder``
        to choose their fused fast path (which reads the projections and never calls our
        ``forward``): True only when the projections are packed and :meth:`_matches_torch`.
        So a Bayesian layer in ``"mean"`` mode keeps torch's fast path, and one that draws
        weights (or has a prior, a support, recorded weights) turns it off. The layout itself
        is ``_same_embed``."""
        return bool(self._same_embed) and self._matches_torch()

    def merge_masks(
        self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, query: Tensor
    ) -> tuple[Tensor | None, int | None]:
        """As ``torch.nn.MultiheadAttention.merge_masks`` (called by torch's encoder layer on its
        fast path): one mask and its type, 0 ``attn_mask`` ``(T, T)``, 1 ``key_padding_mask``
        ``(B, T)``, 2 both merged to ``(B, H, T, T)``.

        Shape:
            query ``(B, T, E)``.
        """
        return merge_masks(attn_mask, key_padding_mask, query, self.num_heads)

    def to_torch(self) -> TorchMultiheadAttention:
        """The deterministic (posterior-mean) layer as a plain ``torch.nn.MultiheadAttention``
        with copies of the same parameters. Only a uniform prior has one."""
        if not isinstance(self.prior, UniformPrior):
            raise TypeError(
                f"to_torch: a layer with prior {type(self.prior).__name__} has no "
                "torch.nn.MultiheadAttention equivalent (only UniformPrior)"
            )
        m = TorchMultiheadAttention(**mha_constructor_args(self))
        sd = {k: v for k, v in self.state_dict().items() if not PRIOR_FAMILY_KEY.search(k)}
        m.load_state_dict(sd)
        m.train(self.training)
        return m

    def __prepare_scriptable__(self) -> TorchMultiheadAttention:
        """``torch.jit.script`` scripts the posterior-mean layer (:meth:`to_torch`): TorchScript
        cannot compile Pyro sample sites, so a scripted layer is always deterministic."""
        return self.to_torch()

    def _reset_parameters(self) -> None:
        """Same initialisation as ``torch.nn.MultiheadAttention``."""
        if self._same_embed:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None and self.bias_v is not None:  # both or neither
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)


def mha_constructor_args(m: nn.Module) -> dict[str, Any]:
    """The constructor arguments that rebuild ``m`` (a ``torch.nn.MultiheadAttention`` or a
    :class:`BayesianMultiheadAttention`: they share these attributes) with the same shapes, on
    the same device and dtype; used to convert between the two."""
    if not isinstance(m, (TorchMultiheadAttention, TorchSurface)):
        raise TypeError(
            f"m must be a torch.nn.MultiheadAttention or a BayesianMultiheadAttention; got "
            f"{type(m).__name__}"
        )
    ref = m.in_proj_weight if m.in_proj_weight is not None else m.q_proj_weight
    return {
        "embed_dim": m.embed_dim,
        "num_heads": m.num_heads,
        "dropout": m.dropout,
        "bias": m.in_proj_bias is not None,
        "add_bias_kv": m.bias_k is not None,
        "add_zero_attn": m.add_zero_attn,
        "kdim": m.kdim,
        "vdim": m.vdim,
        "batch_first": m.batch_first,
        "device": ref.device,
        "dtype": ref.dtype,
    }
