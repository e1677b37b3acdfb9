r"""The predictive pass of a model we did not write: any ``nn.Module`` whose attention
:func:`bayesattn.convert` or :func:`bayesattn.interop.hf.convert_hf` made Bayesian.

``S`` draws of :math:`p_s = \operatorname{softmax}(f(x, w_s) / T)`, either in one pass under
:func:`bayesattn.num_samples` (``vectorised``: the model must broadcast a leading sample dim) or
by batched repetition (every example ``S`` times in the batch; any model). Used through
:class:`bayesattn.predictive.Predictive`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro import poutine
from torch import Tensor, nn

from ..nn.fold import FoldPlan, Inputs, fold_plan, input_batch_size, repeated_rows, take_rows
from ..nn.modes import AttentionMode, attention_mode
from ..nn.networks.foreign import default_forward
from ..nn.sampling import num_samples as num_samples_ctx
from .result import PredictionResult

__all__ = ["Inputs", "default_forward", "input_batch_size", "sample_foreign", "take_rows"]

Forward = Callable[[nn.Module, Any], Tensor]


def _check_logits(out: Any, rows: int, b: int, x: Inputs) -> Tensor:
    """``out``: the forward's logits for ``rows`` input rows ``(rows, ..., C)``, or a clear
    error (the common mistakes: not a tensor; a sequence-first model)."""
    if not isinstance(out, Tensor) or not out.is_floating_point():
        raise TypeError(
            f"forward must return floating-point logits (B, C); got {type(out).__name__}"
            f"{'' if not isinstance(out, Tensor) else f' of dtype {out.dtype}'}"
        )
    if out.dim() != 2 or out.shape[0] != rows:
        xs = {k: tuple(v.shape) for k, v in x.items()} if isinstance(x, Mapping) else tuple(x.shape)
        raise ValueError(
            f"forward must return class logits (B, C) with the batch first: got shape "
            f"{tuple(out.shape)} for {rows} input rows ({b} examples, x {xs}). predict reads "
            "dim 0 of x as the batch; for a sequence-first model (batch_first=False) pass x "
            "batch-first and forward=lambda m, x: m(x.transpose(0, 1)) (with the output's batch "
            "moved first)"
        )
    return out


def sample_foreign(
    model: nn.Module,
    x: Inputs,
    num_samples: int,
    batch_size: int | None,
    mode: AttentionMode,
    forward: Forward | None,
    temperature: float,
    vectorised: bool,
    fold: bool = True,
) -> PredictionResult:
    """The predictive path for a model we did not write (attention made Bayesian by
    :func:`bayesattn.convert` or :func:`bayesattn.interop.hf.convert_hf`): ``S`` draws of
    ``softmax(f(x, w_s) / T)``. ``vectorised``: one pass under :func:`bayesattn.num_samples`
    (the model must broadcast a leading sample dim and return ``(S, B, C)``); otherwise batched
    repetition: every example ``S`` times in the batch (any model). Either way at most
    ``batch_size`` rows (example × sample) go through the model per pass. ``fold``: batched
    repetition starts at the first Bayesian layer (:mod:`bayesattn.nn.fold`: the layers
    before it run once), where the model allows; ``False``: the whole model on ``S·b`` rows."""
    fwd = forward or default_forward
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)) or not (
        temperature > 0
    ):
        raise ValueError(f"temperature must be a positive finite number; got {temperature!r}")
    S, B = (1 if mode == "mean" else num_samples), input_batch_size(x)
    if B == 0:
        raise ValueError("x must hold at least one input; got a batch of 0")
    saved = [(m, m.training) for m in model.modules()]
    model.eval()
    plan = fold_plan(model) if fold and not vectorised and S > 1 else None
    try:
        with torch.no_grad(), poutine.block(), attention_mode(mode):
            per = max(1, (batch_size or 4096) // S)  # examples per pass (S rows each)
            chunks = []
            for i in range(0, B, per):
                xb = take_rows(x, slice(i, i + per))
                if vectorised and S > 1:
                    chunks.append(_vectorised(model, fwd, xb, S))  # (S, b, C)
                else:
                    chunks.append(_repeated(model, fwd, xb, S, batch_size, plan))  # (S, b, C)
            logits = torch.cat(chunks, dim=1)  # (S, B, C)
    finally:
        for m, flag in saved:
            m.training = flag
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if S != num_samples:
        probs = probs.expand((num_samples,) + probs.shape[1:])
    return PredictionResult(probs=probs, kind=mode)



def _vectorised(model: nn.Module, fwd: Forward, xb: Inputs, S: int) -> Tensor:
    """One pass of ``xb`` (``b`` examples) under :func:`bayesattn.num_samples`: logits
    ``(S, b, C)``, or a ``ValueError`` saying the model does not broadcast the samples."""
    b = input_batch_size(xb)
    try:
        with num_samples_ctx(S):
            out = fwd(model, xb)  # (S, b, C)
    except (RuntimeError, IndexError) as e:  # a shape error deep in the model
        raise ValueError(
            f"vectorised sampling: the model's forward failed with a leading "
            f"sample dim of S={S} ({type(e).__name__}: {e}); it does not "
            "broadcast the samples: use batched repetition (vectorised=False; "
            "method='repeat' in sample_probs)"
        ) from e
    if not isinstance(out, Tensor) or out.dim() != 3 or (tuple(out.shape[:2]) != (S, b)):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"vectorised sampling needs a model that returns (S, B, C) = ({S}, "
            f"{b}, C); got {got}: use batched repetition (vectorised=False; "
            "method='repeat' in sample_probs)"
        )
    return out


def _repeated(
    model: nn.Module,
    fwd: Forward,
    xb: Inputs,
    S: int,
    batch_size: int | None,
    plan: FoldPlan | None,
) -> Tensor:
    """Batched repetition of ``xb`` (``b`` examples): logits ``(S, b, C)``, folded at the first
    Bayesian layer where ``plan`` allows (:func:`~bayesattn.nn.fold.repeated_rows`, the path
    :class:`~bayesattn.nn.networks.ModuleClassifier` samples by too)."""
    b = input_batch_size(xb)

    def run(rows_x: Inputs, rows: int) -> Tensor:
        return _check_logits(fwd(model, rows_x), rows, b, xb)  # (rows, C)

    return repeated_rows(run, xb, S, plan, batch_size, "predict", type(model).__name__)
