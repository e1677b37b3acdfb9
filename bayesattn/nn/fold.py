r"""The folded posterior predictive of a converted model: ``S`` samples from the first Bayesian
layer on, everything before it computed once.

Batched repetition (every example ``S`` times in the batch) runs the whole model on ``S·B`` rows.
The layers before the first Bayesian attention layer are deterministic in eval mode, so their
``S`` copies are equal: :func:`folded` computes them once on the ``B`` rows and starts the
sample dimension at the *fold layer*, the layer (an element of an ``nn.ModuleList``) that holds
the first Bayesian attention module:

* a torch ``nn.TransformerEncoderLayer`` (:func:`bayesattn.convert`; not fed a nested tensor:
  an encoder built with ``enable_nested_tensor=True`` packs a padded batch, and then the whole
  model is repeated): its attention draws ``S``
  weight samples in one pass (its projections and scores computed once, the draws a leading
  sample dim), the rest of the layer broadcasts over it, and its output leaves as ``S·B`` rows
  (sample-major: row ``s·B + b`` is example ``b``);
* a Hugging Face layer (:func:`bayesattn.interop.hf.convert_hf`): its inputs are repeated ``S``
  times along the batch (transformers reshapes attention outputs to the input's shape, so no
  sample dim can pass inside a layer).

Every later layer of the same list gets its batch-sized inputs (padding and attention masks)
repeated ``S`` times too; the rest of the model sees an ordinary batch of ``S·B`` rows. Each row
then draws its own weights exactly as in batched repetition, in the same order, so with the same
seed the folded samples equal the repeated ones (up to floating-point rounding of the prefix).

A model the fold cannot follow (a Bayesian layer that runs before the fold layer, a forward that
fails or returns other than ``S·B`` rows) raises :class:`FoldError`; the caller then draws by
batched repetition of the whole model. :func:`repeated_rows` is that whole path, the one way a
foreign model's ``S`` samples are drawn: by :class:`~bayesattn.nn.networks.ModuleClassifier`
(training, ``predict`` on the wrapped model) and by :func:`bayesattn.predictive.foreign.sample_foreign`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from .attention import BayesianMultiheadAttention
from .read import FOREIGN_FAMILY_ATTR
from .sampling import num_samples as num_samples_ctx

__all__ = [
    "FoldError",
    "FoldPlan",
    "Inputs",
    "fold_plan",
    "folded",
    "input_batch_size",
    "repeated_rows",
    "take_rows",
]

Inputs = Tensor | Mapping[str, Tensor]  # a model's inputs: a tensor or a dict (transformers)

#: keyword inputs of a transformers layer that are not per example (never repeated)
_NOT_PER_EXAMPLE = frozenset({"cache_position"})


class FoldError(RuntimeError):
    """The model cannot be folded at its first Bayesian layer (the caller falls back)."""


@dataclass
class FoldPlan:
    """Where a model's sample dimension starts.

    ``library``: whose layer is folded, ``"torch"`` (an ``nn.TransformerEncoderLayer``) or
    ``"hf"`` (a transformers layer); ``layers``: the fold layer and the later layers of its list;
    ``bayesian``: every Bayesian attention module (none may run before the fold layer)."""

    library: Literal["torch", "hf"]
    layers: list[nn.Module]
    bayesian: list[nn.Module]

    @property
    def kind(self) -> str:
        """Deprecated spelling of :attr:`library`; removed in the next release."""
        warnings.warn(
            "FoldPlan.kind is deprecated: use FoldPlan.library", DeprecationWarning, stacklevel=2
        )
        return self.library


def _bayesian(m: nn.Module) -> bool:
    """A module that draws attention weights (a converted torch layer, a transformers module)."""
    if isinstance(m, BayesianMultiheadAttention):
        return m.family is not None or m.gp_read is not None
    return getattr(m, FOREIGN_FAMILY_ATTR, None) is not None


def fold_plan(model: nn.Module) -> FoldPlan | None:
    """The fold of ``model`` (see the module docstring), or ``None`` where there is none: no
    Bayesian layer, a GP read (its global draw is per sample, not per row), or a first Bayesian
    layer that is neither the self-attention of an ``nn.TransformerEncoderLayer`` nor inside an
    element of an ``nn.ModuleList``."""
    named = dict(model.named_modules())
    bayes = [(n, m) for n, m in named.items() if _bayesian(m)]
    if not bayes or any(getattr(m, "gp_read", None) is not None for _, m in bayes):
        return None
    first, mod = bayes[0]
    library: Literal["torch", "hf"]
    if isinstance(mod, BayesianMultiheadAttention):
        parent = first.rpartition(".")[0]
        layer = named.get(parent) if parent else None
        if not isinstance(layer, nn.TransformerEncoderLayer) or first.rpartition(".")[2] != (
            "self_attn"
        ):
            return None
        library, path = "torch", parent
    else:
        library, path = "hf", _list_element(first, named)
        if path is None:
            return None
    head, _, idx = path.rpartition(".")
    siblings = named.get(head) if head else None
    layers = [named[path]]
    if isinstance(siblings, nn.ModuleList) and idx.isdigit():
        layers = list(siblings)[int(idx) :]
    return FoldPlan(library, layers, [m for _, m in bayes])


def _list_element(path: str, named: dict[str, nn.Module]) -> str | None:
    """The nearest ancestor of ``path`` that is an element of an ``nn.ModuleList``."""
    parts = path.split(".")
    for k in range(len(parts) - 1, 0, -1):
        if parts[k].isdigit() and isinstance(named.get(".".join(parts[:k])), nn.ModuleList):
            return ".".join(parts[: k + 1])
    return None


def _repeat(v: Any, S: int, B: int, heads: int | None = None) -> Any:
    """``v`` with its per-example rows repeated ``S`` times, sample-major (tuples and lists
    element-wise): a tensor whose dim 0 is ``B`` (``B·heads`` with ``heads``)."""
    rows = B if heads is None else B * heads
    if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == rows:
        return v.repeat((S,) + (1,) * (v.dim() - 1))  # (S*rows, ...)
    if type(v) in (tuple, list):
        return type(v)(_repeat(t, S, B, heads) for t in v)
    return v


def _flatten_samples(out: Tensor, S: int, batch_first: bool) -> Tensor:
    """A fold layer's output ``(S, B, T, E)`` → ``(S·B, T, E)`` (``(S, T, B, E)`` →
    ``(T, S·B, E)`` for a sequence-first layer)."""
    if out.dim() != 4 or out.shape[0] != S:
        raise FoldError(f"the fold layer returned {tuple(out.shape)}, not a leading sample dim {S}")
    if batch_first:
        return out.reshape((-1,) + out.shape[2:])  # (S*B, T, E)
    T, E = out.shape[1], out.shape[3]
    return out.permute(1, 0, 2, 3).reshape(T, -1, E)  # (T, S*B, E)


@contextlib.contextmanager
def folded(plan: FoldPlan, S: int, B: int) -> Iterator[None]:
    """While open, a forward of the planned model on ``B`` examples returns ``S·B`` rows, the
    samples starting at the fold layer (see the module docstring); raises :class:`FoldError` when
    a Bayesian layer runs before it."""
    state: dict[str, Any] = {"started": False, "ctx": None}
    handles = []

    def check(m: nn.Module, args: Any) -> None:
        if not state["started"]:
            raise FoldError(f"the Bayesian layer {type(m).__name__} runs before the fold layer")

    def torch_first(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        state["started"] = True
        if getattr(args[0] if args else kwargs.get("src"), "is_nested", False):
            raise FoldError(
                "its encoder packs the padded batch as a nested tensor (torch's inference fast "
                "path); build the encoder with enable_nested_tensor=False for the cheap predictive"
            )
        state["ctx"] = num_samples_ctx(S)  # its attention draws S, a leading sample dim
        state["ctx"].__enter__()

    def torch_first_out(m: nn.Module, args: Any, kwargs: dict[str, Any], out: Any) -> Tensor:
        state["ctx"].__exit__(None, None, None)
        state["ctx"] = None
        return _flatten_samples(out, S, bool(cast(Any, m).self_attn.batch_first))

    def torch_later(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        kw = dict(zip(("src_mask", "src_key_padding_mask", "is_causal"), args[1:], strict=False))
        kw |= kwargs
        pad, mask = kw.get("src_key_padding_mask"), kw.get("src_mask")
        if isinstance(pad, Tensor):
            kw["src_key_padding_mask"] = _repeat(pad, S, B)  # (B, T) -> (S*B, T)
        if isinstance(mask, Tensor) and mask.dim() == 3:  # (B*H, T, T); (T, T) broadcasts
            kw["src_mask"] = _repeat(mask, S, B, int(cast(Any, m).self_attn.num_heads))
        return args[:1], kw

    def hf_layer(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        state["started"] = True
        kw = {k: v if k in _NOT_PER_EXAMPLE else _repeat(v, S, B) for k, v in kwargs.items()}
        return _repeat(args, S, B), kw

    try:
        for m in plan.bayesian:
            handles.append(m.register_forward_pre_hook(check))
        first, *later = plan.layers
        if plan.library == "torch":
            handles.append(first.register_forward_pre_hook(torch_first, with_kwargs=True))
            handles.append(first.register_forward_hook(torch_first_out, with_kwargs=True))
            for m in later:
                handles.append(m.register_forward_pre_hook(torch_later, with_kwargs=True))
        else:
            for m in plan.layers:
                handles.append(m.register_forward_pre_hook(hf_layer, with_kwargs=True))
        yield
    finally:
        if state["ctx"] is not None:  # the fold layer raised inside
            state["ctx"].__exit__(None, None, None)
        for h in handles:
            h.remove()


# ---------------------------------------------------------------------------------------------
# batched repetition, folded where the model allows
# ---------------------------------------------------------------------------------------------


def input_batch_size(x: Inputs) -> int:
    """Dim 0 of a tensor or of a dict of tensors (which must agree)."""
    if isinstance(x, Mapping):
        sizes = {k: int(v.shape[0]) for k, v in x.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"inputs must share their batch size (dim 0); got {sizes}")
        return next(iter(sizes.values()))
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a Tensor or a dict of Tensors; got {type(x).__name__}")
    return int(x.shape[0])


def take_rows(x: Inputs, idx: Tensor | slice) -> Inputs:
    """Rows ``idx`` of a tensor or of every tensor of a dict."""
    return {k: v[idx] for k, v in x.items()} if isinstance(x, Mapping) else x[idx]


def _repeat_rows(x: Inputs, S: int) -> Inputs:
    """Each example ``S`` times, sample-major: row ``s * B + b`` is example ``b``."""

    def rep(v: Tensor) -> Tensor:
        return v.repeat((S,) + (1,) * (v.dim() - 1))  # (S*B, ...)

    return {k: rep(v) for k, v in x.items()} if isinstance(x, Mapping) else rep(x)


#: ``run(x_rows, rows)``: the model's logits ``(rows, C)`` for inputs ``x_rows`` (checked: a
#: wrong output is a ``TypeError``/``ValueError``)
RowsForward = Callable[[Inputs, int], Tensor]


def repeated_rows(
    run: RowsForward,
    x: Inputs,
    num_samples: int,
    plan: FoldPlan | None,
    rows_per_pass: int | None = None,
    who: str = "predict",
    name: str = "the model",
) -> Tensor:
    r"""Logits ``(S, b, C)`` of ``S`` samples of the ``b`` examples of ``x`` by batched
    repetition (every example ``S`` times, sample-major), at most ``rows_per_pass`` rows (example
    × sample) per pass (``None``: one pass). With a ``plan`` and all ``S·b`` rows in one pass,
    folded at the first Bayesian layer (:func:`folded`): the same draws in the same order, the
    layers before it run once. A model the fold cannot follow is warned about (``who`` names the
    caller, ``name`` the model) and repeated whole, from the same random state, so the samples do not depend on
    whether the fold worked."""
    S, b = num_samples, input_batch_size(x)
    if plan is not None and (rows_per_pass is None or S * b <= rows_per_pass):
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        state = (torch.random.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None)
        try:
            with folded(plan, S, b):
                out = run(x, S * b)  # (S*b, C)
            return out.reshape((S, b) + out.shape[1:])  # (S, b, C)
        except (FoldError, RuntimeError, IndexError, ValueError, TypeError) as e:
            reason = f"{type(e).__name__}: {e}"
        torch.random.set_rng_state(state[0])  # the fallback draws what it would have drawn
        if state[1] is not None:
            torch.cuda.set_rng_state_all(state[1])
        warnings.warn(
            f"{who}: could not start the samples at the first Bayesian layer of {name} "
            f"({reason}); drawing them by batched repetition of the whole model (S times the "
            "cost of one pass)",
            UserWarning,
            stacklevel=4,
        )
    rows = _repeat_rows(x, S) if S > 1 else x  # (S*b, ...)
    step = rows_per_pass or S * b
    outs = [run(take_rows(rows, slice(j, j + step)), min(step, S * b - j))
            for j in range(0, S * b, step)]  # fmt: skip
    out = torch.cat(outs)  # (S*b, C)
    return out.reshape((S, b) + out.shape[1:])  # (S, b, C)
