r"""Which attention layers of a network are Bayesian, and how: :class:`AttentionConfig`.

A network's stacks (:class:`~bayesattn.nn.blocks.Encoder`, :class:`~bayesattn.nn.blocks.Decoder`)
build every attention layer through the config (:meth:`AttentionConfig.build`); names of families,
priors and supports resolve through the registries (:mod:`bayesattn.registry`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any, Literal, get_args

from torch import nn

from .. import priors as P
from .._validation import check_int
from ..families import FamilyName, get_family
from .attention import BayesianMultiheadAttention
from .gp_read import SparseGP
from .supports import SupportName, get_support

__all__ = ["AttentionConfig", "as_attention_config"]

#: A built-in key-relevance prior by name (:data:`bayesattn.priors.PRIORS` may hold more).
PriorName = Literal["uniform", "causal", "local", "alibi", "learned", "contextual"]
#: Which attention layers of a stack get the posterior (or a list of layer indices).
LayerSelection = Literal["all", "last"]
#: The attention of a decoder layer: its self-attention or its cross-attention.
AttentionRole = Literal["self", "cross"]
#: How a selected layer reads its values: softmax attention alone, or plus a sparse-GP read.
ReadName = Literal["softmax", "sparse_gp"]
#: options of :class:`~bayesattn.nn.gp_read.SparseGP` that ``read_kwargs`` takes
_GP_KWARGS = (
    "num_inducing",
    "covariance",
    "lengthscale",
    "outputscale",
    "learn_lengthscale",
    "learn_outputscale",
    "init_scale",
    "init_mean",
    "init_from_data",
    "jitter",
)


@dataclass
class AttentionConfig:
    """Which attention layers are Bayesian and how.

    Args:
        family: a registered family name (``"dirichlet"``, ``"logistic_normal"``, ``"weibull"``,
            ``"concrete"`` or one added with :func:`~bayesattn.families.register_family`) or
            ``None`` for deterministic attention everywhere.
        prior: a registered prior name (``"uniform"``, ``"causal"``, ``"local"`` (``window`` in
            ``prior_kwargs``), ``"alibi"``, ``"learned"`` (``max_distance``), ``"contextual"`` or
            one added with :func:`~bayesattn.priors.register_prior`), or a callable
            ``(num_heads, head_dim) -> KeyRelevancePrior``.
        layers: ``"all"``, ``"last"`` or a list of layer indices that get the family.
        which: attentions that get it in decoder layers: ``("self", "cross")`` or a subset.
        support: ``None`` (dense) or a registered reduced key support for every *self*-attention
            layer: ``"local"`` (``window``), ``"topk"`` (``k``), ``"lowrank"`` (``rank``,
            ``max_len``), … or one added with :func:`~bayesattn.nn.supports.register_support`,
            options in ``support_kwargs``; see :mod:`bayesattn.nn.supports`.
        read: ``"softmax"`` or ``"sparse_gp"``: the selected layers (``layers``/``which``) add a
            sparse-GP read per head with global inducing keys
            (:class:`~bayesattn.nn.gp_read.SparseGP`; options such as ``num_inducing`` in
            ``read_kwargs``), with or without a ``family``.
        readout, readout_kwargs: deprecated (a ``DeprecationWarning``; removed in the next
            release): a classifier's logits are always a linear layer of its pooled (CLS)
            features, the one value ``readout`` had (``"linear"``, no options). The GP read-outs
            and the epinet head were tried and dropped (their numbers are in
            docs/which-attention.md): use ``read="sparse_gp"`` or, for a trained network, a
            post-hoc GP read.

    Names resolve through the registries (:mod:`bayesattn.registry`) when the config is made, so
    user-registered families, priors and supports work in every network built from it.
    """

    family: FamilyName | str | None = None
    prior: PriorName | str | Callable[[int, int], P.KeyRelevancePrior] = "uniform"
    layers: LayerSelection | Sequence[int] = "all"
    which: AttentionRole | Sequence[AttentionRole] = ("self", "cross")
    family_kwargs: dict = field(default_factory=dict)
    prior_kwargs: dict = field(default_factory=dict)
    support: SupportName | str | None = None
    support_kwargs: dict = field(default_factory=dict)
    read: ReadName = "softmax"
    read_kwargs: dict = field(default_factory=dict)
    readout: InitVar[str | None] = None
    readout_kwargs: InitVar[dict | None] = None

    def __post_init__(self, readout: str | None, readout_kwargs: dict | None) -> None:
        _check_readout(readout, readout_kwargs)
        get_support(self.support, **self.support_kwargs)  # validates the name and options
        self._check_gp_options()
        if self.family is not None and not isinstance(self.family, str):
            raise TypeError(f"family must be a family name or None; got {self.family!r}")
        if not isinstance(self.prior, str) and not callable(self.prior):
            raise TypeError(
                f"prior must be one of {P.list_priors()} or a callable; got {self.prior!r}"
            )
        if isinstance(self.prior, str):
            P.PRIORS.get(self.prior, argument="prior")  # ValueError listing the registered ones
        if isinstance(self.layers, str):
            if self.layers not in get_args(LayerSelection):
                raise ValueError(
                    f"layers must be 'all', 'last' or a list of ints; got {self.layers!r}"
                )
        elif not isinstance(self.layers, Sequence):
            raise TypeError(
                f"layers must be 'all', 'last' or a list of ints; got {self.layers!r}"
            )
        else:
            for i in self.layers:
                check_int("layers[i]", i)
        if isinstance(self.which, str):
            self.which = (self.which,)
        bad = set(self.which) - set(get_args(AttentionRole))
        if bad:
            raise ValueError(f"which must contain only 'self'/'cross'; got {sorted(bad)}")
        for name in ("family_kwargs", "prior_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name} must be a dict; got {getattr(self, name)!r}")
        if callable(self.prior) and self.prior_kwargs:
            raise ValueError(
                "prior_kwargs are for named priors; a callable prior gets (num_heads, head_dim) "
                f"only; got prior_kwargs={self.prior_kwargs!r}"
            )
        if isinstance(self.prior, str):
            takes = P.prior_arguments(self.prior)  # None: the factory takes any keyword
            unknown = [] if takes is None else sorted(set(self.prior_kwargs) - set(takes))
            if unknown:
                raise ValueError(
                    f"prior_kwargs {unknown} are not arguments of prior {self.prior!r}; it takes "
                    f"{list(takes or ())}"
                )
            self.build_prior(1, 1)  # validates the values
        if self.family is not None:
            # validates the name and family_kwargs (names and values)
            get_family(self.family, num_heads=1, head_dim=1, **self.family_kwargs)
        elif self.family_kwargs:
            raise ValueError(
                f"family_kwargs {sorted(self.family_kwargs)} given without a family"
            )

    def _check_gp_options(self) -> None:
        allowed, value, kw = get_args(ReadName), self.read, self.read_kwargs
        if value not in allowed:
            raise ValueError(f"read must be one of {allowed}; got {value!r}")
        if not isinstance(kw, dict):
            raise TypeError(f"read_kwargs must be a dict; got {kw!r}")
        if kw and value == "softmax":
            raise ValueError(f"read_kwargs {sorted(kw)} given with read={value!r}")
        unknown = sorted(set(kw) - set(_GP_KWARGS))  # only read="sparse_gp" takes options
        if unknown:
            raise ValueError(
                f"read_kwargs {unknown} are not options of read={value!r}; it takes "
                f"{list(_GP_KWARGS)}"
            )
        if self.read == "sparse_gp":
            SparseGP(1, 1, 1, **self.read_kwargs)  # validates the values
        if self.read == "sparse_gp" and self.support is not None:
            raise ValueError(
                f"read='sparse_gp' reads over every key; it does not combine with "
                f"support={self.support!r}"
            )

    @property
    def _selects(self) -> bool:
        """Whether the selected layers get anything (a family or a GP read)."""
        return self.family is not None or self.read != "softmax"

    def build_readout(self, in_dim: int, num_classes: int) -> nn.Module:
        """Deprecated (removed in the next release): ``nn.Linear(in_dim, num_classes)``, a
        classifier's read-out of its pooled features, which no longer depends on the config."""
        warnings.warn(
            "AttentionConfig.build_readout is deprecated: a classifier's read-out is "
            "nn.Linear(in_dim, num_classes); build that",
            DeprecationWarning,
            stacklevel=2,
        )
        return nn.Linear(in_dim, num_classes)

    def check_layers(self, num_layers: int) -> None:
        """Every index in ``layers`` must name one of ``num_layers`` layers (negative indices
        count from the end, as in Python)."""
        if isinstance(self.layers, str) or not self._selects:
            return
        bad = [i for i in self.layers if not -num_layers <= i < num_layers]
        if bad:
            raise ValueError(
                f"AttentionConfig.layers {list(self.layers)} names layers {bad} of a stack with "
                f"{num_layers} layer(s) (valid: 0..{num_layers - 1} or negative from the end)"
            )

    @classmethod
    def recommended(cls, **overrides: Any) -> AttentionConfig:
        """The recommended configuration: plain softmax attention (``AttentionConfig(**overrides)``,
        no family), the best configuration the study measured.

        Its uncertainty is carried by the **post-hoc density read**, one call after training::

            from bayesattn.posthoc import DensityRead
            read = DensityRead(model).fit(x_train, y_train, val=(x_val, y_val))
            res, score = read.predict_and_score(x)  # predictive and OOD score, one pass

        With a second network trained from another seed, read the CLS output of both and average
        them, ``ReadEnsemble.of([net_a, net_b], views=("cls",))``
        (:class:`~bayesattn.posthoc.ReadEnsemble`): on the study's images and signals at least
        level with a 5-network ensemble at finding held-out classes, more accurate than one
        network, at two fifths of its training and under half its prediction. On a token
        classifier,
        :class:`~bayesattn.posthoc.TextDensityRead` (the same call) adds
        a bag of words' entropy to the read's score, each standardised on validation: the best
        detector measured on words (it needs scikit-learn to fit).

        In the study's full protocol, the softmax network read this way (method ``density``)
        detects held-out classes better than a 5-ensemble on the digits, with the plain
        network's accuracy and a lower NLL than temperature scaling, at a fraction of the
        ensemble's cost; no configuration with Bayesian attention beat the plain network
        (``docs/which-attention.md``). For posteriors over attention weights (ArviZ
        diagnostics, :func:`bayesattn.convert`), use :meth:`last_layer`. Keyword arguments set
        fields.
        """
        return cls(**overrides)

    @classmethod
    def last_layer(cls, **overrides: Any) -> AttentionConfig:
        r"""The cheap Bayesian attention (the study's ``last_layer`` method): attention
        posteriors for diagnostics and conversion; not the recommended recipe
        (:meth:`recommended`).

        Logistic-normal weights in the **last** layer only, with an input-dependent scale and a
        weight model centred on the softmax attention (``model_location="attention"``):

        .. math:: y_{ij}\sim\mathcal N(\log\bar p_{ij}, \sigma_0^2)\ \text{(weight model)},\qquad
                  y_{ij}\sim\mathcal N(\log\bar p_{ij}, \sigma_{hi}(q_i)^2)\ \text{(guide)},
                  \qquad w_i = \operatorname{softmax}(y_i).

        Why: the KL then measures spread only (no price for attention being sharp), the latents
        are few (with CLS pooling only the CLS row of the last layer reaches the output: ``H``
        rows per example), so the plain ELBO (``kl_weight=1``) trains without collapse; and
        everything before the last layer is computed once for all posterior samples, so ``S``
        samples cost little more than one deterministic pass (``benchmarks/predictive_speed.py``).

        Measured standing: in the study's full protocol it is resolved *below* the plain
        softmax network on the digits (accuracy and NLL), level with it on MNIST-1D and below
        it on fortunes; on the digits its held-out AUROC (by MI) is below the plain network's (by
        entropy). See the study, ``studies/2026-12-04-full-protocol-0.6``. Keyword arguments
        override fields.
        """
        kw: dict = dict(
            family="logistic_normal",
            layers="last",
            family_kwargs={"input_dependent": True, "model_location": "attention"},
        )
        kw.update(overrides)
        return cls(**kw)

    def is_bayesian(self, index: int, num_layers: int, which: AttentionRole = "self") -> bool:
        if not self._selects or which not in self.which:
            return False
        if self.layers == "all":
            return True
        if self.layers == "last":
            return index == num_layers - 1
        self.check_layers(num_layers)
        return index in {i % num_layers for i in self.layers}

    def build_prior(self, num_heads: int, head_dim: int) -> P.KeyRelevancePrior:
        """The self-attention prior: ``prior(num_heads, head_dim)`` for a callable, else the
        registered prior of that name (:func:`bayesattn.priors.build_prior`)."""
        if callable(self.prior):
            return self.prior(num_heads, head_dim)
        return P.build_prior(self.prior, num_heads, head_dim, **self.prior_kwargs)

    def build(
        self,
        embed_dim: int,
        num_heads: int,
        index: int,
        num_layers: int,
        which: AttentionRole,
        **mha_kwargs: Any,
    ) -> BayesianMultiheadAttention:
        head_dim = embed_dim // num_heads
        bayes = self.is_bayesian(index, num_layers, which)
        family = (
            get_family(self.family, num_heads, head_dim, **self.family_kwargs)
            if bayes and self.family is not None  # is_bayesian: False without a family
            else None
        )
        prior = self.build_prior(num_heads, head_dim) if which == "self" else P.UniformPrior()
        support = get_support(self.support, **self.support_kwargs) if which == "self" else None
        gp = (
            SparseGP(num_heads, head_dim, head_dim, **self.read_kwargs)
            if bayes and self.read == "sparse_gp"
            else None
        )
        return BayesianMultiheadAttention(
            embed_dim, num_heads, batch_first=True, prior=prior, family=family, support=support,
            gp_read=gp, **mha_kwargs,
        )  # fmt: skip


def _check_readout(readout: str | None, readout_kwargs: dict | None) -> None:
    """The deprecated ``readout``/``readout_kwargs`` of :class:`AttentionConfig`: a warning, and
    a ``ValueError`` for anything but the one value it had (``"linear"``, no options)."""
    if readout is None and readout_kwargs is None:
        return
    warnings.warn(
        "AttentionConfig(readout=..., readout_kwargs=...) is deprecated and is removed in the "
        "next release: a classifier's read-out is always linear (readout's one value, "
        "'linear'); drop the argument",
        DeprecationWarning,
        stacklevel=4,  # _check_readout < __post_init__ < __init__ < the caller
    )
    if readout not in (None, "linear"):
        raise ValueError(f"readout must be 'linear' (its only value, deprecated); got {readout!r}")
    if readout_kwargs:
        raise ValueError(
            f"readout_kwargs {sorted(readout_kwargs)} given with readout='linear'; it takes none"
        )


def as_attention_config(attention: AttentionConfig | FamilyName | None) -> AttentionConfig:
    """``None`` → deterministic attention; a family name (``"dirichlet"``) is shorthand for
    ``AttentionConfig(family=name)``; an :class:`AttentionConfig` is used as is."""
    if attention is None:
        return AttentionConfig()
    if isinstance(attention, str):
        return AttentionConfig(family=attention)
    if not isinstance(attention, AttentionConfig):
        raise TypeError(
            f"attention must be an AttentionConfig, a family name or None; got "
            f"{type(attention).__name__}"
        )
    return attention

