"""The 0.3 study's building blocks ``_vit`` and ``_train``, which benchmark scripts import
(``benchmarks/elbo_terms.py``); thin wrappers over :class:`~bayesattn.study.runs.Run`."""

from __future__ import annotations

from ..data import DigitsData
from ..nn.blocks import AttentionConfig
from ..nn.networks import BayesianNetwork, TransformerClassifier, VisionTransformer
from .config import StudyConfig
from .datasets import StudyDataset
from .runs import Run

__all__: list[str] = []


def _run(cfg: StudyConfig, data: DigitsData, seed: int) -> Run:
    return Run(cfg, "digits", tuple(data.holdout_classes), seed, data, {}, {})


def _vit(
    cfg: StudyConfig, num_classes: int, attention: AttentionConfig | None
) -> TransformerClassifier:
    """The study's digits ViT (``cfg``'s sizes) with ``num_classes`` outputs."""
    m, kw = cfg.model("digits"), StudyDataset.sizes(cfg.model("digits"), cfg.dropout, attention)
    return VisionTransformer(num_classes, image_size=8, patch_size=m["patch"], **kw)


def _train(
    net: BayesianNetwork,
    data: DigitsData,
    cfg: StudyConfig,
    seed: int,
    bayes: bool,
    kl_weight: float = 1.0,
) -> float:
    """Train ``net`` as the study does (hybrid ELBO, ``cfg``'s epochs and learning rate on the
    digits); returns the seconds it took."""
    return _run(cfg, data, seed).train(net, seed, bayes, kl_weight)
