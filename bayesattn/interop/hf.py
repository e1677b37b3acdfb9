r"""Bayesian attention in Hugging Face ``transformers`` models (optional extra ``bayesattn[hf]``).

:func:`convert_hf` registers the attention function :func:`bayesian_attention_forward` under the
name ``"bayesattn"`` in transformers' ``AttentionInterface`` (with transformers' eager additive
mask in ``AttentionMaskInterface``), switches the model to it, and gives every attention module
that dispatches through the interface its own family (``module.bayesattn_family``,
a registered submodule: its parameters live in ``model.parameters()`` and ``state_dict``) and its
own Pyro site ``"<module path>.latent"``. Nothing in transformers is patched: models that use the
interface (BERT, ViT, GPT-2, Llama and most current architectures) work unchanged.

Per attention module and query :math:`i`, with transformers' own scores
:math:`\ell_{ij} = s\,q_i\cdot k_j` (its scaling :math:`s`) and additive mask :math:`m_{ij}`:

* ``"mean"`` mode (the default in eval mode, as in torch: see :func:`~bayesattn.nn.modes.default_mode`):
  :math:`w_i = \operatorname{softmax}(\ell_i + m_i)`, exactly transformers' eager attention (the
  model's own output);
* ``"guide"`` (the default in training mode and under ``bayesattn.num_samples``)/``"model"``/``"elbo"`` modes: :math:`w_i` drawn from the module's family
  :math:`q(w_i\mid\ell_i, \log\pi_i)` (or its prior), masked keys (``m_{ij}`` at the dtype's
  minimum) getting zero weight, exactly as in :class:`~bayesattn.nn.attention.BayesianMultiheadAttention`.

Grouped-query attention (Llama) repeats key/value heads like transformers' ``repeat_kv``.
Extra arguments of the interface are honoured as the model's own eager attention does: T5's
relative ``position_bias`` is added to the scores, Gemma-2's ``softcap`` caps them
(:math:`c\tanh(\ell/c)`), ``sliding_window`` is carried by the mask; arguments only the fused
kernels read (``is_causal``, ``position_ids``, ``cu_seq_lens_*``, …) are ignored as eager does.
Any other non-``None`` argument is refused with an error naming the model type. A query row whose
keys are all masked (an all-zero ``attention_mask``) is uniform over all keys in the mean, and
its draws are centred on that uniform mean too. A model holding a transformers model
(``self.bert = BertModel(cfg)``) converts and unconverts through the models it holds.
``with bayesattn.num_samples(S): model(**inputs)`` gives ``S`` draws on a converted transformers
model too: its inputs are repeated ``S`` times along the batch (batched repetition: transformers
reshapes attention outputs to the input's shape, so no sample dim can pass through it) and every
output tensor comes back as ``(S, B, ...)``. A model that only *holds* a transformers model
refuses ``num_samples`` (its own code would see the sample dim); use :func:`bayesattn.uncertainty.predict`.
``transformers`` is imported only when these functions run.

Example:
    >>> from transformers import BertConfig, BertModel
    >>> cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    ...                  intermediate_size=64, vocab_size=50, attn_implementation="eager")
    >>> model = convert_hf(BertModel(cfg).eval(), family="dirichlet")
    >>> len(hf_attention_modules(model))
    2
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from .._deprecation import renamed_submodule_hook
from ..families import AttentionFamily, FamilyName, check_family, get_family
from ..nn.config import AttentionConfig
from ..nn.modes import AttentionMode, default_mode
from ..nn.read import FOREIGN_FAMILY_ATTR, AttentionRead
from ..nn.sampling import context_num_samples, current_num_samples, num_samples
from .recipe import UNSET, candidates, hf_recipe, roles

__all__ = [
    "ATTN_NAME",
    "register",
    "bayesian_attention_forward",
    "convert_hf",
    "unconvert_hf",
    "hf_attention_modules",
]

ATTN_NAME = "bayesattn"
_FAMILY_ATTR = FOREIGN_FAMILY_ATTR
#: state_dicts saved before 0.3 hold each module's family under ``bayesattn_posterior.*``
_OLD_FAMILY_KEYS = renamed_submodule_hook("bayesattn_posterior", _FAMILY_ATTR)
_HOOK_ATTR = "_bayesattn_old_keys_hook"
_SITE_ATTR = "_bayesattn_site"
_PREV_ATTR = "_bayesattn_previous_attn_implementation"


def register() -> None:
    """Register ``"bayesattn"`` in transformers' attention and attention-mask interfaces."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "bayesattn.interop.hf needs transformers: pip install 'bayesattn[hf]'"
        ) from e
    AttentionInterface.register(ATTN_NAME, bayesian_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, eager_mask)


class _Registration:
    """Held by a converted transformers model (``model._bayesattn_registration``): unpickling it
    registers ``"bayesattn"`` in transformers' interfaces, so a ``torch.save``d converted model
    runs in a fresh process without importing this module first."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _registered, ()


def _registered() -> _Registration:
    """Register the attention implementation (called when a converted model is unpickled)."""
    register()
    return _Registration()


_REGISTRATION_ATTR = "_bayesattn_registration"


def _check_heads(path: str, fam: AttentionFamily, heads: int) -> None:
    """A family built for ``fam.num_heads`` heads fits a module of ``heads`` heads (or is shared,
    one head)."""
    if fam.num_heads not in (1, heads):
        raise ValueError(
            f"family {type(fam).__name__} has {fam.num_heads} heads but the attention module "
            f"{path!r} has {heads}; build it with num_heads={heads} (or pass the family's name)"
        )


def _mode(fam: AttentionFamily | None, training: bool) -> AttentionMode:
    """``"mean"`` without a family; else the context's mode or torch's train/eval
    (:func:`~bayesattn.nn.modes.default_mode`: drawn in training mode or under
    ``bayesattn.num_samples``, the model's own softmax in eval mode)."""
    if fam is None:
        return "mean"
    return default_mode(training)


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, Hkv, T, D)`` → ``(B, Hkv*n_rep, T, D)``, each kv head repeated ``n_rep`` times."""
    if n_rep == 1:
        return x
    B, Hkv, T, D = x.shape
    return x[:, :, None].expand(B, Hkv, n_rep, T, D).reshape(B, Hkv * n_rep, T, D)


def _as_log_prior(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """transformers' mask (bool, True = attend; or additive float with the dtype's minimum for
    masked keys) → log-prior with ``-inf`` on masked keys."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    mask = mask.to(dtype)
    return mask.masked_fill(mask <= torch.finfo(dtype).min / 2, float("-inf"))


#: interface arguments that only the fused kernels read: eager attention ignores them (the mask
#: already carries causality and sliding windows), so do we
_IGNORED_KWARGS = frozenset({
    "sliding_window", "is_causal", "position_ids", "cache_position", "cu_seq_lens_q",
    "cu_seq_lens_k", "max_length_q", "max_length_k", "output_attentions", "output_hidden_states",
    "return_dict", "use_cache",
    "layer_idx", "head_mask", "query_length", "target_dtype", "implementation",
})  # fmt: skip


def _refuse_unknown(module: nn.Module, kwargs: dict[str, Any]) -> None:
    unknown = sorted(k for k, v in kwargs.items() if v is not None and k not in _IGNORED_KWARGS)
    if unknown:
        cfg = getattr(module, "config", None)
        model_type = getattr(cfg, "model_type", None) or "?"
        raise TypeError(  # as Python does for an unexpected keyword argument
            f"bayesattn attention does not implement the argument(s) {unknown} that "
            f"{type(module).__name__} (model type {model_type!r}) passes to its attention "
            "function; its output would be wrong, so it is refused: unconvert_hf(model) "
            "restores the model's own attention"
        )


def _scores(logits: Tensor, position_bias: Tensor | None, softcap: float | None) -> Tensor:
    """The model's own pre-mask scores: ``softcap·tanh(ℓ/softcap)`` (Gemma-2) and ``+ bias``
    (T5's relative position bias), in eager attention's order."""
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if position_bias is not None:
        logits = logits + position_bias
    return logits


def bayesian_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_bias: Tensor | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """transformers attention-interface function.

    Shape:
        query ``(B, H, Tq, D)``, key/value ``(B, Hkv, Tk, D)``, attention_mask and
        position_bias broadcastable to ``(B, H, Tq, Tk)``; returns output ``(B, Tq, H, D)`` and
        weights ``(B, H, Tq, Tk)``.
    """
    _refuse_unknown(module, kwargs)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    n_rep = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)  # (B, H, Tk, D)
    logits = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, Tq, Tk)
    logits = _scores(logits, position_bias, softcap)
    fam = getattr(module, _FAMILY_ATTR, None)
    mode = _mode(fam, module.training)
    lp = None
    if mode != "mean":
        S = context_num_samples()
        if S is not None:
            raise ValueError(
                f"bayesattn.num_samples({S}) cannot reach {type(module).__name__} from here: "
                "transformers models reshape the attention output to the input's shape, so a "
                "leading sample dim cannot pass; call the converted transformers model itself "
                f"(it repeats its inputs), or draw {S} samples with bayesattn.uncertainty.predict(model, x, "
                f"num_samples={S}) (batched repetition)"
            )
        lp = _as_log_prior(attention_mask, logits.dtype)
        logits, lp = _dead_rows_uniform(logits, lp)
    site = getattr(module, _SITE_ATTR, "latent")
    read = AttentionRead(
        fam, mode, site, site.rsplit(".", 1)[0] + ".weights",
        dropout_p=dropout if module.training else 0.0,
    )  # fmt: skip

    def eager(scores: Tensor) -> Tensor:  # transformers' eager attention, operation for operation
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
            else:
                scores = scores + attention_mask
        return nn.functional.softmax(scores, dim=-1).type(value.dtype)

    out, w = read.from_logits(logits, lp, query, key, value, eager)  # (B, H, Tq, D)
    return out.transpose(1, 2).contiguous(), w  # (B, Tq, H, D)


def _dead_rows_uniform(logits: Tensor, log_prior: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """A query row with every key masked: transformers' mean is uniform over all keys (the
    dtype's minimum swamps the scores), so its draws are centred on uniform too (zero scores,
    no mask) — the same rule as the mean."""
    if log_prior is None:
        return logits, None
    lp = log_prior.expand_as(logits)  # (B, H, Tq, Tk)
    dead = ~(lp > float("-inf")).any(-1, keepdim=True)  # (B, H, Tq, 1)
    return logits.masked_fill(dead, 0.0), lp.masked_fill(dead, 0.0)


_SAMPLES_ATTR = "_bayesattn_sample_stack"
_SAMPLE_HOOKS_ATTR = "_bayesattn_sample_hooks"


def _samples_pre_hook(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """Under ``num_samples(S)``: every input tensor with the batch along dim 0 repeated ``S``
    times, sample-major (row ``s·B + b`` is example ``b``); the sample count is cleared for the
    layers inside (each row draws its own weights) and restored by :func:`_samples_post_hook`."""
    S = current_num_samples()
    if S is None or torch.compiler.is_compiling():
        return None
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, Tensor) and v.dim() > 0]
    if not tensors:
        return None
    if kwargs.get("past_key_values") is not None or kwargs.get("cache") is not None:
        raise ValueError(
            f"bayesattn.num_samples({S}) with a cache: repeat the inputs yourself or use "
            "bayesattn.uncertainty.predict (the cache is not repeated)"
        )
    B = int(tensors[0].shape[0])

    def rep(v: Any) -> Any:
        if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == B:
            return v.repeat((S,) + (1,) * (v.dim() - 1))  # (S*B, ...)
        return v

    inner = num_samples(None)  # left by _samples_post_hook
    inner.__enter__()
    stack = module.__dict__.setdefault(_SAMPLES_ATTR, [])
    stack.append((S, B, inner))
    return tuple(rep(a) for a in args), {k: rep(v) for k, v in kwargs.items()}


def _split(v: Any, S: int, B: int) -> Any:
    if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == S * B:
        return v.reshape((S, B) + v.shape[1:])  # (S, B, ...)
    if isinstance(v, tuple) and not hasattr(v, "keys"):
        return type(v)(_split(t, S, B) for t in v) if type(v) is tuple else v
    return v


def _samples_post_hook(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
) -> Any:
    """The outputs of a :func:`_samples_pre_hook` pass as ``(S, B, ...)``."""
    stack = module.__dict__.get(_SAMPLES_ATTR)
    if not stack:
        return None
    S, B, inner = stack.pop()
    inner.__exit__(None, None, None)
    if hasattr(output, "keys"):  # a transformers ModelOutput
        for k in list(output.keys()):
            output[k] = _split(output[k], S, B)
        return output
    return _split(output, S, B)


_DISPATCHES: dict[type, bool] = {}


def _dispatches_through_interface(m: nn.Module) -> bool:
    """True for modules whose ``forward`` calls transformers' attention interface."""
    cls = type(m)
    if cls not in _DISPATCHES:
        try:
            src = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            src = ""
        _DISPATCHES[cls] = "ALL_ATTENTION_FUNCTIONS" in src and hasattr(m, "config")
    return _DISPATCHES[cls]


def hf_attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{module path: module}`` for every attention module that dispatches through the
    interface (converted or not)."""
    return {n: m for n, m in model.named_modules() if _dispatches_through_interface(m)}


def _heads(m: nn.Module) -> tuple[int, int]:
    cfg: Any = m.config  # a transformers PretrainedConfig
    H = getattr(m, "num_heads", None) or getattr(m, "num_attention_heads", None)
    H = H or cfg.num_attention_heads
    D = getattr(m, "head_dim", None) or getattr(m, "attention_head_size", None)
    D = D or cfg.hidden_size // H
    return int(H), int(D)


def convert_hf(
    model: nn.Module,
    family: FamilyName | AttentionFamily | None = UNSET,
    layers: str | list[int] | list[str] = UNSET,
    *,
    config: AttentionConfig | None = None,
    **family_kwargs: Any,
) -> nn.Module:
    """Make the attention of a transformers ``PreTrainedModel`` Bayesian, in place.

    Args:
        model: a transformers model whose attention modules use ``AttentionInterface``.
        family: family name or an :class:`~bayesattn.families.AttentionFamily` (deep-copied
            per module); ``None`` installs the deterministic function only. State_dicts saved
            before 0.3 (families under ``bayesattn_posterior.*``) load.
        layers: ``"all"``, ``"last"`` or module paths / indices into :func:`hf_attention_modules`.
        config: an :class:`~bayesattn.nn.config.AttentionConfig` as the recipe (uniform prior
            only; :mod:`bayesattn.interop.recipe`), e.g. ``AttentionConfig.last_layer()``.
        family_kwargs: passed to :func:`~bayesattn.families.get_family`.

    Without ``config``: ``family="dirichlet"``, ``layers="all"`` by default.

    Returns:
        ``model``; its mean-mode output equals its own eager-attention output.
    """
    from .convert import select_layers

    family, layers, family_kwargs = hf_recipe(config, family, layers, family_kwargs)
    register()
    mods = hf_attention_modules(model)
    if not mods:
        raise ValueError(
            f"{type(model).__name__} has no attention module that dispatches through "
            "transformers' AttentionInterface"
        )
    roots = _hf_roots(model)  # checked before anything changes
    chosen = select_layers(layers, candidates(model, list(mods), roles(config)), model)
    if family is not None and not isinstance(family, (str, AttentionFamily)):
        raise TypeError(f"family must be a name, an AttentionFamily or None; got {family!r}")
    if isinstance(family, AttentionFamily):
        check_family(family)
    # build every family first; change the model only when all were built, and undo every
    # change if switching an implementation fails: a call that raises leaves the model as it was
    fams = _build_families(mods, chosen, family, family_kwargs)
    saved = [(mods[path], _attrs(mods[path])) for path in fams]
    had_hooks = hasattr(model, _SAMPLE_HOOKS_ATTR)
    root_state = [
        (r, getattr(r.config, "_attn_implementation", None), r.__dict__.get(_PREV_ATTR, _MISSING),
         had_hooks)
        for r in roots
    ]  # fmt: skip
    try:
        for path, fam in fams.items():
            m = mods[path]
            setattr(m, _FAMILY_ATTR, fam)
            if not hasattr(m, _HOOK_ATTR):
                setattr(m, _HOOK_ATTR, m.register_load_state_dict_pre_hook(_OLD_FAMILY_KEYS))
            setattr(m, _SITE_ATTR, f"{path}.latent")
        for root in roots:
            prev = getattr(root.config, "_attn_implementation", None)
            if prev != ATTN_NAME:
                setattr(root, _PREV_ATTR, prev)
            root.set_attn_implementation(ATTN_NAME)
            root.__dict__[_REGISTRATION_ATTR] = _Registration()
        if roots == [model] and not hasattr(model, _SAMPLE_HOOKS_ATTR):  # num_samples(S) draws
            hooks: list[Any] = []  # filled one by one: a failure in between removes them
            setattr(model, _SAMPLE_HOOKS_ATTR, hooks)
            hooks.append(model.register_forward_pre_hook(_samples_pre_hook, with_kwargs=True))
            hooks.append(model.register_forward_hook(_samples_post_hook, with_kwargs=True))
    except BaseException:
        _restore(saved, root_state, model)
        raise
    return model


def _build_families(
    mods: dict[str, nn.Module],
    chosen: set[str],
    family: FamilyName | AttentionFamily | None,
    family_kwargs: dict[str, Any],
) -> dict[str, AttentionFamily]:
    """``{path: family}`` for each chosen module, on its device (nothing is attached yet): a
    name built for the module's heads, an instance checked against them and deep-copied."""
    fams: dict[str, AttentionFamily] = {}
    for path, m in mods.items():
        if path not in chosen or family is None:
            continue
        H, D = _heads(m)
        if isinstance(family, AttentionFamily):
            _check_heads(path, family, H)
            fam = copy.deepcopy(family)
        else:
            fam = get_family(family, num_heads=H, head_dim=D, **family_kwargs)
        ref = next(m.parameters())
        fams[path] = fam.to(device=ref.device)
    return fams


_MISSING = object()


def _attrs(m: nn.Module) -> dict[str, Any]:
    """``m``'s conversion attributes (family, state-dict hook, site name) as they are now."""
    fam = m._modules.get(_FAMILY_ATTR, _MISSING)
    return {
        _FAMILY_ATTR: fam,
        _HOOK_ATTR: m.__dict__.get(_HOOK_ATTR, _MISSING),
        _SITE_ATTR: m.__dict__.get(_SITE_ATTR, _MISSING),
    }


def _restore(
    saved: list[tuple[nn.Module, dict[str, Any]]],
    roots: list[tuple[Any, Any, Any, Any]],
    model: nn.Module,
) -> None:
    """Undo a failed :func:`convert_hf`: every module's attributes, every root's attention
    implementation and registration, and the model's sample hooks as they were before it."""
    if hasattr(model, _SAMPLE_HOOKS_ATTR) and not roots[0][3]:  # hooks added by this call
        for h in getattr(model, _SAMPLE_HOOKS_ATTR):
            h.remove()
        delattr(model, _SAMPLE_HOOKS_ATTR)
    for m, before in saved:
        now_hook = m.__dict__.get(_HOOK_ATTR, _MISSING)
        if now_hook is not _MISSING and now_hook is not before[_HOOK_ATTR]:
            now_hook.remove()
        for attr, value in before.items():
            if attr == _FAMILY_ATTR:
                if value is _MISSING:
                    m._modules.pop(_FAMILY_ATTR, None)
                else:
                    m._modules[_FAMILY_ATTR] = value
            elif value is _MISSING:
                m.__dict__.pop(attr, None)
            else:
                m.__dict__[attr] = value
    for root, impl, prev, _ in roots:
        root.__dict__.pop(_REGISTRATION_ATTR, None)
        if impl == ATTN_NAME:  # it was converted before this call
            root.__dict__[_REGISTRATION_ATTR] = _Registration()
        if getattr(root.config, "_attn_implementation", None) != impl and impl is not None:
            try:
                root.set_attn_implementation(impl)
            except Exception:  # noqa: BLE001 - best effort; the config is set back below
                root.config._attn_implementation = impl
        if prev is _MISSING:
            root.__dict__.pop(_PREV_ATTR, None)
        else:
            root.__dict__[_PREV_ATTR] = prev


def _hf_roots(model: nn.Module) -> list[Any]:
    """The transformers models whose attention implementation to switch: ``model`` itself, or
    the outermost transformers models it holds (``self.bert = BertModel(cfg)``)."""
    if hasattr(model, "set_attn_implementation") and hasattr(model, "config"):
        return [model]
    roots: list[Any] = []
    inside: list[str] = []
    for name, m in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        if hasattr(m, "set_attn_implementation") and hasattr(m, "config"):
            roots.append(m)
            inside.append(name)
    if not roots:
        raise TypeError(
            f"{type(model).__name__} is not a transformers PreTrainedModel and holds none; "
            "its attention modules cannot be switched (nothing was changed)"
        )
    return roots


def unconvert_hf(model: nn.Module) -> nn.Module:
    """Remove the families and restore the model's previous attention implementation. A model
    that was never converted is returned unchanged."""
    for m in hf_attention_modules(model).values():
        if hasattr(m, _FAMILY_ATTR):
            delattr(m, _FAMILY_ATTR)
        if hasattr(m, _HOOK_ATTR):
            getattr(m, _HOOK_ATTR).remove()
            delattr(m, _HOOK_ATTR)
        if hasattr(m, _SITE_ATTR):
            delattr(m, _SITE_ATTR)
    for h in getattr(model, _SAMPLE_HOOKS_ATTR, ()):
        h.remove()
    if hasattr(model, _SAMPLE_HOOKS_ATTR):
        delattr(model, _SAMPLE_HOOKS_ATTR)
    try:
        roots = _hf_roots(model)
    except TypeError:
        return model
    for root in roots:
        converted = getattr(root.config, "_attn_implementation", None) == ATTN_NAME
        if not converted and not hasattr(root, _PREV_ATTR):
            continue  # never converted: nothing to restore
        prev = getattr(root, _PREV_ATTR, None) or "eager"
        root.set_attn_implementation(prev)
        if hasattr(root, _PREV_ATTR):
            delattr(root, _PREV_ATTR)
        root.__dict__.pop(_REGISTRATION_ATTR, None)
    return model
