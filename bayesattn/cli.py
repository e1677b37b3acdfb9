"""The ``bayesattn`` command. ``bayesattn study`` runs the default uncertainty study."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from .study import METHODS

    p = argparse.ArgumentParser(prog="bayesattn", description="Bayesian attention toolkit")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "study",
        help="train and compare uncertainty methods on the embedded digits data",
        description="Train a deterministic ViT, MC dropout, a deep ensemble, the recommended "
        "Bayesian attention and other attention families on digits over several seeds; report "
        "accuracy, NLL, ECE, Brier, OOD AUROC and timings (mean ± sd, paired differences), with "
        "figures and ArviZ files.",
    )
    s.add_argument("--out", default="bayesattn-study", help="output folder")
    s.add_argument(
        "--force",
        action="store_true",
        help="replace the results in a non-empty output folder (the previous run's results.json, "
        "report.md, *.png and *.nc files are removed first; other files are kept)",
    )
    s.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    s.add_argument("--dataset", default="digits", choices=["digits"], help="dataset")
    s.add_argument("--methods", nargs="+", choices=METHODS, default=None, help="methods to run")
    s.add_argument("--epochs", type=int, default=None)
    s.add_argument("--seed", type=int, default=0, help="first seed")
    s.add_argument(
        "--seeds", type=int, default=None, help="number of seeds (seed, seed+1, …); default 3"
    )
    s.add_argument(
        "--holdout-classes",
        type=int,
        nargs="+",
        default=None,
        metavar="DIGIT",
        help="digit classes held out as out-of-distribution (default 8 9)",
    )
    s.add_argument("--samples", type=int, default=None, help="posterior samples per prediction")
    s.add_argument("--ensemble-size", type=int, default=None)
    s.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the study's models are small, so one thread is fastest "
        "and gives the same numbers on any machine)",
    )
    s.add_argument("--no-progress", action="store_true")
    return p


def _describe(out: Path) -> str:
    from ._study_io import study_status

    return {
        "complete": "it holds a complete study",
        "incomplete": "it holds an unfinished study or other files",
    }.get(study_status(out), "")


def _study(args: argparse.Namespace) -> int:
    import torch

    from .study import StudyConfig, format_table, run_study

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"bayesattn: --out {out} is a file; give a folder", file=sys.stderr)
        return 2
    if args.threads < 0:
        print(f"bayesattn: --threads must be >= 1 (0: torch's default); got {args.threads}",
              file=sys.stderr)
        return 2
    if out.exists() and any(out.iterdir()) and not args.force:
        print(
            f"bayesattn: output folder {out} exists and is not empty ({_describe(out)}); pass "
            "--force to replace the study's results in it",
            file=sys.stderr,
        )
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    kw = {"out": str(out), "seed": args.seed, "dataset": args.dataset}
    kw["progress"] = not args.no_progress
    for name, val in (
        ("methods", args.methods),
        ("epochs", args.epochs),
        ("num_samples", args.samples),
        ("ensemble_size", args.ensemble_size),
        ("seeds", args.seeds),
        ("holdout_classes", args.holdout_classes),
    ):
        if val is not None:
            kw[name] = tuple(val) if name in ("methods", "holdout_classes") else val
    try:
        cfg = StudyConfig.quick(**kw) if args.quick else StudyConfig(**kw)
    except (ValueError, TypeError) as e:
        print(f"bayesattn: {e}", file=sys.stderr)
        return 2
    try:
        from ._study_io import prepare_out_dir

        prepare_out_dir(out)
    except (ValueError, TypeError) as e:
        print(f"bayesattn: {e}", file=sys.stderr)
        return 2
    results = run_study(cfg)
    print()
    print(format_table(results))
    print(f"\nwrote {out / 'results.json'}, {out / 'report.md'} and figures")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "study":
        return _study(args)
    return 1  # pragma: no cover - argparse enforces the sub-command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
