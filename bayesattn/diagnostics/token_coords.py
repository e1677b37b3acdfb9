"""Tokens as ArviZ coordinates beside the positions.

An attention variable's ``query``/``key`` dims are indexed by position (integers); the words go
in the non-dimension coordinates ``query_token``/``key_token`` (``<dim>_token`` for a numbered
dim such as ``key_1``), each with an xarray index under arviz 0.x, so ``w.sel(query_token="cat")``
selects every position holding that word, and ``az.summary`` labels stay positions
(``w[0, 0, 2, 1]``), never a word glued to its position. Under arviz 1.x, whose ``summary``
refuses a second index on a dim, the words are not indexed: ``w.set_xindex("query_token")``
first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["check_tokens", "token_dims", "with_coords", "with_tokens"]

_TOKEN_DIM = re.compile(r"^(query|key)(_\d+)?$")


def check_tokens(tokens: Sequence[str] | None) -> tuple[str, ...] | None:
    """The checked token labels (repeats allowed: positions are a coordinate of their own)."""
    if tokens is None:
        return None
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(f"tokens must be a list of str; got {tokens!r}")
    toks = tuple(tokens)
    if not toks:
        raise ValueError("tokens must not be empty")
    return toks


def token_dims(
    dims: Mapping[str, Sequence[str]], shapes: Mapping[str, tuple[int, ...]], size: int
) -> list[str]:
    """The ``query``/``key`` dims (``query_1``, ... included) of length ``size``, in order of
    appearance (``dims``: per variable, its non-sample dims; ``shapes``: their sizes)."""
    out: list[str] = []
    for name, ds in dims.items():
        for d, n in zip(ds, shapes[name], strict=True):
            if _TOKEN_DIM.match(d) and n == size and d not in out:
                out.append(d)
    return out


def with_coords(
    idata: Any,
    group: str,
    extra: Mapping[str, tuple[tuple[str, ...], Any]],
    *,
    v1: bool,
    index: bool = True,
) -> Any:
    """``idata`` (arviz 0.x ``InferenceData``, or a 1.x ``DataTree`` when ``v1``) with the
    non-dimension coordinates ``extra`` (``{name: (dims, values)}``) added to ``group``;
    ``index``: the 1-D ones get an xarray index, so ``.sel(name=value)`` works."""
    ds = idata[group].to_dataset() if v1 else getattr(idata, group)
    ds = ds.assign_coords({k: (tuple(d), np.asarray(v)) for k, (d, v) in extra.items()})
    for k, (d, _) in extra.items():
        if index and len(d) == 1:
            ds = ds.set_xindex(k)
    if v1:
        idata[group] = ds
    else:
        setattr(idata, group, ds)
    return idata


def with_tokens(
    idata: Any,
    data: Mapping[str, Mapping[str, np.ndarray]],
    dims: Mapping[str, Sequence[str]],
    tokens: Sequence[str] | None,
    *,
    v1: bool,
) -> Any:
    """``idata`` with ``<dim>_token`` coordinates on the posterior's ``query``/``key`` dims of
    ``len(tokens)`` positions (unchanged without ``tokens``). ``data``: the exported arrays,
    ``(chain, draw, ...)`` per variable; ``dims``: their non-sample dims."""
    toks = check_tokens(tokens)
    if toks is None:
        return idata
    post = data.get("posterior", {})
    shapes = {n: tuple(post[n].shape[2:]) for n in dims if n in post}  # after (chain, draw)
    tdims = token_dims({n: d for n, d in dims.items() if n in shapes}, shapes, len(toks))
    extra = {f"{d}_token": ((d,), list(toks)) for d in tdims}
    # arviz 1.x's summary stacks the dims and refuses a dim with two indexes: there the words
    # stay unindexed (select after ``.set_xindex("query_token")``)
    return with_coords(idata, "posterior", extra, v1=v1, index=not v1)
