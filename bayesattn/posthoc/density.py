r""":class:`DensityRead`: the class-conditional density read of a trained classifier's features
(DDU's discriminant analysis with a conjugate Normal–inverse-Wishart posterior per class;
the maths in :mod:`bayesattn.posthoc._density_core`).

Features read: ``cls`` (what the head reads) and ``tokens`` (the mean final token state)
where the model has both, else ``cls`` alone. For each view :math:`v` the OOD score is the
standardised negative log predictive density

.. math:: s(x) = \sum_v \frac{-\log p_v(h_v(x)) - m_v}{s_v}, \qquad
          \log p_v(h) = \operatorname{logsumexp}_c\big(\log\pi_c + \log t_{vc}(h)\big),

(:math:`t_{vc}` the class's Student-t predictive, :math:`m_v, s_v` on validation) and the
predictive the model's logits under a density-aware temperature,
:math:`\operatorname{softmax}\big(z / \sqrt{T^2 + b\,\operatorname{softplus}(s(x))}\big)`,
:math:`(T, b)` fitted on the validation NLL. Deterministic: ``S = 1``.

Example (any classifier: ours, a plain or converted torch encoder, a Hugging Face model)::

    read = DensityRead(model).fit(x_train, y_train, val=(x_val, y_val))
    res, score = read.predict_and_score(x_test)   # one forward pass
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from .._validation import check_reals
from ..functional.niw import NIW
from ..nn.networks import TransformerClassifier
from ..predictive import PredictionResult
from ._checks import check_labels
from ._density_core import DEFAULT_STRENGTHS, ClassDensityRead, fit_class_density
from .base import PosthocRead
from .features import Features

__all__ = ["DensityRead"]

_NO_TOKENS = (
    "the read reads the token view, but the model gave none (Features.tokens is None): name the "
    "layer whose output (B, T, E) holds the token states, DensityRead(model, tokens_layer=...), "
    "or read views=('cls',)"
)


class DensityRead(PosthocRead):
    """The class-conditional density read (module docstring).

    Args:
        model, head, tokens_layer, forward, batch_size: see :class:`~bayesattn.posthoc.base.PosthocRead`.
        views: the features read, any of ``"cls"`` and ``"tokens"`` (``None``: both where the
            model gives tokens, else ``"cls"``).
        strengths: candidate prior strengths :math:`\\nu_0 - D - 1`, chosen per view by the
            validation features' log predictive density under their own class.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        views: Sequence[str] | None = None,
        strengths: Sequence[float] = DEFAULT_STRENGTHS,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        if views is not None:
            views = tuple(views)
            if not views or len(set(views)) != len(views) or any(
                v not in ("cls", "tokens") for v in views
            ):
                raise ValueError(f"views must be distinct names from ('cls', 'tokens'); got {views}")
        self.views: tuple[str, ...] | None = views
        self.strengths = check_reals("strengths", strengths, gt=0)
        self.core_: ClassDensityRead | None = None

    @property
    def uses_tokens(self) -> bool:
        """The token view is read unless ``views`` leaves it out (it costs a network of ours its
        whole last layer, so a CLS read's pass computes the CLS row only)."""
        return self.views is None or "tokens" in self.views

    def _views(self, f: Features) -> list[Tensor]:
        assert self.views is not None
        if "tokens" in self.views and f.tokens is None:
            raise ValueError(_NO_TOKENS if not isinstance(self.model, TransformerClassifier) else
                             "a network with pooling='mean' has no separate token view (its "
                             "pooled state is the token mean): read it with views=('cls',) or "
                             "views=None")  # fmt: skip
        return [f.cls if v == "cls" else f.tokens for v in self.views]  # type: ignore[misc]

    def _fit(self, x: Features, y: Tensor, val: tuple[Any, Tensor] | None) -> None:
        if val is None:
            raise ValueError(
                "DensityRead.fit needs a validation split of the known classes (it sets the "
                "score's scale and the temperature): fit(x, y, val=(x_val, y_val)); got val=None"
            )
        fv, yv = val
        C = x.logits.shape[1]
        check_labels("y", y, len(x.logits), C)
        yv = check_labels("val y", yv, len(fv.logits), C)
        if fv.logits.shape[1] != C:
            raise ValueError(f"val logits must have C = {C} classes; got {tuple(fv.logits.shape)}")
        if self.views is None:
            self.views = ("cls",) if x.tokens is None else ("cls", "tokens")
        self.core_ = fit_class_density(self._views(x), y, self._views(fv), yv, C,
                                       val_logits=fv.logits, strengths=self.strengths)  # fmt: skip
        self.num_classes = C

    @property
    def temperature(self) -> float:
        """:math:`T` of the density-aware temperature."""
        return self._core().temperature

    @property
    def prior_strengths(self) -> list[float]:
        """The prior strength chosen for each view."""
        return list(self._core().strengths)

    @property
    def scale(self) -> float:
        """:math:`b` of the density-aware temperature."""
        return self._core().scale

    def _core(self) -> ClassDensityRead:
        self._check_fitted()
        assert self.core_ is not None
        return self.core_

    def _predict(self, x: Features, num_samples: int | None) -> PredictionResult:
        return self._predict_and_score(x, num_samples)[0]

    def _score(self, x: Features) -> Tensor:
        return self._core().score(self._views(x))

    def _predict_and_score(
        self, f: Features, num_samples: int | None
    ) -> tuple[PredictionResult, Tensor]:
        if num_samples not in (None, 1):
            raise ValueError(f"num_samples must be None or 1 (the read is deterministic); got "
                             f"{num_samples}")  # fmt: skip
        core = self._core()
        score = core.score(self._views(f))  # (B,)
        u = nn.functional.softplus(score)
        probs = core.probs_from_novelty(f.logits, u).to(f.logits.dtype)  # (B, C)
        return PredictionResult(probs[None], kind="posthoc/density"), score

    def predict_and_score(
        self, features: Any, num_samples: int | None = None
    ) -> tuple[PredictionResult, Tensor]:
        """:meth:`predict` and :meth:`score` of one feature pass and one density evaluation."""
        self._check_fitted()
        return self._predict_and_score(self.features(features), num_samples)

    def sample(self, features: Any, num_samples: int = 8, seed: int = 0) -> PredictionResult:
        """``(S, B, C)`` generative-classifier probabilities under posterior draws of the first
        view's class parameters (their spread is the read's mutual information)."""
        f = self.features(features)
        probs = self._core().sample_probs(self._views(f), num_samples, seed)
        return PredictionResult(probs.to(f.logits.dtype), kind="posthoc/density-draws")

    def kl(self) -> float:
        """KL of every class posterior from its prior, summed over classes and views (nats)."""
        return self._core().kl()

    def _state(self) -> dict[str, Any]:
        core = self._core()
        niw = lambda q: [q.mean, float(q.kappa), q.scale, float(q.df)]  # noqa: E731
        return {
            "views": list(self.views or ()),
            "priors": [niw(p) for p in core.priors],
            "posteriors": [[niw(q) for q in posts] for posts in core.posteriors],
            "log_class_prior": core.log_class_prior, "score_center": core.score_center,
            "score_scale": core.score_scale, "strengths": list(core.strengths),
            "temperature": core.temperature, "scale": core.scale,
        }  # fmt: skip

    def _load(self, state: dict[str, Any]) -> None:
        niw = lambda s: NIW(s[0], s[1], s[2], s[3])  # noqa: E731
        self.views = tuple(state["views"])
        self.core_ = ClassDensityRead(
            [niw(p) for p in state["priors"]],
            [[niw(q) for q in posts] for posts in state["posteriors"]],
            state["log_class_prior"], state["score_center"], state["score_scale"],
            list(state["strengths"]), float(state["temperature"]), float(state["scale"]),
        )  # fmt: skip

