r"""The predictive pass of a bayesattn network: ``S`` samples as a leading sample dim through
the whole network, in one vectorised pass per chunk of inputs.

.. math:: p_s(c\mid x) = p(c\mid x, w_s, \theta_s), \qquad w_s \sim q(w\mid x),
          \quad \theta_s \sim q(\theta)

Attention weights :math:`w_s` are drawn in the attention mode, projection weights
:math:`\theta_s` (Bayesian projections) and global latents once per sample, shared by every
chunk. Used through :class:`bayesattn.predictive.Predictive`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pyro
import torch
from pyro import poutine
from torch import Tensor, nn

from ..nn.attention import BayesianMultiheadAttention
from ..nn.modes import AttentionMode, attention_mode, global_values
from ..nn.networks import BayesianNetwork, Seq2Seq, TransformerClassifier
from .result import AttentionSamples, PredictionResult

__all__ = ["check_network", "check_targets", "draw_weights", "sample_network"]


def check_network(network: Any) -> BayesianNetwork:
    if not isinstance(network, BayesianNetwork):
        raise TypeError(
            f"network must be a bayesattn BayesianNetwork (TransformerClassifier, "
            f"VisionTransformer, Seq2Seq, CausalLM) or a torch nn.Module whose attention "
            f"bayesattn.convert made Bayesian; got {type(network).__name__}"
        )
    return network


def check_targets(net: BayesianNetwork, x: Tensor, y: Tensor | None) -> None:
    if isinstance(net, Seq2Seq) and y is None:
        raise ValueError(
            "Seq2Seq needs y (the target sequences, BOS first) for its per-token predictive "
            "distribution (teacher forcing); use network.generate() to decode without targets"
        )
    if y is not None and not isinstance(net, Seq2Seq):
        raise ValueError(
            f"y is only used by Seq2Seq (teacher forcing); {type(net).__name__} predicts from x "
            f"alone, got y of shape {tuple(y.shape)}"
        )
    if y is not None and y.shape[0] != x.shape[0]:
        raise ValueError(
            f"x and y must have the same batch size; got x {tuple(x.shape)}, y {tuple(y.shape)}"
        )


def draw_weights(
    network: BayesianNetwork, mode: AttentionMode, num_samples: int
) -> dict[str, Tensor] | None:
    """Projection weights for the ``S`` samples: ``(S, *shape)`` draws from the weight guide
    (``"guide"``/``"elbo"``) or the projection prior (``"model"``); the guide's median in
    ``"mean"`` mode (as :meth:`BayesianNetwork.forward`); ``None`` without Bayesian weights."""
    if network.weight_guide is None:
        return None
    if mode == "mean":
        return network.weight_guide.median()
    fn = network.weight_prior_model if mode == "model" else network.weight_guide
    with poutine.block():
        if num_samples == 1:
            values = fn()  # (*shape)
        else:
            with pyro.plate("_predict_samples", num_samples, dim=-1):
                values = fn()  # (S, *shape): one weight draw per sample
    return {k: v.detach() for k, v in values.items()}


def _chunks(n: int, batch_size: int | None) -> Iterator[slice]:
    step = n if batch_size is None else batch_size
    for start in range(0, n, max(step, 1)):
        yield slice(start, min(start + step, n))


def _run_pass(
    net: BayesianNetwork,
    xb: Tensor,
    yb: Tensor | None,
    mode: AttentionMode,
    values: dict[str, Tensor] | None,
    num_samples: int,
    layers: list[tuple[str, BayesianMultiheadAttention]],
    keep_attention: bool,
    globals_: dict[str, Tensor] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One network pass with ``num_samples`` samples: probabilities ``(S, b, ..., C)`` and the
    recorded attention weights ``(S, b, H, Tq, Tk)`` per layer."""
    with poutine.block(), attention_mode(mode), net.pyro_context, net.weights_from(values):
        with global_values(globals_):  # one draw per sample, shared by every chunk
            logits = net.forward_logits(xb, yb, num_samples)  # (S?, b, ..., C)
    if num_samples == 1:
        logits = logits.unsqueeze(0)  # (1, b, ..., C)
    ws: dict[str, Tensor] = {}
    for name, m in layers if keep_attention else ():
        w = m.last_weights
        if w is None:
            raise RuntimeError(f"attention layer {name} recorded no weights")
        w = w.unsqueeze(0) if w.dim() == 4 else w  # (S, b, H, Tq, Tk)
        if w.shape[0] != logits.shape[0]:  # a mixture in "mean" mode: its K component means
            w = w.mean(0, keepdim=True)  # their average map, as the logits average them
        ws[name] = w
    return torch.softmax(logits, dim=-1), ws


def _memory_bytes() -> int | None:
    """The machine's physical memory in bytes (``None`` where unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def _check_result_fits(
    net: BayesianNetwork, x: Tensor, S: int, attention: bool, batch_size: int | None
) -> None:
    """A ``ValueError`` naming ``num_samples`` when the result alone, ``S`` probability vectors
    per input (``(S, B, C)``, at least 4 bytes each), exceeds the machine's memory:
    ``batch_size`` bounds the inputs per pass, never the samples kept."""
    total = _memory_bytes()
    if total is None:
        return
    per_input = 1
    for d in x.shape[1:] if not isinstance(net, TransformerClassifier) else ():
        per_input *= int(d)  # sequence models: one distribution per position, at least
    width = int(getattr(net, "num_classes", None) or getattr(net, "vocab_size", None) or 1)
    need = 4 * S * x.shape[0] * per_input * width
    if need > total:
        raise ValueError(
            f"num_samples={S} draws of {x.shape[0]} inputs need at least {need / 2**30:.1f} GiB "
            f"for the result alone (S, B, ..., C), more than this machine's "
            f"{total / 2**30:.1f} GiB (batch_size={batch_size} bounds the inputs per pass, not "
            "the samples); lower num_samples or draw in several calls"
        )


def _predictive_mask(net: BayesianNetwork, x: Tensor, y: Tensor | None) -> Tensor | None:
    """Valid positions ``(B, T)`` of a sequence model's per-token predictive; ``None`` for
    classifiers."""
    if isinstance(net, TransformerClassifier):
        return None
    _, mask, _ = net.targets(x, y)
    return mask


def _check_inputs(net: BayesianNetwork, x: Tensor, y: Tensor | None, check_y: bool) -> None:
    """``x`` a non-empty batch the network takes (and ``y`` its targets when ``check_y``)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor; got {type(x).__name__}")
    if check_y:
        check_targets(net, x, y)
    net.check_batch(x, y)
    if x.shape[0] == 0:
        raise ValueError(f"x must hold at least one input; got shape {tuple(x.shape)}")


def _is_stochastic(net: BayesianNetwork, mode: AttentionMode, drops: list[nn.Dropout]) -> bool:
    """Whether two passes can differ: active dropout, or (outside ``"mean"`` mode) a Bayesian
    attention layer or Bayesian projection weights."""
    return bool(drops) or (
        mode != "mean" and (bool(net.bayesian_layers) or net.weight_guide is not None)
    )


@contextmanager
def _predictive_state(
    net: BayesianNetwork,
    layers: list[tuple[str, BayesianMultiheadAttention]],
    drops: list[nn.Dropout],
    keep_attention: bool,
) -> Iterator[None]:
    """The network in eval mode with ``drops`` active and its attention layers recording their
    weights iff ``keep_attention``; every module's training flag and the layers'
    ``record_weights``/``last_weights`` are restored on exit."""
    saved_layers = [(m, m.record_weights, m.last_weights) for _, m in layers]
    saved_training = [(m, m.training) for m in net.modules()]
    try:
        if any(flag for _, flag in saved_training):  # (a Pyro module's setattr is slow)
            net.eval()
        for drop in drops:
            drop.train()
        for _, layer in layers:
            layer.record_weights = keep_attention
        yield
    finally:
        for layer, rec, last in saved_layers:
            layer.record_weights, layer.last_weights = rec, last
        for mod, flag in saved_training:
            if mod.training != flag:
                mod.training = flag


def _is_out_of_memory(e: RuntimeError) -> bool:
    """A failed allocation (``torch.OutOfMemoryError`` is a ``RuntimeError`` too)."""
    return "alloc" in str(e).lower() or "out of memory" in str(e).lower()


def _memory_error(
    num_samples: int, inputs: int, batch_size: int | None, e: Exception
) -> ValueError:
    """The ``ValueError`` for a pass of ``inputs`` inputs × ``num_samples`` that did not fit."""
    return ValueError(
        f"num_samples={num_samples} samples of {inputs} inputs per "
        f"pass (batch_size={batch_size}) do not fit in memory: the S samples "
        "go through the network together; lower num_samples (and batch_size), "
        f"or draw in several calls ({e})"
    )


def _mixture_components(
    net: BayesianNetwork, mode: AttentionMode, S_run: int, S: int, device: torch.device
) -> Tensor | None:
    """The component ``i % K`` of each draw ``(S,)`` of a mixture posterior's stratified draws
    (``None`` without a mixture, outside ``"guide"``/``"elbo"`` mode, or with one draw)."""
    mix = net.trunk_mixture  # draws stratified over its K components
    if mix is not None and mode in ("guide", "elbo") and S_run > 1:
        return torch.arange(S, device=device) % mix.num_components  # (S,)
    return None


def sample_network(
    net: BayesianNetwork,
    x: Tensor,
    y: Tensor | None,
    *,
    num_samples: int,
    batch_size: int | None,
    mode: AttentionMode,
    keep_attention: bool,
    dropout: bool = False,
    progress: bool = False,
    check_y: bool = True,
    expand: bool = True,
) -> PredictionResult:
    """``S`` posterior-predictive samples of a bayesattn network (arguments already checked by
    :class:`~bayesattn.predictive.Predictive`; ``x``/``y`` are checked here).

    ``dropout=True`` keeps every ``nn.Dropout`` active (MC dropout); otherwise the network runs in
    eval mode. Computation before the first random layer is shared by all samples
    (:meth:`~bayesattn.nn.networks.TransformerClassifier.first_stochastic_layer`). A network with
    nothing random runs once and its output is repeated ``S`` times (``expand=False``: kept
    once, ``S = 1``). ``check_y=False`` passes ``y`` to any network (a validation batch's
    targets) instead of only to a ``Seq2Seq``.

    A network with a mixture posterior (:mod:`bayesattn.nn.mixture`) draws its ``S`` samples
    stratified over its ``K`` components: draw ``i`` (of the probabilities and of every kept
    attention map) is component ``i % K``, recorded in ``PredictionResult.components``; in
    ``"mean"`` mode the kept maps are the average of the K component means' maps.

    Shape:
        probs ``(S, B, C)`` (``(S, B, T, V)`` for sequence models), attention
        ``(S, B, H, Tq, Tk)`` per layer.
    """
    _check_inputs(net, x, y, check_y)
    drops = [m for m in net.modules() if isinstance(m, nn.Dropout) and m.p > 0] if dropout else []
    S_run = num_samples if _is_stochastic(net, mode, drops) else 1
    S = num_samples if expand else S_run
    layers = [(n, m) for n, m in net.named_modules() if isinstance(m, BayesianMultiheadAttention)]
    _check_result_fits(net, x, S, keep_attention and bool(layers), batch_size)
    probs_chunks: list[Tensor] = []
    attn_chunks: dict[str, list[Tensor]] = {n: [] for n, _ in layers} if keep_attention else {}
    chunks: Iterable[slice] = list(_chunks(x.shape[0], batch_size))
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc="predict", unit="batch")
    with _predictive_state(net, layers, drops, keep_attention), torch.no_grad():
        values = draw_weights(net, mode, S_run)
        gvals = net.draw_globals(mode, S_run if S_run > 1 else None)
        for sl in chunks:
            yb = None if y is None else y[sl]
            try:
                p, ws = _run_pass(
                    net, x[sl], yb, mode, values, S_run, layers, keep_attention, gvals
                )
            except RuntimeError as e:
                if not _is_out_of_memory(e):
                    raise
                raise _memory_error(num_samples, sl.stop - sl.start, batch_size, e) from e
            probs_chunks.append(p.expand((S,) + p.shape[1:]))  # (S, b, ..., C)
            for name, w in ws.items():
                attn_chunks[name].append(w.expand((S,) + w.shape[1:]))  # (S, b, H, Tq, Tk)
    probs = torch.cat(probs_chunks, dim=1)  # (S, B, ..., C)
    return PredictionResult(
        probs=probs,
        attention={  # (S, B, H, Tq, Tk)
            name: AttentionSamples(torch.cat(ws, dim=1)) for name, ws in attn_chunks.items()
        },
        kind="mc_dropout" if dropout else mode,
        mask=_predictive_mask(net, x, y),
        components=_mixture_components(net, mode, S_run, S, probs.device),
    )
