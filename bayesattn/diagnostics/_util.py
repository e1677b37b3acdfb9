"""Small helpers shared by the diagnostics modules: eval mode, plate nesting and per-draw
reshapes (argument checks and seeded RNG forks are in :mod:`bayesattn._validation`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


@contextlib.contextmanager
def _eval_mode(module: Any) -> Iterator[None]:
    """Temporarily put a torch module in eval mode (no dropout), restoring every flag after."""
    if not isinstance(module, torch.nn.Module):
        yield
        return
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, t in flags:
            m.training = t


def _max_plate_nesting(*traces: Any) -> int:
    """Deepest vectorised plate dim over the traces; rejects enumerated sites."""
    nest = 0
    for tr in traces:
        for site in tr.nodes.values():
            if site["type"] != "sample":
                continue
            if site["infer"].get("enumerate"):
                raise ValueError(
                    f"site {site['name']!r} is enumerated; marginalise discrete latents first"
                )
            for f in site["cond_indep_stack"]:
                if f.vectorized and f.dim is not None:
                    nest = max(nest, -f.dim)
    return nest


def _per_draw(t: Tensor, num: int, dim: int) -> Tensor:
    """Move the draw dim (``dim`` from the right of a batch-shaped tensor) to the front:
    ``(num, -1)`` with every other batch dim flattened (singletons included)."""
    k = -dim
    if t.dim() < k:
        t = t.reshape((1,) * (k - t.dim()) + t.shape)
    t = t.movedim(-k, 0)
    return t.expand((num,) + t.shape[1:]).reshape(num, -1)
