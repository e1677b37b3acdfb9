"""Pyro's global parameter store and a network's parameters: :func:`sync_param_store`."""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from torch import Tensor

from ..nn.networks import BayesianNetwork
from .data import fork_rng as _fork_rng

__all__ = ["sync_param_store"]


def sync_param_store(
    network: BayesianNetwork, x: Tensor, y: Tensor | None, num_data: int | None
) -> list[str]:
    """Make Pyro's global param store point at ``network``'s tensors; returns the param names of
    its model and guide.

    PyroModules register their parameters in the global store by name; a stale entry of the
    same name (another network built earlier in the process) would otherwise be what SVI
    optimises (``pyro.module``) or be silently copied into this network (``PyroParam``).
    Names used by this network's model and guide are found in a scoped, empty store; stale
    entries under those names are removed so that the next trace registers ours.
    """
    net = network
    store = pyro.get_param_store()
    with _fork_rng(), torch.no_grad(), store.scope():
        gtr = poutine.trace(net.guide).get_trace(x, y, num_data)
        mtr = poutine.trace(poutine.replay(net.model, trace=gtr)).get_trace(x, y, num_data)
    names: list[str] = []
    for tr in (gtr, mtr):
        for name, site in tr.nodes.items():
            if site["type"] == "param" and name not in names:
                names.append(name)
    own = {id(p) for p in net.parameters()}
    current = dict(store.named_parameters())
    for name in names:
        if name in current and id(current[name]) not in own:
            del store[name]
    return names
