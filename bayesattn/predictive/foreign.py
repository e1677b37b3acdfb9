r"""The predictive pass of a model we did not write: any ``nn.Module`` whose attention
:func:`bayesattn.convert` or :func:`bayesattn.interop.hf.convert_hf` made Bayesian.

``S`` draws of :math:`p_s = \operatorname{softmax}(f(x, w_s) / T)`, either in one pass under
:func:`bayesattn.num_samples` (``vectorised``: the model must broadcast a leading sample dim) or
by batched repetition (every example ``S`` times in the batch; any model). Used through
:class:`bayesattn.predictive.Predictive`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro import poutine
from torch import Tensor, nn

from ..nn.modes import AttentionMode, attention_mode
from ..nn.sampling import num_samples as num_samples_ctx
from .fold import FoldError, FoldPlan, fold_plan, folded
from .result import PredictionResult

__all__ = ["Inputs", "default_forward", "input_batch_size", "sample_foreign", "take_rows"]

Inputs = Tensor | Mapping[str, Tensor]  # a model's inputs: a tensor or a dict (transformers)


def default_forward(model: nn.Module, x: Inputs) -> Tensor:
    """``model(x)`` (``model(**x)`` for a dict); a transformers output's ``.logits``, the first
    element of a tuple. A base model's output (``last_hidden_state``, no ``.logits``) is refused:
    which token and head give class logits is the caller's choice (``forward=``)."""
    out = model(**x) if isinstance(x, Mapping) else model(x)
    if hasattr(out, "logits"):
        out = out.logits
    elif hasattr(out, "last_hidden_state"):
        raise ValueError(
            f"{type(model).__name__} returned a {type(out).__name__} without .logits (a base "
            "model: hidden states, not class scores); use a model with a head (e.g. "
            "...ForSequenceClassification) or pass forward=, e.g. forward=lambda m, x: "
            "head(m(**x).last_hidden_state[:, 0])"
        )
    elif isinstance(out, tuple):
        out = out[0]
    return out


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


def input_batch_size(x: Inputs) -> int:
    """Dim 0 of a tensor or of a dict of tensors (which must agree)."""
    if isinstance(x, Mapping):
        sizes = {k: int(v.shape[0]) for k, v in x.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"inputs must share their batch size (dim 0); got {sizes}")
        return next(iter(sizes.values()))
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a Tensor or a dict of Tensors; got {type(x).__name__}")
    return int(x.shape[0])


def take_rows(x: Inputs, idx: Tensor | slice) -> Inputs:
    """Rows ``idx`` of a tensor or of every tensor of a dict."""
    return {k: v[idx] for k, v in x.items()} if isinstance(x, Mapping) else x[idx]


def _repeat_rows(x: Inputs, S: int) -> Inputs:
    """Each example ``S`` times, sample-major: row ``s * B + b`` is example ``b``."""

    def rep(v: Tensor) -> Tensor:
        return v.repeat((S,) + (1,) * (v.dim() - 1))  # (S*B, ...)

    return {k: rep(v) for k, v in x.items()} if isinstance(x, Mapping) else rep(x)


def sample_foreign(
    model: nn.Module,
    x: Inputs,
    num_samples: int,
    batch_size: int | None,
    mode: AttentionMode,
    forward: Callable[[nn.Module, Any], Tensor] | None,
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
    repetition starts at the first Bayesian layer (:mod:`bayesattn.predictive.fold`: the layers
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
                b = input_batch_size(xb)
                if vectorised and S > 1:
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
                    if (
                        not isinstance(out, Tensor)
                        or out.dim() != 3
                        or (tuple(out.shape[:2]) != (S, b))
                    ):
                        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                        raise ValueError(
                            f"vectorised sampling needs a model that returns (S, B, C) = ({S}, "
                            f"{b}, C); got {got}: use batched repetition (vectorised=False; "
                            "method='repeat' in sample_probs)"
                        )
                    chunks.append(out)
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


def _repeated(
    model: nn.Module,
    fwd: Callable[[nn.Module, Any], Tensor],
    xb: Inputs,
    S: int,
    batch_size: int | None,
    plan: FoldPlan | None,
) -> Tensor:
    """Batched repetition of ``xb`` (``b`` examples): logits ``(S, b, C)``, every example ``S``
    times (sample-major), at most ``batch_size`` rows per pass (``S > batch_size``: ``S`` split
    too). With a ``plan`` and all ``S·b`` rows in one pass, folded at the first Bayesian layer
    (:func:`~bayesattn.predictive.fold.folded`); a model the fold cannot follow is warned about
    and repeated whole, from the same random state."""
    b = input_batch_size(xb)
    if plan is not None and (batch_size is None or S * b <= batch_size):
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        state = (torch.random.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None)
        try:
            with folded(plan, S, b):
                out = fwd(model, xb)  # (S*b, C)
            if isinstance(out, Tensor) and out.dim() == 2 and out.shape[0] == S * b:
                return out.reshape((S, b) + out.shape[1:])  # (S, b, C)
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            reason = f"the forward returned {got}, not {S * b} rows"
        except (FoldError, RuntimeError, IndexError, ValueError) as e:
            reason = f"{type(e).__name__}: {e}"
        torch.random.set_rng_state(state[0])  # the fallback draws what it would have drawn
        if state[1] is not None:
            torch.cuda.set_rng_state_all(state[1])
        warnings.warn(
            f"predict: could not start the samples at the first Bayesian layer of "
            f"{type(model).__name__} ({reason}); drawing them by batched repetition of the "
            "whole model (S times the cost of one pass)",
            UserWarning,
            stacklevel=4,
        )
    rows = _repeat_rows(xb, S) if S > 1 else xb  # (S*b, ...)
    step = batch_size or S * b
    outs = [
        _check_logits(fwd(model, take_rows(rows, slice(j, j + step))),
                      min(step, S * b - j), b, xb)
        for j in range(0, S * b, step)
    ]  # fmt: skip
    out = torch.cat(outs)  # (S*b, C)
    return out.reshape((S, b) + out.shape[1:])  # (S, b, C)
