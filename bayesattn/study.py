r"""The uncertainty study: several ways of being uncertain, trained and scored on the same split.

Methods (all a small ViT on 8×8 digits, same architecture, split and seed):

=====================  ==========================================================================
``deterministic``      softmax attention, trained by cross-entropy (the ELBO with nothing random)
``mc_dropout``         the same trained network, dropout kept on at test time (Gal & Ghahramani)
``ensemble``           ``ensemble_size`` deterministic networks from different seeds
``recommended``        :meth:`AttentionConfig.recommended`: logistic-normal attention in the last
                       layer (CLS row), prior centred on softmax attention; the plain ELBO
                       (KL weight 1)
``dirichlet``          Bayesian attention, Dirichlet posterior over the weights (hybrid, tempered
                       ELBO: ``kl_weight`` on the attention KL, see the report)
``logistic_normal``    Bayesian attention, logistic-normal posterior (input-dependent variance)
``weibull``            Bayesian attention, BAM's Weibull posterior with a contextual Gamma prior
``weights``            softmax attention, Bayesian Q/K/V/out projections (mean-field normal)
=====================  ==========================================================================

Every method is trained and scored on ``seeds`` seeds (its own split, initialisation and
sampling per seed); ``results.json`` keeps every seed's numbers and their mean ± sd, and
``report.md`` the paired differences against the deterministic network and the ensemble, a Pareto
figure of quality against cost, and which method wins what. Each is scored on the in-distribution
test set (accuracy, NLL, ECE, Brier), on out-of-distribution
detection with the predictive entropy as the score (held-out digit classes; corrupted test images:
noise, rotation, occlusion), and on time (training seconds, inference ms per example). Writes
``results.json``, ``report.md``, PNG figures and ArviZ netCDF files to the output folder.
"""

from __future__ import annotations

import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import pyro
import torch
from torch import Tensor

from . import calibration as C
from ._study_io import begin_run, finish_run, prepare_out_dir, validate_study_config
from .data import corruption_suite, load_digits_data
from .inference import fit
from .nn.blocks import AttentionConfig
from .nn.networks import BayesianNetwork, VisionTransformer
from .nn.weights import bayesian_projections
from .uncertainty import PredictionResult, predict, predict_ensemble, predict_mc_dropout

if TYPE_CHECKING:
    from .data import DigitsData

__all__ = ["StudyConfig", "METHODS", "DEFAULT_METHODS", "run_study", "format_table"]

#: A method of the study (the recipe a network is trained and predicted with).
StudyMethod = Literal[
    "deterministic",
    "mc_dropout",
    "ensemble",
    "recommended",
    "dirichlet",
    "logistic_normal",
    "weibull",
    "weights",
]
METHODS: tuple[StudyMethod, ...] = get_args(StudyMethod)
#: methods run by default (``weights`` on request: slow to train and the weakest in every run)
DEFAULT_METHODS = METHODS[:-1]
#: methods trained on the tempered ELBO (``kl_weight``); ``recommended`` uses the plain ELBO
_TEMPERED = ("dirichlet", "logistic_normal", "weibull")
_ATTENTION = {
    "recommended": AttentionConfig.recommended(),
    "dirichlet": AttentionConfig(family="dirichlet"),
    "logistic_normal": AttentionConfig(
        family="logistic_normal", family_kwargs={"input_dependent": True}
    ),
    "weibull": AttentionConfig(family="weibull", prior="contextual"),
}


@dataclass
class StudyConfig:
    """Settings of :func:`run_study`; ``quick()`` is the one-minute smoke preset."""

    out: str = "bayesattn-study"
    dataset: Literal["digits"] = "digits"
    methods: Sequence[StudyMethod] = DEFAULT_METHODS
    epochs: int = 40
    seed: int = 0
    seeds: int = 3
    holdout_classes: Sequence[int] = (8, 9)
    num_samples: int = 8
    timing_samples: Sequence[int] = (1, 8, 32)
    ensemble_size: int = 5
    d_model: int = 32
    nhead: int = 4
    num_layers: int = 2
    dim_feedforward: int = 64
    dropout: float = 0.1
    batch_size: int = 64
    lr: float = 3e-3
    kl_anneal_epochs: int = 5
    kl_weight: float = 1e-3
    severities: Sequence[int] = (1, 3, 5)
    arviz_examples: int = 16
    progress: bool = True
    extra: dict = field(default_factory=dict)

    @classmethod
    def quick(cls, **kw: Any) -> StudyConfig:
        base: dict[str, Any] = dict(
            epochs=5, seeds=2, num_samples=8, ensemble_size=2, severities=(3,), arviz_examples=4
        )
        base.update(kw)
        return cls(**base)

    def __post_init__(self) -> None:
        validate_study_config(self)
        if self.dataset != "digits":
            raise ValueError(
                f"dataset must be 'digits' (the embedded dataset); got {self.dataset!r}"
            )
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(
                f"methods must be a non-empty subset of {METHODS}; got {list(self.methods)}"
            )
        for name in ("epochs", "seeds", "num_samples", "ensemble_size", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        if not 0 < self.kl_weight <= 1:
            raise ValueError(f"kl_weight must be in (0, 1]; got {self.kl_weight}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if not self.timing_samples or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.timing_samples
        ):
            raise ValueError(f"timing_samples must be ints >= 1; got {list(self.timing_samples)}")
        h = list(self.holdout_classes)
        if (
            len(h) < 1
            or len(set(h)) != len(h)
            or any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= 9 for c in h)
        ):
            raise ValueError(f"holdout_classes must be distinct digits 0..9; got {h}")
        if len(h) > 8:
            raise ValueError(f"holdout_classes must leave >= 2 classes in distribution; got {h}")
        if any(s not in (1, 2, 3, 4, 5) for s in self.severities):
            raise ValueError(f"severities must be in 1..5; got {list(self.severities)}")


# ---------------------------------------------------------------------------------------------


def _vit(
    cfg: StudyConfig, num_classes: int, attention: AttentionConfig | None
) -> VisionTransformer:
    return VisionTransformer(
        num_classes,
        image_size=8,
        patch_size=2,
        d_model=cfg.d_model,
        nhead=cfg.nhead,
        num_layers=cfg.num_layers,
        dim_feedforward=cfg.dim_feedforward,
        dropout=cfg.dropout,
        attention=attention,
    )


def _train(
    net: VisionTransformer,
    data: DigitsData,
    cfg: StudyConfig,
    seed: int,
    bayes: bool,
    kl_weight: float = 1.0,
) -> float:
    steps_per_epoch = math.ceil(len(data.x_train) / cfg.batch_size)
    t0 = time.perf_counter()
    fit(
        net,
        (data.x_train, data.y_train),
        val_data=(data.x_val, data.y_val),
        method="hybrid",
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        weight_decay=1e-4,
        warmup_steps=steps_per_epoch,
        kl_anneal_steps=cfg.kl_anneal_epochs * steps_per_epoch if bayes else 0,
        kl_weight=kl_weight,
        seed=seed,
        progress=False,
        restore_best=True,
        early_stopping_patience=None,
    )
    return time.perf_counter() - t0


def _predictor(
    method: str, nets: list[BayesianNetwork], cfg: StudyConfig
) -> Callable[[Tensor], PredictionResult]:
    """The method's posterior predictive, all through :mod:`bayesattn.uncertainty`'s one path."""
    if method == "mc_dropout":
        return lambda x: predict_mc_dropout(nets[0], x, cfg.num_samples, batch_size=512)
    if method in ("deterministic", "ensemble"):
        return lambda x: predict_ensemble(nets, x, batch_size=512)
    return lambda x: predict(
        nets[0], x, num_samples=cfg.num_samples, batch_size=512, keep_attention=False
    )


def _metrics(res: PredictionResult, y: Tensor) -> dict[str, float]:
    p = res.mean_probs
    return {
        "accuracy": C.accuracy(p, y),
        "nll": C.negative_log_likelihood(p, y),
        "ece": C.expected_calibration_error(p, y),
        "brier": C.brier_score(p, y),
        "mean_entropy": float(res.predictive_entropy.mean()),
        "mean_mi": float(res.mutual_information.mean()),
    }


def _ood(res_in: PredictionResult, res_out: PredictionResult) -> dict[str, float]:
    return {
        "auroc_entropy": C.ood_auroc(res_in.predictive_entropy, res_out.predictive_entropy),
        "auroc_mi": C.ood_auroc(res_in.mutual_information, res_out.mutual_information),
        "aupr_entropy": C.ood_aupr(res_in.predictive_entropy, res_out.predictive_entropy),
    }


def _figures(
    out: Path, method: str, res: PredictionResult, y: Tensor, res_ood: PredictionResult
) -> list[str]:
    from . import plots

    files = []
    f = out / f"reliability_{method}.png"
    fig = plots.plot_reliability_diagram(res.mean_probs, y, title=f"{method}", path=f)
    files.append(f.name)
    f = out / f"entropy_{method}.png"
    plots.plot_uncertainty_histograms(
        res.predictive_entropy, res_ood.predictive_entropy, label="predictive entropy", path=f
    )
    files.append(f.name)
    f = out / f"accuracy_confidence_{method}.png"
    plots.plot_accuracy_vs_confidence(res.mean_probs, y, path=f)
    files.append(f.name)
    del fig
    return files


def _attention_outputs(
    out: Path, method: str, net: BayesianNetwork, x: Tensor, cfg: StudyConfig
) -> dict[str, Any]:
    """Attention map with uncertainty (PNG) and the attention posterior as ArviZ netCDF."""
    from . import plots
    from .diagnostics import to_arviz

    res = predict(net.eval(), x, num_samples=cfg.num_samples)
    layer = sorted(res.attention)[-1]
    att = res.attention[layer]  # samples (S, B, H, Tq, Tk)
    labels = ["cls"] + [f"p{i}" for i in range(att.samples.shape[-1] - 1)]
    png = out / f"attention_{method}.png"
    plots.plot_attention_uncertainty(
        att.mean[0].mean(0),
        att.std[0].mean(0),
        query_labels=labels,
        key_labels=labels,
        title=f"{method}: {layer} (example 0, head mean)",
        path=png,
    )
    idata = to_arviz(
        posterior={f"{layer}.weights": att.samples}, sample_dims=("sample",), tokens=labels
    )
    nc = out / f"attention_{method}.nc"
    idata.to_netcdf(str(nc))
    return {"figure": png.name, "netcdf": nc.name, "layer": layer, **att.summary()}


def _train_method(
    method: str, cfg: StudyConfig, data: DigitsData, seed: int, trained: dict
) -> tuple[list[BayesianNetwork], float]:
    """Trained networks of ``method`` and their training seconds (the ensemble's members are the
    deterministic network and ``ensemble_size - 1`` more seeds, trained once and shared)."""
    C_in = data.num_classes

    def deterministic_nets(n: int) -> tuple[list[BayesianNetwork], float]:
        nets, secs = trained.get("deterministic", ([], 0.0))
        while len(nets) < n:
            s = seed + 1000 * len(nets)  # member seeds never collide with other study seeds
            torch.manual_seed(s)
            net = _vit(cfg, C_in, None)
            secs += _train(net, data, cfg, s, bayes=False)
            nets.append(net)
        trained["deterministic"] = (nets, secs)
        return nets, secs

    if method in ("deterministic", "mc_dropout"):
        nets, _ = deterministic_nets(1)
        return nets[:1], trained["deterministic"][1] / len(trained["deterministic"][0])
    if method == "ensemble":
        nets, secs = deterministic_nets(cfg.ensemble_size)
        return nets[: cfg.ensemble_size], secs
    torch.manual_seed(seed)
    net = _vit(cfg, C_in, _ATTENTION.get(method))
    if method == "weights":
        bayesian_projections(net, targets=("*self_attn.in_proj_weight", "*out_proj.weight"))
    klw = cfg.kl_weight if method in _TEMPERED else 1.0
    return [net], _train(net, data, cfg, seed, bayes=True, kl_weight=klw)


def _timing(pred: Callable[[Tensor], Any], x: Tensor) -> float:
    """ms per example of one prediction call."""
    t0 = time.perf_counter()
    pred(x)
    return 1e3 * (time.perf_counter() - t0) / len(x)


def _predictive_cost(net: BayesianNetwork, x: Tensor, cfg: StudyConfig) -> dict[str, float]:
    """ms/example of the recommended network for each ``timing_samples`` S, and of one
    deterministic forward pass of the same network (median of 3)."""

    def med(fn: Callable[..., Any]) -> float:  # ...: mypy cannot type the lambda (default arg)
        return sorted(_timing(fn, x) for _ in range(3))[1]

    def forward(xb: Tensor) -> Tensor:
        with torch.no_grad():
            return net(xb)

    out = {"deterministic_forward": med(forward)}
    for S in cfg.timing_samples:
        out[f"S={S}"] = med(lambda xb, S=S: predict(net, xb, S, keep_attention=False))
    return out


def _evaluate(
    method: str,
    nets: list[BayesianNetwork],
    cfg: StudyConfig,
    data: DigitsData,
    corrupted: dict[tuple[str, int], Tensor],
    seed: int,
) -> tuple[dict, Any]:
    pred = _predictor(method, nets, cfg)
    pred(data.x_test[:8])  # warm-up: the first call pays one-off allocation costs
    # time: median of 3 calls on the test set; the last call, seeded, gives the numbers
    times = []
    for _ in range(3):
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        res = pred(data.x_test)
        times.append(time.perf_counter() - t0)
    infer_ms = 1e3 * sorted(times)[1] / len(data.x_test)
    row: dict[str, Any] = _metrics(res, data.y_test)
    res_ood = pred(data.x_ood_classes)
    row["ood_classes"] = _ood(res, res_ood)
    row["corruptions"] = {}
    for (kind, sev), xc in corrupted.items():
        rc = pred(xc)
        row["corruptions"][f"{kind}_{sev}"] = {
            **_ood(res, rc),
            "accuracy": C.accuracy(rc.mean_probs, data.y_test),
        }
    row["corruption_auroc_mean"] = sum(
        v["auroc_entropy"] for v in row["corruptions"].values()
    ) / len(row["corruptions"])
    row["infer_ms_per_example"] = infer_ms
    return row, (res, res_ood)


def run_study(cfg: StudyConfig) -> dict[str, Any]:
    """Train, evaluate and write every requested method on every seed; returns the results dict.

    Seeds are ``cfg.seed, cfg.seed + 1, …`` (``cfg.seeds`` of them); each seed has its own data
    split, initialisations and posterior draws. Figures and ArviZ files come from the first seed.
    """
    out = prepare_out_dir(cfg.out)
    foreign = begin_run(out)  # INCOMPLETE marker; the previous run's files go
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    results: dict[str, Any] = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "seeds": seeds,
        "environment": {"torch": torch.__version__, "python": platform.python_version()},
        "per_seed": {},
    }
    from tqdm.auto import tqdm

    bar = tqdm(total=len(seeds) * len(cfg.methods), desc="study", disable=not cfg.progress)
    for seed in seeds:
        torch.manual_seed(seed)
        data = load_digits_data(seed=seed, holdout_classes=tuple(cfg.holdout_classes))
        if "data" not in results:
            results["data"] = {
                "train": len(data.x_train),
                "val": len(data.x_val),
                "test": len(data.x_test),
                "ood_classes": len(data.x_ood_classes),
                "holdout_classes": list(data.holdout_classes),
            }
        corrupted = corruption_suite(data.x_test, severities=tuple(cfg.severities), seed=seed)
        trained: dict[str, tuple[list[BayesianNetwork], float]] = {}
        rows: dict[str, Any] = {}
        for method in cfg.methods:
            bar.set_postfix_str(f"seed {seed}: {method}")
            # every method starts from an empty global param store: networks of different
            # methods share Pyro names, and a stale entry would otherwise be picked up
            pyro.clear_param_store()
            nets, train_s = _train_method(method, cfg, data, seed, trained)
            row, (res, res_ood) = _evaluate(method, nets, cfg, data, corrupted, seed)
            row["train_seconds"] = train_s
            if seed == seeds[0]:
                row["figures"] = _figures(out, method, res, data.y_test, res_ood)
                if method in _ATTENTION:
                    row["attention"] = _attention_outputs(
                        out, method, nets[0], data.x_test[: cfg.arviz_examples], cfg
                    )
                if method == "recommended":
                    results["predictive_cost"] = _predictive_cost(nets[0], data.x_test, cfg)
                if method in _GEOMETRY:
                    results.setdefault("geometry", {})[method] = _geometry(
                        out, method, nets[0], data.x_test[:64], cfg
                    )
            rows[method] = row
            bar.update()
        results["per_seed"][str(seed)] = rows
    bar.close()
    results["methods"] = {m: _aggregate(m, results["per_seed"]) for m in cfg.methods}
    results["paired"] = _paired(results["per_seed"], cfg.methods)
    results["wins"] = _wins(results["methods"])
    results["goal"] = _goal(results["methods"])
    results["figures"] = {"pareto": _pareto_figure(out, results["methods"])}
    finish_run(out, results, _report(results), foreign)  # atomic; results.json last = complete
    return results


#: methods whose attention geometry the study reports (first seed): softmax attention, the
#: recommended recipe and a posterior in every layer
_GEOMETRY = ("deterministic", "recommended", "dirichlet")


def _geometry(out: Path, method: str, net: BayesianNetwork, x: Tensor, cfg: StudyConfig) -> dict:
    """:func:`bayesattn.geometry.geometry_report` of a trained network: attention distance and
    entropy per layer, posterior spread by distance and depth, head subspace angles; figures in
    ``geometry_<method>_*.png``."""
    from .geometry import geometry_report

    with tempfile.TemporaryDirectory(dir=out) as tmp:
        rep = geometry_report(net.eval(), x, tmp, num_samples=cfg.num_samples)
        figures = []
        for f in rep["figures"]:  # top level, like every study file (listed, replaced by --force)
            name = f"geometry_{method}_{f}"
            os.replace(Path(tmp) / f, out / name)
            figures.append(name)
    keep = ("layers", "distance_unit", "distance_mean", "entropy_mean", "posterior_sd",
            "subspace_angle_mean", "local_to_global", "spread_by_distance")  # fmt: skip
    return {k: rep[k] for k in keep} | {"figures": figures}


# ---------------------------------------------------------------------------------------------
# aggregation over seeds

#: scalar metrics aggregated over seeds: (key, where in a per-seed row, higher is better)
_SCALARS = (
    ("accuracy", ("accuracy",), True),
    ("nll", ("nll",), False),
    ("ece", ("ece",), False),
    ("brier", ("brier",), False),
    ("auroc_held_out", ("ood_classes", "auroc_entropy"), True),
    ("auroc_held_out_mi", ("ood_classes", "auroc_mi"), True),
    ("corruption_auroc_mean", ("corruption_auroc_mean",), True),
    ("mean_entropy", ("mean_entropy",), None),
    ("mean_mi", ("mean_mi",), None),
    ("train_seconds", ("train_seconds",), False),
    ("infer_ms_per_example", ("infer_ms_per_example",), False),
)


def _get(row: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = row
    for k in path:
        value = value[k]
    return float(value)


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def _aggregate(method: str, per_seed: dict[str, dict]) -> dict[str, Any]:
    """Mean over seeds at the top level (the first seed's figures kept), ``sd`` and per-seed
    values beside it."""
    rows = [r[method] for r in per_seed.values()]
    first = rows[0]
    agg: dict[str, Any] = {"sd": {}, "per_seed": {}}
    for key, path, _ in _SCALARS:
        vals = [_get(r, path) for r in rows]
        m, sd = _mean_sd(vals)
        agg[key] = m
        agg["sd"][key] = sd
        agg["per_seed"][key] = vals
    agg["ood_classes"] = {
        k: _mean_sd([r["ood_classes"][k] for r in rows])[0] for k in first["ood_classes"]
    }
    agg["corruptions"] = {
        c: {k: _mean_sd([r["corruptions"][c][k] for r in rows])[0] for k in v}
        for c, v in first["corruptions"].items()
    }
    for k in ("figures", "attention"):
        if k in first:
            agg[k] = first[k]
    return agg


def _paired(per_seed: dict[str, dict], methods: Sequence[str]) -> dict[str, Any]:
    """Per-seed differences ``method − reference`` (mean ± sd over seeds) against the
    deterministic network and the ensemble, where those were run."""
    out: dict[str, Any] = {}
    for ref in ("deterministic", "ensemble"):
        if ref not in methods:
            continue
        out[f"vs_{ref}"] = {}
        for m in methods:
            if m == ref:
                continue
            d = {}
            for key, path, _ in _SCALARS:
                diffs = [_get(r[m], path) - _get(r[ref], path) for r in per_seed.values()]
                mean, sd = _mean_sd(diffs)
                d[key] = {"mean": mean, "sd": sd}
            out[f"vs_{ref}"][m] = d
    return out


def _wins(methods: dict[str, Any]) -> dict[str, str]:
    """The best method (by mean over seeds) on each quality and cost metric."""
    wins = {}
    for key, _, higher in _SCALARS:
        if higher is None:
            continue
        pick = max if higher else min
        wins[key] = pick(methods, key=lambda m: methods[m][key])
    return wins


def _goal(methods: dict[str, Any]) -> dict[str, Any] | None:
    """Issue 8's goal for the recommended method, each criterion with its numbers."""
    need = ("recommended", "deterministic", "ensemble")
    if any(m not in methods for m in need):
        return None
    r, d, e = (methods[m] for m in need)
    checks = {
        "accuracy >= deterministic - sd": r["accuracy"] >= d["accuracy"] - d["sd"]["accuracy"],
        "nll <= deterministic + sd": r["nll"] <= d["nll"] + d["sd"]["nll"],
        "ece <= deterministic + sd": r["ece"] <= d["ece"] + d["sd"]["ece"],
        "auroc_held_out >= ensemble - 0.01": r["auroc_held_out"] >= e["auroc_held_out"] - 0.01,
        "train_seconds <= ensemble / 3": r["train_seconds"] <= e["train_seconds"] / 3,
        "infer_ms <= ensemble / 3": r["infer_ms_per_example"] <= e["infer_ms_per_example"] / 3,
    }
    return {"checks": checks, "reached": all(checks.values())}


def _pareto_figure(out: Path, methods: dict[str, Any]) -> str:
    """Quality (NLL, held-out AUROC) against cost (inference ms/example, training seconds), mean ±
    sd over seeds; ``pareto.png``."""
    from . import plots

    fig = plots._new_figure(figsize=(10.0, 7.5), layout="constrained")
    axes = fig.subplots(2, 2)
    for i, (q, qlabel) in enumerate(
        (("nll", "NLL (lower is better)"), ("auroc_held_out", "held-out AUROC (higher is better)"))
    ):
        for j, (c, clabel) in enumerate(
            (
                ("infer_ms_per_example", "inference ms / example"),
                ("train_seconds", "training seconds"),
            )
        ):
            ax = axes[i][j]
            for m, r in methods.items():
                ax.errorbar(
                    r[c], r[q], xerr=r["sd"][c], yerr=r["sd"][q], fmt="o", capsize=3, label=m
                )
                ax.annotate(m, (r[c], r[q]), textcoords="offset points", xytext=(4, 4), fontsize=8)
            ax.set_xscale("log")
            ax.set_xlabel(clabel)
            ax.set_ylabel(qlabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="best")
    fig.suptitle("Quality against cost (mean ± sd over seeds)")
    path = out / "pareto.png"
    plots._finish(fig, path)
    return path.name


# ---------------------------------------------------------------------------------------------

_COLUMNS = [
    ("accuracy", "acc", "{:.3f}"),
    ("nll", "NLL", "{:.3f}"),
    ("ece", "ECE", "{:.3f}"),
    ("brier", "Brier", "{:.3f}"),
    ("auroc_held_out", "AUROC held-out", "{:.3f}"),
    ("corruption_auroc_mean", "AUROC corrupt", "{:.3f}"),
    ("train_seconds", "train s", "{:.1f}"),
    ("infer_ms_per_example", "infer ms/ex", "{:.3f}"),
]


def format_table(results: dict[str, Any]) -> str:
    """The results as a Markdown table, mean ± sd over seeds (also printed by the CLI)."""
    head = "| method | " + " | ".join(c[1] for c in _COLUMNS) + " |"
    sep = "|---" * (len(_COLUMNS) + 1) + "|"
    lines = [head, sep]
    for m, r in results["methods"].items():
        cells = []
        for k, _, fmt in _COLUMNS:
            sd = r.get("sd", {}).get(k)
            cells.append(fmt.format(r[k]) + (f" ± {fmt.format(sd)}" if sd else ""))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _paired_table(paired: dict[str, Any], ref: str) -> list[str]:
    keys = [
        ("accuracy", "Δacc"),
        ("nll", "ΔNLL"),
        ("ece", "ΔECE"),
        ("brier", "ΔBrier"),
        ("auroc_held_out", "ΔAUROC held-out"),
        ("train_seconds", "Δtrain s"),
        ("infer_ms_per_example", "Δinfer ms/ex"),
    ]
    rows = paired.get(f"vs_{ref}", {})
    if not rows:
        return []
    lines = [
        f"### Paired differences against `{ref}` (method − {ref}, mean ± sd over seeds)",
        "",
        "| method | " + " | ".join(k[1] for k in keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for m, d in rows.items():
        cells = [f"{d[k]['mean']:+.3f} ± {d[k]['sd']:.3f}" for k, _ in keys]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines + [""]


def _geometry_section(geo: dict[str, Any]) -> list[str]:
    """Attention geometry per layer (first seed): does reading go from local to global with
    depth, how spread out is the posterior over keys, how far apart are the heads?"""
    if not geo:
        return []
    parts = [
        "## Attention geometry (first seed, 64 test images)",
        "",
        "Mean attention distance (pixels between the query patch and the keys it reads, CLS "
        "excluded; 4.0 is what uniform attention gives on 8×8 digits with 2×2 patches), entropy "
        "of the mean weights (nats; uniform over 17 tokens: 2.83), mean posterior sd of the "
        "weights across draws, and the mean principal angle between heads' query subspaces.",
        "",
        "| method | layer | distance | entropy | posterior sd | head angle (°) |",
        "|---|---|---|---|---|---|",
    ]
    for m, g in geo.items():
        for layer in g["layers"]:
            parts.append(
                f"| {m} | {layer} | {g['distance_mean'][layer]:.2f} | "
                f"{g['entropy_mean'][layer]:.2f} | {g['posterior_sd'][layer]:.4f} | "
                f"{g['subspace_angle_mean'][layer]:.1f} |"
            )
    parts.append("")
    for m, g in geo.items():
        verdict = "grows" if g["local_to_global"] else "does not grow"
        parts.append(f"- `{m}`: attention distance {verdict} with depth.")
    parts.append("")
    for m, g in geo.items():
        parts += [f"![{m} {f}]({f})" for f in g["figures"]]
    return parts + [""]


def _intro_section(results: dict[str, Any]) -> list[str]:
    """Title, set-up, the results table and how to read it."""
    cfg = results["config"]
    d = results["data"]
    return [
        "# bayesattn uncertainty study",
        "",
        f"Digits (scikit-learn, 8×8), classes {d['holdout_classes']} held out as OOD; "
        f"train/val/test = {d['train']}/{d['val']}/{d['test']}, seeds {results['seeds']}, "
        f"{cfg['epochs']} epochs, {cfg['num_samples']} posterior samples, ensemble of "
        f"{cfg['ensemble_size']}. OOD score: predictive entropy. ECE: 15 equal-width bins. "
        "Numbers are mean ± sd over seeds; every seed has its own split and initialisations.",
        "",
        format_table(results),
        "",
        "Training time of `mc_dropout` is that of the deterministic network it reuses; the "
        "ensemble's is the sum over its members. Inference ms/example is one call on the whole "
        "test set (all samples).",
        "",
        "`recommended` (`AttentionConfig.recommended()`) is trained on the plain ELBO (KL weight "
        "1). `dirichlet`, `logistic_normal` and `weibull` put a latent on every attention row of "
        f"every layer with priors centred on key relevance, and need a tempered ELBO (KL weight "
        f"{cfg['kl_weight']:g}): with weight 1 their KL (thousands of nats per image) swamps the "
        "label's likelihood and the attention collapses to the prior (see `docs/training.md`). "
        "The `weights` method's KL is global and uses weight 1.",
        "",
    ]


def _wins_section(results: dict[str, Any]) -> list[str]:
    """The best method for each metric."""
    parts = ["## Who wins what", ""]
    labels = {
        "accuracy": "accuracy",
        "nll": "NLL",
        "ece": "ECE",
        "brier": "Brier",
        "auroc_held_out": "held-out AUROC (entropy)",
        "auroc_held_out_mi": "held-out AUROC (mutual information)",
        "corruption_auroc_mean": "corruption AUROC",
        "train_seconds": "training time",
        "infer_ms_per_example": "inference time",
    }
    for k, m in results["wins"].items():
        r = results["methods"][m]
        parts.append(f"- **{labels.get(k, k)}**: `{m}` ({r[k]:.3f} ± {r['sd'][k]:.3f})")
    return parts + [""]


def _goal_section(goal: dict[str, Any] | None) -> list[str]:
    """Which criteria of the recommended method's goal are reached (nothing without a goal)."""
    if goal is None:
        return []
    parts = ["## The goal for the recommended method", ""]
    for name, ok in goal["checks"].items():
        parts.append(f"- {'reached' if ok else 'NOT reached'}: {name}")
    parts.append("")
    parts.append(
        "All criteria reached."
        if goal["reached"]
        else "Not every criterion is reached; the paired differences below and the Pareto figure "
        "show the trade-off."
    )
    return parts + [""]


def _cost_section(cost: dict[str, float] | None) -> list[str]:
    """Milliseconds per example of each predictive, relative to one deterministic forward."""
    if not cost:
        return []
    base = cost["deterministic_forward"]
    parts = [
        "## Cost of posterior samples (recommended, first seed)",
        "",
        "| | ms/example | × deterministic forward |",
        "|---|---|---|",
        f"| deterministic forward | {base:.4f} | 1.00 |",
    ]
    for k, v in cost.items():
        if k != "deterministic_forward":
            parts.append(f"| {k} | {v:.4f} | {v / base:.2f} |")
    return parts + [""]


def _corruptions_section(results: dict[str, Any]) -> list[str]:
    """AUROC of predictive entropy and accuracy under each corruption, per method."""
    parts = ["## Corruptions (AUROC of predictive entropy, accuracy; mean over seeds)", ""]
    kinds = sorted(next(iter(results["methods"].values()))["corruptions"])
    parts.append("| method | " + " | ".join(kinds) + " |")
    parts.append("|---" * (len(kinds) + 1) + "|")
    for m, r in results["methods"].items():
        cells = [
            f"{r['corruptions'][k]['auroc_entropy']:.3f} / {r['corruptions'][k]['accuracy']:.2f}"
            for k in kinds
        ]
        parts.append(f"| {m} | " + " | ".join(cells) + " |")
    return parts


def _figures_section(results: dict[str, Any]) -> list[str]:
    """Each method's figures of the first seed, and where its attention posterior was saved."""
    parts = ["", "## Figures (first seed)", ""]
    for m, r in results["methods"].items():
        parts.append(f"### {m}")
        parts.append("")
        for f in r.get("figures", []):
            parts.append(f"![{f}]({f})")
        if "attention" in r:
            a = r["attention"]
            parts.append(f"![{a['figure']}]({a['figure']})")
            parts.append("")
            parts.append(
                f"Attention posterior of `{a['layer']}` saved for ArviZ as `{a['netcdf']}` "
                "(`arviz.from_netcdf`)."
            )
        parts.append("")
    return parts


def _report(results: dict[str, Any]) -> str:
    """The study's Markdown report (``report.md``)."""
    parts = _intro_section(results)
    parts += _wins_section(results)
    parts += _goal_section(results.get("goal"))
    parts += _cost_section(results.get("predictive_cost"))
    parts += ["## Paired differences", ""]
    parts += _paired_table(results["paired"], "deterministic")
    parts += _paired_table(results["paired"], "ensemble")
    parts += ["## Quality against cost", "", f"![pareto]({results['figures']['pareto']})", ""]
    parts += _geometry_section(results.get("geometry", {}))
    parts += _corruptions_section(results)
    parts += _figures_section(results)
    return "\n".join(parts)
