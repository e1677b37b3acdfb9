r""":class:`ReadEnsemble`: one post-hoc read per network of a small ensemble, averaged.

.. math::

    p(y \mid x) = \frac1M \sum_{m=1}^M p_m(y \mid x), \qquad
    s(x) = \frac1M \sum_{m=1}^M s_m(x),

with :math:`p_m, s_m` the predictive and OOD score of read :math:`m`, each fitted on its own
network's features. The reads' scores are already on one scale (a
:class:`~bayesattn.posthoc.density.DensityRead` standardises its score on the validation data),
so no weight is fitted. The predictive keeps every read's draws, ``(M·S, B, C)``: their spread
is the ensemble's mutual information.

Two networks, each read by the density of its CLS output, are the study's recipe for images
and signals: on MNIST-1D the pair finds held-out classes level with a 5-network ensemble at two
fifths of its training and under half its prediction (the study's ``density_cls_pair``; reading
the token view too, ``density_pair``, adds about .01 there at a whole last layer more per
network; the numbers are on the "Which attention" page).

Example::

    read = ReadEnsemble.of([net_a, net_b], views=("cls",)).fit(x_train, y_train,
                                                               val=(x_val, y_val))
    res, score = read.predict_and_score(x_test)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..predictive import PredictionResult
from .base import PosthocRead
from .density import DensityRead

__all__ = ["ReadEnsemble"]


class ReadEnsemble(PosthocRead):
    """Post-hoc reads of ``M ≥ 2`` different networks, averaged (module docstring). Every read
    must hold its own network (``DensityRead(net)``, not ``DensityRead()``): the ensemble reads
    model inputs, and each read extracts its network's features from them.

    Args:
        reads: the reads, one per network (unfitted: :meth:`fit` fits each; or all fitted).
    """

    takes_inputs = True

    def __init__(self, reads: Sequence[PosthocRead]) -> None:
        super().__init__(None)
        if isinstance(reads, PosthocRead) or not isinstance(reads, Sequence):
            raise TypeError(f"reads must be a sequence of post-hoc reads; got {type(reads).__name__}")
        reads = list(reads)
        if len(reads) < 2:
            raise ValueError(f"reads must hold at least 2 reads (one per network); got {len(reads)}")
        for i, r in enumerate(reads):
            if not isinstance(r, PosthocRead):
                raise TypeError(f"reads[{i}] must be a PosthocRead; got {type(r).__name__}")
            if r.model is None:
                raise ValueError(
                    f"reads[{i}] ({type(r).__name__}) has no model: each read of an ensemble reads "
                    f"its own network's inputs; build it with the network, e.g. "
                    f"{type(r).__name__}(net)"
                )
        shared = [i for i, r in enumerate(reads) if any(r.model is q.model for q in reads[:i])]
        if shared:
            raise ValueError(
                f"reads[{shared[0]}] reads the same network as an earlier read: an ensemble needs "
                "a different network per read"
            )
        self.reads = reads
        fitted = {r.num_classes for r in reads}
        if None not in fitted:  # all fitted already
            self.num_classes = self._classes(fitted)

    @classmethod
    def of(
        cls,
        models: Sequence[nn.Module],
        read: Callable[..., PosthocRead] = DensityRead,
        **kwargs: Any,
    ) -> ReadEnsemble:
        """``ReadEnsemble([read(m, **kwargs) for m in models])``: by default each network's
        :class:`~bayesattn.posthoc.density.DensityRead`."""
        if isinstance(models, nn.Module) or not isinstance(models, Sequence):
            raise TypeError(f"models must be a sequence of networks; got {type(models).__name__}")
        return cls([read(m, **kwargs) for m in models])

    @staticmethod
    def _classes(found: set[int | None]) -> int:
        if len(found) != 1:
            raise ValueError(f"the reads disagree on the number of classes: {sorted(map(str, found))}")
        (c,) = found
        assert c is not None
        return c

    def _fit(self, x: Any, y: Tensor, val: tuple[Any, Tensor] | None) -> None:
        for r in self.reads:
            r.fit(x, y, val=val)
        self.num_classes = self._classes({r.num_classes for r in self.reads})

    def _predict(self, x: Any, num_samples: int | None) -> PredictionResult:
        probs = torch.cat([r.predict(x, num_samples).probs for r in self.reads])  # (M·S, B, C)
        return PredictionResult(probs=probs, kind="posthoc/ensemble")

    def _score(self, x: Any) -> Tensor:
        return torch.stack([r.score(x) for r in self.reads]).mean(0)  # (B,)

    def predict_and_score(
        self, x: Any, num_samples: int | None = None
    ) -> tuple[PredictionResult, Tensor]:
        """``(predict(x), score(x))``, each network's features extracted once."""
        self._check_fitted()
        parts = [_predict_and_score(r, x, num_samples) for r in self.reads]
        probs = torch.cat([res.probs for res, _ in parts])  # (M·S, B, C)
        score = torch.stack([s for _, s in parts]).mean(0)  # (B,)
        return PredictionResult(probs=probs, kind="posthoc/ensemble"), score

    def kl(self) -> float:
        """The reads' KLs from their priors, summed (independent reads: the KL of the product)."""
        return float(sum(r.kl() for r in self.reads))

    def _state(self) -> dict[str, Any]:
        return {"reads": [r.state_dict() for r in self.reads]}

    def _load(self, state: dict[str, Any]) -> None:
        saved = state.get("reads")
        if not isinstance(saved, list) or len(saved) != len(self.reads):
            got = len(saved) if isinstance(saved, list) else type(saved).__name__
            raise ValueError(f"state holds {got} reads; this ensemble has {len(self.reads)}")
        for r, s in zip(self.reads, saved, strict=True):
            r.load_state_dict(s)


def _predict_and_score(
    read: PosthocRead, x: Any, num_samples: int | None
) -> tuple[PredictionResult, Tensor]:
    """One read's prediction and score, in one pass where the read offers it."""
    both = getattr(read, "predict_and_score", None)
    if both is not None:
        out: tuple[PredictionResult, Tensor] = both(x, num_samples)
        return out
    return read.predict(x, num_samples), read.score(x)
