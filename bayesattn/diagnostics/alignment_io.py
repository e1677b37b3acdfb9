"""ArviZ export of alignment posteriors (:func:`bayesattn.predictive.alignment_posterior`).

Variables ``alignment_prior``, ``alignment_posterior`` ``(draw, example, target, source)`` and
``alignment_kl`` ``(draw, example, target)`` (nats) go to the ``posterior`` group as one chain of
``S`` draws (members of an ensemble count as draws). Positions and words are separate
coordinates: ``target``/``source`` index positions (integers), ``target_token`` ``(example,
target)`` and ``source_token`` ``(example, source)`` hold the words, so a user selects by either::

    post = idata.posterior.alignment_posterior.sel(example=0)
    post.where(post.target_token == "haus", drop=True)   # the row of the word "haus"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..functional.alignment import categorical_kl
from .arviz_io import arviz_is_v1, to_arviz
from .token_coords import with_coords

if TYPE_CHECKING:
    from ..predictive.alignment import AlignmentPosterior

__all__ = ["alignment_to_arviz"]

PAD_LABEL = "<pad>"


def _labels(name: str, tokens: Sequence[Sequence[str]], rows: int, cols: int) -> np.ndarray:
    """``(rows, cols)`` array of words, padded with :data:`PAD_LABEL`."""
    if isinstance(tokens, str) or len(tokens) != rows:
        raise ValueError(
            f"{name} must hold one token list per example ({rows}); got {tokens!r:.80}"
        )
    out = np.full((rows, cols), PAD_LABEL, dtype=object)
    for i, words in enumerate(tokens):
        if isinstance(words, str) or not all(isinstance(w, str) for w in words):
            raise TypeError(f"{name}[{i}] must be a sequence of str; got {words!r:.80}")
        if len(words) > cols:
            raise ValueError(
                f"{name}[{i}] has {len(words)} tokens but the alignment has {cols} positions"
            )
        out[i, : len(words)] = list(words)
    return out.astype(str)


def alignment_to_arviz(
    ap: AlignmentPosterior,
    src_tokens: Sequence[Sequence[str]],
    tgt_tokens: Sequence[Sequence[str]],
) -> Any:
    """An :class:`~bayesattn.predictive.AlignmentPosterior` as ``arviz.InferenceData`` (arviz 0.x)
    or ``xarray.DataTree`` (1.x), with the words as coordinates.

    ``src_tokens[b]``: the source words of example ``b``; ``tgt_tokens[b]``: its predicted target
    words (the rows, ``tgt[b, 1:]`` decoded: EOS included if wanted); shorter lists are padded with
    ``"<pad>"``.

    Shape:
        ap ``(S, B, Tt-1, Ts)`` → variables ``(chain=1, draw=S, example, target, source)``.
    """
    S, B, T, Ts = ap.log_prior.shape
    src_lab = _labels("src_tokens", src_tokens, B, Ts)  # (B, Ts)
    tgt_lab = _labels("tgt_tokens", tgt_tokens, B, T)  # (B, T)
    grid = ["example", "target", "source"]
    idata = to_arviz(
        {
            "alignment_prior": ap.log_prior.exp(),
            "alignment_posterior": ap.log_posterior.exp(),
            "alignment_kl": categorical_kl(ap.log_posterior, ap.log_prior),  # (S, B, T)
        },
        dims={"alignment_prior": grid, "alignment_posterior": grid, "alignment_kl": grid[:2]},
        coords={"example": list(range(B)), "target": list(range(T)), "source": list(range(Ts))},
        sample_dims=("sample",),
        attention_dims=False,
    )
    extra = {
        "target_token": (("example", "target"), tgt_lab),
        "source_token": (("example", "source"), src_lab),
    }
    return with_coords(idata, "posterior", extra, v1=arviz_is_v1(), index=False)
