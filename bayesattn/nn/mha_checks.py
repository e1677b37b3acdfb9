r"""The torch-compatible surface of :class:`~bayesattn.nn.attention.BayesianMultiheadAttention`:
argument checks, masks and layouts as ``torch.nn.MultiheadAttention`` reads them.

Errors follow torch's types (an ``AssertionError`` or ``RuntimeError`` that is also a
``ValueError``) and keep torch's phrase in the message, so code written for torch still matches
them. Nothing here draws or reads: that is :mod:`bayesattn.nn.read`.

Shape glossary: ``S`` samples (leftmost), ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key length,
``E`` embed dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from torch import Tensor

from .._validation import ShapeAssertionError, ShapeRuntimeError, check_finite, check_same_dtype
from ..functional.supports import SupportWeights
from .read import ReadOut

__all__ = [
    "CausalHintError",
    "causal_hint",
    "pad_masks",
    "check_mask_dims",
    "check_inputs",
    "nested_lengths",
    "lengths_to_padding_mask",
    "to_batch_first",
    "to_caller_layout",
    "pad_nested",
    "renest",
    "merge_masks",
    "dense_outputs",
    "support_outputs",
]


class CausalHintError(RuntimeError, ValueError):
    """``is_causal=True`` without an ``attn_mask``: a ``RuntimeError`` with torch's message (code
    written for ``torch.nn.MultiheadAttention`` catches that) that is also a ``ValueError``
    (bad arguments are ``ValueError``s in this library)."""


_CAUSAL_HINT_ERROR = (
    "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
    "`generate_square_subsequent_mask` to create this mask."
)  # torch's own message, raised in the same case


def causal_hint(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    is_causal: bool,
    need_weights: bool,
    hint_only: bool = False,
) -> tuple[Tensor | None, bool]:
    """torch's reading of ``is_causal``: a hint that ``attn_mask`` is causal, which it needs; the
    causal structure replaces the mask without padding and weights, else the mask is used.
    ``hint_only``: a support that takes ``is_causal`` but no ``attn_mask`` (cluster top-k) reads
    the causal mask given with the hint as the hint, with or without padding."""
    if is_causal and attn_mask is not None and hint_only:
        return None, True
    if not is_causal:
        return attn_mask, False
    if attn_mask is None:
        raise CausalHintError(_CAUSAL_HINT_ERROR)
    if key_padding_mask is None and not need_weights:
        return None, True  # torch: the hint stands for the mask
    return attn_mask, False  # torch: the mask is used, the hint dropped


def pad_masks(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """Both masks widened by one allowed key (for ``bias_k`` or ``add_zero_attn``)."""
    attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
    if key_padding_mask is not None:
        key_padding_mask = F.pad(key_padding_mask, (0, 1))
    return attn_mask, key_padding_mask


def check_mask_dims(
    query: Tensor,
    key: Tensor,
    num_heads: int,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
) -> None:
    """Mask dims as ``torch.nn.MultiheadAttention`` checks them (an ``AssertionError`` that is
    also a ``ValueError``), with torch's phrase in the message so code matching it still works."""
    if query.dim() not in (2, 3):
        return  # leading sample dims: our own extension, checked later
    batched = query.dim() == 3
    if key_padding_mask is not None and key_padding_mask.dim() != (2 if batched else 1):
        kpm_shape = "(B, Tk)" if batched else "(Tk,) for unbatched input"
        raise ShapeAssertionError(
            f"key_padding_mask must be {kpm_shape}; got shape {tuple(key_padding_mask.shape)} (torch: "
            f"expected `key_padding_mask` to be `None` or {2 if batched else 1}-D but found "
            f"{key_padding_mask.dim()}-D tensor instead)"
        )
    if attn_mask is None:
        return
    if attn_mask.dim() not in (2, 3, 4):
        raise ShapeAssertionError(
            f"attn_mask must be 2-D (Tq, Tk), 3-D (B*H, Tq, Tk) or 4-D (B, H, Tq, Tk); got shape "
            f"{tuple(attn_mask.shape)} (torch: expected `attn_mask` to be `None`, 2-D or 3-D but "
            f"found {attn_mask.dim()}-D tensor instead)"
        )
    if not batched and attn_mask.dim() == 3:
        want = (num_heads, query.shape[0], key.shape[0])
        if tuple(attn_mask.shape) != want:
            raise ShapeAssertionError(
                f"attn_mask 3-D shape must be (H, Tq, Tk) = {want} for unbatched input; got "
                f"{tuple(attn_mask.shape)} (torch: Expected `attn_mask` shape to be {want} but "
                f"got {torch.Size(attn_mask.shape)})"
            )


def _check_dim(name: str, x: Tensor, expected: int) -> None:
    if x.shape[-1] != expected:
        # torch: an assert for the query, a RuntimeError from the key/value projection
        cls = ShapeAssertionError if name == "query" else ShapeRuntimeError
        raise cls(f"{name} last dim must be {expected}; got shape {tuple(x.shape)}")


def _check_tensor(name: str, t: object, weight: Tensor) -> None:
    """A floating tensor of at least 2 dims, on the layer's dtype and device."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be floating point; got dtype {t.dtype}")
    if t.dim() < 2:
        raise ShapeAssertionError(
            f"{name} must be 2-D (unbatched) or 3-D (batched); got shape {tuple(t.shape)}"
        )
    check_same_dtype(name, t, weight.dtype, "BayesianMultiheadAttention")
    if t.device != weight.device:
        raise ValueError(
            f"{name} is on {t.device} but the layer's weights are on "
            f"{weight.device}: move the input or the layer (.to(device))"
        )


def check_inputs(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    *,
    dims: tuple[int, int, int],
    num_heads: int,
    weight: Tensor,
    reads_values: bool,
) -> None:
    """Inputs as ``torch.nn.MultiheadAttention`` takes them: types, dtype and device of the layer
    (``weight``), last dims ``dims = (embed_dim, kdim, vdim)``, mask dims, finite values (under
    Pyro validation). ``reads_values``: the layer's read looks at values (a support, a family or
    a GP), which meta tensors do not have."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t, weight)
    if query.device.type == "meta" and reads_values:
        raise ValueError(
            "meta tensors (no values) go through deterministic dense attention only: this "
            "layer has a support, a family or a GP read, whose reads look at the values"
        )
    if not (query.dim() == key.dim() == value.dim()):
        raise ShapeAssertionError(
            f"query, key and value must have the same number of dims; got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)} (torch: "
            f"expected `key` and `value` to be {query.dim()}-D but found {key.dim()}-D and "
            f"{value.dim()}-D tensors respectively)"
        )
    for name, t, d in zip(("query", "key", "value"), (query, key, value), dims, strict=True):
        _check_dim(name, t, d)
    if key.shape[:-1] != value.shape[:-1]:
        raise ShapeAssertionError(
            f"key and value must share all but the last dim; got key {tuple(key.shape)}, "
            f"value {tuple(value.shape)}"
        )
    for name, m in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
        if m is not None and not isinstance(m, Tensor):
            raise TypeError(f"{name} must be a Tensor or None; got {type(m).__name__}")
    check_mask_dims(query, key, num_heads, key_padding_mask, attn_mask)
    if is_validation_enabled():
        check_finite("query", query)
        if key is not query:
            check_finite("key", key)
        if value is not key:
            check_finite("value", value)


def nested_lengths(x: Tensor) -> list[int]:
    """The lengths of a NestedTensor's components along their first dim."""
    return [int(t.shape[0]) for t in x.unbind()]


def lengths_to_padding_mask(lengths: list[int], T: int, device: torch.device) -> Tensor:
    """``(B, T)`` bool, True where a position is padding."""
    ar = torch.arange(T, device=device)  # (T,)
    return ar.unsqueeze(0) >= torch.tensor(lengths, device=device).unsqueeze(1)  # (B, T)


def to_batch_first(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None,
    unbatched: bool,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Inputs as ``(…, B, T, E)``: unbatched ``(T, E)`` gains a batch of one, sequence-first
    ``(…, T, B, E)`` is transposed; the batch sizes of query and key must agree."""
    if unbatched:  # (T, E) → (1, T, E)
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        if key_padding_mask is not None:
            if key_padding_mask.dim() != 1:
                raise ShapeAssertionError(
                    f"key_padding_mask must be 1-D (Tk,) for unbatched input; got shape "
                    f"{tuple(key_padding_mask.shape)}"
                )
            key_padding_mask = key_padding_mask.unsqueeze(0)
    elif not batch_first:  # (*S, T, B, E) → (*S, B, T, E)
        query, key, value = (x.transpose(-3, -2) for x in (query, key, value))
    if key.shape[-3] != query.shape[-3]:
        raise ShapeRuntimeError(
            f"query and key must have the same batch size; got query {tuple(query.shape)}, "
            f"key {tuple(key.shape)} (batch_first={batch_first})"
        )
    return query, key, value, key_padding_mask


def to_caller_layout(out: Tensor, unbatched: bool, batch_first: bool) -> Tensor:
    """``(…, B, Tq, E)`` back to the caller's layout: ``(…, Tq, E)`` unbatched, ``(…, Tq, B,
    E)`` sequence-first."""
    if unbatched:
        return out.squeeze(-3)
    if not batch_first:
        return out.transpose(-3, -2)  # (…, Tq, B, E)
    return out


def pad_nested(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    is_causal: bool,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, list[int]]:
    """NestedTensor inputs ``(B, T_b, E)`` padded: ``(q, k, v, key_padding_mask, attn_mask,
    query lengths)``, the padding masked and, for ``is_causal``, torch's causal mask built."""
    if not batch_first:
        raise ValueError("NestedTensor inputs need batch_first=True (they are batch-first)")
    if attn_mask is not None or key_padding_mask is not None:
        raise ValueError(
            "attn_mask/key_padding_mask are not supported with NestedTensor inputs: the "
            "nested lengths already define the padding"
        )
    if not (query.is_nested and key.is_nested and value.is_nested):
        raise ValueError("query, key and value must all be NestedTensors or all be Tensors")
    q_len = nested_lengths(query)
    k_len = nested_lengths(key)
    if nested_lengths(value) != k_len:
        raise ValueError(f"key and value lengths differ: {k_len} vs {nested_lengths(value)}")
    self_attn = query is key and key is value
    q = torch.nested.to_padded_tensor(query, 0.0)  # (B, Tq, E)
    k = q if self_attn else torch.nested.to_padded_tensor(key, 0.0)  # (B, Tk, kdim)
    v = k if self_attn else torch.nested.to_padded_tensor(value, 0.0)  # (B, Tk, vdim)
    kpm = lengths_to_padding_mask(k_len, k.shape[1], k.device)  # (B, Tk)
    if is_causal:  # the nested form carries no mask: build torch's causal one
        Tq, Tk = q.shape[1], k.shape[1]
        attn_mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(1)
    return q, k, v, kpm, attn_mask, q_len


def renest(out: Tensor, q_len: list[int], layout: torch.layout) -> Tensor:
    """``(…, B, Tq, E)`` padded → nested over the batch (sample dims stay in each component)."""
    pieces = [out[..., b, : q_len[b], :] for b in range(len(q_len))]
    return torch.nested.as_nested_tensor(pieces, layout=layout)


def merge_masks(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, query: Tensor, num_heads: int
) -> tuple[Tensor | None, int | None]:
    """``torch.nn.MultiheadAttention.merge_masks``: one mask and its type, 0 ``attn_mask``
    ``(T, T)``, 1 ``key_padding_mask`` ``(B, T)``, 2 both merged to ``(B, H, T, T)``.

    Shape:
        query ``(B, T, E)``.
    """
    mask_type: int | None = None
    merged: Tensor | None = None
    if key_padding_mask is not None:
        mask_type, merged = 1, key_padding_mask
    if attn_mask is not None:
        B, T, _ = query.shape
        mask_type = 2
        if attn_mask.dim() == 3:
            am = attn_mask.view(B, -1, T, T)  # (B, H, T, T)
        else:
            am = attn_mask.view(1, 1, T, T).expand(B, num_heads, -1, -1)  # (B, H, T, T)
        merged = am
        if key_padding_mask is not None:
            kp = key_padding_mask.view(B, 1, 1, T).expand(-1, num_heads, -1, -1)
            merged = am + kp
    return merged, mask_type


def _squeeze_support_batch(w: SupportWeights) -> None:
    """Drop the batch dim of size 1 of support weights, in place, for an unbatched call:
    ``(…, 1, H, Tq, K)`` → ``(…, H, Tq, K)`` (and the index, dropped mass, global rows alike)."""
    w.weights = w.weights.squeeze(-4)
    if w.index is not None and w.index.dim() >= 4:
        w.index = w.index.squeeze(-4)
    if w.dropped_mass is not None:
        w.dropped_mass = w.dropped_mass.squeeze(-3)
    if w.global_weights is not None:
        w.global_weights = w.global_weights.squeeze(-4)


def support_outputs(
    out: Tensor,
    res: ReadOut,
    unbatched: bool,
    batch_first: bool,
    need_weights: bool,
    average_attn_weights: bool,
) -> tuple[Tensor, SupportWeights | None]:
    """A reduced support's read (``out``: heads merged, ``(*S, …, B, Tq, E)``) in the caller's
    layout, and its weights on the support (:class:`~bayesattn.functional.supports.SupportWeights`)."""
    sw = None
    if need_weights and res.support is not None and res.weights is not None:
        red = res.support
        sw = SupportWeights(
            res.weights, red.index, red.num_keys, red.dropped_mass, average_attn_weights,
            red.global_rows, res.global_weights,
        )  # fmt: skip
        if unbatched:
            _squeeze_support_batch(sw)
    return to_caller_layout(out, unbatched, batch_first), sw


def dense_outputs(
    out: Tensor,
    res: ReadOut,
    num_samples: int | None,
    unbatched: bool,
    batch_first: bool,
    need_weights: bool,
    average_attn_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """The dense read (``out``: heads merged, ``(…, B, Tq, E)``) in the caller's layout and the
    weights as torch returns them (head-averaged unless ``average_attn_weights=False``; ``S``
    identical copies of a deterministic read when ``num_samples`` is given)."""
    w = res.weights
    if num_samples is not None and not res.drawn:  # deterministic: S identical draws
        w = w.expand((num_samples,) + w.shape) if w is not None else None
        out = out.expand((num_samples,) + out.shape)
    out = to_caller_layout(out, unbatched, batch_first)
    if not need_weights or w is None:
        return out, None
    if average_attn_weights:
        w = w.mean(dim=-3)  # (…, B, Tq, Tk)
    if unbatched:
        w = w.squeeze(-3 if average_attn_weights else -4)
    return out, w
