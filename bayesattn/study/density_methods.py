"""The study's distance-aware read of what attention writes (issue 30): the class-conditional
density read (:class:`bayesattn.posthoc.DensityRead`) on the deterministic network.

Every hyperparameter is chosen on in-distribution data: the density's prior strength by the
validation features' log predictive density, its score's standardisation and the density-aware
temperature on validation. Its ablations (the CLS output alone; the generative classifier under
posterior draws) and a spectrally normalised trunk read by it and by the post-hoc GP read were
measured and lost; their numbers are in ``docs/which-attention.md``, their code is gone."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from ..nn.networks import BayesianNetwork
from ..posthoc import DensityRead
from ..posthoc.features import Features
from ..uncertainty import PredictionResult
from .methods import Fitted, Method, register_method
from .runs import Run

__all__ = ["ClassDensity", "DensityPair", "member_reads"]


class ClassDensity(Method):
    """The deterministic network, frozen, with the class-conditional NIW density read of its CLS
    output and mean token state; predictive: the network's logits under the density-aware
    temperature; own score: the density score."""

    name = "density"
    description = ("class-conditional NIW density of the CLS output + token states (DDU-style, "
                   "conjugate); density-aware temperature (one network)")  # fmt: skip
    own_score = "class density"
    views: tuple[str, ...] = ("cls", "tokens")  # the Features read (Run.views: one pass)

    def members(self, run: Run) -> tuple[list[BayesianNetwork], list[float]]:
        """The network read (``run.members(1)``) and its training seconds."""
        return run.members(1)

    def features(self, run: Run, split: str, x: Tensor | None = None) -> Features:
        """The read's features of that network on a named split or on ``x``
        (:meth:`Run.views <bayesattn.study.runs.Run.views>`: one pass, cached)."""
        return run.views(split, x)

    def fit(self, run: Run) -> Fitted:
        nets, secs = self.members(run)
        f = Fitted(list(nets), secs[0])
        t0 = time.perf_counter()
        d = run.data
        read = DensityRead(views=self.views).fit(self.features(run, "train"), d.y_train,
                                                 val=(self.features(run, "val"), d.y_val))  # fmt: skip
        f.train_seconds += time.perf_counter() - t0
        f.state.update(read=read, run=run)
        f.params = {"views": list(self.views), "prior_strength": read.prior_strengths,
                    "temperature": read.temperature, "density_scale": read.scale,
                    "chosen_by": "prior strength by validation log predictive density; score "
                                 "standardised and (T, a) fitted on validation"}  # fmt: skip
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        run: Run = fitted.state["run"]
        return fitted.state["read"].predict(self.features(run, "", x))  # (1, B, C)

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return fitted.state["read"].score(self.features(run, "", x))

    def predict_and_score(
        self, fitted: Fitted, run: Run, x: Tensor
    ) -> tuple[PredictionResult, Tensor]:
        """One pass and one density evaluation (the predictive's temperature needs the score)."""
        return fitted.state["read"].predict_and_score(self.features(run, "", x))

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float]:
        return 0.0, fitted.state["read"].kl()


register_method(ClassDensity(), default=True)  # the best single network measured: in make study


def member_reads(
    run: Run, size: int, views: tuple[str, ...], features: Callable[..., Features]
) -> tuple[list[DensityRead], float]:
    """A :class:`~bayesattn.posthoc.DensityRead` of ``views`` fitted on each of the run's first
    ``size`` members (``features(split, member=m)``: member ``m``'s features of a split), and
    the seconds the fits took."""
    t0 = time.perf_counter()
    d, reads = run.data, []
    for m in range(size):
        train, val = features("train", member=m), features("val", member=m)
        reads.append(DensityRead(views=views).fit(train, d.y_train, val=(val, d.y_val)))
    return reads, time.perf_counter() - t0


class DensityPair(ClassDensity):
    r"""The density read fitted on each of the first ``size`` deterministic members (the
    ensemble's first networks, each read on its own features); predictive: the members' density
    predictives averaged (``S = size`` draws, so their disagreement is a mutual information);
    own score: the members' density scores averaged, :math:`s(x) = \frac1M\sum_m s_m(x)`
    (each already standardised on validation, so no weight is fitted).

    ``views=("cls",)`` reads the CLS output alone, from a pass whose last layer computes the CLS
    row only (:meth:`Run.passes <bayesattn.study.runs.Run.passes>`): the cheaper pair."""

    def __init__(self, size: int = 2, views: tuple[str, ...] = ("cls", "tokens")) -> None:
        self.size, self.views = size, tuple(views)
        cls_only = self.views == ("cls",)
        self.name = f"density{'_cls' if cls_only else ''}_{'pair' if size == 2 else size}"
        what = "the CLS output's density read (one CLS-only pass)" if cls_only else (
            "the density read")
        self.description = (f"{what} on each of {size} deterministic networks; predictives and "
                            "density scores averaged")  # fmt: skip

    def member_features(
        self, run: Run, split: str, x: Tensor | None = None, member: int = 0
    ) -> Features:
        """Member ``member``'s features read (cached per split; the last ``x`` by identity)."""
        read = run.views if "tokens" in self.views else run.passes
        return read(split, x, member=member)

    def fit(self, run: Run) -> Fitted:
        nets, secs = run.members(self.size)
        reads, fit_secs = member_reads(
            run, self.size, self.views, lambda split, member: self.member_features(
                run, split, member=member))  # fmt: skip
        f = Fitted(list(nets), sum(secs) + fit_secs)
        f.state.update(reads=reads, run=run)
        f.params = {"views": list(self.views), "members": self.size,
                    "prior_strength": [r.prior_strengths for r in reads],
                    "temperature": [r.temperature for r in reads],
                    "density_scale": [r.scale for r in reads],
                    "chosen_by": "per member: prior strength by validation log predictive "
                                 "density; score standardised and (T, a) fitted on validation"}  # fmt: skip
        return f

    def predict_and_score(
        self, fitted: Fitted, run: Run, x: Tensor
    ) -> tuple[PredictionResult, Tensor]:
        """Per member one pass and one density evaluation; ``(M, B, C)`` and the mean score."""
        each = [r.predict_and_score(self.member_features(run, "", x, member=m))
                for m, r in enumerate(fitted.state["reads"])]  # fmt: skip
        probs = torch.cat([res.probs for res, _ in each])  # (M, B, C)
        score = torch.stack([s for _, s in each]).mean(0)  # (B,)
        return PredictionResult(probs=probs, kind=f"posthoc/{self.name}"), score

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        return self.predict_and_score(fitted, fitted.state["run"], x)[0]

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return self.predict_and_score(fitted, run, x)[1]

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float]:
        return 0.0, float(sum(r.kl() for r in fitted.state["reads"]))


# the recipe for images and signals (issue 45): two views read lift MNIST-1D's AUROC by .01 but
# cost a whole last layer per network (prediction 0.68-0.75 of the 5-ensemble's, not <= 0.5)
register_method(DensityPair(views=("cls",)), default=True)
register_method(DensityPair())  # the full protocol's
