"""The alignment benchmark's ensemble of latent decoders (``benchmarks/alignment.py``,
kind ``context_ensemble``): its members, its averaged posterior and its training count."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "alignment_bench", ROOT / "benchmarks" / "alignment.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return mod


class _Bar:
    n = 0

    def update(self, k: int) -> None:
        self.n += k


def test_kinds_bring_what_they_need():
    ab = _load()
    assert ab.expand_kinds("soft,context_ensemble") == ["soft", "context", "context_ensemble"]
    assert ab.expand_kinds("context,context_ensemble") == ["context", "context_ensemble"]
    assert ab.expand_kinds("ensemble,variational") == [
        "soft",
        "ensemble",
        "variational",
        "variational_q",
    ]


def test_context_ensemble_averages_its_members_posteriors():
    ab = _load()
    args = ab.parse_args(["--quick", "--kinds", "soft,context_ensemble"])
    args.n, args.epochs, args.warmup, args.members = 120, 1, 1, 3
    kinds = ab.expand_kinds(args.kinds)
    bar = _Bar()
    out = ab.run_seed(0, kinds, args, bar)
    assert bar.n == 1 + 3  # soft once, three context members
    single, ens = out["context"]["_ap"], out["context_ensemble"]["_ap"]
    assert ens.num_draws == 3 and single.num_draws == 1
    # member 0 is the single context decoder; the members differ (other initialisations)
    assert torch.allclose(ens.log_posterior[0], single.log_posterior[0], atol=1e-6)
    assert not torch.allclose(ens.log_posterior[1], ens.log_posterior[0], atol=1e-3)
    want = ens.log_posterior.exp().mean(0)  # the members' average posterior
    assert torch.allclose(ens.posterior, want)
    p = want.clamp_min(1e-30)
    h = -(torch.where(want > 0, want * p.log(), torch.zeros_like(want))).sum(-1)
    assert torch.allclose(ens.entropy(), h, atol=1e-6)
    # the ensemble is scored on the same links and its training time is all three members'
    assert out["context_ensemble"]["posterior"]["links"] == out["context"]["posterior"]["links"]
    assert out["context_ensemble"]["train_s"] > out["context"]["train_s"]
