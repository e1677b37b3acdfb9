r"""Rank-1 factors on the attention projections of a model we did not write, applied by hooks.

A projection :math:`y = \bar W x + b` rescaled by a rank-1 factor :math:`(r, s)` is

.. math:: y = (\bar W \circ s\,r^\top)\,x + b = s \circ \bar W (r \circ x) + b
          = y_0 + (s - 1)\circ(y_0 - b),\qquad y_0 = \bar W (r\circ x) + b,

so the input side :math:`r` is a forward pre-hook (scale the input) and the output side
:math:`s` a forward hook (the last form: all-ones factors leave ``y`` bit for bit). No weight
is touched. :func:`rank1_sites` finds the factor *sites* of every attention layer:

* ``torch.nn.MultiheadAttention`` and our
  :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` (what :func:`bayesattn.convert`
  makes): their projections are not submodule calls, so a hook on the layer reaches the input
  sides of :math:`W_q, W_k, W_v` (``query``/``key``/``value`` scaled separately) and the output
  side of :math:`W_o` (four sites);
* Hugging Face attention (``query``/``key``/``value`` or ``q_proj``/``k_proj``/``v_proj``
  ``nn.Linear`` children; :math:`W_o` an ``o_proj``/``out_proj`` child or BERT's sibling
  ``output.dense``): both sides of all four projections (eight sites).

``J`` factor draws are evaluated in one pass by folding them into the batch: the inputs are
repeated draw-major (row ``j·B + b`` is example ``b`` under draw ``j``) and every hook reshapes
its tensor to ``(J, B, …)`` to apply draw ``j``'s factor to its rows; nothing loops over ``J``.
:func:`apply_factors` installs the hooks for one ``(J, D)`` draw tensor and always removes them.

Shape:
    ``theta (J, D)`` with ``D = sum(site.size)``; the batch of every hooked tensor is
    ``J·B`` (dim 0, or dim 1 for a sequence-first ``MultiheadAttention``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn

from ..nn.attention import BayesianMultiheadAttention

__all__ = ["Rank1Site", "rank1_sites", "apply_factors", "hook_count"]

Side = Literal["in", "out"]
_QKV = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"))
_OUT = ("o_proj", "out_proj")


@dataclass(frozen=True)
class Rank1Site:
    """One factor vector: ``side`` (``"in"``: :math:`r`, ``"out"``: :math:`s`) of projection
    ``role`` (``q``, ``k``, ``v``, ``o``) of the attention layer at ``layer``; it occupies
    ``theta[:, offset:offset + size]``. ``module`` is the hooked module (the attention layer
    itself for ``hooked="mha"``, the projection's ``nn.Linear`` for ``hooked="linear"``)."""

    layer: str
    role: str
    side: Side
    size: int
    offset: int
    module: nn.Module
    hooked: Literal["mha", "linear"]

    @property
    def kind(self) -> str:
        """Deprecated spelling of :attr:`hooked`; removed in the next release."""
        warnings.warn(
            "Rank1Site.kind is deprecated: use Rank1Site.hooked", DeprecationWarning, stacklevel=2
        )
        return self.hooked

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.role}.{self.side}"


def _mha_sites(path: str, m: Any, offset: int) -> list[Rank1Site]:
    E = int(m.embed_dim)
    sizes = {"q": E, "k": int(m.kdim), "v": int(m.vdim)}
    sites = []
    for role in ("q", "k", "v"):
        sites.append(Rank1Site(path, role, "in", sizes[role], offset, m, "mha"))
        offset += sizes[role]
    sites.append(Rank1Site(path, "o", "out", E, offset, m, "mha"))
    return sites


def _out_linear(model: nn.Module, path: str, m: nn.Module) -> nn.Linear | None:
    for n in _OUT:
        if isinstance(getattr(m, n, None), nn.Linear):
            return getattr(m, n)
    if path:  # BERT: attention.self.{query,key,value} and attention.output.dense
        head, _, _ = path.rpartition(".")
        parent = model.get_submodule(head) if head else model
        dense = getattr(getattr(parent, "output", None), "dense", None)
        if isinstance(dense, nn.Linear):
            return dense
    return None


def _linear_sites(model: nn.Module, path: str, m: nn.Module, offset: int) -> list[Rank1Site]:
    for names in _QKV:
        lins = [getattr(m, n, None) for n in names]
        if all(isinstance(lin, nn.Linear) for lin in lins):
            break
    else:
        return []
    out = _out_linear(model, path, m)
    projs = list(zip(("q", "k", "v"), lins, strict=True)) + ([("o", out)] if out else [])
    sites = []
    for role, lin in projs:
        assert isinstance(lin, nn.Linear)
        for side, size in (("in", lin.in_features), ("out", lin.out_features)):
            sites.append(Rank1Site(path, role, side, size, offset, lin, "linear"))  # type: ignore[arg-type]
            offset += size
    return sites


def rank1_sites(model: nn.Module) -> list[Rank1Site]:
    """The factor sites of every attention layer of ``model``, in ``named_modules`` order
    (module docstring). ``ValueError`` when there are none."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    sites: list[Rank1Site] = []
    for path, m in model.named_modules():
        offset = sites[-1].offset + sites[-1].size if sites else 0
        if isinstance(m, (nn.MultiheadAttention, BayesianMultiheadAttention)):
            sites += _mha_sites(path, m, offset)
        else:
            sites += _linear_sites(model, path, m, offset)
    if not sites:
        raise ValueError(
            f"model ({type(model).__name__}) has no attention layers to put rank-1 factors on: "
            "expected torch.nn.MultiheadAttention, bayesattn's BayesianMultiheadAttention, or "
            "Hugging Face attention with query/key/value (q_proj/k_proj/v_proj) nn.Linear children"
        )
    return sites


def _scale(x: Tensor, f: Tensor, bdim: int) -> Tensor:
    """``x`` ``(…, J·B, …, n)`` (batch at ``bdim``) times ``f`` ``(J, n)``, draw ``j`` on its rows."""
    J = f.shape[0]
    if x.dim() < bdim + 2 or x.shape[bdim] % J or x.shape[-1] != f.shape[-1]:
        raise ValueError(
            f"a hooked projection saw a tensor {tuple(x.shape)}: expected the batch (dim {bdim}) "
            f"to be a multiple of the {J} factor draws and a last dim of {f.shape[-1]}"
        )
    shape = x.shape[:bdim] + (J, x.shape[bdim] // J) + x.shape[bdim + 1 :]
    fv = f.reshape((1,) * bdim + (J,) + (1,) * (x.dim() - bdim - 1) + (f.shape[-1],))
    return (x.reshape(shape) * fv.to(x.dtype)).reshape(x.shape)


def _out_scale(y: Tensor, s: Tensor, bias: Tensor | None, bdim: int) -> Tensor:
    """:math:`y + (s - 1)\\circ(y - b)`: the output side of a rank-1 factor, exact at ``s = 1``."""
    centred = y if bias is None else y - bias
    return y + _scale(centred, s - 1, bdim)


def _mha_hooks(m: Any, f: dict[str, Tensor]) -> list[Any]:
    bdim = 0 if m.batch_first else 1
    names = ("query", "key", "value")

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        new, kw = list(args), dict(kwargs)
        for i, (role, n) in enumerate(zip("qkv", names, strict=True)):
            if i < len(new):
                new[i] = _scale(new[i], f[role], bdim)
            elif n in kw:
                kw[n] = _scale(kw[n], f[role], bdim)
        return tuple(new), kw

    def post(module: nn.Module, args: Any, out: Any) -> Any:
        y = _out_scale(out[0], f["o"], m.out_proj.bias, bdim)
        return (y, *out[1:])

    return [
        m.register_forward_pre_hook(pre, with_kwargs=True),
        m.register_forward_hook(post),
    ]


def _linear_hooks(lin: Any, r: Tensor, s: Tensor) -> list[Any]:
    def pre(module: nn.Module, args: tuple[Any, ...]) -> Any:
        return (_scale(args[0], r, 0), *args[1:])

    def post(module: nn.Module, args: Any, y: Tensor) -> Tensor:
        return _out_scale(y, s, lin.bias, 0)

    return [lin.register_forward_pre_hook(pre), lin.register_forward_hook(post)]


@contextmanager
def apply_factors(sites: list[Rank1Site], theta: Tensor) -> Iterator[None]:
    """Within the block, every forward of the sites' modules applies draw ``j`` of ``theta``
    ``(J, D)`` to rows ``j·B … (j+1)·B − 1`` of its batch; the hooks are removed on exit, on
    an error too."""
    D = sites[-1].offset + sites[-1].size if sites else 0
    if not isinstance(theta, Tensor) or theta.dim() != 2 or theta.shape[-1] != D:
        got = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
        raise ValueError(f"theta must be (J, {D}) factor draws; got {got}")
    groups: dict[int, tuple[nn.Module, str, dict[str, Tensor]]] = {}
    for st in sites:
        key = st.role if st.hooked == "mha" else st.side
        groups.setdefault(id(st.module), (st.module, st.hooked, {}))[2][key] = theta[
            :, st.offset : st.offset + st.size
        ]
    handles: list[Any] = []
    try:
        for module, hooked, f in groups.values():
            if hooked == "mha":
                handles += _mha_hooks(module, f)
            else:
                handles += _linear_hooks(module, f["in"], f["out"])
        yield
    finally:
        for h in handles:
            h.remove()


def hook_count(model: nn.Module) -> int:
    """Forward (pre-)hooks on all modules of ``model`` (to check that none are left behind)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
