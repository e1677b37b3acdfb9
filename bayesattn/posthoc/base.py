r""":class:`PosthocRead`: the one shape of a post-hoc read (scikit-learn's estimator API).

Hyperparameters go to ``__init__`` (with the model whose features are read, when the read
extracts them itself); then

* ``fit(features, y, *, val=None) -> self`` — ``features`` a :class:`~bayesattn.posthoc.features.Features`, the
  model's inputs (a tensor or a dict of tensors; needs ``model``) or a ``DataLoader`` of
  ``(x, y)`` batches (then ``y`` is ``None``); ``val`` the same as ``(features, y)`` or a
  ``DataLoader`` (the reads that choose hyperparameters or a temperature on it need it);
* ``predict(features, num_samples=None) -> PredictionResult`` — ``(S, B, C)`` draws of the
  predictive (``S = 1`` for a deterministic read; ``None`` is the read's default);
* ``score(features) -> (B,)`` — the read's OOD score (higher: less like the training data);
* ``kl() -> float`` — the read's global KL from its prior, in nats (0 when it has none);
* ``state_dict()`` / ``load_state_dict(state)`` — the fitted state as tensors, numbers and
  strings: ``torch.save(read.state_dict(), f)`` and ``torch.load(f, weights_only=True)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Self

import torch
from torch import Tensor, nn

from .._validation import check_int
from ..predictive import PredictionResult
from ._checks import check_labels, check_matrix
from .features import Features, concat_features, extract_features

__all__ = ["PosthocRead"]

Forward = Callable[[nn.Module, Any], Tensor]


class PosthocRead(ABC):
    """Base class of the post-hoc reads (module docstring).

    Args:
        model: the trained model whose features are read (``None``: every call takes
            :class:`~bayesattn.posthoc.features.Features`).
        head, tokens_layer, forward: how the features of a model we did not write are read
            (:func:`~bayesattn.posthoc.features.extract_features`).
        batch_size: rows per forward pass.
    """

    #: the read takes model inputs, never Features (the reads that change the model's pass)
    takes_inputs: bool = False

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        head: nn.Module | str | None = None,
        tokens_layer: nn.Module | str | None = None,
        forward: Forward | None = None,
        batch_size: int = 512,
    ) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module or None; got {type(model).__name__}")
        self.model, self.head, self.tokens_layer, self.forward = model, head, tokens_layer, forward
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.num_classes: int | None = None  # set by fit

    @property
    def uses_tokens(self) -> bool:
        """Whether the read reads the token view (``Features.tokens``): features extracted from
        model inputs include it only then."""
        return False

    # ---- data --------------------------------------------------------------------------

    def features(self, data: Any) -> Features:
        """``data`` as checked :class:`~bayesattn.posthoc.features.Features` (extracted from model inputs)."""
        if isinstance(data, Features):
            return self._check_features(data)
        if self.model is None:
            raise TypeError(
                f"{type(self).__name__} has no model: pass Features(logits, cls, tokens), or "
                f"build it with the model; got {type(data).__name__}"
            )
        return self._check_features(extract_features(
            self.model, data, head=self.head, tokens_layer=self.tokens_layer,
            forward=self.forward, batch_size=self.batch_size, tokens=self.uses_tokens,
        ))  # fmt: skip

    def _check_features(self, f: Features) -> Features:
        z = check_matrix("features.logits", f.logits, dim=self.num_classes)
        if z.shape[1] < 2:
            raise ValueError(f"features.logits must have C >= 2 classes; got {tuple(z.shape)}")
        check_matrix("features.cls", f.cls, n=len(z))
        if f.tokens is not None:
            check_matrix("features.tokens", f.tokens, n=len(z))
        return f

    def _inputs(self, data: Any) -> Any:
        """What :meth:`_fit`/:meth:`_predict` take: Features, or the inputs themselves."""
        return data if self.takes_inputs else self.features(data)

    def _labelled(self, data: Any, y: Any, name: str) -> tuple[Any, Tensor]:
        """``(inputs, labels)`` of ``(data, y)`` or of a DataLoader of ``(x, y)`` batches."""
        if isinstance(data, torch.utils.data.DataLoader):
            if y is not None:
                raise ValueError(f"{name}: y must be None when the data is a DataLoader")
            xs, ys = [], []
            for batch in data:
                if not isinstance(batch, (list, tuple)) or len(batch) != 2:
                    raise ValueError(f"{name}: the DataLoader must yield (x, y) batches")
                xs.append(self._inputs(batch[0]))
                ys.append(batch[1])
            if not xs:
                raise ValueError(f"{name}: the DataLoader yielded no batches")
            inputs = concat_features(xs) if not self.takes_inputs else _cat_inputs(xs)
            return inputs, torch.cat(ys)
        return self._inputs(data), y

    # ---- the estimator API ---------------------------------------------------------------

    def fit(self, features: Any, y: Tensor | None = None, *, val: Any = None) -> Self:
        """Fit the read on ``(features, y)`` (and ``val``); returns ``self``."""
        x, labels = self._labelled(features, y, "features")
        v = None
        if val is not None:
            v = (self._labelled(val, None, "val") if isinstance(val, torch.utils.data.DataLoader)
                 else self._labelled(*_pair(val), "val"))  # fmt: skip
        n = len(x.logits) if isinstance(x, Features) else None
        labels = check_labels("y", labels, n)
        self._fit(x, labels, v)
        return self

    def predict(self, features: Any, num_samples: int | None = None) -> PredictionResult:
        """``(S, B, C)`` draws of the read's predictive (module docstring)."""
        self._check_fitted()
        if num_samples is not None:
            check_int("num_samples", num_samples, 1)
        return self._predict(self._inputs(features), num_samples)

    def score(self, features: Any) -> Tensor:
        """The OOD score ``(B,)`` (higher: less like the data the read was fitted on)."""
        self._check_fitted()
        return self._score(self._inputs(features))

    def _check_fitted(self) -> None:
        if self.num_classes is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(...) first")

    @abstractmethod
    def _fit(self, x: Any, y: Tensor, val: tuple[Any, Tensor] | None) -> None: ...

    @abstractmethod
    def _predict(self, x: Any, num_samples: int | None) -> PredictionResult: ...

    @abstractmethod
    def _score(self, x: Any) -> Tensor: ...

    @abstractmethod
    def kl(self) -> float:
        """The read's global KL from its prior, in nats."""

    # ---- saving ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The fitted state (tensors, numbers, strings, lists of them)."""
        self._check_fitted()
        return {"read": type(self).__name__, "num_classes": self.num_classes, **self._state()}

    def load_state_dict(self, state: dict[str, Any]) -> Self:
        """Restore a :meth:`state_dict` (of a read of this class); returns ``self``."""
        if not isinstance(state, dict) or state.get("read") != type(self).__name__:
            got = state.get("read") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"state must be a {type(self).__name__}.state_dict(); got {got!r}")
        self._load(state)
        self.num_classes = int(state["num_classes"])
        return self

    @abstractmethod
    def _state(self) -> dict[str, Any]: ...

    @abstractmethod
    def _load(self, state: dict[str, Any]) -> None: ...


def _pair(val: Any) -> tuple[Any, Any]:
    if not isinstance(val, (list, tuple)) or len(val) != 2:
        raise ValueError(
            f"val must be (features, y) or a DataLoader of (x, y) batches; got {type(val).__name__}"
        )
    return val[0], val[1]


def _cat_inputs(xs: Iterable[Any]) -> Any:
    """Batches of inputs (tensors, or dicts of tensors) concatenated along dim 0."""
    xs = list(xs)
    if isinstance(xs[0], dict):
        return {k: torch.cat([x[k] for x in xs]) for k in xs[0]}
    return torch.cat(xs)
