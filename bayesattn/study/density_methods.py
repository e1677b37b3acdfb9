"""The study's distance-aware reads of what attention writes (issue 30): the class-conditional
density read (:mod:`bayesattn.interop.class_density`) on the deterministic network, its
ablations, and a spectrally normalised (distance-preserving) trunk read by it and by the
post-hoc GP read.

Every hyperparameter is chosen on in-distribution data: the density's prior strength by the
validation features' log predictive density, its score's standardisation and the density-aware
temperature on validation; the spectral-norm bound is fixed in advance
(:data:`~bayesattn.study.runs.SPECTRAL_NORM`)."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from ..interop.class_density import ClassDensityRead, fit_class_density
from ..uncertainty import PredictionResult, predict_ensemble
from .methods import Fitted, Method, register_method
from .runs import SPECTRAL_NORM, Run

__all__ = ["ClassDensity", "SpectralNormalised", "SpectralPosthocGP"]

_VIEWS = {"cls": 1, "tokens": 2}  # index in Run.views' (logits, cls, tokens)


class ClassDensity(Method):
    """A trunk (the deterministic network, or the spectrally normalised one), frozen, with the
    class-conditional NIW density read of its CLS output and mean token state; predictive: the
    network's logits under the density-aware temperature; own score: the density score."""

    name = "density"
    description = ("class-conditional NIW density of the CLS output + token states (DDU-style, "
                   "conjugate); density-aware temperature")  # fmt: skip
    own_score = "class density"
    trunk = "plain"
    views: tuple[str, ...] = ("cls", "tokens")
    sampled = False

    def _trunk_fit(self, run: Run) -> Fitted:
        if self.trunk == "plain":
            nets, secs = run.members(1)
            return Fitted(list(nets), secs[0])
        net, sec = run.spectral_member()
        return Fitted([net], sec)

    def _views(self, run: Run, split: str, x: Tensor | None = None) -> list[Tensor]:
        v = run.views(self.trunk, split, x)
        return [v[_VIEWS[name]] for name in self.views]

    def fit(self, run: Run) -> Fitted:
        f = self._trunk_fit(run)
        t0 = time.perf_counter()
        d = run.data
        val_logits = run.views(self.trunk, "val")[0]
        read = fit_class_density(self._views(run, "train"), d.y_train, self._views(run, "val"),
                                 d.y_val, d.num_classes, val_logits=val_logits)  # fmt: skip
        f.train_seconds += time.perf_counter() - t0
        f.state.update(read=read, run=run, num_samples=run.cfg.num_samples)
        f.params = {"views": list(self.views), "prior_strength": read.strengths,
                    "temperature": read.temperature, "density_scale": read.scale,
                    "trunk": self.trunk,
                    "chosen_by": "prior strength by validation log predictive density; score "
                                 "standardised and (T, a) fitted on validation"}  # fmt: skip
        if self.trunk == "spectral":
            f.params["spectral_norm"] = SPECTRAL_NORM
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        run: Run = fitted.state["run"]
        read: ClassDensityRead = fitted.state["read"]
        views = self._views(run, "", x)
        if self.sampled:
            seed = int(torch.randint(0, 2**31 - 1, ()))  # the study seeds the global generator
            return PredictionResult(read.sample_probs(views, fitted.state["num_samples"], seed))
        logits = run.views(self.trunk, "", x)[0]
        return PredictionResult(read.probs(logits, views).float()[None])  # (1, B, C)

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return fitted.state["read"].score(self._views(run, "", x))

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float]:
        return 0.0, fitted.state["read"].kl()


class _CLSOnly(ClassDensity):
    name = "density_cls"
    description = "ablation of density: the CLS output's density alone (no token states)"
    views = ("cls",)


class _Sampled(ClassDensity):
    name = "density_gda"
    description = ("density's generative classifier under posterior draws of the class "
                   "means/covariances (its MI); own score: the density")  # fmt: skip
    views = ("cls", "tokens")
    sampled = True


class SpectralNormalised(Method):
    """The deterministic network with a spectrally normalised trunk (a control: what the bound
    alone does to accuracy, calibration and entropy AUROC)."""

    name = "spectral"
    description = f"the deterministic network, trunk projections spectrally bounded (c={SPECTRAL_NORM})"

    def fit(self, run: Run) -> Fitted:
        net, secs = run.spectral_member()
        return Fitted([net], secs, {"spectral_norm": SPECTRAL_NORM})

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        return predict_ensemble(fitted.nets[:1], x, batch_size=512)


class _SpectralDensity(ClassDensity):
    name = "spectral_density"
    description = "the spectrally normalised trunk + the class-conditional density read (DDU)"
    trunk = "spectral"


class SpectralPosthocGP(Method):
    """The spectrally normalised trunk + the post-hoc GP read's mean-field predictive (SNGP's
    recipe, post hoc); own score: the GP variance."""

    name = "spectral_gp"
    description = "the spectrally normalised trunk + the post-hoc GP read (mean-field)"
    own_score = "GP variance"

    def fit(self, run: Run) -> Fitted:
        from ..interop.posthoc_gp import fit_posthoc_gp

        net, secs = run.spectral_member()
        t0 = time.perf_counter()
        _, val_cls, _ = run.views("spectral", "val")
        read = fit_posthoc_gp(net.head, val_cls, run.data.y_val, net.head, seed=run.seed)
        secs += time.perf_counter() - t0
        params = {"mf_temperature": read.mf_temperature, "mf_scale": read.mf_scale,
                  "spectral_norm": SPECTRAL_NORM}  # fmt: skip
        return Fitted([net], secs, params, {"read": read, "run": run})

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        cls = fitted.state["run"].views("spectral", "", x)[1]
        return PredictionResult(fitted.state["read"].probs(cls)[None])

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return fitted.state["read"].variance(run.views("spectral", "", x)[1])


register_method(ClassDensity(), default=True)  # the best single network measured: in make study
for _m in (_CLSOnly(), _Sampled(), SpectralNormalised(), _SpectralDensity(), SpectralPosthocGP()):
    register_method(_m)
