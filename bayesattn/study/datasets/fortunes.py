"""The fortune cookies of Debian's ``fortunes`` package by topic as a study data set (tokens):
a transformer over the word tokens with CLS pooling; token corruptions
(:func:`~bayesattn.data.token_ood.corrupt_tokens`) and the token far-OOD suite
(:func:`~bayesattn.data.token_ood.token_far_ood_suite`). 10 epochs, chosen on validation NLL
(2.03 against 2.76 at 20 epochs, two runs) at half the training cost (docs/which-attention.md,
"Tokens")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ...data.fortunes import FortunesData, load_fortunes_data, read_fortunes
from ...data.holdout import HoldoutData
from ...data.token_ood import TOKEN_CORRUPTIONS, corrupt_tokens, token_far_ood_suite
from ...nn.blocks import AttentionConfig
from ...nn.networks import TransformerClassifier
from .base import StudyDataset, register_dataset

__all__ = ["Fortunes"]


def _tokens(data: HoldoutData) -> FortunesData:
    if not isinstance(data, FortunesData):
        raise TypeError(
            f"data must be FortunesData (the fortunes' split); got {type(data).__name__}"
        )
    return data


class Fortunes(StudyDataset):
    """The fortunes: token ids ``(N, 48)`` (0 padding, 1 unknown), ten topics."""

    name = "fortunes"
    description = "Debian's fortune cookies by topic (word tokens; apt-get install fortunes)"
    model_defaults = dict(d_model=64, nhead=4, num_layers=2, dim_feedforward=128, epochs=10,
                          lr=3e-3, batch_size=64, patch=1)  # fmt: skip
    token_unit = "word"
    full_protocol = True
    order = 2

    def check_available(self) -> None:
        try:
            read_fortunes()
        except FileNotFoundError as e:
            raise ImportError(str(e)) from e

    def load(self, seed: int, holdout_classes: tuple[int, ...]) -> HoldoutData:
        return load_fortunes_data(seed=seed, holdout_classes=holdout_classes)

    def corruptions(
        self, data: HoldoutData, severities: Sequence[int], seed: int
    ) -> dict[tuple[str, int], Tensor]:
        v = _tokens(data).vocab_size
        return {(k, s): corrupt_tokens(data.x_test, k, s, v, seed)
                for k in TOKEN_CORRUPTIONS for s in severities}  # fmt: skip

    def far_ood(self, data: HoldoutData, seed: int) -> dict[str, Tensor]:
        v = _tokens(data).vocab_size
        return token_far_ood_suite(data.x_test, v, seed, train=(data.x_train, data.y_train))

    def network(
        self,
        data: HoldoutData,
        model: Mapping[str, Any],
        dropout: float,
        attention: AttentionConfig | None,
    ) -> TransformerClassifier:
        """A transformer over the word tokens (embedding of the vocabulary, CLS pooling)."""
        vocab, length = _tokens(data).vocab_size, data.x_train.shape[1]
        kw = self.sizes(model, dropout, attention)
        return TransformerClassifier(
            data.num_classes, vocab_size=vocab, max_len=length, pooling="cls", **kw
        )


register_dataset(Fortunes())
