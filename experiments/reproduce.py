"""Reproduce the shape of the paper's results at small scale, with its pictures.

    python -m experiments.reproduce --quick --output docs/example_report --jobs 2
    python -m experiments.reproduce --study fashion_mnist --output docs/fashion_mnist --jobs 2
    python -m experiments.reproduce --dataset cifar10 --output runs/reproduce   # GPU hours

The default (and --quick) writes into --output: report.md (tables beside the paper's
numbers, pictures linked), results.json, pmat.png, smat.png, penaltyplot.png,
roundplot.png, and runs/ (one training run per row: model.keras, history.csv,
report.json, logs/, result.json). `--study fashion_mnist` runs the multi-seed study on
Fashion-MNIST (see docs/fashion_mnist/report.md). Every run's row is kept in
runs/<name>/result.json: a rerun skips finished runs and resumes a killed one.
"""

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _given(args, names):
    """The flags of `names` that were given (lists as tuples)."""
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}


def _settings(defaults, given, parser):
    """`defaults` with the `given` flags; an invalid value ends as argparse's errors do."""
    try:
        return dataclasses.replace(defaults, **given)
    except ValueError as error:
        parser.error(str(error))


def _run(function, *args, **kwargs):
    """`function(...)`; a folder or file it refuses, missing data or a diverged run ends
    the program with its message, as the training scripts do."""
    from keras_autoshuffle.data import DataMissingError
    from keras_autoshuffle.training import RunDirectoryError, TrainingDivergedError

    try:
        return function(*args, **kwargs)
    except (RunDirectoryError, TrainingDivergedError, DataMissingError) as error:
        sys.exit(f"error: {error}")


def _study(args, parser):
    from experiments import study

    names = ("epochs", "lambdas", "penalty", "harden_at_epoch", "max_train_examples", "seeds")
    given = _given(args, (*names, "arms", "finalists", "more_seeds"))
    # A flag that differs from the recorded study is named first: the settings check
    # below would otherwise blame what it contradicts (e.g. harden_at_epoch for --epochs).
    differences = _run(study.recorded_differences, given, args.output)
    if differences:
        parser.error(str(study.other_settings(args.output, differences)))
    settings = _settings(study.StudySettings(), given, parser)
    results = _run(study.study, settings, args.output, jobs=args.jobs, train=not args.report_only)
    print(
        f"Report: {os.path.join(args.output, 'report.md')} ({len(results['runs'])} of "
        f"{results['runs_planned']} runs)"
    )
    return results


def main(argv=None):
    # Imported here, after TF_CPP_MIN_LOG_LEVEL is set.
    from keras_autoshuffle_cli._help import positive_int_argument as positive

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--dataset", choices=("digits", "cifar10"), default=None)
    parser.add_argument("--quick", action="store_true", help="digits-sized settings (~15 min)")
    parser.add_argument("--study", choices=("fashion_mnist",), default=None)
    parser.add_argument("--epochs", type=positive, default=None)
    parser.add_argument("--lambdas", type=float, nargs="+", default=None)
    parser.add_argument("--penalty", type=float, default=None, help="the study's lambda")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="the study's seeds")
    parser.add_argument("--harden-at-epoch", type=positive, default=None)
    parser.add_argument(
        "--arms", nargs="+", default=None, help="the study's arms screened on v2, in run order"
    )
    parser.add_argument(
        "--finalists",
        nargs="+",
        default=None,
        help="the arms of the verdict (v1 and v2, seeds 0-4)",
    )
    parser.add_argument(
        "--more-seeds",
        type=int,
        nargs="+",
        default=None,
        help="more seeds of the verdict for v2 only (its manual net and the finalists)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="the study's report from the runs finished so far (trains nothing)",
    )
    parser.add_argument("--max-train-examples", type=positive, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--jobs",
        type=positive,
        default=1,
        help="trainings at once, one process each, at most the number of CPUs (default 1)",
    )
    args = parser.parse_args(argv)
    cpus = os.cpu_count() or 1
    if args.jobs > cpus:  # each job is a process with its TensorFlow threads
        parser.error(
            f"--jobs must be at most the number of CPUs ({cpus}). Received: --jobs {args.jobs}"
        )
    if args.study:
        # The study has its own data set and seeds: a flag it would ignore is refused.
        for flag, value in (("--seed", args.seed), ("--dataset", args.dataset)):
            if value is not None:
                parser.error(
                    f"{flag} does not apply to --study (it has its data set; use --seeds). "
                    f"Received: {flag} {value}"
                )
        return _study(args, parser)
    if args.report_only or args.arms or args.finalists or args.seeds or args.more_seeds:
        parser.error(
            "--report-only, --arms, --finalists, --seeds and --more-seeds apply to --study only"
        )
    from experiments import paper

    dataset = args.dataset or "digits"
    names = ("epochs", "lambdas", "harden_at_epoch", "max_train_examples", "seed")
    defaults = paper.quick(dataset) if args.quick else paper.full(dataset)
    settings = _settings(defaults, _given(args, names), parser)
    results = _run(paper.reproduce, settings, args.output, jobs=args.jobs)
    print(f"Report: {os.path.join(args.output, 'report.md')} ({results['time'] / 60:.1f} min)")
    return results


if __name__ == "__main__":
    main()
