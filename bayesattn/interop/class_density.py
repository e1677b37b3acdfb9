"""Deprecated: the class-conditional density read moved to :mod:`bayesattn.posthoc`
(:class:`~bayesattn.posthoc.DensityRead`); these names keep working for one release with a
``DeprecationWarning`` (migration table in ``docs/posthoc-reads.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from .._deprecation import deprecated, moved_names
from ..nn.networks import TransformerClassifier
from ..posthoc.density import DensityRead
from ..posthoc.features import extract_features

__all__: list[str] = []

_CORE = "bayesattn.posthoc._density_core"
__getattr__ = moved_names(__name__, {
    "ClassDensityRead": (_CORE, "ClassDensityRead", "bayesattn.posthoc.DensityRead"),
    "fit_class_density": (_CORE, "fit_class_density", "bayesattn.posthoc.DensityRead().fit"),
    "fit_density_temperature": ("bayesattn.calibration", "fit_variance_temperature",
                                "bayesattn.calibration.fit_variance_temperature"),
})  # fmt: skip


def state_views(
    net: TransformerClassifier, x: Tensor, batch_size: int = 512
) -> tuple[Tensor, Tensor, Tensor]:
    """Deprecated: ``(logits, cls, tokens)`` of one pass; use
    :func:`bayesattn.posthoc.extract_features`."""
    deprecated("state_views", "bayesattn.posthoc.extract_features")
    if not isinstance(net, TransformerClassifier) or net.cls is None:
        raise ValueError("state_views needs a CLS-pooled network (pooling='cls')")
    f = extract_features(net, x, batch_size=batch_size)
    assert f.tokens is not None
    return f.logits, f.cls, f.tokens


@dataclass
class NetworkDensityRead:
    """Deprecated: a fitted :class:`~bayesattn.posthoc.DensityRead` of a network."""

    read: DensityRead

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(probs (B, C), score (B,))`` of inputs ``x`` in one pass."""
        res, score = self.read.predict_and_score(x)
        return res.probs[0].double(), score

    def sample_probs(self, x: Tensor, num_samples: int = 8, seed: int = 0) -> Tensor:
        return self.read.sample(x, num_samples, seed).probs


def fit_network_density(
    net: TransformerClassifier,
    train: tuple[Tensor, Tensor],
    val: tuple[Tensor, Tensor],
    views: Sequence[str] | None = None,
) -> NetworkDensityRead:
    """Deprecated: use ``DensityRead(net, views=views).fit(*train, val=val)`` (``views=None``:
    ``cls`` and ``tokens`` where the network has a token view, ``cls`` alone on a mean-pooled
    one)."""
    deprecated("fit_network_density", "bayesattn.posthoc.DensityRead(net).fit(x, y, val=...)")
    if not isinstance(net, TransformerClassifier):
        raise TypeError(
            f"net must be a TransformerClassifier; got {type(net).__name__}: for any other "
            "model (plain torch, converted, Hugging Face) use bayesattn.posthoc.DensityRead("
            "model).fit(x, y, val=(x_val, y_val)), with head= / tokens_layer= where the head "
            "and the last block are not found by name"
        )
    return NetworkDensityRead(DensityRead(net, views=views).fit(*train, val=val))
