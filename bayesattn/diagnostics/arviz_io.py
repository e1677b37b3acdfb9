r"""Diagnostics: ArviZ export, PSIS :math:`\hat k` for variational fits, LOO model comparison, and
NUTS as ground truth for a small attention model.

**ArviZ export, both API generations.** :func:`to_arviz` turns posterior draws (torch or numpy)
into an ``arviz.InferenceData`` (arviz 0.x) or an ``xarray.DataTree`` (arviz >= 1.0, via
``arviz_base.from_dict``); :func:`to_arviz_dict` is the version-independent part (the nested
``{group: {var: array}}`` dict with ``dims``/``coords``). Attention-weight variables
(``"<path>.weights"``/``"<path>.latent"``, shape ``(..., B, H, Tq, Tk)``) get the dims
``("example", "head", "query", "key")`` (plus ``"layer"`` when stacked) and, with ``tokens``,
token coordinates on ``query``/``key``. :func:`predictive_to_arviz` draws from a network's guide,
replays its model and exports posterior attention weights, the posterior predictive, the observed
labels and the pointwise log-likelihood :math:`\log p(y_b\mid x_b, w_s)`.

**What ArviZ diagnostics mean for variational draws.** Draws from a variational guide are
independent, so they are stored as **one chain** of ``S`` draws, ``(chain, draw) = (1, S)``. For
them the MCMC diagnostics are trivially fine and say nothing about the fit:

* bulk/tail ESS :math:`\approx S` (draws are i.i.d. by construction);
* R-hat needs at least two chains (ArviZ returns NaN for one); ``num_chains=C`` splits the
  i.i.d. draws into ``C`` pseudo-chains, and then R-hat :math:`\approx 1` trivially;
* MCSE = sd/√S is a correct Monte-Carlo error *of expectations under q*, not under the posterior;
* ``az.summary`` means/sds/HDIs describe :math:`q`, ``plot_forest``/``plot_posterior`` plot
  :math:`q`; they are useful to *look at* attention uncertainty, not to validate it.

Whether :math:`q` is a good approximation of the posterior is what **PSIS** measures
(:func:`psis_diagnostic`, Yao et al. 2018, "Yes, but did it work?"): with
:math:`\log w_s = \log p(x, \theta_s) - \log q(\theta_s)`, :math:`\theta_s\sim q`, the Pareto shape
:math:`\hat k` of the weights' upper tail reads

* :math:`\hat k < 0.5`: **good**, q is close to the posterior; importance sampling (and the
  variational estimates) are reliable;
* :math:`0.5 \le \hat k \le 0.7`: **ok**, usable, PSIS-corrected estimates converge slowly;
* :math:`\hat k > 0.7`: **unreliable**, q misses posterior mass (typically too narrow or shifted).

PSIS-LOO on variational draws (:func:`compare_attention_variants`) is likewise an approximation
under :math:`q`; its per-observation :math:`\hat k` flags points where that breaks down. On
**held-out** data the ``elpd_loo`` it reports estimates the held-out log predictive density
slightly conservatively (LOO removes each point's influence, which held-out points never had);
the ranking between models is what matters.

**NUTS as ground truth.** :func:`attention_regression_model` is a one-layer attention regression
small enough for NUTS (:func:`nuts_attention_regression`); :func:`compare_svi_nuts` fits an
autoguide to the same model and compares posterior means and standard deviations with NUTS.

ArviZ (and xarray) are imported lazily inside the functions; ``import bayesattn.diagnostics`` does
not import them.

Dimension glossary: ``S`` draws, ``C`` chains, ``D`` draws per chain, ``B`` examples, ``H`` heads,
``Tq``/``Tk`` queries/keys, ``L`` stacked layers, ``N`` data points, ``d`` feature dim.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import Tensor

__all__ = [
    # ArviZ export
    "arviz_major_version",
    "to_arviz_dict",
    "to_arviz",
    "NetworkDraws",
    "network_draws",
    "predictive_to_arviz",
    "prediction_to_arviz",
    # variational diagnostics
    "KHAT_INTERPRETATIONS",
    "interpret_khat",
    "psis_smooth",
    "PSISResult",
    "psis_diagnostic",
    # model comparison
    "pointwise_log_likelihood",
    "compare_attention_variants",
    # NUTS ground truth
    "AttentionRegressionData",
    "simulate_attention_regression",
    "attention_regression_model",
    "NUTSResult",
    "nuts_attention_regression",
    "fit_svi_attention_regression",
    "SVINUTSComparison",
    "compare_svi_nuts",
]

#: output sample dims of every exported object: variational draws are one chain
SAMPLE_DIMS = ("chain", "draw")
#: automatic dims of an attention-weight variable, after the sample dims
ATTENTION_DIMS = ("example", "head", "query", "key")
_SAMPLED_GROUPS = ("posterior", "posterior_predictive", "log_likelihood")
_GROUPS = (*_SAMPLED_GROUPS, "observed_data")
_LAYER_RE = re.compile(r"^(?:(?P<pre>.*)\.)?layers\.(?P<idx>\d+)\.(?P<post>.+)$")


# ================================================================================================
# small helpers
# ================================================================================================


def arviz_major_version() -> int:
    """Major version of the installed ArviZ (``0`` for the InferenceData API, ``>= 1`` for the
    DataTree API of ``arviz_base``/``arviz_stats``). Imports arviz."""
    import arviz

    return int(arviz.__version__.split(".")[0])


def _arviz_is_v1() -> bool:
    """The one switch between the two ArviZ API generations."""
    return arviz_major_version() >= 1


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Run under a forked torch RNG seeded with ``seed`` (global RNG untouched); no-op for None."""
    if seed is None:
        yield
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None; got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _eval_mode(module: Any) -> Iterator[None]:
    """Temporarily put a torch module in eval mode (no dropout), restoring every flag after."""
    if not isinstance(module, torch.nn.Module):
        yield
        return
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, t in flags:
            m.training = t


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return value


def _to_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray | np.generic | int | float | bool | list | tuple):
        return np.asarray(value)
    raise TypeError(
        f"variable {name!r} must be a torch.Tensor or numpy array; got {type(value).__name__}"
    )


def _is_attention_name(name: str) -> bool:
    return name in ("weights", "latent") or name.endswith((".weights", ".latent"))


# ================================================================================================
# ArviZ export
# ================================================================================================


class _DimNamer:
    """Names automatic dims consistently across variables: variables whose ``base`` dim agrees in
    size (and coordinates) share a name; disagreeing ones get ``base_1``, ``base_2``, ..."""

    def __init__(self) -> None:
        self._entries: dict[str, list[tuple[str, int, tuple | None]]] = {}
        self.coords: dict[str, list] = {}

    def __call__(self, base: str, size: int, coord: Sequence | None = None) -> str:
        key = tuple(coord) if coord is not None else None
        entries = self._entries.setdefault(base, [])
        for name, s, c in entries:
            if s == size and c == key:
                return name
        name = base if not entries else f"{base}_{len(entries)}"
        entries.append((name, size, key))
        if key is not None:
            self.coords[name] = list(key)
        return name

    def names(self, base: str) -> list[str]:
        return [n for n, _, _ in self._entries.get(base, [])]


def _token_coords(tokens: Sequence[str] | None) -> tuple[str, ...] | None:
    """Token labels as coordinate values; repeated tokens are made unique as ``"i:token"``."""
    if tokens is None:
        return None
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(f"tokens must be a list of str; got {tokens!r}")
    toks = tuple(tokens)
    if not toks:
        raise ValueError("tokens must not be empty")
    if len(set(toks)) < len(toks):
        toks = tuple(f"{i}:{t}" for i, t in enumerate(toks))
    return toks


def _split_samples(
    group: str, name: str, arr: np.ndarray, flat: bool, num_chains: int = 1
) -> tuple[np.ndarray, tuple[int, int]]:
    """Bring the leading sample dims to ``(C, D)``: a flat ``S`` becomes ``(num_chains,
    S / num_chains)``."""
    need = 1 if flat else 2
    if arr.ndim < need:
        layout = "(S, ...)" if flat else "(chain, draw, ...)"
        raise ValueError(
            f"{group} variable {name!r} must have leading sample dims {layout}; got shape "
            f"{arr.shape}"
        )
    if flat:
        if arr.shape[0] % num_chains:
            raise ValueError(
                f"{group} variable {name!r} has {arr.shape[0]} draws, not divisible into "
                f"num_chains={num_chains} chains"
            )
        arr = arr.reshape((num_chains, arr.shape[0] // num_chains) + arr.shape[1:])
    c, d = arr.shape[0], arr.shape[1]
    if c < 1 or d < 1:
        raise ValueError(
            f"{group} variable {name!r} needs at least one draw; got (chain, draw) = ({c}, {d})"
        )
    return arr, (c, d)


def _attention_core(name: str, arr: np.ndarray) -> np.ndarray:
    """``(C, D, *extra, B, H, Tq, Tk)``: drop singleton extra dims (Predictive's); keep at most one
    non-singleton extra dim (a stacked layer dim)."""
    extra = arr.shape[2:-4]
    keep = [s for s in extra if s != 1]
    if len(keep) > 1:
        raise ValueError(
            f"attention variable {name!r} must have shape (chain, draw, [layer,] B, H, Tq, Tk); "
            f"got {arr.shape}"
        )
    return arr.reshape(arr.shape[:2] + tuple(keep) + arr.shape[-4:])


def _stack_layers(
    posterior: dict[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    """Stack ``<pre>.layers.<i>.<post>`` attention variables into ``<pre>.<post>`` with a layer
    axis after the sample dims. Returns the new posterior and the layer indices per new name."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in posterior:
        m = _LAYER_RE.match(name)
        if m and _is_attention_name(name):  # every size: mismatches are errors, not skipped
            new = f"{m['pre']}.{m['post']}" if m["pre"] else m["post"]
            groups.setdefault(new, []).append((int(m["idx"]), name))
    groups = {  # a lone variable that is not (C, D, B, H, Tq, Tk) is left alone, as before
        n: lst for n, lst in groups.items() if len(lst) > 1 or posterior[lst[0][1]].ndim >= 6
    }
    if not groups:
        return posterior, {}
    members = {old: new for new, lst in groups.items() for _, old in lst}
    out: dict[str, np.ndarray] = {}
    layers: dict[str, list[int]] = {}
    for name, arr in posterior.items():
        new = members.get(name)
        if new is None:
            if name in groups:
                raise ValueError(
                    f"stack_layers: stacked name {name!r} collides with an existing variable"
                )
            out[name] = arr
            continue
        if new in out:
            continue
        lst = sorted(groups[new])
        ok = all(posterior[o].ndim >= 6 for _, o in lst)
        arrs = [_attention_core(old, posterior[old]) for _, old in lst] if ok else []
        shapes = {a.shape for a in arrs}
        if not ok or len(shapes) > 1 or arrs[0].ndim != 6:
            shapes = {posterior[o].shape[2:] for _, o in lst}
            raise ValueError(
                f"stack_layers: variables {[o for _, o in lst]} have different shapes "
                f"{sorted(shapes)}; cannot stack them into {new!r}"
            )
        out[new] = np.stack(arrs, axis=2)  # (C, D, L, B, H, Tq, Tk)
        layers[new] = [i for i, _ in lst]
    return out, layers


def to_arviz_dict(
    posterior: Mapping[str, Any] | None = None,
    *,
    posterior_predictive: Mapping[str, Any] | None = None,
    observed_data: Mapping[str, Any] | None = None,
    log_likelihood: Mapping[str, Any] | None = None,
    coords: Mapping[str, Sequence] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    sample_dims: Sequence[str] = SAMPLE_DIMS,
    attention_dims: bool = True,
    tokens: Sequence[str] | None = None,
    stack_layers: bool = False,
    squeeze: bool = True,
    predictive_names: Sequence[str] = ("obs",),
    num_chains: int = 1,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, list[str]], dict[str, list]]:
    r"""The version-independent half of :func:`to_arviz`: validated numpy arrays with
    ``(chain, draw)`` leading dims, grouped as ``{group: {var: array}}`` (the arviz 1.x
    ``from_dict`` layout), plus ``dims`` (per variable, sample dims excluded) and ``coords``.

    See :func:`to_arviz` for the arguments. Returns ``(data, dims, coords)``.
    """
    if isinstance(sample_dims, str) or len(tuple(sample_dims)) not in (1, 2):
        raise ValueError(
            "sample_dims must name the input's leading sample dims: ('chain', 'draw') or one "
            f"flat dim such as ('sample',); got {sample_dims!r}"
        )
    flat = len(tuple(sample_dims)) == 1
    _check_positive_int("num_chains", num_chains)
    if num_chains > 1 and not flat:
        raise ValueError("num_chains splits flat draws; the input already has (chain, draw) dims")
    raw = {
        "posterior": posterior,
        "posterior_predictive": posterior_predictive,
        "log_likelihood": log_likelihood,
        "observed_data": observed_data,
    }
    data: dict[str, dict[str, np.ndarray]] = {}
    for group, mapping in raw.items():
        if mapping is None:
            continue
        if not isinstance(mapping, Mapping):
            raise TypeError(
                f"{group} must be a mapping name -> array; got {type(mapping).__name__}"
            )
        converted = {}
        for name, value in mapping.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"{group} variable names must be non-empty str; got {name!r}")
            if "/" in name:
                raise ValueError(
                    f"{group} variable {name!r} contains '/', which netCDF/HDF5 and xarray's "
                    "DataTree reserve as a path separator; rename it"
                )
            arr = _to_numpy(name, value)
            if arr.dtype.kind == "f" and np.isnan(arr).any():
                raise ValueError(
                    f"{group} variable {name!r} holds {int(np.isnan(arr).sum())} NaN values "
                    f"(shape {arr.shape}); diagnostics of NaN draws are meaningless"
                )
            if arr.dtype.kind == "O":
                raise TypeError(f"{group} variable {name!r} must hold numbers; got objects")
            converted[name] = arr
        data[group] = converted

    # Predictive returns "obs" alongside the latents: move it to the posterior predictive
    post = data.get("posterior", {})
    for name in predictive_names:
        if name in post:
            pp = data.setdefault("posterior_predictive", {})
            if name in pp:
                raise ValueError(
                    f"{name!r} given both in posterior and in posterior_predictive; pass it once"
                )
            pp[name] = post.pop(name)
    if "posterior" in data and not data["posterior"]:
        del data["posterior"]
    if not any(data.get(g) for g in _GROUPS):
        raise ValueError("nothing to convert: every group is empty")

    # sample dims → (C, D), the same for every sampled variable
    cd: tuple[int, int] | None = None
    first = ""
    for group in _SAMPLED_GROUPS:
        for name, arr in data.get(group, {}).items():
            arr, shape = _split_samples(group, name, arr, flat, num_chains)
            if cd is None:
                cd, first = shape, f"{group}/{name}"
            elif shape != cd:
                raise ValueError(
                    f"mismatched (chain, draw) dims: {first} has {cd}, {group}/{name} has {shape}"
                )
            data[group][name] = arr

    # Predictive's singleton dims; attention variables to (C, D, [L,] B, H, Tq, Tk)
    post = data.get("posterior", {})
    for name, arr in list(post.items()):
        if _is_attention_name(name) and arr.ndim >= 6:
            post[name] = _attention_core(name, arr)
        elif squeeze:
            lead = 0
            while 2 + lead < arr.ndim and arr.shape[2 + lead] == 1:
                lead += 1
            post[name] = arr.reshape(arr.shape[:2] + arr.shape[2 + lead :])
    layer_idx: dict[str, list[int]] = {}
    if stack_layers and post:
        data["posterior"], layer_idx = _stack_layers(post)

    # dims: user's first, then automatic ones
    dims_in = {k: list(v) for k, v in (dims or {}).items()}
    shapes: dict[str, tuple[int, ...]] = {}
    for group in _GROUPS:
        for name, arr in data.get(group, {}).items():
            core = arr.shape if group == "observed_data" else arr.shape[2:]
            if name in shapes and shapes[name] != core:
                raise ValueError(
                    f"variable {name!r} has non-sample shape {shapes[name]} in one group and "
                    f"{core} in {group}; dims are shared by name, so they must agree"
                )
            shapes[name] = core
    unknown = sorted(set(dims_in) - set(shapes))
    if unknown:
        raise ValueError(f"dims names unknown variables {unknown}; variables are {sorted(shapes)}")
    for name, ds in dims_in.items():
        if any(not isinstance(d, str) for d in ds):
            raise TypeError(f"dims[{name!r}] must be a list of str; got {ds!r}")
        if len(ds) != len(shapes[name]):
            raise ValueError(
                f"dims[{name!r}] = {ds} has {len(ds)} names but {name!r} has {len(shapes[name])} "
                f"non-sample dims, shape {shapes[name]}"
            )
        if set(ds) & set(SAMPLE_DIMS):
            raise ValueError(f"dims[{name!r}] must not include the sample dims {SAMPLE_DIMS}")

    toks = _token_coords(tokens)
    namer = _DimNamer()
    out_dims: dict[str, list[str]] = {}
    for group in _GROUPS:
        for name in data.get(group, {}):
            if name in out_dims:
                continue
            if name in dims_in:
                out_dims[name] = dims_in[name]
                continue
            core = shapes[name]
            auto: list[str] = []
            if attention_dims and group == "posterior" and _is_attention_name(name):
                if len(core) in (4, 5):
                    if len(core) == 5:
                        idx = layer_idx.get(name, list(range(core[0])))
                        auto.append(namer("layer", core[0], idx))
                    for base, size in zip(ATTENTION_DIMS, core[-4:], strict=True):
                        labels = toks if base in ("query", "key") and toks else None
                        auto.append(
                            namer(base, size, labels if labels and len(labels) == size else None)
                        )
            elif attention_dims and name in predictive_names and len(core) >= 1:
                auto.append(namer(ATTENTION_DIMS[0], core[0]))
            auto += [f"{name}_dim_{i}" for i in range(len(core) - len(auto))]
            out_dims[name] = auto
    if toks is not None and not any(
        n in namer.coords for n in namer.names("query") + namer.names("key")
    ):
        raise ValueError(
            f"tokens has length {len(toks)} but no attention variable (with attention_dims=True) "
            "has that many queries or keys"
        )

    # coords: automatic (layers, tokens) overridden by the user's, validated against sizes
    out_coords: dict[str, list] = dict(namer.coords)
    sizes: dict[str, int] = {}
    for name, ds in out_dims.items():
        for d, s in zip(ds, shapes[name], strict=True):
            if sizes.setdefault(d, s) != s:
                raise ValueError(
                    f"dim {d!r} has size {sizes[d]} in one variable and {s} in {name!r}; give the "
                    "variables different dim names"
                )
    for d, values in (coords or {}).items():
        if d in SAMPLE_DIMS:
            raise ValueError(f"coords for the sample dim {d!r} are set automatically")
        if d not in sizes:
            raise ValueError(f"coords given for unknown dim {d!r}; dims are {sorted(sizes)}")
        values = list(values)
        if len(values) != sizes[d]:
            raise ValueError(
                f"coords[{d!r}] has {len(values)} values but dim {d!r} has size {sizes[d]}"
            )
        out_coords[d] = values
    return data, out_dims, out_coords


def _from_dict(
    data: dict[str, dict[str, np.ndarray]],
    dims: dict[str, list[str]],
    coords: dict[str, list],
) -> Any:
    """The version adapter: arviz 0.x ``az.from_dict(**groups)`` or 1.x ``arviz_base.from_dict``."""
    if _arviz_is_v1():
        from arviz_base import from_dict

        return from_dict(data, sample_dims=list(SAMPLE_DIMS), coords=coords, dims=dims)
    import arviz as az

    return az.from_dict(**data, coords=coords, dims=dims)


def to_arviz(
    posterior: Mapping[str, Any] | None = None,
    *,
    posterior_predictive: Mapping[str, Any] | None = None,
    observed_data: Mapping[str, Any] | None = None,
    log_likelihood: Mapping[str, Any] | None = None,
    coords: Mapping[str, Sequence] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    sample_dims: Sequence[str] = SAMPLE_DIMS,
    attention_dims: bool = True,
    tokens: Sequence[str] | None = None,
    stack_layers: bool = False,
    squeeze: bool = True,
    predictive_names: Sequence[str] = ("obs",),
    num_chains: int = 1,
) -> Any:
    r"""Posterior draws → ``arviz.InferenceData`` (arviz 0.x) or ``xarray.DataTree`` (arviz 1.x).

    One function for both ArviZ API generations: the groups are built by :func:`to_arviz_dict`,
    then passed to ``az.from_dict(posterior=..., ...)`` (0.x) or
    ``arviz_base.from_dict({"posterior": ..., ...}, sample_dims=["chain", "draw"])`` (1.x). The
    output's sample dims are always ``("chain", "draw")``, so ``az.ess``, ``az.rhat``,
    ``az.summary`` and ``az.loo`` work the same on both.

    Args:
        posterior, posterior_predictive, log_likelihood: ``{name: array}`` of torch tensors or
            numpy arrays with leading sample dims; ``observed_data``: ``{name: array}`` without.
            Variables named in ``predictive_names`` (``"obs"``) found in ``posterior`` (as in a
            ``Predictive`` output) are moved to ``posterior_predictive``.
        coords: ``{dim: values}``, overriding automatic coordinates.
        dims: ``{var: [dim, ...]}`` for the non-sample dims, overriding automatic dims.
        sample_dims: the *input* layout: ``("chain", "draw")`` (e.g. MCMC
            ``get_samples(group_by_chain=True)``) or one flat sample dim such as ``("sample",)``
            (``Predictive``, guide draws): a flat ``S`` becomes ``(chain, draw) = (1, S)``,
            independent variational draws as one chain (see ``num_chains``).
        attention_dims: name the dims of attention variables (``*.weights``/``*.latent``,
            ``(..., B, H, Tq, Tk)``) ``("example", "head", "query", "key")`` and the first dim of
            ``predictive_names`` variables ``"example"``. Variables whose sizes disagree (e.g.
            self- vs cross-attention) get numbered dims ``query_1``, ``key_1``, ...
        tokens: token strings labelling ``query``/``key`` dims of that length (same for every
            example); repeated tokens become ``"i:token"``. Default: integer coordinates.
        stack_layers: stack ``<pre>.layers.<i>.<post>`` attention variables of equal shape into
            one ``<pre>.<post>`` variable with a leading ``"layer"`` dim (coords = layer indices).
        squeeze: drop ``Predictive``'s singleton dims right after the sample dims of non-attention
            posterior variables (e.g. global weight sites ``(S, 1, Out, In)``); attention
            variables always drop singleton dims in front of ``(B, H, Tq, Tk)``.
        predictive_names: names of observed sites.
        num_chains: split flat draws ``S`` into ``num_chains`` pseudo-chains of ``S /
            num_chains`` draws (i.i.d. draws, so any split is valid); R-hat needs >= 2.

    Raises:
        ValueError: wrong shapes, no draws, mismatched ``(chain, draw)`` across variables,
            unknown variables in ``dims``/dims in ``coords``, coordinate lengths, ``"/"`` in names.
        TypeError: non-array values, non-str names.

    Shape:
        attention weights ``(S, B, H, Tq, Tk)`` or ``(C, D, B, H, Tq, Tk)`` →
        ``(chain, draw, example, head, query, key)``; with ``stack_layers``
        ``(chain, draw, layer, example, head, query, key)``.

    Example:
        >>> draws = Predictive(net.model, guide=net.guide, num_samples=100)(x)
        >>> idata = to_arviz(draws, sample_dims=("sample",), tokens=["the", "cat", "sat"])
        >>> az.summary(idata, var_names=["encoder.layers.0.self_attn.weights"])
    """
    data, out_dims, out_coords = to_arviz_dict(
        posterior,
        posterior_predictive=posterior_predictive,
        observed_data=observed_data,
        log_likelihood=log_likelihood,
        coords=coords,
        dims=dims,
        sample_dims=sample_dims,
        attention_dims=attention_dims,
        tokens=tokens,
        stack_layers=stack_layers,
        squeeze=squeeze,
        predictive_names=predictive_names,
        num_chains=num_chains,
    )
    return _from_dict(data, out_dims, out_coords)


# ------------------------------------------------------------------------------------------------
# draws from a network's guide
# ------------------------------------------------------------------------------------------------


@dataclass
class NetworkDraws:
    """Joint draws from a network's guide with its model replayed on them.

    Shapes: ``sites[name]`` ``(S, *site_shape)`` (global weight sites may carry a singleton dim,
    ``(S, 1, Out, In)``, as in ``Predictive``); ``predictive`` ``(S, B, ...)`` draws of ``obs``;
    ``log_likelihood`` ``(S, B)`` unscaled :math:`\\log p(y_b\\mid x_b, w_s)` (``None`` without
    ``y``).
    """

    sites: dict[str, Tensor]
    predictive: Tensor
    log_likelihood: Tensor | None


def _max_plate_nesting(*traces: Any) -> int:
    nest = 0
    for tr in traces:
        for site in tr.nodes.values():
            if site["type"] != "sample":
                continue
            if site["infer"].get("enumerate"):
                raise ValueError(
                    f"site {site['name']!r} is enumerated; marginalise discrete latents first"
                )
            for f in site["cond_indep_stack"]:
                if f.vectorized and f.dim is not None:
                    nest = max(nest, -f.dim)
    return nest


def _per_draw(t: Tensor, num: int, dim: int) -> Tensor:
    """Move the draw dim (``dim`` from the right of a batch-shaped tensor) to the front:
    ``(num, -1)`` with every other batch dim flattened (singletons included)."""
    k = -dim
    if t.dim() < k:
        t = t.reshape((1,) * (k - t.dim()) + t.shape)
    t = t.movedim(-k, 0)
    return t.expand((num,) + t.shape[1:]).reshape(num, -1)


def network_draws(
    network: Any,
    x: Tensor,
    y: Tensor | None = None,
    num_samples: int = 100,
    *,
    num_data: int | None = None,
    var_names: Sequence[str] | None = None,
    obs_name: str = "obs",
    parallel: bool = True,
    seed: int | None = None,
) -> NetworkDraws:
    r"""Draw ``S`` joint samples from ``network.guide`` and replay ``network.model`` on them.

    This is what ``Predictive(network.model, guide=network.guide, num_samples=S)`` does, plus the
    pointwise log-likelihood of every draw,

    .. math:: \ell_{sb} = \log p(y_b \mid x_b, w_s), \qquad w_s \sim q(w\mid x),

    read from the replayed model's ``obs`` site as ``fn.log_prob(y)``: **unscaled**, i.e. without
    the ``num_data / B`` factor that the data plate applies in the ELBO (``trace.log_prob_sum()``
    includes it). ``parallel=True`` draws all ``S`` in one vectorised pass (an outer plate left of
    the model's plates); ``parallel=False`` loops. Runs under ``torch.no_grad`` with the network in
    eval mode (no dropout).

    Args:
        var_names: sites to keep in ``sites``; default every deterministic ``*.weights`` site
            (the attention weights). Any latent or deterministic site name is allowed.
        seed: draw under a forked torch RNG seeded with ``seed``.

    Shape:
        x ``(B, ...)``, y ``(B, ...)`` → see :class:`NetworkDraws`.
    """
    _check_positive_int("num_samples", num_samples)
    for attr in ("model", "guide"):
        if not callable(getattr(network, attr, None)):
            raise TypeError(f"network must have a callable .{attr}; got {type(network).__name__}")
    S = num_samples
    with torch.no_grad(), _eval_mode(network), _seeded(seed):
        # one unvectorised pass: validates, initialises autoguides, finds the plate nesting
        gtr = poutine.trace(network.guide).get_trace(x, y, num_data)
        mtr = poutine.trace(poutine.replay(network.model, trace=gtr)).get_trace(x, y, num_data)
        if obs_name not in mtr.nodes:
            raise ValueError(f"the model has no site {obs_name!r}")
        if var_names is None:
            names = [
                n
                for n, s in mtr.nodes.items()
                if s["type"] == "sample" and s["infer"].get("_deterministic") and n != obs_name
            ]
        else:
            names = list(var_names)
            missing = [n for n in names if n not in mtr.nodes or mtr.nodes[n]["type"] != "sample"]
            if missing:
                available = [
                    n for n, s in mtr.nodes.items() if s["type"] == "sample" and n != obs_name
                ]
                raise ValueError(f"unknown sites {missing}; the model's sites are {available}")
        if parallel:
            dim = -(_max_plate_nesting(gtr, mtr) + 1)
            with pyro.plate("_bayesattn_draws", S, dim=dim):
                gtr = poutine.trace(network.guide).get_trace(x, y, num_data)
                mtr = poutine.trace(poutine.replay(network.model, trace=gtr)).get_trace(
                    x, y, num_data
                )
            traces = [mtr]
        else:
            dim = None
            traces = [mtr]
            for _ in range(S - 1):
                g = poutine.trace(network.guide).get_trace(x, y, num_data)
                traces.append(
                    poutine.trace(poutine.replay(network.model, trace=g)).get_trace(x, y, num_data)
                )

        def obs_terms(tr: Any) -> tuple[Tensor, Tensor | None]:
            site = tr.nodes[obs_name]
            fn = site["fn"]
            pred = fn.sample()
            if y is None:
                return pred, None
            lp = fn.log_prob(site["value"])  # unscaled: no num_data/B factor
            if site["mask"] is not None:
                lp = torch.where(site["mask"], lp, torch.zeros_like(lp))
            return pred, lp

        if parallel:
            pred, lp = obs_terms(mtr)
            B = x.shape[0]
            ll = _per_draw(lp, S, dim) if lp is not None else None
            if ll is not None and ll.shape[1] != B:
                raise RuntimeError(f"log-likelihood has shape {tuple(lp.shape)}; expected (S, B)")
            sites = {n: mtr.nodes[n]["value"] for n in names}
        else:
            terms = [obs_terms(tr) for tr in traces]
            pred = torch.stack([p for p, _ in terms])  # (S, B, ...)
            ll = torch.stack([lp for _, lp in terms]) if y is not None else None  # (S, B)
            sites = {n: torch.stack([tr.nodes[n]["value"] for tr in traces]) for n in names}
        if pred.shape[0] != S:
            pred = pred.expand((S,) + pred.shape[1:])
    return NetworkDraws(sites=sites, predictive=pred, log_likelihood=ll)


def prediction_to_arviz(
    result: Any,
    y: Tensor | None = None,
    *,
    num_chains: int = 1,
    tokens: Sequence[str] | None = None,
) -> Any:
    r"""Any predictor's output, from the one posterior-predictive path, as ArviZ data.

    ``result`` is a :class:`~bayesattn.uncertainty.PredictionResult` from
    :func:`~bayesattn.uncertainty.predict`, :func:`~bayesattn.uncertainty.predict_mc_dropout` or
    :func:`~bayesattn.uncertainty.predict_ensemble`: the per-sample class probabilities (a
    function of each posterior draw) and kept attention samples (``"<layer>.weights"``) go to the
    ``posterior`` group as ``"probs"``, one label drawn from each sample's predictive to
    ``posterior_predictive`` (``"obs"``), and with labels ``y`` the pointwise
    :math:`\log p_s(y_b\mid x_b)` to ``log_likelihood`` (``"obs"``) and ``y`` to
    ``observed_data``, so ``az.loo``/``az.compare`` rank Bayesian attention, MC dropout and
    ensembles on the same footing. Draws are independent, ``(chain, draw) = (num_chains, S /
    num_chains)``.
    """
    from ..uncertainty import PredictionResult

    if not isinstance(result, PredictionResult):
        raise TypeError(f"result must be a PredictionResult; got {type(result).__name__}")
    posterior = {f"{name}.weights": a.samples for name, a in result.attention.items()}
    posterior["probs"] = result.probs  # (S, B, ..., C)
    draws = torch.distributions.Categorical(probs=result.probs.double()).sample()  # (S, B, ...)
    kw: dict[str, Any] = {"posterior_predictive": {"obs": draws}}
    if y is not None:
        kw["log_likelihood"] = {"obs": result.log_likelihood(y)}
        kw["observed_data"] = {"obs": y}
    return to_arviz(
        posterior, sample_dims=("sample",), num_chains=num_chains, tokens=tokens, **kw
    )


def predictive_to_arviz(
    network: Any,
    x: Tensor,
    y: Tensor | None = None,
    num_samples: int = 100,
    *,
    num_data: int | None = None,
    var_names: Sequence[str] | None = None,
    tokens: Sequence[str] | None = None,
    stack_layers: bool = False,
    parallel: bool = True,
    seed: int | None = None,
    coords: Mapping[str, Sequence] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    num_chains: int = 1,
) -> Any:
    r"""Posterior attention of a network as an ArviZ object, with predictive checks and LOO data.

    Draws ``S`` samples with :func:`network_draws` and exports (as one chain of ``S`` draws, or
    ``num_chains`` pseudo-chains):

    * ``posterior``: the attention weights ``<path>.weights`` (or ``var_names``),
      dims ``(chain, draw, example, head, query, key)``;
    * ``posterior_predictive``: ``obs`` drawn from :math:`p(y\mid x, w_s)`;
    * ``observed_data``: ``obs = y`` (if given);
    * ``log_likelihood``: ``obs`` :math:`=\log p(y_b\mid x_b, w_s)`, unscaled (if ``y`` given),
      ready for ``az.loo``.

    A network with deterministic attention has no attention sites: its ``posterior`` group is
    omitted (``az.loo`` then needs ``reff=1.0``, which is right for independent draws anyway).

    Shape:
        x ``(B, ...)``, y ``(B, ...)`` → see above.
    """
    draws = network_draws(
        network,
        x,
        y,
        num_samples,
        num_data=num_data,
        var_names=var_names,
        parallel=parallel,
        seed=seed,
    )
    return to_arviz(
        draws.sites or None,
        posterior_predictive={"obs": draws.predictive},
        observed_data={"obs": y} if y is not None else None,
        log_likelihood={"obs": draws.log_likelihood} if y is not None else None,
        sample_dims=("sample",),
        tokens=tokens,
        stack_layers=stack_layers,
        coords=coords,
        dims=dims,
        num_chains=num_chains,
    )


# ================================================================================================
# PSIS k-hat
# ================================================================================================

#: interpretation labels of :func:`interpret_khat`, best first
KHAT_INTERPRETATIONS = ("good", "ok", "unreliable")


def interpret_khat(khat: float) -> str:
    r"""Yao et al. (2018): :math:`\hat k < 0.5` ``"good"``, :math:`0.5 \le \hat k \le 0.7`
    ``"ok"``, :math:`\hat k > 0.7` (or NaN) ``"unreliable"``."""
    k = float(khat)
    if k < 0.5:
        return "good"
    if k <= 0.7:
        return "ok"
    return "unreliable"


def _gpdfit(x: np.ndarray) -> tuple[float, float]:
    """Zhang & Stephens (2009) empirical-Bayes fit of a generalized Pareto distribution to sorted
    positive exceedances, with the weak prior on k used by ArviZ/loo (Vehtari et al.)."""
    prior_bs, prior_k = 3.0, 10.0
    n = len(x)
    m = 30 + int(n**0.5)
    b = 1.0 - np.sqrt(m / (np.arange(1, m + 1, dtype=float) - 0.5))
    b /= prior_bs * x[int(n / 4 + 0.5) - 1]
    b += 1.0 / x[-1]
    k = np.log1p(-b[:, None] * x).mean(axis=1)  # (m,)
    len_scale = n * (np.log(-(b / k)) - k - 1.0)  # profile log-likelihood
    w = 1.0 / np.exp(len_scale - len_scale[:, None]).sum(axis=1)
    keep = w >= 10 * np.finfo(float).eps
    w, b = w[keep], b[keep]
    w /= w.sum()
    b_post = float(np.sum(b * w))
    k_post = float(np.log1p(-b_post * x).mean())
    sigma = -k_post / b_post
    k_post = (n * k_post + prior_k * 0.5) / (n + prior_k)  # shrink towards 0.5
    return k_post, sigma


def _gpinv(p: np.ndarray, k: float, sigma: float) -> np.ndarray:
    """Quantile function of the generalized Pareto distribution (``0 < p < 1``)."""
    if not sigma > 0:
        return np.full_like(p, np.nan)
    if abs(k) < np.finfo(float).eps:
        return -sigma * np.log1p(-p)
    return sigma * np.expm1(-k * np.log1p(-p)) / k


def psis_smooth(log_weights: Any, reff: float = 1.0) -> tuple[np.ndarray, float]:
    r"""Pareto-smoothed importance sampling of one vector of log weights (Vehtari et al. 2024).

    The largest :math:`M = \lceil\min(S/5,\ 3\sqrt{S/r_{\text{eff}}})\rceil` weights are replaced
    by the expected order statistics of a generalized Pareto distribution fitted to them
    (:math:`p(w) \propto (1 + k (w-\mu)/\sigma)^{-1/k-1}`), truncated at the largest raw weight;
    :math:`\hat k` is the fitted shape. A self-contained numpy implementation of the algorithm of
    ``arviz.psislw`` (0.x), so PSIS works without arviz and with either ArviZ generation.

    Returns ``(smoothed log weights normalised to logsumexp 0, k̂)``; ``k̂ = inf`` when the tail
    has fewer than 5 draws, ``-inf`` when all weights are equal (q is exact to rounding).

    Shape:
        ``(S,)`` → ``((S,), scalar)``.
    """
    if isinstance(reff, bool) or not isinstance(reff, (int, float)):
        raise TypeError(f"reff must be a float > 0; got {reff!r}")
    if not (math.isfinite(reff) and reff > 0):
        raise ValueError(f"reff (relative efficiency of the draws) must be finite and > 0; got {reff!r}")
    if isinstance(log_weights, (str, bytes)):
        raise TypeError(f"log_weights must be an array of floats; got {type(log_weights).__name__}")
    try:
        x = np.array(log_weights, dtype=float).reshape(-1)
    except (TypeError, ValueError) as e:
        raise TypeError(f"log_weights must be an array of floats ({e})") from e
    n = x.size
    if n < 2:
        raise ValueError(f"need at least 2 log weights; got {n}")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("log weights must not contain NaN or +inf")
    if np.isneginf(x).all():
        raise ValueError("every log weight is -inf (no draw has positive weight)")
    x -= x.max()
    if np.all(x == 0.0):
        return x - math.log(n), float("-inf")
    cutoff_ind = -int(np.ceil(min(n / 5.0, 3 * (n / reff) ** 0.5))) - 1
    order = np.argsort(x)
    xcutoff = max(x[order[cutoff_ind]], np.log(np.finfo(float).tiny))
    expcut = np.exp(xcutoff)
    (tail_idx,) = np.where(x > xcutoff)
    tail = x[tail_idx]
    if len(tail) <= 4:
        k = float("inf")
    else:
        tail_order = np.argsort(tail)
        exceed = np.exp(tail[tail_order]) - expcut
        k, sigma = _gpdfit(exceed)
        if np.isfinite(k):
            probs = np.arange(0.5, len(tail)) / len(tail)
            smoothed = np.log(_gpinv(probs, k, sigma) + expcut)
            x[tail_idx[tail_order]] = smoothed
            x[x > 0] = 0.0
    m = x.max()
    x -= m + np.log(np.exp(x - m).sum())
    return x, float(k)


@dataclass
class PSISResult:
    r"""PSIS diagnostic of a variational guide.

    ``khat``: Pareto shape :math:`\hat k`; ``interpretation``: ``"good"``/``"ok"``/
    ``"unreliable"`` (:func:`interpret_khat`); ``log_weights``: raw
    :math:`\log p(x,\theta_s) - \log q(\theta_s)`, ``(S,)``; ``smoothed_log_weights``: normalised
    PSIS weights, ``(S,)``; ``ess``: importance-sampling effective sample size
    :math:`1/\sum_s \tilde w_s^2` of the smoothed weights.
    """

    khat: float
    interpretation: str
    log_weights: np.ndarray
    smoothed_log_weights: np.ndarray = field(repr=False)
    ess: float = float("nan")

    @property
    def elbo(self) -> float:
        r"""Monte-Carlo ELBO :math:`\frac1S\sum_s\log w_s`."""
        return float(np.mean(self.log_weights))


def _log_prob_per_draw(tr: Any, num: int, dim: int) -> Tensor:
    """Per-draw sum of every sample site's (scaled, masked) log-density: ``(num,)``."""
    tr.compute_log_prob()
    total = torch.zeros(num, dtype=torch.float64)
    for site in tr.nodes.values():
        if site["type"] == "sample":
            lp = site["log_prob"]
            if not isinstance(lp, Tensor):
                lp = torch.as_tensor(lp)
            total = total + _per_draw(lp.to(torch.float64), num, dim).sum(1)
    return total


def psis_diagnostic(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    *args: Any,
    num_samples: int = 1000,
    vectorize: bool = False,
    seed: int | None = None,
    **kwargs: Any,
) -> PSISResult:
    r"""Pareto :math:`\hat k` of the importance weights of a guide (Yao et al. 2018).

    .. math::

        \log w_s = \log p(x, \theta_s) - \log q(\theta_s), \qquad \theta_s \sim q,

    with :math:`\log q` from the guide's trace and :math:`\log p` from the model replayed on it
    (``trace.log_prob_sum()``, which **includes** Pyro scales: for a subsampled model the weight is
    that of the scaled joint, as in the ELBO). The tail of :math:`w` is fitted by
    :func:`psis_smooth` (``arviz.psislw`` with arviz 0.x gives the same :math:`\hat k`).

    Interpretation (:func:`interpret_khat`): :math:`\hat k < 0.5` good, :math:`0.5`–:math:`0.7`
    ok, :math:`> 0.7` unreliable (the guide is too narrow or misplaced; variational estimates and
    the ELBO are untrustworthy). Unlike ESS/R-hat of i.i.d. guide draws, this measures the fit.
    When all :math:`\log w_s` agree to rounding (within :math:`10^3\,\epsilon` of the log
    densities' size) the guide *is* the posterior: :math:`\hat k = -\infty` ("good"), where a
    tail fit of rounding noise would give ArviZ's :math:`+\infty` for ties.

    Args:
        model, guide: Pyro callables taking ``*args, **kwargs``; discrete latents must not be
            enumerated (marginalise them in the model).
        num_samples: draws ``S`` (>= 2; ~1000 for a stable :math:`\hat k`).
        vectorize: draw all ``S`` in one pass under an outer plate (the model must broadcast
            over a leading batch dim); default loops.
        seed: run under a forked torch RNG seeded with ``seed``.

    Shape:
        ``log_weights`` ``(S,)``.
    """
    _check_positive_int("num_samples", num_samples)
    if num_samples < 2:
        raise ValueError(f"num_samples must be >= 2; got {num_samples}")
    S = num_samples
    with torch.no_grad(), _seeded(seed):
        gtr = poutine.trace(guide).get_trace(*args, **kwargs)
        mtr = poutine.trace(poutine.replay(model, trace=gtr)).get_trace(*args, **kwargs)
        if vectorize:
            dim = -(_max_plate_nesting(gtr, mtr) + 1)
            with pyro.plate("_bayesattn_psis", S, dim=dim):
                gtr = poutine.trace(guide).get_trace(*args, **kwargs)
                mtr = poutine.trace(poutine.replay(model, trace=gtr)).get_trace(*args, **kwargs)
            logp, logq = _log_prob_per_draw(mtr, S, dim), _log_prob_per_draw(gtr, S, dim)
        else:
            _max_plate_nesting(gtr, mtr)  # rejects enumerated sites
            lps = [(mtr.log_prob_sum(), gtr.log_prob_sum())]
            for _ in range(S - 1):
                g = poutine.trace(guide).get_trace(*args, **kwargs)
                m = poutine.trace(poutine.replay(model, trace=g)).get_trace(*args, **kwargs)
                lps.append((m.log_prob_sum(), g.log_prob_sum()))
            logp = torch.tensor([float(a) for a, _ in lps], dtype=torch.float64)
            logq = torch.tensor([float(b) for _, b in lps], dtype=torch.float64)
        dtype = mtr.log_prob_sum().dtype if isinstance(mtr.log_prob_sum(), Tensor) else None
    lw = (logp - logq).numpy()
    if np.isnan(lw).any() or np.isposinf(lw).any():
        raise ValueError("log weights contain NaN or +inf (a guide draw with q = 0 or p = inf?)")
    # Weights equal to rounding (1000 ulps of the log densities' size): q is the posterior, the
    # "tail" would be rounding noise (ArviZ reports k = inf for ties), so k-hat = -inf.
    eps = torch.finfo(dtype if dtype is not None and dtype.is_floating_point else torch.float64).eps
    scale = 1.0 + float(logp.abs().mean() + logq.abs().mean())
    exact = bool(np.isfinite(lw).all()) and float(np.ptp(lw)) <= 1e3 * eps * scale
    if exact:
        smoothed, k = np.full(S, -math.log(S)), float("-inf")
    elif _psislw_from_arviz_available():
        import arviz as az

        smoothed, k = az.psislw(lw.copy())
        smoothed, k = np.asarray(smoothed), float(k)
    else:
        smoothed, k = psis_smooth(lw)
    ess = float(1.0 / np.exp(2 * smoothed).sum())
    return PSISResult(
        khat=k,
        interpretation=interpret_khat(k),
        log_weights=lw,
        smoothed_log_weights=smoothed,
        ess=ess,
    )


def _psislw_from_arviz_available() -> bool:
    try:
        import arviz as az
    except ImportError:  # pragma: no cover - arviz is a dependency
        return False
    return not _arviz_is_v1() and hasattr(az, "psislw")


# ================================================================================================
# model comparison
# ================================================================================================


def pointwise_log_likelihood(
    network: Any,
    x: Tensor,
    y: Tensor,
    num_samples: int = 100,
    *,
    num_data: int | None = None,
    parallel: bool = True,
    seed: int | None = None,
) -> Tensor:
    r"""Pointwise log-likelihood :math:`\log p(y_b\mid x_b, w_s)` over guide draws
    :math:`w_s\sim q(w\mid x)` (unscaled by ``num_data``; see :func:`network_draws`).

    Shape:
        x ``(B, ...)``, y ``(B, ...)`` → ``(S, B)``.
    """
    if y is None:
        raise ValueError("pointwise_log_likelihood needs the observed y")
    draws = network_draws(
        network, x, y, num_samples, num_data=num_data, var_names=[], parallel=parallel, seed=seed
    )
    assert draws.log_likelihood is not None
    return draws.log_likelihood


def _loo(obj: Any) -> Any:
    """PSIS-LOO with ``reff = 1`` (independent variational draws) in either ArviZ generation."""
    if _arviz_is_v1():
        from arviz_stats import loo

        return loo(obj, reff=1.0)
    import arviz as az

    return az.loo(obj, reff=1.0)


def compare_attention_variants(
    variants: Mapping[str, tuple[Any, Tensor, Tensor]],
    num_samples: int = 200,
    *,
    seed: int | None = 0,
    parallel: bool = True,
) -> Any:
    r"""Rank networks (e.g. attention variants) by PSIS-LOO on held-out data: ``az.compare``.

    For each ``name -> (network, x_heldout, y_heldout)`` the pointwise log-likelihood
    :math:`\log p(y_b\mid x_b, w_s)` over ``num_samples`` guide draws is exported with
    :func:`predictive_to_arviz`, ``az.loo`` (``reff = 1``: independent draws) gives
    :math:`\widehat{\mathrm{elpd}}_{\text{loo}} = \sum_b \log \sum_s \tilde w_{sb}\,
    p(y_b\mid x_b, w_s)`, and ``az.compare`` ranks them (best first). The networks should be
    compared on the same held-out set. See the module docstring for what LOO on held-out data
    and variational draws means.

    Returns:
        the ``az.compare`` DataFrame (index = variant names, best first; column ``elpd_loo`` in
        arviz 0.x, ``elpd`` in 1.x).
    """
    if not isinstance(variants, Mapping) or len(variants) < 2:
        raise ValueError("variants must be a mapping with at least two name -> (network, x, y)")
    elpds = {}
    for name, spec in variants.items():
        if not isinstance(spec, tuple | list) or len(spec) != 3:
            raise TypeError(f"variants[{name!r}] must be (network, x, y); got {spec!r}")
        net, x, y = spec
        obj = predictive_to_arviz(net, x, y, num_samples, seed=seed, parallel=parallel)
        elpds[name] = _loo(obj)
    if _arviz_is_v1():
        from arviz_stats import compare

        return compare(elpds)
    import arviz as az

    return az.compare(elpds, ic="loo")


# ================================================================================================
# NUTS as ground truth: one-layer attention regression
# ================================================================================================


@dataclass
class AttentionRegressionData:
    r"""Data of :func:`attention_regression_model`, with the parameters that generated it.

    Shapes: ``q (N, d)``, ``keys (N, T, d)``, ``values (N, T)``, ``y (N,)``;
    ``true_params = {"M": (d, d), "log_pi": (T-1,)}``.
    """

    q: Tensor
    keys: Tensor
    values: Tensor
    y: Tensor
    noise_scale: float
    prior_scale: float
    true_params: dict[str, Tensor]

    @property
    def args(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.q, self.keys, self.values, self.y

    @property
    def kwargs(self) -> dict[str, float]:
        return {"noise_scale": self.noise_scale, "prior_scale": self.prior_scale}


def _drop_plate_dim(t: Tensor, event_dim: int) -> Tensor:
    """A global site drawn under an outer (particle) plate has batch shape ``(*P, 1)``: the 1 is
    the data plate's dim. Drop it so the draw dims sit left of the data dim."""
    if t.dim() > event_dim:
        if t.shape[-event_dim - 1] != 1:
            raise ValueError(
                f"unexpected batch shape {tuple(t.shape[:-event_dim])} of a global site"
            )
        t = t.squeeze(-event_dim - 1)
    return t


def attention_regression_model(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    y: Tensor | None = None,
    *,
    noise_scale: float = 0.1,
    prior_scale: float = 1.0,
) -> Tensor:
    r"""One attention read as a regression, small enough for NUTS.

    .. math::

        M_{ab} \sim \mathcal N(0, s^2), \qquad \log\pi_{j} \sim \mathcal N(0, s^2)\ (j \ge 2),
        \ \log\pi_1 = 0,

        w_{nj} = \operatorname{softmax}_j\big(\log\pi_j + q_n^\top M k_{nj}/\sqrt d\big),
        \qquad y_n \sim \mathcal N\big(\textstyle\sum_j w_{nj} v_{nj},\ \sigma^2\big).

    The score :math:`q^\top M k` is the bilinear form :math:`q^\top W_Q^\top W_K k`: the data
    identify only :math:`M = W_Q^\top W_K` (a prior on :math:`W_Q, W_K` separately gives a
    posterior with sign/rotation symmetries that no sampler mixes over), so ``M`` is the
    parameter. The key-relevance log-prior :math:`\log\pi` is pinned at key 1 because softmax is
    shift invariant (a free shift would be a direction the data never inform).

    Sites: ``"M"`` ``(d, d)``, ``"log_pi"`` ``(T-1,)``, ``"y"`` in plate ``"data"`` (dim -1).
    Broadcasts over leading draw dims (vectorised particles, ``Predictive(parallel=True)``).

    Shape:
        q ``(N, d)``, keys ``(N, T, d)``, values ``(N, T)``, y ``(N,)`` → mean ``(*P, N)``.
    """
    N, d = q.shape
    T = keys.shape[-2]
    if keys.shape != (N, T, d) or values.shape != (N, T) or (y is not None and y.shape != (N,)):
        raise ValueError(
            f"expected q (N, d), keys (N, T, d), values (N, T), y (N,); got {tuple(q.shape)}, "
            f"{tuple(keys.shape)}, {tuple(values.shape)}, {None if y is None else tuple(y.shape)}"
        )
    zero = q.new_zeros(())
    s = q.new_tensor(prior_scale)
    M = pyro.sample("M", dist.Normal(zero, s).expand([d, d]).to_event(2))
    log_pi = pyro.sample("log_pi", dist.Normal(zero, s).expand([T - 1]).to_event(1))
    M = _drop_plate_dim(M, 2)  # (*P, d, d)
    log_pi = _drop_plate_dim(log_pi, 1)  # (*P, T-1)
    log_pi = torch.cat([log_pi.new_zeros(log_pi.shape[:-1] + (1,)), log_pi], dim=-1)  # (*P, T)
    scores = torch.einsum("nd,...de,nte->...nt", q, M, keys) / math.sqrt(d)  # (*P, N, T)
    w = torch.softmax(log_pi.unsqueeze(-2) + scores, dim=-1)  # (*P, N, T)
    mean = (w * values).sum(-1)  # (*P, N)
    with pyro.plate("data", N, dim=-1):
        pyro.sample("y", dist.Normal(mean, q.new_tensor(noise_scale)), obs=y)
    return mean


def simulate_attention_regression(
    num_data: int = 30,
    num_keys: int = 3,
    dim: int = 2,
    *,
    noise_scale: float = 0.1,
    prior_scale: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> AttentionRegressionData:
    """Seeded data from :func:`attention_regression_model` with fixed, well-identified parameters
    (``M`` with entries of size ~1, ``log_pi = [0, 0.5, -0.5, ...]``); global RNG untouched."""
    for name, v in (("num_data", num_data), ("num_keys", num_keys), ("dim", dim)):
        _check_positive_int(name, v)
    if num_keys < 2:
        raise ValueError(f"num_keys must be >= 2; got {num_keys}")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_data, dim, generator=g, dtype=dtype)
    keys = torch.randn(num_data, num_keys, dim, generator=g, dtype=dtype)
    values = torch.randn(num_data, num_keys, generator=g, dtype=dtype)
    ones = torch.ones(dim, dim, dtype=dtype)
    M = torch.eye(dim, dtype=dtype) + 0.5 * (torch.tril(ones, -1) - torch.triu(ones, 1))
    M[0, 0] = 1.5  # d = 2: [[1.5, -0.5], [0.5, 1.0]]
    log_pi = torch.tensor([0.5 * (-1) ** j for j in range(num_keys - 1)], dtype=dtype)
    full = torch.cat([log_pi.new_zeros(1), log_pi])
    scores = torch.einsum("nd,de,nte->nt", q, M, keys) / math.sqrt(dim)
    mean = (torch.softmax(full + scores, -1) * values).sum(-1)
    y = mean + noise_scale * torch.randn(num_data, generator=g, dtype=dtype)
    return AttentionRegressionData(
        q, keys, values, y, noise_scale, prior_scale, {"M": M, "log_pi": log_pi}
    )


def _flat_names(name: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{','.join(map(str, i))}]" for i in np.ndindex(*shape)]


def _posterior_dataset(obj: Any) -> Any:
    """The posterior group as an ``xarray.Dataset`` (InferenceData or DataTree)."""
    import xarray as xr

    ds = obj["posterior"]
    return ds if isinstance(ds, xr.Dataset) else ds.to_dataset()


def _flat_stat(ds: Any, names: Sequence[str]) -> np.ndarray:
    return np.concatenate([np.asarray(ds[n].values, dtype=float).reshape(-1) for n in names])


@dataclass
class NUTSResult:
    """NUTS draws of :func:`attention_regression_model` and their convergence diagnostics.

    ``samples[name]`` ``(C, D, *site_shape)``; ``inference_data`` the ArviZ object
    (:func:`to_arviz`); ``rhat``/``ess_bulk`` per scalar parameter (``param_names`` order);
    ``divergences`` total over chains.
    """

    samples: dict[str, Tensor]
    inference_data: Any
    param_names: list[str]
    rhat: np.ndarray
    ess_bulk: np.ndarray
    divergences: int

    @property
    def max_rhat(self) -> float:
        return float(np.max(self.rhat))

    @property
    def min_ess_bulk(self) -> float:
        return float(np.min(self.ess_bulk))


def nuts_attention_regression(
    data: AttentionRegressionData,
    *,
    num_samples: int = 300,
    warmup_steps: int = 300,
    num_chains: int = 2,
    seed: int = 0,
    jit_compile: bool = False,
) -> NUTSResult:
    r"""NUTS on :func:`attention_regression_model`: the reference posterior.

    Chains run **sequentially** in this process with seeds ``seed + c`` (``num_chains > 1`` in
    ``pyro.infer.MCMC`` would fork worker processes, which is slow to start on CPU and fragile
    under test runners); their draws are stacked as ``(chain, draw)`` and exported with
    :func:`to_arviz`; R-hat (rank-normalised split) and bulk ESS come from ArviZ.

    Shape:
        ``samples["M"]`` ``(C, D, d, d)``, ``samples["log_pi"]`` ``(C, D, T-1)``.
    """
    from pyro.infer import MCMC, NUTS

    for name, v in (("num_samples", num_samples), ("num_chains", num_chains)):
        _check_positive_int(name, v)
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative int; got {warmup_steps!r}")
    chains: list[dict[str, Tensor]] = []
    divergences = 0
    for c in range(num_chains):
        with _seeded(seed + c):
            kernel = NUTS(
                attention_regression_model, jit_compile=jit_compile, ignore_jit_warnings=True
            )
            mcmc = MCMC(
                kernel,
                num_samples=num_samples,
                warmup_steps=warmup_steps,
                num_chains=1,
                disable_progbar=True,
            )
            mcmc.run(*data.args, **data.kwargs)
            chains.append({k: v.detach() for k, v in mcmc.get_samples().items()})
            div = mcmc.diagnostics().get("divergences", {})
            divergences += sum(len(v) for v in div.values())
    samples = {k: torch.stack([ch[k] for ch in chains]) for k in chains[0]}  # (C, D, ...)
    idata = to_arviz(samples)
    rhat, ess, names = _rhat_ess(idata, samples)
    return NUTSResult(samples, idata, names, rhat, ess, divergences)


def _rhat_ess(idata: Any, samples: Mapping[str, Tensor]) -> tuple[np.ndarray, np.ndarray, list]:
    """Rank-normalised split R-hat and bulk ESS per scalar parameter, from ArviZ (0.x or 1.x)."""
    if _arviz_is_v1():
        from arviz_stats import ess, rhat
    else:
        from arviz import ess, rhat

    ds = _posterior_dataset(idata)
    order = list(samples)
    r = _flat_stat(rhat(ds), order)
    e = _flat_stat(ess(ds, method="bulk"), order)
    names = [n for k in order for n in _flat_names(k, tuple(samples[k].shape[2:]))]
    return r, e, names


def fit_svi_attention_regression(
    data: AttentionRegressionData,
    *,
    guide: str = "mvn",
    num_steps: int = 1500,
    lr: float = 0.03,
    num_particles: int = 8,
    seed: int = 0,
) -> Any:
    r"""Fit an autoguide to :func:`attention_regression_model` by SVI.

    ``guide="mvn"`` (``AutoMultivariateNormal``, full covariance) or ``"normal"`` (``AutoNormal``,
    mean field). ``Trace_ELBO`` with ``num_particles`` vectorised particles and ``ClippedAdam``
    whose learning rate decays tenfold over the run (the last iterates average out gradient noise).
    Runs in a scoped param store (the fitted parameters live in the returned guide's closure, not
    in the global store) and a forked, seeded RNG.
    """
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

    if guide not in ("mvn", "normal"):
        raise ValueError(f"guide must be 'mvn' or 'normal'; got {guide!r}")
    _check_positive_int("num_steps", num_steps)
    _check_positive_int("num_particles", num_particles)
    cls = AutoMultivariateNormal if guide == "mvn" else AutoNormal
    # scoped store: nothing leaks into the global one; the trained values live in the guide
    # module itself (PyroModule parameters), so the guide works outside the scope
    with _seeded(seed), pyro.get_param_store().scope():
        g = cls(attention_regression_model, init_scale=0.1)
        elbo = Trace_ELBO(
            num_particles=num_particles, vectorize_particles=True, max_plate_nesting=1
        )
        optim = pyro.optim.ClippedAdam({"lr": lr, "lrd": 0.1 ** (1.0 / num_steps)})
        svi = SVI(attention_regression_model, g, optim, elbo)
        for _ in range(num_steps):
            svi.step(*data.args, **data.kwargs)
    return g


def _guide_draws(guide: Any, data: AttentionRegressionData, num: int) -> dict[str, Tensor]:
    """``num`` joint draws of the guide's sites, ``(num, *site_shape)``."""
    # an empty scoped store: the guide uses its own (module) parameters, never a same-named
    # parameter of someone else's in the global store
    with (
        torch.no_grad(),
        pyro.get_param_store().scope(),
        pyro.plate("_bayesattn_draws", num, dim=-2),
    ):
        tr = poutine.trace(guide).get_trace(*data.args, **data.kwargs)
    return {
        name: _drop_plate_dim(tr.nodes[name]["value"], len(shape))
        for name, shape in (
            ("M", data.true_params["M"].shape),
            ("log_pi", data.true_params["log_pi"].shape),
        )
    }


@dataclass
class SVINUTSComparison:
    r"""Posterior means and standard deviations of an SVI guide against NUTS, per scalar
    parameter (``param_names``), with NUTS' R-hat, bulk ESS and Monte-Carlo error of the mean
    (:math:`\mathrm{sd}/\sqrt{\mathrm{ESS}}`) and the guide's PSIS :math:`\hat k`."""

    param_names: list[str]
    nuts_mean: np.ndarray
    nuts_sd: np.ndarray
    nuts_mcse: np.ndarray
    svi_mean: np.ndarray
    svi_sd: np.ndarray
    rhat: np.ndarray
    ess_bulk: np.ndarray
    num_svi_draws: int
    psis: PSISResult | None
    nuts: NUTSResult = field(repr=False)

    @property
    def mean_error_in_sd(self) -> np.ndarray:
        r""":math:`|\bar\theta_{\text{SVI}} - \bar\theta_{\text{NUTS}}| / \mathrm{sd}_{\text{NUTS}}`."""
        return np.abs(self.svi_mean - self.nuts_mean) / self.nuts_sd

    @property
    def sd_ratio(self) -> np.ndarray:
        r""":math:`\mathrm{sd}_{\text{SVI}} / \mathrm{sd}_{\text{NUTS}}`."""
        return self.svi_sd / self.nuts_sd

    def table(self) -> Any:
        """A ``pandas.DataFrame`` of the comparison (pandas comes with ArviZ)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "nuts_mean": self.nuts_mean,
                "svi_mean": self.svi_mean,
                "nuts_sd": self.nuts_sd,
                "svi_sd": self.svi_sd,
                "mean_error_in_sd": self.mean_error_in_sd,
                "sd_ratio": self.sd_ratio,
                "nuts_mcse": self.nuts_mcse,
                "rhat": self.rhat,
                "ess_bulk": self.ess_bulk,
            },
            index=self.param_names,
        )


def compare_svi_nuts(
    data: AttentionRegressionData | None = None,
    *,
    guide: str = "mvn",
    nuts: NUTSResult | None = None,
    num_samples: int = 300,
    warmup_steps: int = 300,
    num_chains: int = 2,
    svi_steps: int = 1500,
    num_svi_draws: int = 4000,
    psis_samples: int = 0,
    seed: int = 0,
    jit_compile: bool = False,
) -> SVINUTSComparison:
    r"""Check an SVI autoguide against NUTS on :func:`attention_regression_model`.

    Runs :func:`nuts_attention_regression` (or reuses ``nuts``), fits
    :func:`fit_svi_attention_regression` with ``guide``, and compares posterior means and
    standard deviations per parameter. Expect, for a well-identified near-Gaussian posterior,
    :math:`|\Delta\text{mean}| \lesssim 0.25\,\mathrm{sd}` plus Monte-Carlo error for both guides
    and ``sd_ratio`` near 1 for ``"mvn"``; mean field (``"normal"``) minimises
    :math:`\mathrm{KL}(q\|p)`, which for correlated Gaussians matches the *conditional* variances
    :math:`1/\Lambda_{ii}` (:math:`\Lambda` = posterior precision), never larger than the
    marginal ones: its ``sd_ratio`` is :math:`\le 1`, the more so the stronger the correlations.
    ``psis_samples > 0`` also reports the guide's PSIS :math:`\hat k`.
    """
    data = data if data is not None else simulate_attention_regression(seed=seed)
    if nuts is None:
        nuts = nuts_attention_regression(
            data,
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            num_chains=num_chains,
            seed=seed,
            jit_compile=jit_compile,
        )
    _check_positive_int("num_svi_draws", num_svi_draws)
    g = fit_svi_attention_regression(data, guide=guide, num_steps=svi_steps, seed=seed)
    with _seeded(seed + 1000):
        draws = _guide_draws(g, data, num_svi_draws)
    order = list(nuts.samples)
    nuts_flat = torch.cat(
        [nuts.samples[k].reshape(nuts.samples[k].shape[:2] + (-1,)) for k in order], dim=-1
    ).reshape(-1, len(nuts.param_names))  # (C*D, P)
    svi_flat = torch.cat([draws[k].reshape(num_svi_draws, -1) for k in order], dim=-1)  # (n, P)
    nuts_sd = nuts_flat.std(0).numpy()
    psis = None
    if psis_samples:
        with pyro.get_param_store().scope():
            psis = psis_diagnostic(
                attention_regression_model,
                g,
                *data.args,
                num_samples=psis_samples,
                vectorize=True,
                seed=seed + 2000,
                **data.kwargs,
            )
    return SVINUTSComparison(
        param_names=nuts.param_names,
        nuts_mean=nuts_flat.mean(0).numpy(),
        nuts_sd=nuts_sd,
        nuts_mcse=nuts_sd / np.sqrt(nuts.ess_bulk),
        svi_mean=svi_flat.mean(0).numpy(),
        svi_sd=svi_flat.std(0).numpy(),
        rhat=nuts.rhat,
        ess_bulk=nuts.ess_bulk,
        num_svi_draws=num_svi_draws,
        psis=psis,
        nuts=nuts,
    )
