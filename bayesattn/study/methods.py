"""The study's methods: a registry of name → :class:`Method` (how to train it, how to predict
with it, and its own OOD score, if it has one). A new method plugs in with one
:func:`register_method` call; every registered method runs through the same protocol, metrics
and report.

Hyperparameters are chosen on in-distribution data only (never on a held-out class or a far-OOD
set): the temperature by validation NLL, the Laplace prior precision by the marginal likelihood
of the training set, kNN's ``k`` by how well the distance flags validation errors."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .. import calibration as C
from ..nn.blocks import AttentionConfig
from ..nn.networks import BayesianNetwork
from ..nn.weights import bayesian_projections
from ..registry import Registry
from ..uncertainty import PredictionResult, predict, predict_ensemble, predict_mc_dropout
from .datasets import StudyDataset
from .laplace_evidence import laplace_evidence
from .runs import Run
from .scores import choose_k, fit_mahalanobis, knn_distance

__all__ = [
    "Fitted",
    "Method",
    "METHODS",
    "DEFAULT_METHODS",
    "FULL_METHODS",
    "register_method",
    "get_method",
    "methods_for",
    "ensemble_of",
]

_BATCH = 512


@dataclass
class Fitted:
    """A trained method on one run: its networks, training seconds (including any post-hoc
    fit), the hyperparameters it chose (``params``, JSON-able, reported) and other state."""

    nets: list[BayesianNetwork]
    train_seconds: float
    params: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


class Method:
    """A method of the study. Subclasses set ``name``/``description`` and implement
    :meth:`fit` and :meth:`predict`; a method with its own OOD score (higher = more OOD) sets
    ``own_score`` to the score's name and implements :meth:`score`."""

    name: str = ""
    description: str = ""
    own_score: str | None = None
    #: a network with Bayesian attention whose posterior the study saves (first run)
    attention_outputs: bool = False

    def check_available(self) -> None:
        """Raise ``ImportError`` (saying what to install) if the method cannot run here; called
        before a study starts."""

    def applies_to(self, dataset: StudyDataset) -> bool:
        """Whether the method runs on ``dataset`` (every data set by default; a method for
        words only on word tokens): a study skips it on the others, and its report leaves it
        out of their tables."""
        return True

    def fit(self, run: Run) -> Fitted:
        raise NotImplementedError

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        """The posterior predictive ``(S, B, C)`` on ``x``."""
        raise NotImplementedError

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        """The method's own OOD score ``(B,)`` (only when ``own_score`` is set)."""
        raise NotImplementedError(f"{self.name} has no own score")

    def predict_and_score(
        self, fitted: Fitted, run: Run, x: Tensor
    ) -> tuple[PredictionResult, Tensor | None]:
        """:meth:`predict` and, with ``own_score``, :meth:`score` on ``x``: what a user computes
        at prediction time (the study times this call). A method whose predictive already
        computes its score (the density reads) overrides it to compute the score once."""
        res = self.predict(fitted, x)
        return res, (self.score(fitted, run, x) if self.own_score else None)

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float] | None:
        """``(mean per-example KL over the training inputs, global KL)`` in nats of a method
        with a variational posterior (:meth:`~bayesattn.nn.networks.BayesianNetwork.posterior_kl`);
        ``None`` (the default) for a method without one."""
        return None


#: the registered methods (a :class:`~bayesattn.registry.Registry` of ready instances)
_REGISTRY: Registry[Method] = Registry(
    "method", Method, instances=True, register_with="bayesattn.study.register_method"
)
_DEFAULT: list[str] = []


class _Names(Sequence[str]):
    """A live view of registered names (so later registrations show up)."""

    def __init__(self, source: Callable[[], list[str]]) -> None:
        self._source = source

    def __getitem__(self, i: Any) -> Any:
        return tuple(self._source())[i]

    def __len__(self) -> int:
        return len(self._source())

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._source()))

    def __contains__(self, name: object) -> bool:
        return name in self._source()

    def __repr__(self) -> str:
        return repr(tuple(self._source()))


#: every registered method, in registration order
METHODS: Sequence[str] = _Names(lambda: list(_REGISTRY))
#: the methods a plain ``run_study``/``bayesattn study`` runs
DEFAULT_METHODS: Sequence[str] = _Names(lambda: list(_DEFAULT))
#: the methods the full protocol runs (:meth:`StudyConfig.full`, ``--protocol full``): the
#: defaults plus the global, distance-aware posteriors of issue 17 that earned their place, the
#: class-conditional density read of issue 30 (:mod:`.density_methods`) and its mixture posterior
#: over the trunk (:mod:`.mixture_methods`). The mixture's ablations (``mixture_point``/``_k1``/
#: ``_k2``/``_wide``) run by name; the density's ablations and the spectrally normalised trunk
#: lost and were removed (their full-protocol numbers are in docs/which-attention.md). On words
#: (:mod:`.word_methods`, skipped on images) the bag-of-words baseline, the network fine-tuned
#: from a masked-LM trunk with and without the density read, and the density score summed with
#: the bag of words' entropy, on one network and averaged over two (``density_bow_pair``).
_FULL_EXTRA = ("dirichlet", "posthoc_gp", "posthoc_gp_mf", "sgpa", "density", "mixture",
               "bag_of_words", "pretrained", "density_pretrained", "density_bow",
               "density_pretrained_bow", "density_bow_pair", "density_pair")  # fmt: skip
FULL_METHODS: Sequence[str] = _Names(
    lambda: [*_DEFAULT, *(m for m in _FULL_EXTRA if m in _REGISTRY and m not in _DEFAULT)]
)


def register_method(method: Method, default: bool = False, *, override: bool = False) -> Method:
    """Add ``method`` under ``method.name`` (``default``: run it when no methods are named); a
    name already taken is a ``ValueError`` unless ``override=True``, which replaces it."""
    if not isinstance(method, Method) or not method.name or not method.name.isidentifier():
        raise ValueError(f"method must be a Method with an identifier name; got {method!r}")
    if not isinstance(method.description, str) or not method.description.strip():
        raise ValueError(
            f"method {method.name!r} needs a description (one line: what it is; shown by "
            "`bayesattn study --list-methods` and in the report)"
        )
    _REGISTRY.register(method.name, method, override=override)  # taken: ValueError
    if default and method.name not in _DEFAULT:
        _DEFAULT.append(method.name)
    return method


def get_method(name: str) -> Method:
    """The registered method called ``name`` (an unknown name: ``ValueError`` listing them)."""
    return _REGISTRY.get(name)


def methods_for(dataset: StudyDataset, methods: Sequence[str]) -> list[str]:
    """The names of ``methods`` that apply to ``dataset`` (:meth:`Method.applies_to`), in order."""
    return [m for m in methods if get_method(m).applies_to(dataset)]


# ---------------------------------------------------------------------------------------------
# the deterministic network and what reuses it


class Deterministic(Method):
    name = "deterministic"
    description = "softmax attention, cross-entropy (the ELBO with nothing random)"

    def fit(self, run: Run) -> Fitted:
        nets, secs = run.members(1)
        return Fitted(nets, secs[0])

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        return predict_ensemble(fitted.nets[:1], x, batch_size=_BATCH)


class TemperatureScaled(Deterministic):
    name = "temp_scaled"
    description = "the deterministic network, temperature fitted on validation NLL"

    def fit(self, run: Run) -> Fitted:
        f = super().fit(run)
        t0 = time.perf_counter()
        logp = super().predict(f, run.data.x_val).mean_probs.clamp_min(1e-12).log()
        T = C.fit_temperature(logp, run.data.y_val)
        f.train_seconds += time.perf_counter() - t0
        f.params = {"temperature": T, "chosen_by": "validation NLL (L-BFGS)"}
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        p = super().predict(fitted, x).mean_probs.clamp_min(1e-12)
        return PredictionResult(torch.softmax(p.log() / fitted.params["temperature"], -1)[None])


class McDropout(Deterministic):
    name = "mc_dropout"
    description = "the deterministic network with dropout kept on at test time"

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        S = fitted.state["num_samples"]
        return predict_mc_dropout(fitted.nets[0], x, S, batch_size=_BATCH)

    def fit(self, run: Run) -> Fitted:
        f = super().fit(run)
        f.state["num_samples"] = run.cfg.num_samples
        return f


class Ensemble(Method):
    """A deep ensemble of the first ``size`` deterministic members (``None``: the run's
    ``ensemble_size``)."""

    description = "deterministic networks from different seeds, predictions averaged"

    def __init__(self, size: int | None = None) -> None:
        self.size = size
        self.name = "ensemble" if size is None else f"ensemble_{size}"

    def fit(self, run: Run) -> Fitted:
        nets, secs = run.members(self.size or run.cfg.ensemble_size)
        return Fitted(nets, sum(secs))

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        return predict_ensemble(fitted.nets, x, batch_size=_BATCH)


def ensemble_of(size: int) -> Method:
    """The ensemble of the first ``size`` members (the ensemble-size curve; not registered)."""
    return Ensemble(size)


class KNN(Deterministic):
    name = "knn"
    description = "the deterministic network; own score: kNN distance of its pooled features"
    own_score = "kNN distance"

    def fit(self, run: Run) -> Fitted:
        f = super().fit(run)
        t0 = time.perf_counter()
        train, val = run.features("train"), run.features("val")
        correct = super().predict(f, run.data.x_val).mean_probs.argmax(-1) == run.data.y_val
        k, by_k = choose_k(train, val, correct, run.cfg.knn_ks)
        f.train_seconds += time.perf_counter() - t0
        f.params = {"k": k, "chosen_by": "AUROC of validation errors vs correct",
                    "val_auroc_by_k": {str(i): v for i, v in by_k.items()}}  # fmt: skip
        return f

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return knn_distance(run.features("train"), run.features("", x), fitted.params["k"])


class RelativeMahalanobis(Deterministic):
    name = "mahalanobis"
    description = "the deterministic network; own score: relative Mahalanobis distance"
    own_score = "relative Mahalanobis"

    def fit(self, run: Run) -> Fitted:
        f = super().fit(run)
        t0 = time.perf_counter()
        f.state["maha"] = fit_mahalanobis(
            run.features("train"), run.data.y_train, run.data.num_classes
        )
        f.train_seconds += time.perf_counter() - t0
        f.params = {"chosen_by": "no hyperparameter (ridge 1e-6 · mean variance)"}
        return f

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return fitted.state["maha"].score(run.features("", x))


class LastLayerLaplace(Deterministic):
    """Last-layer Laplace (laplace-torch): a full-covariance Laplace over the head's weights and
    bias at the trained values, GGN Hessian on the training set, the prior precision maximising
    the Laplace log marginal likelihood (closed form in the GGN's eigenvalues,
    :mod:`.laplace_evidence`; laplace-torch's recommendation); predictive = the linearised (GLM)
    model, ``num_samples`` draws. The head is fitted on the pooled features (the same as
    ``subset_of_weights="last_layer"`` on the whole network, the body being fixed), so the body
    runs once per input. The 0.5 choice (grid 1e-4..1e4 on validation NLL) is kept as an
    ablation in ``params`` (``grid_*``): it sat on the grid's upper end in every run."""

    name = "laplace"
    description = "last-layer Laplace (laplace-torch), prior precision by marginal likelihood"

    def check_available(self) -> None:
        try:
            import laplace  # noqa: F401
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "the laplace method needs laplace-torch (the study extra: `make study` installs "
                "it; docs/api/study.md says how by hand), or leave it out with --methods"
            ) from e

    def fit(self, run: Run) -> Fitted:
        from laplace import Laplace
        from torch.utils.data import DataLoader, TensorDataset

        f = super().fit(run)
        t0 = time.perf_counter()
        head = copy.deepcopy(f.nets[0].head).float()
        d = run.data

        def loader(z: Tensor, y: Tensor) -> DataLoader:
            return DataLoader(TensorDataset(z.float(), y), batch_size=256)

        la: Any = Laplace(head, "classification", subset_of_weights="all", hessian_structure="full")
        la.fit(loader(run.features("train"), d.y_train))
        zv = run.features("val").float()
        grid = _laplace_grid(la, loader(zv, d.y_val))  # the 0.5 choice, kept as an ablation
        ev = laplace_evidence(la.H, la.mean, -float(la.loss))
        delta = ev.maximise()
        la.prior_precision = torch.tensor(delta, dtype=torch.float32)
        f.train_seconds += time.perf_counter() - t0
        f.state.update(laplace=la, run=run, num_samples=run.cfg.num_samples)
        f.params = {"prior_precision": delta, "effective_params": ev.effective_parameters(delta),
                    "num_params": ev.num_params, "val_nll": _laplace_nll(la, zv, d.y_val),
                    **grid, "chosen_by": "Laplace log marginal likelihood on the training set "
                    "(MacKay's fixed point, closed form)"}  # fmt: skip
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        z = fitted.state["run"].features("", x).float()
        S = fitted.state["num_samples"]
        probs = fitted.state["laplace"].predictive_samples(z, pred_type="glm", n_samples=S)
        return PredictionResult(probs.detach())  # (S, B, C)


def _laplace_nll(la: Any, z: Tensor, y: Tensor) -> float:
    """Validation NLL of the GLM predictive (probit) at ``la``'s prior precision."""
    with warnings.catch_warnings():  # its reminder that link_approx defaults to probit
        warnings.simplefilter("ignore", UserWarning)
        p = la(z, pred_type="glm", link_approx="probit")
    return C.negative_log_likelihood(p.detach(), y)


def _laplace_grid(la: Any, val: Any) -> dict[str, float]:
    """The 0.5 choice (grid 1e-4..1e4, 21 values, on validation NLL): its precision and NLL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        la.optimize_prior_precision(
            method="gridsearch", pred_type="glm", link_approx="probit", grid_size=21,
            val_loader=val, progress_bar=False,
        )  # fmt: skip
    zv, yv = val.dataset.tensors
    return {"grid_prior_precision": float(la.prior_precision.reshape(-1)[0]),
            "grid_val_nll": _laplace_nll(la, zv, yv)}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Bayesian attention


class BayesianAttention(Method):
    """A network with Bayesian attention (``attention()`` is called at fit time, so a change of
    :meth:`AttentionConfig.last_layer` is picked up), trained on the (tempered) ELBO and
    predicted through :func:`bayesattn.uncertainty.predict`."""

    attention_outputs = True

    def __init__(
        self,
        name: str,
        description: str,
        attention: Callable[[], AttentionConfig | None],
        tempered: bool,
        weights: bool = False,
    ) -> None:
        self.name, self.description = name, description
        self.attention, self.tempered, self.weights = attention, tempered, weights
        self.attention_outputs = not weights

    def fit(self, run: Run) -> Fitted:
        torch.manual_seed(run.seed)
        net = run.network(self.attention())
        if self.weights:
            bayesian_projections(net, targets=("*self_attn.in_proj_weight", "*out_proj.weight"))
        klw = run.cfg.kl_weight if self.tempered else 1.0
        secs = run.train(net, run.seed, bayes=True, kl_weight=klw)
        return Fitted([net.eval()], secs, {"kl_weight": klw}, {"num_samples": run.cfg.num_samples})

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        S = fitted.state["num_samples"]
        return predict(fitted.nets[0], x, S, batch_size=_BATCH, keep_attention=False)

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float]:
        local, global_ = fitted.nets[0].posterior_kl(run.data.x_train, batch_size=_BATCH)
        return float(local.mean()), global_


for _m in (Deterministic(), TemperatureScaled(), McDropout(), Ensemble(), KNN(),
           RelativeMahalanobis(), LastLayerLaplace()):  # fmt: skip
    register_method(_m, default=True)
register_method(
    BayesianAttention("last_layer", "AttentionConfig.last_layer(): logistic-normal attention in "
                      "the last layer, plain ELBO", AttentionConfig.last_layer, tempered=False),
    default=True,
)  # fmt: skip
register_method(  # the full protocol's, not the main job's (issue 28: room for the post-hoc reads)
    BayesianAttention("dirichlet", "Dirichlet attention in every layer, tempered ELBO",
                      lambda: AttentionConfig(family="dirichlet"), tempered=True),
)  # fmt: skip
register_method(
    BayesianAttention(
        "logistic_normal", "logistic-normal attention (input-dependent) in every layer",
        lambda: AttentionConfig(family="logistic_normal",
                                family_kwargs={"input_dependent": True}),
        tempered=True),
    default=True,
)  # fmt: skip
register_method(
    BayesianAttention("weibull", "Weibull attention, contextual Gamma prior, every layer",
                      lambda: AttentionConfig(family="weibull", prior="contextual"),
                      tempered=True),
    default=True,
)  # fmt: skip
register_method(
    BayesianAttention("weights", "softmax attention, Bayesian Q/K/V/out projections",
                      lambda: None, tempered=False, weights=True)
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# global, distance-aware posteriors (issue 17; not run unless named: --methods ...)


class PosthocGPMethod(Deterministic):
    """The deterministic network, frozen, with the post-hoc random-feature GP read of
    :class:`bayesattn.posthoc.GPRead` on its pooled CLS features: temperature
    and prior output scale chosen on validation NLL, the Gaussian posterior over the random
    feature weights from the validation features; own score: the GP's posterior variance."""

    name = "posthoc_gp"
    description = "the deterministic network + a post-hoc random-feature GP read (validation)"
    own_score = "GP variance"

    def fit(self, run: Run) -> Fitted:
        from ..posthoc import GPRead

        f = super().fit(run)
        t0 = time.perf_counter()
        read = GPRead(seed=run.seed).fit(run.passes("val"), run.data.y_val)
        f.train_seconds += time.perf_counter() - t0
        f.state.update(read=read, run=run, num_samples=run.cfg.num_samples)
        f.params = {"temperature": read.temperature, "outputscale": read.outputscale,
                    "lengthscale": read.lengthscale,
                    "chosen_by": "temperature and output scale on validation NLL; length "
                                 "scale the median validation feature distance"}  # fmt: skip
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        feats = fitted.state["run"].passes("", x)
        seed = int(torch.randint(0, 2**31 - 1, ()))  # the study seeds the global generator
        return fitted.state["read"].predict(feats, fitted.state["num_samples"], seed=seed)

    def score(self, fitted: Fitted, run: Run, x: Tensor) -> Tensor:
        return fitted.state["read"].score(run.passes("", x))


class PosthocGPMeanFieldMethod(PosthocGPMethod):
    r""":class:`PosthocGPMethod`'s read with its deterministic mean-field predictive
    (:meth:`bayesattn.posthoc.GPRead.predict` without ``num_samples``): the logits divided by
    :math:`T_{\rm mf}\sqrt{1 + a\,v(x)}`, a temperature that grows with the GP variance, both
    fitted on validation with out-of-fold variances; own score: the GP's posterior variance."""

    name = "posthoc_gp_mf"
    description = "the post-hoc GP read's mean-field predictive (distance-aware temperature)"

    def fit(self, run: Run) -> Fitted:
        f = super().fit(run)
        mf_temperature, mf_scale = f.state["read"].mean_field
        f.params.update(mf_temperature=mf_temperature, mf_scale=mf_scale)
        return f

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        return fitted.state["read"].predict(fitted.state["run"].passes("", x))  # (1, B, C)


register_method(PosthocGPMethod(), default=True)  # the main job runs it (issue 28)
register_method(PosthocGPMeanFieldMethod(), default=True)
register_method(
    BayesianAttention("sgpa", "sparse-GP attention read of the last layer (SGPA-style)",
                      lambda: AttentionConfig(read="sparse_gp", layers="last",
                                              read_kwargs={"init_mean": 1.0, "init_scale": 0.3}),
                      tempered=False)
)  # fmt: skip
