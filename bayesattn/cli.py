"""The ``bayesattn`` command. ``bayesattn study`` runs the uncertainty study."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from .study import DATASETS, METHODS

    p = argparse.ArgumentParser(prog="bayesattn", description="Bayesian attention toolkit")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "study",
        help="train and compare uncertainty methods (digits, MNIST-1D, fortunes)",
        description="Train and score every uncertainty method (deterministic, temperature "
        "scaling, MC dropout, deep ensembles and their size curve, kNN and relative-Mahalanobis "
        "feature scores, last-layer Laplace, the recommended and every-layer Bayesian "
        "attentions, the post-hoc GP and density reads) on held-out class pairs × seeds; report "
        "means with 95% intervals, paired differences (Holm-corrected marks), AUROCs by each "
        "method's primary score near / far / shift, selective prediction, corruption curves, "
        "costs, with figures and ArviZ files. Default: the digits, 2 held-out pairs × 3 seeds "
        "(about 8 minutes on 2 cores); --protocol full: digits and MNIST-1D, 5 pairs × 5 seeds; "
        "--dataset fortunes: tokens (Debian's fortunes package).",
    )
    s.add_argument("--out", default="bayesattn-study", help="output folder (a folder of its own)")
    s.add_argument(
        "--force",
        action="store_true",
        help="replace the study in the output folder: only the files its manifest lists (those "
        "a study run wrote) are removed; a folder with other files and no manifest is refused",
    )
    s.add_argument("--quick", action="store_true", help="a smoke run of a minute or two")
    s.add_argument("--protocol", choices=["default", "full"], default="default",
                   help="full: both datasets, 5 held-out pairs, 5 seeds, 2 jobs (about 2 h on 2 cores; "
                   "docs/which-attention.md)")
    s.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help="dataset (default digits; --protocol full runs digits and mnist1d; fortunes: "
                   "tokens, needs apt-get install fortunes)")
    s.add_argument("--methods", nargs="+", choices=list(METHODS), default=None,
                   help="methods to run")
    s.add_argument("--epochs", type=int, default=None)
    s.add_argument("--seed", type=int, default=0, help="first seed")
    s.add_argument("--seeds", type=int, default=None,
                   help="number of seeds (seed, seed+1, …); default 3 (full: 5)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--holdout-classes", type=int, nargs="+", default=None, metavar="CLASS",
                   help="one held-out class set (e.g. 8 9) instead of the rotation")
    g.add_argument("--holdout-rotation", type=int, default=None, metavar="K",
                   help="rotate over K disjoint held-out pairs (default 2; full: 5)")
    s.add_argument("--samples", type=int, default=None, help="posterior samples per prediction")
    s.add_argument("--ensemble-size", type=int, default=None)
    s.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the study's models are small, so one thread is fastest "
        "and gives the same numbers on any machine)",
    )
    s.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs in parallel worker processes (default 1; --protocol full: 2); the numbers do "
        "not change, only the wall time (each worker uses --threads torch threads)",
    )
    s.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="instead of running: merge finished studies of the same settings into --out, "
        "pooled again: a method added later on the same runs, or the same methods on other "
        "seeds (a protocol split over machines); a method in several must agree",
    )
    s.add_argument("--no-progress", action="store_true")
    return p


def _config(args: argparse.Namespace) -> Any:
    from .study import StudyConfig

    kw: dict[str, Any] = {"out": str(args.out), "seed": args.seed}
    kw["progress"] = not args.no_progress
    if args.dataset is not None:
        kw["dataset" if args.protocol == "default" else "datasets"] = (
            args.dataset if args.protocol == "default" else (args.dataset,)
        )
    for name, val in (
        ("methods", args.methods),
        ("epochs", args.epochs),
        ("num_samples", args.samples),
        ("ensemble_size", args.ensemble_size),
        ("seeds", args.seeds),
        ("holdout_classes", args.holdout_classes),
        ("holdout_rotation", args.holdout_rotation),
        ("jobs", args.jobs),
    ):
        if val is not None:
            kw[name] = tuple(val) if name in ("methods", "holdout_classes") else val
    if args.quick:
        return StudyConfig.quick(**kw)
    if args.protocol == "full":
        return StudyConfig.full(**kw)
    return StudyConfig(**kw)


def _study(args: argparse.Namespace) -> int:
    import torch

    from ._study_io import prepare_out_dir
    from .study import format_table, run_study

    if args.threads < 0:
        print(f"bayesattn: --threads must be >= 1 (0: torch's default); got {args.threads}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.merge:
        from .study import merge_studies

        try:
            prepare_out_dir(args.out, force=args.force)
            results = merge_studies(args.merge, args.out)
        except (ValueError, TypeError) as e:
            print(f"bayesattn: {e}", file=sys.stderr)
            return 2
        print(format_table(results))
        print(f"\nwrote {Path(args.out) / 'results.json'} and {Path(args.out) / 'report.md'}")
        return 0
    try:
        cfg = _config(args)
        # refuses unsafe paths, folders a study did not write, and a study without --force
        prepare_out_dir(args.out, force=args.force)
    except (ValueError, TypeError) as e:
        print(f"bayesattn: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        results = run_study(cfg)
    except ImportError as e:  # a method's or dataset's optional dependency is missing
        print(f"bayesattn: {e}", file=sys.stderr)
        return 2
    print()
    print(format_table(results))
    out = Path(args.out)
    print(f"\nwrote {out / 'results.json'}, {out / 'report.md'} and figures")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "study":
        return _study(args)
    return 1  # pragma: no cover - argparse enforces the sub-command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
