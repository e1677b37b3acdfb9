"""Scoring one fitted method on one run: quality raw and after temperature scaling, OOD AUROCs
(entropy, mutual information, own score) on the held-out classes, the far-OOD sets and the
corruptions, and cost (training seconds, inference ms at batch 1 and batch 512)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import calibration as C
from ..uncertainty import PredictionResult
from .methods import Fitted, Method
from .runs import Run

__all__ = ["evaluate", "quality", "ood_scores", "selective", "finish_row", "primary_score", "get",
           "SCALARS", "TIMINGS", "COVERAGES"]  # fmt: skip


def quality(p: Tensor, y: Tensor, suffix: str = "") -> dict[str, float]:
    """Accuracy, NLL, ECE (15 bins) and Brier of predictive probabilities ``p`` ``(B, C)``."""
    return {
        f"accuracy{suffix}": C.accuracy(p, y),
        f"nll{suffix}": C.negative_log_likelihood(p, y),
        f"ece{suffix}": C.expected_calibration_error(p, y),
        f"brier{suffix}": C.brier_score(p, y),
    }


def _scaled(p: Tensor, T: float) -> Tensor:
    """``p^(1/T)`` renormalised: temperature scaling of a predictive's log-probabilities."""
    return torch.softmax(p.clamp_min(1e-12).log() / T, dim=-1)


def ood_scores(
    res_in: PredictionResult, res_out: PredictionResult, own: tuple[Tensor, Tensor] | None
) -> dict[str, float | None]:
    """AUROC of in- vs out-of-distribution by predictive entropy, by mutual information and by
    the method's own score (``None`` without one); AUPR by entropy."""
    return {
        "auroc_entropy": C.ood_auroc(res_in.predictive_entropy, res_out.predictive_entropy),
        "auroc_mi": C.ood_auroc(res_in.mutual_information, res_out.mutual_information),
        "auroc_own": C.ood_auroc(*own) if own is not None else None,
        "aupr_entropy": C.ood_aupr(res_in.predictive_entropy, res_out.predictive_entropy),
    }


#: coverages of the selective-prediction accuracies
COVERAGES = (0.9, 0.8)


def selective(res: PredictionResult, y: Tensor, own: Tensor | None) -> dict[str, float | None]:
    """Selective prediction on the in-distribution test set: AURC (area under the risk–coverage
    curve) and the accuracy on the 90% / 80% most certain examples, abstaining by predictive
    entropy; ``aurc_own`` abstaining by the method's own score (``None`` without one)."""
    correct = res.mean_probs.argmax(-1) == y
    u = res.predictive_entropy
    out: dict[str, float | None] = {"aurc": C.aurc(u, correct)}
    for c in COVERAGES:
        out[f"acc_at_{round(100 * c)}"] = C.accuracy_at_coverage(u, correct, c)
    out["aurc_own"] = C.aurc(own, correct) if own is not None else None
    return out


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def _cost(method: Method, fitted: Fitted, run: Run) -> dict[str, float]:
    """ms per example of prediction with the own score (:meth:`Method.predict_and_score`): one
    call on 512 test inputs (median of 3), and one call on a single input (median of 15)."""
    x = run.data.x_test

    def call(xb: Tensor) -> None:
        xb = xb.clone()  # a new tensor per call: nothing a method remembers of its inputs
        # (Run.features keeps the last inputs' features) is reused from an earlier timed call
        method.predict_and_score(fitted, run, xb)

    call(x[:8])  # warm-up
    big = x[:512] if len(x) >= 512 else x.repeat(512 // len(x) + 1, *[1] * (x.dim() - 1))[:512]
    return {
        "infer_ms_batch512": _median_ms(lambda: call(big), 3) / 512,
        "infer_ms_batch1": _median_ms(lambda: call(x[:1]), 15),
    }


def evaluate(method: Method, fitted: Fitted, run: Run) -> tuple[dict[str, Any], dict[str, Any]]:
    """The method's row of numbers on ``run`` and the predictions the figures need."""
    d = run.data

    def pred(x: Tensor) -> PredictionResult:
        torch.manual_seed(run.seed)  # every set is predicted with the same draws
        return method.predict(fitted, x)

    def own(x: Tensor) -> Tensor | None:
        return method.score(fitted, run, x).double() if method.own_score else None

    res, res_val = pred(d.x_test), pred(d.x_val)
    T = C.fit_temperature(res_val.mean_probs.clamp_min(1e-12).log(), d.y_val)
    row: dict[str, Any] = quality(res.mean_probs, d.y_test)
    row.update(quality(_scaled(res.mean_probs, T), d.y_test, "_ts"))
    row["temperature"] = T
    row["mean_entropy"] = float(res.predictive_entropy.mean())
    own_in = own(d.x_test)
    res_ood = pred(d.x_ood_classes)
    own_ood = own(d.x_ood_classes)
    row["mean_mi_in"] = float(res.mutual_information.mean())
    row["mean_mi_out"] = float(res_ood.mutual_information.mean())
    both = (own_in, own_ood) if own_in is not None and own_ood is not None else None
    row["held_out"] = ood_scores(res, res_ood, both)
    row["far_ood"] = {}
    for kind, xf in run.far.items():
        o = own(xf)
        pair = (own_in, o) if own_in is not None and o is not None else None
        row["far_ood"][kind] = ood_scores(res, pred(xf), pair)
    row["corruptions"] = {}
    for (kind, sev), xc in run.corrupted.items():
        rc, o = pred(xc), own(xc)
        pair = (own_in, o) if own_in is not None and o is not None else None
        row["corruptions"][f"{kind}_{sev}"] = {
            **ood_scores(res, rc, pair),
            "accuracy": C.accuracy(rc.mean_probs, d.y_test),
            "nll": C.negative_log_likelihood(rc.mean_probs, d.y_test),
        }
    row["selective"] = selective(res, d.y_test, own_in)
    kl = method.posterior_kl(fitted, run)
    row["kl_local"], row["kl_global"] = (None, None) if kl is None else kl
    row["train_seconds"] = fitted.train_seconds
    row.update(_cost(method, fitted, run))
    row["params"] = fitted.params
    return finish_row(row), {"test": res, "ood": res_ood}


#: scalar metrics pooled over units: (key, path in a row, higher is better / None: neither)
SCALARS: tuple[tuple[str, tuple[str, ...], bool | None], ...] = (
    ("accuracy", ("accuracy",), True),
    ("nll", ("nll",), False),
    ("ece", ("ece",), False),
    ("brier", ("brier",), False),
    ("nll_ts", ("nll_ts",), False),
    ("ece_ts", ("ece_ts",), False),
    ("brier_ts", ("brier_ts",), False),
    ("temperature", ("temperature",), None),
    ("auroc_entropy", ("held_out", "auroc_entropy"), True),
    ("auroc_mi", ("held_out", "auroc_mi"), True),
    ("auroc_own", ("held_out", "auroc_own"), True),
    ("auroc_primary", ("auroc_primary",), True),
    ("mean_mi_in", ("mean_mi_in",), None),
    ("mean_mi_out", ("mean_mi_out",), None),
    ("kl_local", ("kl_local",), None),
    ("kl_global", ("kl_global",), None),
    ("far_auroc_uniform", ("far_ood", "uniform", "auroc_entropy"), True),
    ("far_auroc_inverted", ("far_ood", "inverted", "auroc_entropy"), True),
    ("far_auroc_permuted", ("far_ood", "permuted", "auroc_entropy"), True),
    ("far_auroc_moments", ("far_ood", "moments", "auroc_entropy"), True),
    ("auroc_far", ("auroc_far",), True),
    ("auroc_far_moments", ("auroc_far_moments",), True),
    ("auroc_shift", ("auroc_shift",), True),
    ("aurc", ("selective", "aurc"), False),
    ("acc_at_90", ("selective", "acc_at_90"), True),
    ("acc_at_80", ("selective", "acc_at_80"), True),
    ("aurc_own", ("selective", "aurc_own"), False),
    ("corruption_auroc_mean", ("corruption_auroc_mean",), True),
    ("corruption_accuracy_mean", ("corruption_accuracy_mean",), True),
    ("train_seconds", ("train_seconds",), False),
    ("wall_seconds", ("wall_seconds",), False),
    ("infer_ms_batch1", ("infer_ms_batch1",), False),
    ("infer_ms_batch512", ("infer_ms_batch512",), False),
)
#: cost metrics: their numbers differ from run to run of the same arguments
TIMINGS = ("train_seconds", "wall_seconds", "infer_ms_batch1", "infer_ms_batch512")


def primary_score(row: dict[str, Any]) -> tuple[str, float]:
    """The held-out AUROC of a method's declared primary OOD score, fixed before any result is
    seen: its own score where it has one, else mutual information where its predictive has
    more than one distinct draw (MI not identically zero), else predictive entropy; with the
    score's name."""
    held = row["held_out"]
    if held.get("auroc_own") is not None:
        return "own", float(held["auroc_own"])
    if row.get("mean_mi_in", 0.0) > 0 or row.get("mean_mi_out", 0.0) > 0:
        return "MI", float(held["auroc_mi"])
    return "entropy", float(held["auroc_entropy"])


_KEY = {"own": "auroc_own", "MI": "auroc_mi", "entropy": "auroc_entropy"}


def _by(scores: dict[str, Any], name: str) -> float | None:
    """The AUROC of one OOD set by the primary score ``name`` (``None``: not recorded)."""
    v = scores.get(_KEY[name])
    return None if v is None else float(v)


def finish_row(row: dict[str, Any]) -> dict[str, Any]:
    """Add the means over corruptions, the primary score's AUROC (:func:`primary_score`) and
    the near / far / shift AUROCs by that score: held-out classes, the mean over the far-OOD
    sets (and the ``moments`` set alone), the mean over corruptions (``None`` where a set of
    an older study lacks the score)."""
    cs = row["corruptions"].values()
    row["corruption_auroc_mean"] = sum(c["auroc_entropy"] for c in cs) / len(cs)
    row["corruption_accuracy_mean"] = sum(c["accuracy"] for c in cs) / len(cs)
    row["primary_score"], row["auroc_primary"] = primary_score(row)
    name = row["primary_score"]
    for key, sets in (("auroc_far", row["far_ood"].values()), ("auroc_shift", cs)):
        vals = [_by(v, name) for v in sets]
        row[key] = None if not vals or None in vals else sum(vals) / len(vals)  # type: ignore[arg-type]
    moments = row["far_ood"].get("moments")
    row["auroc_far_moments"] = _by(moments, name) if moments is not None else None
    return row


def get(row: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at ``path`` in a row (``None`` where the method has none, e.g. own score)."""
    v: Any = row
    for k in path:
        if k not in v:  # a number a study of an older version did not record (e.g. the KL)
            return None
        v = v[k]
    return None if v is None else float(v)
