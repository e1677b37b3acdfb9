r"""ArviZ export for both API generations: posterior draws (torch or numpy) → ``arviz.InferenceData``
(arviz 0.x) or ``xarray.DataTree`` (arviz >= 1.0, via ``arviz_base.from_dict``).

:func:`to_arviz_dict` is the version-independent part (the nested ``{group: {var: array}}`` dict
with ``dims``/``coords``); :func:`to_arviz` passes it to the installed ArviZ. Attention-weight
variables (``"<path>.weights"``/``"<path>.latent"``, shape ``(..., B, H, Tq, Tk)``) get the dims
``("example", "head", "query", "key")`` (plus ``"layer"`` when stacked). Positions and tokens are
separate coordinates: ``query``/``key`` are indexed by position (integers), and with ``tokens``
the non-dimension coordinates ``query_token``/``key_token`` hold the words (indexed, so
``w.sel(query_token="cat")`` selects every position of that word). ArviZ is imported lazily
inside the functions.

Dimension glossary: ``S`` draws, ``C`` chains, ``D`` draws per chain, ``B`` examples, ``H`` heads,
``Tq``/``Tk`` queries/keys, ``L`` stacked layers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor

from .._validation import check_int
from .token_coords import check_tokens, token_dims, with_tokens

__all__ = ["arviz_major_version", "to_arviz_dict", "to_arviz"]

#: output sample dims of every exported object: variational draws are one chain
SAMPLE_DIMS = ("chain", "draw")
#: automatic dims of an attention-weight variable, after the sample dims
ATTENTION_DIMS = ("example", "head", "query", "key")
_SAMPLED_GROUPS = ("posterior", "posterior_predictive", "log_likelihood")
_GROUPS = (*_SAMPLED_GROUPS, "observed_data")
_LAYER_RE = re.compile(r"^(?:(?P<pre>.*)\.)?layers\.(?P<idx>\d+)\.(?P<post>.+)$")


def arviz_major_version() -> int:
    """Major version of the installed ArviZ (``0`` for the InferenceData API, ``>= 1`` for the
    DataTree API of ``arviz_base``/``arviz_stats``). Imports arviz."""
    import arviz

    return int(arviz.__version__.split(".")[0])


def arviz_is_v1() -> bool:
    """The one switch between the two ArviZ API generations."""
    return arviz_major_version() >= 1


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


def _check_sample_layout(sample_dims: Sequence[str], num_chains: int) -> bool:
    """Validate the input's sample layout; True for one flat sample dim ``(S, ...)``."""
    if isinstance(sample_dims, str) or len(tuple(sample_dims)) not in (1, 2):
        raise ValueError(
            "sample_dims must name the input's leading sample dims: ('chain', 'draw') or one "
            f"flat dim such as ('sample',); got {sample_dims!r}"
        )
    flat = len(tuple(sample_dims)) == 1
    check_int("num_chains", num_chains, 1)
    if num_chains > 1 and not flat:
        raise ValueError("num_chains splits flat draws; the input already has (chain, draw) dims")
    return flat


def _convert_variable(group: str, name: Any, value: Any) -> np.ndarray:
    """One variable as a numpy array, with its name and values validated."""
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
    return arr


def _convert_groups(raw: Mapping[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """``{group: mapping or None}`` → ``{group: {var: array}}`` (groups given as None dropped)."""
    data: dict[str, dict[str, np.ndarray]] = {}
    for group, mapping in raw.items():
        if mapping is None:
            continue
        if not isinstance(mapping, Mapping):
            raise TypeError(
                f"{group} must be a mapping name -> array; got {type(mapping).__name__}"
            )
        data[group] = {
            name: _convert_variable(group, name, value) for name, value in mapping.items()
        }
    return data


def _move_predictive(
    data: dict[str, dict[str, np.ndarray]], predictive_names: Sequence[str]
) -> None:
    """``Predictive`` returns ``"obs"`` alongside the latents: move it to the posterior
    predictive (in place); refuse an empty result."""
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


def _to_chain_draw(data: dict[str, dict[str, np.ndarray]], flat: bool, num_chains: int) -> None:
    """Sample dims → ``(C, D)`` (in place), the same for every sampled variable."""
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


def _normalise_posterior(
    data: dict[str, dict[str, np.ndarray]], squeeze: bool, stack_layers: bool
) -> dict[str, list[int]]:
    """Drop ``Predictive``'s singleton dims; attention variables to ``(C, D, [L,] B, H, Tq,
    Tk)``; optionally stack layers (in place). Returns the layer indices per stacked name."""
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
    return layer_idx


def _core_shapes(data: dict[str, dict[str, np.ndarray]]) -> dict[str, tuple[int, ...]]:
    """Non-sample shape per variable name; a name shared across groups must agree."""
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
    return shapes


def _check_user_dims(
    dims: Mapping[str, Sequence[str]] | None, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, list[str]]:
    """The user's ``dims``, validated against the variables' non-sample shapes."""
    dims_in = {k: list(v) for k, v in (dims or {}).items()}
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
    return dims_in


def _attention_auto_dims(
    name: str,
    core: tuple[int, ...],
    namer: _DimNamer,
    layer_idx: Mapping[str, list[int]],
) -> list[str]:
    """``[layer,] example, head, query, key`` for a ``([L,] B, H, Tq, Tk)`` attention variable;
    ``[]`` for other shapes."""
    if len(core) not in (4, 5):
        return []
    auto: list[str] = []
    if len(core) == 5:
        idx = layer_idx.get(name, list(range(core[0])))
        auto.append(namer("layer", core[0], idx))
    for base, size in zip(ATTENTION_DIMS, core[-4:], strict=True):
        auto.append(namer(base, size))
    return auto


def _auto_dims(
    data: dict[str, dict[str, np.ndarray]],
    shapes: Mapping[str, tuple[int, ...]],
    dims_in: Mapping[str, list[str]],
    layer_idx: Mapping[str, list[int]],
    tokens: Sequence[str] | None,
    attention_dims: bool,
    predictive_names: Sequence[str],
) -> tuple[dict[str, list[str]], _DimNamer]:
    """Dims per variable: the user's first, then automatic ones (attention dims, ``example``
    for observed sites, ``<name>_dim_<i>`` for the rest)."""
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
                auto = _attention_auto_dims(name, core, namer, layer_idx)
            elif attention_dims and name in predictive_names and len(core) >= 1:
                auto.append(namer(ATTENTION_DIMS[0], core[0]))
            auto += [f"{name}_dim_{i}" for i in range(len(core) - len(auto))]
            out_dims[name] = auto
    toks = check_tokens(tokens)
    if toks is not None and not token_dims(out_dims, shapes, len(toks)):
        raise ValueError(
            f"tokens has length {len(toks)} but no attention variable (with attention_dims=True) "
            "has that many queries or keys"
        )
    return out_dims, namer


def _merge_coords(
    namer: _DimNamer,
    out_dims: Mapping[str, list[str]],
    shapes: Mapping[str, tuple[int, ...]],
    coords: Mapping[str, Sequence] | None,
) -> dict[str, list]:
    """Automatic coords (layers, tokens) overridden by the user's, validated against sizes."""
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
    return out_coords


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
    flat = _check_sample_layout(sample_dims, num_chains)
    data = _convert_groups(
        {
            "posterior": posterior,
            "posterior_predictive": posterior_predictive,
            "log_likelihood": log_likelihood,
            "observed_data": observed_data,
        }
    )
    _move_predictive(data, predictive_names)
    _to_chain_draw(data, flat, num_chains)
    layer_idx = _normalise_posterior(data, squeeze, stack_layers)
    shapes = _core_shapes(data)
    dims_in = _check_user_dims(dims, shapes)
    out_dims, namer = _auto_dims(
        data, shapes, dims_in, layer_idx, tokens, attention_dims, predictive_names
    )
    return data, out_dims, _merge_coords(namer, out_dims, shapes, coords)


def _from_dict(
    data: dict[str, dict[str, np.ndarray]],
    dims: dict[str, list[str]],
    coords: dict[str, list],
) -> Any:
    """The version adapter: arviz 0.x ``az.from_dict(**groups)`` or 1.x ``arviz_base.from_dict``."""
    if arviz_is_v1():
        from arviz_base import from_dict

        return from_dict(data, sample_dims=list(SAMPLE_DIMS), coords=coords, dims=dims)
    import arviz as az

    groups: dict[str, Any] = data  # posterior=, log_likelihood=, ...: one keyword per group
    return az.from_dict(**groups, coords=coords, dims=dims)


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

    The groups built by :func:`to_arviz_dict` go to ``az.from_dict(posterior=..., ...)`` (0.x) or
    ``arviz_base.from_dict({"posterior": ..., ...}, sample_dims=["chain", "draw"])`` (1.x); the
    sample dims are always ``("chain", "draw")``, so ``az.ess``/``rhat``/``summary``/``loo`` work
    the same on both.

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
        tokens: words at the ``query``/``key`` positions: coordinates ``query_token``/``key_token``.
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
    idata = _from_dict(data, out_dims, out_coords)
    return with_tokens(idata, data, out_dims, tokens, v1=arviz_is_v1())
