r"""Local + global attention (Longformer, BigBird's window and global parts)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from ..._validation import check_int
from ...functional import supports as K
from .local import LocalSupport

__all__ = ["LocalGlobalSupport"]


class LocalGlobalSupport(LocalSupport):
    r"""Local + global attention (Longformer, BigBird's window and global parts): query ``i``
    reads keys ``|i - j| <= window`` and the ``global_tokens`` (a collection of positions, any
    order, repeats ignored; default ``(0,)``: a CLS token prepended by the network); the global tokens' own queries read every key. A position
    at or past the sequence length ``T`` is a ``ValueError`` naming ``global_tokens`` and ``T``
    (the functional :func:`~bayesattn.functional.supports.local_global_support` drops them).

    Equal to dense attention under the log-prior that is 0 on that support and ``-inf`` off it
    (:func:`bayesattn.functional.supports.dense_support_mask`), at :math:`O(T(w + G))` cost. In
    the stochastic modes the global queries' rows are a second latent site, ``global/<layer>.latent``, of event
    shape ``(H, Gq, Tk)``."""

    name = "local_global"

    def __init__(
        self,
        window: int = 64,
        global_tokens: Iterable[int] = (0,),
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(window, chunk_size)
        if isinstance(global_tokens, (str, bytes)) or not isinstance(global_tokens, Iterable):
            raise TypeError(
                "global_tokens must be a collection (tuple, list, set) of token positions (() "
                "for none); got "
                f"{global_tokens!r}"
            )
        # a set of positions: any order, a repeat is the same position
        self.global_tokens = tuple(sorted({check_int("global_tokens", t, 0) for t in global_tokens}))

    def global_keys(
        self, device: torch.device, num_keys: int | None = None
    ) -> tuple[int, ...] | None:
        if not self.global_tokens:
            return None
        if num_keys == 0:
            return None  # no keys at all: the read is empty, as in dense attention
        if num_keys is not None and max(self.global_tokens) >= num_keys:
            raise ValueError(
                f"global_tokens must be positions < T = {num_keys} (the sequence length); got "
                f"{self.global_tokens}"
            )
        return self.global_tokens  # Python ints: static sizes under torch.compile

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        s = K.local_global_support(
            q, k, self.window, self.global_keys(q.device, k.shape[-2]), log_prior,
            chunk_size=self.chunk_size,
        )  # fmt: skip
        return s, v

    def extra_repr(self) -> str:
        return f"window={self.window}, global_tokens={self.global_tokens}"
