"""The study's distance-aware read of what attention writes (issue 30): the class-conditional
density read (:mod:`bayesattn.interop.class_density`) on the deterministic network.

Every hyperparameter is chosen on in-distribution data: the density's prior strength by the
validation features' log predictive density, its score's standardisation and the density-aware
temperature on validation. Its ablations (the CLS output alone; the generative classifier under
posterior draws) and a spectrally normalised trunk read by it and by the post-hoc GP read were
measured and lost; their numbers are in ``docs/which-attention.md``, their code is gone."""

from __future__ import annotations

import time

from torch import Tensor

from ..interop.class_density import ClassDensityRead, fit_class_density
from ..uncertainty import PredictionResult
from .methods import Fitted, Method, register_method
from .runs import Run

__all__ = ["ClassDensity"]


class ClassDensity(Method):
    """The deterministic network, frozen, with the class-conditional NIW density read of its CLS
    output and mean token state; predictive: the network's logits under the density-aware
    temperature; own score: the density score."""

    name = "density"
    description = ("class-conditional NIW density of the CLS output + token states (DDU-style, "
                   "conjugate); density-aware temperature")  # fmt: skip
    own_score = "class density"
    views = ("cls", "tokens")  # what the density reads: Run.views' (logits, cls, tokens)[1:]

    @staticmethod
    def _views(run: Run, split: str, x: Tensor | None = None) -> list[Tensor]:
        return list(run.views(split, x)[1:])

    def fit(self, run: Run) -> Fitted:
        nets, secs = run.members(1)
        f = Fitted(list(nets), secs[0])
        t0 = time.perf_counter()
        d = run.data
        val_logits, *val_views = run.views("val")
        read = fit_class_density(self._views(run, "train"), d.y_train, val_views, d.y_val,
                                 d.num_classes, val_logits=val_logits)  # fmt: skip
        f.train_seconds += time.perf_counter() - t0
        f.state.update(read=read, run=run)
        f.params = {"views": list(self.views), "prior_strength": read.strengths,
                    "temperature": read.temperature, "density_scale": read.scale,
                    "chosen_by": "prior strength by validation log predictive density; score "
                                 "standardised and (T, a) fitted on validation"}  # fmt: skip
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        run: Run = fitted.state["run"]
        read: ClassDensityRead = fitted.state["read"]
        logits, *views = run.views("", x)
        return PredictionResult(read.probs(logits, views).float()[None])  # (1, B, C)

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return fitted.state["read"].score(self._views(run, "", x))

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float]:
        return 0.0, fitted.state["read"].kl()


register_method(ClassDensity(), default=True)  # the best single network measured: in make study
