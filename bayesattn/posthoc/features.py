r"""One feature source for the post-hoc reads: the logits and the features of a model's inputs
from **one** forward pass (eval mode, no grad, posterior-mean attention).

:class:`Features` is what every read takes:

* ``logits`` ``(B, C)`` — the model's output;
* ``cls`` ``(B, E)`` — what the classification head reads (our CLS-pooled networks: the
  final-normed CLS state; mean-pooled ones: the masked mean of the token states; a Hugging Face
  classifier: its pooled output, e.g. BERT's pooler);
* ``tokens`` ``(B, E)`` or ``None`` — the mean of the final token states (the CLS token and
  padding excluded on our networks; positions with ``attention_mask == 0`` excluded on a
  Hugging Face model), ``None`` where the model has no separate token view.

Where they come from (:func:`extract_features`):

* our :class:`~bayesattn.nn.networks.TransformerClassifier` family:
  ``forward_features(x) -> (cls, tokens)`` and ``forward_head(cls)`` (timm's split);
* any other ``nn.Module`` (plain torch, :func:`bayesattn.convert`-ed, Hugging Face): one call of
  ``forward(model, x)`` with a forward pre-hook on the ``head`` module (its input is ``cls``)
  and a forward hook on the ``tokens_layer`` (its output ``(B, T, E)`` is averaged). Both are
  named by the user (a module or its dotted name) or found by name: the head is the last
  module called ``head``/``classifier``/``score``/``fc``, the token layer the last numbered
  block of a ``layers``/``layer``/``h``/``blocks`` list.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .._validation import check_int
from ..nn.modes import attention_mode
from ..nn.networks import TransformerClassifier
from ..predictive.foreign import Inputs, default_forward, input_batch_size, take_rows

__all__ = ["Features", "extract_features", "find_head", "find_token_layer"]

Forward = Callable[[nn.Module, Any], Tensor]
_HEAD_NAMES = ("head", "classifier", "score", "fc")
_BLOCK = re.compile(r"(^|\.)(layers|layer|h|blocks)\.\d+$")


class Features(NamedTuple):
    """The logits and the features of one pass (module docstring)."""

    logits: Tensor  # (B, C)
    cls: Tensor  # (B, E)
    tokens: Tensor | None = None  # (B, E)

    def rows(self, idx: Tensor) -> Features:
        """The rows ``idx`` of every field."""
        return Features(self.logits[idx], self.cls[idx],
                        None if self.tokens is None else self.tokens[idx])  # fmt: skip


def _module(model: nn.Module, which: nn.Module | str, name: str) -> nn.Module:
    """``which`` as a module of ``model`` (a module, or its dotted name)."""
    if isinstance(which, str):
        try:
            return model.get_submodule(which)
        except AttributeError:
            raise ValueError(f"{name}={which!r} names no module of {type(model).__name__}") from None
    if not isinstance(which, nn.Module) or not any(m is which for m in model.modules()):
        raise ValueError(
            f"{name} must be a module of the model (or its dotted name); got "
            f"{type(which).__name__}"
        )
    return which


def find_head(model: nn.Module) -> nn.Module:
    """The last module named ``head``/``classifier``/``score``/``fc`` (the one the logits come
    from); ``ValueError`` asking to name it when there is none."""
    found = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in _HEAD_NAMES]
    if not found:
        raise ValueError(
            f"no classification head found in {type(model).__name__} (no module named "
            f"{'/'.join(_HEAD_NAMES)}): pass head=, the module that maps features to logits, "
            "as a module or its dotted name (e.g. DensityRead(model, head=model[-1]) or "
            "head=\"out\")"
        )
    return found[-1]


def find_token_layer(model: nn.Module) -> nn.Module | None:
    """The last numbered block of the model's layer list (``encoder.layers.1``,
    ``bert.encoder.layer.1``, ``transformer.h.11``), or ``None``."""
    found = [m for n, m in model.named_modules() if _BLOCK.search(n)]
    return found[-1] if found else None


def extract_features(
    model: nn.Module,
    x: Inputs,
    *,
    head: nn.Module | str | None = None,
    tokens_layer: nn.Module | str | None = None,
    forward: Forward | None = None,
    batch_size: int = 512,
    tokens: bool = True,
) -> Features:
    """:class:`Features` of inputs ``x`` (a tensor, or a dict of tensors such as
    ``input_ids``/``attention_mask``, batch first) in one eval-mode pass per ``batch_size``
    rows (module docstring). ``tokens=False``: no token view (a CLS-pooled network of ours then
    computes the last layer's CLS row only)."""
    check_int("batch_size", batch_size, 1)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    n = input_batch_size(x)
    if n == 0:
        raise ValueError("x must hold at least one example; got an empty batch (0 rows)")
    ours = isinstance(model, TransformerClassifier) and head is None and tokens_layer is None
    if ours and forward is not None:
        raise ValueError("forward applies to models we did not write; got one for a network")
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), attention_mode("mean"):
            if ours:
                assert isinstance(model, TransformerClassifier)
                parts = [_ours(model, take_rows(x, idx), tokens) for idx in _chunks(n, batch_size)]
            else:
                parts = _foreign(model, x, n, head, tokens_layer if tokens else None,
                                 forward or default_forward, batch_size, tokens)  # fmt: skip
    finally:
        model.train(was)
    out = concat_features(parts)
    for name, t in (("logits", out.logits), ("features", out.cls)):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"the model's {name} for x are not finite (NaN or Inf): check x")
    return out


def _chunks(n: int, batch_size: int) -> list[Tensor]:
    return [torch.arange(a, min(a + batch_size, n)) for a in range(0, n, batch_size)]


def _ours(net: TransformerClassifier, xb: Any, tokens: bool) -> Features:
    cls, tok = net.forward_features(xb, tokens=tokens)  # (B, E), (B, E) | None
    return Features(net.forward_head(cls, tok), cls, tok)


def concat_features(parts: list[Features]) -> Features:
    toks = [p.tokens for p in parts]
    tok = None if any(t is None for t in toks) else torch.cat(toks)  # type: ignore[arg-type]
    return Features(torch.cat([p.logits for p in parts]), torch.cat([p.cls for p in parts]), tok)


def _foreign(
    model: nn.Module, x: Inputs, n: int, head: nn.Module | str | None,
    tokens_layer: nn.Module | str | None, forward: Forward, batch_size: int, tokens: bool,
) -> list[Features]:  # fmt: skip
    """One hooked pass per chunk: the head's input and the token layer's output."""
    head_m = find_head(model) if head is None else _module(model, head, "head")
    tok_m = (find_token_layer(model) if tokens_layer is None and tokens
             else None if tokens_layer is None else _module(model, tokens_layer, "tokens_layer"))  # fmt: skip
    seen: dict[str, Any] = {}

    def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
        seen["cls"] = args[0].detach()

    def post(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        seen["tokens"] = (out if isinstance(out, Tensor) else out[0]).detach()

    handles = [head_m.register_forward_pre_hook(pre)]
    if tok_m is not None:
        handles.append(tok_m.register_forward_hook(post))
    parts = []
    try:
        for idx in _chunks(n, batch_size):
            seen.clear()
            xb = take_rows(x, idx)
            z = forward(model, xb).detach()
            if "cls" not in seen:
                raise ValueError(
                    f"head ({type(head_m).__name__}) was not called by the model's forward: "
                    "name the module that maps features to logits (head=...)"
                )
            tok = _token_mean(seen.get("tokens"), xb, len(idx))
            parts.append(Features(z, pooled_at_logits(head_m, seen["cls"], z), tok))
    finally:
        for h in handles:
            h.remove()
    return parts


def _token_mean(h: Tensor | None, xb: Inputs, B: int) -> Tensor | None:
    """The mean over positions of the token layer's output ``(B, T, E)`` (``attention_mask``
    zeros excluded when ``xb`` is a dict holding one)."""
    if h is None:
        return None
    if h.dim() != 3 or h.shape[0] != B:
        raise ValueError(
            f"the token layer's output must be batch-first (B, T, E) = ({B}, T, E); got "
            f"{tuple(h.shape)}: name another tokens_layer"
        )
    mask = xb.get("attention_mask") if isinstance(xb, dict) else None
    if mask is None:
        return h.mean(-2)
    keep = mask.to(h.dtype).unsqueeze(-1)  # (B, T, 1)
    return (h * keep).sum(-2) / keep.sum(-2).clamp_min(1.0)


def pooled_at_logits(head: nn.Module, h: Tensor, z: Tensor) -> Tensor:
    """Features ``(B, E)`` of the position the logits ``z (B, C)`` come from, for a head given
    ``h (B, T, E)`` (the first token when no position's head output matches ``z``): a GPT-2
    sequence classifier applies its head to every token and reads the last non-padding one."""
    if h.dim() == 2:
        return h
    if h.dim() != 3 or z.dim() != 2 or h.shape[0] != z.shape[0]:
        return h[:, 0] if h.dim() == 3 else h.reshape(h.shape[0], -1)
    per_token = head(h)  # (B, T, C)
    if per_token.shape[:1] + per_token.shape[2:] != z.shape:
        return h[:, 0]
    err = (per_token - z[:, None, :]).abs().amax(-1)  # (B, T)
    pos = err.argmin(-1)  # (B,)
    tol = 1e-4 * (1 + z.abs().amax(-1))
    if not bool((err.gather(1, pos[:, None]).squeeze(1) <= tol).all()):
        return h[:, 0]
    return h[torch.arange(h.shape[0], device=h.device), pos]
