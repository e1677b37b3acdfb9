"""What a CLS-pooled token network writes, per layer, for the density read's token views: one
eval-mode pass without grad gives the logits, every encoder layer's CLS state (the last one
final-normed, as the head reads it; the earlier ones the residual stream after that layer) and
the final-normed token states (CLS excluded), to be reduced by
:func:`~bayesattn.calibration.token_scores.masked_token_mean`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..nn.networks import TransformerClassifier

__all__ = ["TokenViews", "token_views"]


@dataclass(frozen=True)
class TokenViews:
    """``logits (B, C)``, ``layer_cls (L, B, E)``, ``states (B, T, E)``."""

    logits: Tensor
    layer_cls: Tensor
    states: Tensor


def token_views(net: TransformerClassifier, x: Tensor, batch_size: int = 512) -> TokenViews:
    """The views of token ids ``x`` ``(B, T)`` through a CLS-pooled token network (a
    deterministic pass: dropout off, any Bayesian attention in its current mode).

    Shape:
        x ``(B, T)`` → logits ``(B, C)``, layer_cls ``(L, B, E)``, states ``(B, T, E)``.
    """
    if not isinstance(net, TransformerClassifier) or net.cls is None or net.vocab_size is None:
        raise ValueError("token_views needs a CLS-pooled TransformerClassifier over token ids")
    layers = net._encoder_layers()
    norm = net.encoder.norm
    was = net.training
    net.eval()
    logits, cls, states = [], [], []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            xb = x[i : i + batch_size]
            h = net.embed(xb)  # (B, T, E)
            pad = net.padding_mask(xb)
            h = torch.cat([net.cls.expand(h.shape[0], 1, -1), h], dim=1)  # (B, 1+T, E)
            if pad is not None:
                pad = torch.cat([pad.new_zeros(pad.shape[0], 1), pad], dim=1)
            per_layer = []
            for layer in layers:
                h = layer(h, src_key_padding_mask=pad)  # (B, 1+T, E)
                per_layer.append(h[:, 0])
            out = norm(h) if norm is not None else h
            per_layer[-1] = out[:, 0]
            logits.append(net.head(out[:, 0]))
            cls.append(torch.stack(per_layer))  # (L, B, E)
            states.append(out[:, 1:])
    net.train(was)
    return TokenViews(torch.cat(logits), torch.cat(cls, 1), torch.cat(states))
