r"""A model we did not write as a network: :class:`ModuleClassifier`, the network contract around
any ``nn.Module`` that returns class logits ``(B, C)``.

``fit(model, data)`` wraps a plain ``nn.Module`` (a torch model made Bayesian by
:func:`bayesattn.convert`, a transformers model by :func:`bayesattn.interop.hf.convert_hf`, or one
with no Bayesian layer at all) in a :class:`ModuleClassifier`, so the trainer sees a
:class:`~bayesattn.nn.networks.BayesianNetwork`. The wrapped model's parameters are trained in
place; checkpoints hold them under ``module.``. The likelihood is categorical over the logits,
:math:`y_b\sim\mathrm{Cat}(\operatorname{softmax} f(x_b; w_b))`, the latents are the attention
weights of its Bayesian layers (drawn from the guide, their :math:`\mathrm{KL}(q\|p)` collected in
``"elbo"`` mode, or at Pyro sites inside the data plate for ``method="svi"``); without Bayesian
layers the objective is the cross-entropy.

A pass of ``S > 1`` samples repeats every example ``S`` times in the batch (batched repetition):
any model works, whatever shapes it expects, and each copy draws its own attention weights. In
eval mode the repetition starts at the first Bayesian layer where the model allows (the fold,
:mod:`bayesattn.nn.fold`: the layers before it run once), the path
:class:`~bayesattn.predictive.Predictive` takes for the bare model too, so both draw the same
samples from the same seed. In ``"mean"`` mode the one deterministic pass is used ``S`` times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyro
from pyro.nn import PyroModule
from torch import Tensor, nn

from ..fold import FoldPlan, Inputs, fold_plan, repeated_rows
from ..modes import current_kl_collector, current_mode
from .base import BayesianNetwork

__all__ = ["ModuleClassifier", "as_network", "default_forward"]

Forward = Callable[[nn.Module, Any], Tensor]


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


class ModuleClassifier(BayesianNetwork):
    """The network contract around ``module``, a classifier that returns logits ``(B, C)``.

    Args:
        module: any ``nn.Module``; its Bayesian attention layers (if any) give the latents.
        forward: ``forward(module, x)`` → logits ``(B, C)`` (default ``module(x)``; a
            transformers output's ``.logits``), e.g. ``lambda m, x: m(input_ids=x,
            attention_mask=(x != 0)).logits``.
        fold: start the samples of an eval-mode pass at the first Bayesian layer where the
            model allows (:func:`~bayesattn.nn.fold.repeated_rows`); ``False``: repeat the
            whole model (the same draws, ``S`` times the cost).

    Shape:
        ``x`` ``(B, ...)`` (a tensor: what the trainer batches), ``y`` ``(B,)`` integer labels;
        logits ``(B, C)``, or ``(S, B, C)`` with ``num_samples = S > 1``.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> net = ModuleClassifier(model)
        >>> net.forward_logits(torch.randn(5, 4), num_samples=2).shape
        torch.Size([2, 5, 3])
    """

    def __init__(
        self, module: nn.Module, forward: Forward | None = None, fold: bool = True
    ) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module; got {type(module).__name__}")
        if isinstance(module, BayesianNetwork):
            raise TypeError(
                f"module is a BayesianNetwork ({type(module).__name__}): train it directly"
            )
        if forward is not None and not callable(forward):
            raise TypeError(f"forward must be callable (module, x) -> logits; got {forward!r}")
        super().__init__()
        self.module = module
        self._forward: Forward = forward if forward is not None else default_forward
        self.fold = bool(fold)

    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        """As :meth:`BayesianNetwork.check_batch`; ``y``, when given, must be ``(B,)`` labels."""
        super().check_batch(x, y)
        if y is not None and y.dim() != 1:
            raise ValueError(
                f"y must be (B,) class labels for a classifier; got shape {tuple(y.shape)}"
            )

    @property
    def wrapped(self) -> nn.Module:
        """The module itself (read without ``PyroModule``'s implicit ``pyro.module``)."""
        return self._modules["module"]  # type: ignore[return-value]

    def _register_params(self) -> None:
        """Every parameter that no ``PyroModule`` owns becomes a Pyro param ``"module$$$<path>"``
        (what ``pyro.module`` does), so ``method="svi"`` trains it; those of Pyro modules (the
        Bayesian layers and families) register under their own names, once each."""
        pyro_owned: list[str] = []
        for path, m in self.wrapped.named_modules():
            if isinstance(m, PyroModule) or any(path.startswith(o) for o in pyro_owned):
                pyro_owned.append(path + "." if path else "")  # it registers them itself
                continue
            for name, p in m.named_parameters(recurse=False):
                pyro.param(f"module$$${path + '.' if path else ''}{name}", p)

    def _logits(self, x: Tensor, rows: int) -> Tensor:
        self._register_params()
        try:
            out = self._forward(self.wrapped, x)
        except (RuntimeError, IndexError) as e:  # the model cannot take x as fit batches it
            raise ValueError(
                f"{type(self.wrapped).__name__} failed on a batch x of shape {tuple(x.shape)} and "
                f"dtype {x.dtype} ({type(e).__name__}: {e}); fit calls forward(model, x), by "
                "default model(x): give ModuleClassifier(model, forward=lambda m, x: ...) that "
                "maps x to logits (B, C)"
            ) from e
        if not isinstance(out, Tensor) or not out.is_floating_point():
            raise TypeError(
                f"{type(self.module).__name__}'s forward must return floating-point logits "
                f"(B, C); got {type(out).__name__}"
            )
        if out.dim() != 2 or out.shape[0] != rows:
            raise ValueError(
                f"{type(self.module).__name__}'s forward must return logits (B, C) = ({rows}, C) "
                f"for x of shape {tuple(x.shape)}; got {tuple(out.shape)} (pass forward= to map "
                "the model's output to class logits)"
            )
        return out

    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        """Logits ``(B, C)``; ``(S, B, C)`` for ``num_samples = S > 1`` by batched repetition,
        folded at the first Bayesian layer in eval mode (each copy draws its own weights; one
        pass expanded in ``"mean"`` mode); labels ``y``, when given, must be in ``[0, C)``."""
        out = self._forward_logits(x, num_samples)
        if y is not None:
            check_labels(y, out.shape[-1])
        return out

    def _forward_logits(self, x: Tensor, num_samples: int) -> Tensor:
        B, S = x.shape[0], num_samples
        if S == 1:
            return self._logits(x, B)
        if current_mode() == "mean":
            out = self._logits(x, B)
            return out.expand((S,) + out.shape)  # (S, B, C): one deterministic pass
        col = current_kl_collector()
        before = set(col.terms) if col is not None else set()
        out = repeated_rows(self._rows, x, S, self._fold_plan(), None, "ModuleClassifier",
                            type(self.wrapped).__name__)  # (S, B, C)  # fmt: skip
        if col is not None:  # per-example KLs (S·B,) of this pass → (S, B)
            for name, kl in col.terms.items():
                if name not in before and isinstance(kl, Tensor) and kl.shape[:1] == (S * B,):
                    col.terms[name] = kl.reshape((S, B) + kl.shape[1:])
        return out

    def _rows(self, x: Inputs, rows: int) -> Tensor:
        assert isinstance(x, Tensor)  # the trainer batches tensors
        return self._logits(x, rows)  # (rows, C)

    def _fold_plan(self) -> FoldPlan | None:
        """The fold of the wrapped model in eval mode (``None`` while any of it trains: dropout
        before the first Bayesian layer would then differ between the ``S`` copies)."""
        if not self.fold or any(m.training for m in self.wrapped.modules()):
            return None
        return fold_plan(self.wrapped)

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        return y, None, 0


def check_labels(y: Tensor, num_classes: int) -> None:
    """Integer labels ``y`` inside ``[0, C)`` for a model with ``C`` logits (a ``ValueError``
    naming the model's class count, not Pyro's support error on the likelihood)."""
    if y.numel() and not y.is_floating_point() and y.device.type != "meta":
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(
                f"labels y must be in [0, {num_classes}) for a model that returns "
                f"{num_classes} logits per example; got min {lo}, max {hi}"
            )


def as_network(model: nn.Module) -> BayesianNetwork:
    """``model`` itself if it is a :class:`BayesianNetwork`, else a :class:`ModuleClassifier`
    around it; anything else is a ``TypeError`` naming the ways in."""
    if isinstance(model, BayesianNetwork):
        return model
    if isinstance(model, nn.Module):
        return ModuleClassifier(model)
    raise TypeError(
        f"network must be an nn.Module (a BayesianNetwork, or any module returning logits "
        f"(B, C), wrapped as ModuleClassifier(model, forward=...)); got {type(model).__name__}"
    )
