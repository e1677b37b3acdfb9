"""The ``bayesattn`` command. ``bayesattn study`` runs the uncertainty study."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser", "method_listing"]


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default: ``(default: X)`` where the option has a plain
    default; an option whose default depends on the preset says so in its own help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or not action.option_strings
            or any(action.default is v for v in (None, False, argparse.SUPPRESS))
        ):
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="bayesattn", description="Bayesian attention toolkit", formatter_class=_HelpFormatter
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _add_study_parser(sub)
    return p


def _add_study_parser(sub: Any) -> None:
    """``bayesattn study`` and its options, each help with its default (from the presets)."""
    from .study import DATASETS, METHODS, StudyConfig

    d, q, f = StudyConfig(), StudyConfig.quick(), StudyConfig.full()
    s = sub.add_parser(
        "study",
        help="train and compare uncertainty methods (digits, MNIST-1D, fortunes)",
        formatter_class=_HelpFormatter,
        description="Train and score every uncertainty method (deterministic, temperature "
        "scaling, MC dropout, deep ensembles and their size curve, kNN and relative-Mahalanobis "
        "feature scores, last-layer Laplace, the last-layer and every-layer Bayesian "
        "attentions, the post-hoc GP and density reads) on held-out class pairs × seeds; report "
        "means with 95% intervals, paired differences (Holm-corrected marks), AUROCs by each "
        "method's primary score near / far / shift, selective prediction, corruption curves, "
        "costs, with figures and ArviZ files. Default: the digits, "
        f"{len(d.pairs())} held-out pairs × {d.seeds} seeds (about 4 minutes with --jobs 2, 7 with one job, on an idle 2-core "
        "machine); --protocol full: the digits, MNIST-1D and the fortunes tokens (Debian's "
        "fortunes package), 5 pairs × 5 seeds (about 2 h 45 min on 2 cores; split it by --seed/--seeds "
        "and --merge); --quick: a smoke run that checks "
        "everything runs (its numbers are not results). --list-methods describes every method.",
    )
    s.add_argument("--out", default=d.out, help="output folder (a folder of its own)")
    s.add_argument(
        "--force",
        action="store_true",
        help="replace the study in the output folder (one of other settings is refused without "
        "it; one of the same settings is resumed): only the files its manifest lists are "
        "removed; a folder with other files and no manifest is refused",
    )
    s.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run of a minute or two ({q.seeds} seeds, {q.epochs} epochs, held-out "
        f"classes {' '.join(map(str, q.holdout_classes))}): checks that everything runs; its "
        "numbers are not results, and the report says so",
    )
    s.add_argument("--protocol", choices=["default", "full"], default="default",
                   help="full: four datasets, 5 held-out pairs, 5 seeds, 2 jobs (the digits, "
                   "MNIST-1D and fortunes took 2 h 45 min on 2 cores; WordNet adds an estimated "
                   "8-10 h; docs/which-attention.md)")  # fmt: skip
    s.add_argument("--dataset", default=None, choices=list(DATASETS),
                   help=f"dataset (default: {d.dataset}; --protocol full runs "
                   f"{', '.join(f.dataset_list)}; fortunes: tokens, needs apt-get install "
                   "fortunes)")  # fmt: skip
    s.add_argument("--methods", nargs="+", choices=list(METHODS), default=None, metavar="METHOD",
                   help=f"methods to run (default: the {len(d.methods)} of the default "
                   f"protocol; --protocol full: {len(f.methods)}; --list-methods lists and "
                   "describes them all)")  # fmt: skip
    s.add_argument("--list-methods", action="store_true",
                   help="print every method with its description and the protocols that run "
                   "it, then exit")  # fmt: skip
    _add_run_options(s, d, q, f)


def _add_run_options(s: argparse.ArgumentParser, d: Any, q: Any, f: Any) -> None:
    """The options of a study run's size, seeds, workers and merging."""
    from .study import MODEL_DEFAULTS
    from .study.config import MAX_SEED

    epochs = ", ".join(f"{k} {v['epochs']}" for k, v in MODEL_DEFAULTS.items())
    s.add_argument("--epochs", type=int, default=None,
                   help=f"training epochs (default: by dataset, {epochs}; --quick: "
                   f"{q.epochs})")  # fmt: skip
    s.add_argument("--seed", type=int, default=d.seed,
                   help=f"first seed (0 .. {MAX_SEED})")  # fmt: skip
    s.add_argument("--seeds", type=int, default=None,
                   help=f"number of seeds (seed, seed+1, …) (default: {d.seeds}; --quick: "
                   f"{q.seeds}; --protocol full: {f.seeds})")  # fmt: skip
    g = s.add_mutually_exclusive_group()
    g.add_argument("--holdout-classes", type=int, nargs="+", default=None, metavar="CLASS",
                   help="one held-out class set (e.g. 8 9) instead of the rotation (default: "
                   f"the rotation; --quick: {' '.join(map(str, q.holdout_classes))})")  # fmt: skip
    g.add_argument("--holdout-rotation", type=int, default=None, metavar="K",
                   help=f"rotate over K disjoint held-out pairs (default: {len(d.pairs())}; "
                   f"--protocol full: {f.holdout_rotation})")  # fmt: skip
    s.add_argument(
        "--samples",
        type=int,
        default=None,
        help=f"posterior samples per prediction (default: {d.num_samples})",
    )
    s.add_argument("--ensemble-size", type=int, default=None,
                   help=f"ensemble members (default: {d.ensemble_size}; --quick: "
                   f"{q.ensemble_size})")  # fmt: skip
    s.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default: 1: the study's models are small, so one thread is "
        "fastest; the numbers repeat bit for bit on the same machine and software, and may "
        "differ in the last digits on another CPU whose kernels round differently)",
    )
    s.add_argument(
        "--jobs",
        type=_positive_int("--jobs"),
        default=None,
        help=f"runs in parallel worker processes on this machine (default: {d.jobs}; --protocol "
        f"full: {f.jobs}; `make study`: every core); the numbers do not change, only the wall "
        "time (each worker uses --threads torch threads)",
    )
    s.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the runs on a running Dask scheduler (e.g. tcp://head:8786; pip install "
        "bayesattn[cluster]); its workers must see --out (default: this machine)",
    )
    s.add_argument(
        "--resume",
        action="store_true",
        help="continue the study in --out (its finished runs are kept, the others run); "
        "rerunning the same command does the same, --resume also refuses a folder with no "
        "study to continue",
    )
    s.add_argument(
        "--any-version",
        action="store_true",
        help="resume or merge runs made by another bayesattn version or git commit (refused "
        "otherwise)",
    )
    s.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="instead of running: merge finished studies of the same settings into --out, "
        "pooled again: a method added later on the same runs, or the same methods on other "
        "seeds (a protocol split over machines); a method in several must agree; with "
        "--methods, only those are kept (default: run, not merge)",
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bars")


def _positive_int(flag: str) -> Any:
    """An argparse type: an int >= 1 (the error names ``flag`` and what it got)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an int >= 1; got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be an int >= 1; got {v}")
        return v

    return parse


def method_listing() -> str:
    """Every registered study method: its name, the protocols that run it and its description."""
    from .study import DEFAULT_METHODS, FULL_METHODS, METHODS, get_method

    width = max(len(m) for m in METHODS)
    lines = [f"{'method':{width}}  {'runs in':13}  description"]
    for name in METHODS:
        runs = "full" if name in FULL_METHODS else "by name"
        runs = "default, full" if name in DEFAULT_METHODS else runs
        lines.append(f"{name:{width}}  {runs:13}  {get_method(name).description}")
    return "\n".join(lines)


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

    from .study import format_table

    if args.list_methods:
        print(method_listing())
        return 0
    if args.threads < 0:
        print(f"bayesattn: --threads must be >= 1 (0: torch's default); got {args.threads}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.merge:
        return _merge(args, format_table)
    try:
        cfg, executor = _config(args), None
        _check_folder(args, cfg)  # before anything is written or any worker is started
        if args.scheduler is not None:
            executor = _dask_executor(args)
    except (ValueError, TypeError, ImportError) as e:
        print(f"bayesattn: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if cfg.smoke:
        print("bayesattn: a smoke run (--quick): it checks that the study runs end to end; "
              "its numbers are not results (run without --quick for those)")  # fmt: skip
    try:
        results = _run(cfg, executor, args)
    except ImportError as e:  # a method's or dataset's optional dependency is missing
        print(f"bayesattn: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nbayesattn: interrupted; the finished runs are kept in {args.out} (rerun the "
              "same command to resume)", file=sys.stderr)  # fmt: skip
        return 130
    print()
    print(format_table(results))
    out = Path(args.out)
    print(f"\nwrote {out / 'results.json'}, {out / 'report.md'} and figures")
    return 0


def _merge(args: argparse.Namespace, format_table: Any) -> int:
    from ._study_io import prepare_out_dir
    from .study import merge_studies

    for flag, given in (("--scheduler", args.scheduler), ("--jobs", args.jobs),
                        ("--resume", args.resume)):  # fmt: skip
        if given:
            print(f"bayesattn: {flag} runs a study; --merge only merges finished ones",
                  file=sys.stderr)  # fmt: skip
            return 2
    try:
        prepare_out_dir(args.out, force=args.force)
        results = merge_studies(args.merge, args.out, any_version=args.any_version,
                                methods=args.methods)  # fmt: skip
    except (ValueError, TypeError) as e:
        print(f"bayesattn: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    print(f"\nwrote {Path(args.out) / 'results.json'} and {Path(args.out) / 'report.md'}")
    return 0


def _check_folder(args: argparse.Namespace, cfg: Any) -> None:
    """Refuse, before any work, a folder the study cannot use (``ValueError``)."""
    from .study.protocol import study_config_dict
    from .study.runfiles import plan_study

    if args.scheduler is not None and args.jobs is not None:
        raise ValueError("give --scheduler (a Dask cluster's workers) or --jobs (local "
                         "workers), not both")  # fmt: skip
    plan = plan_study(study_config_dict(cfg), force=args.force, any_version=args.any_version)
    if args.resume and not plan.resume:
        raise ValueError(f"--resume: {args.out} holds no study of these settings to continue")


def _dask_executor(args: argparse.Namespace) -> Any:
    """The executor of a running Dask scheduler at ``--scheduler`` (``ImportError`` without
    ``distributed``; ``ValueError`` when it cannot be reached)."""
    try:
        from distributed import Client
    except ImportError as e:
        raise ImportError("--scheduler needs Dask: pip install 'bayesattn[cluster]'") from e
    try:
        client = Client(args.scheduler, timeout=30)
    except (OSError, TimeoutError) as e:
        raise ValueError(f"--scheduler {args.scheduler}: cannot reach it ({e})") from e
    return client.get_executor()


def _run(cfg: Any, executor: Any, args: argparse.Namespace) -> Any:
    from .study import run_study

    return run_study(cfg, executor, force=args.force, any_version=args.any_version)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "study":
        return _study(args)
    return 1  # pragma: no cover - argparse enforces the sub-command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
