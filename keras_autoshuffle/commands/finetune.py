"""`autoshuffle-finetune`'s work: `main` fine-tunes, exports and reports; `summary` is what
it prints. The command line (`parser`, the options' help) is `keras_autoshuffle_cli.finetune`,
which the installed command runs first: `--help` without TensorFlow.
"""

import sys

from keras_autoshuffle_cli.finetune import parse_args


def _formats(given):
    if given is None:
        return None
    return tuple(f for f in given if f != "none")


def main(argv: list[str] | None = None) -> int:
    """Runs `autoshuffle-finetune` on `argv` (default: the command line); returns 0, or
    exits with status 2 and a one-line error on bad input."""
    args = parse_args(argv)
    from keras_autoshuffle import _startup
    from keras_autoshuffle.finetuning import finetune
    from keras_autoshuffle_cli._terminal import printable

    _startup.find_devices_quietly()  # before TensorFlow first looks for them, noisily
    try:
        report = finetune(
            args.images,
            args.output,
            width=args.width,
            weights=args.weights,
            image_size=args.image_size,
            epochs=args.epochs,
            head_epochs=args.head_epochs,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            label_smoothing=args.label_smoothing,
            class_weights=args.class_weights,
            val_fraction=args.val_fraction,
            split_seed=args.split_seed,
            flip=not args.no_flip,
            seed=args.seed,
            export_formats=_formats(args.export_formats),
            int8=args.int8,
            **({} if args.int8_max_drop is None else {"max_accuracy_drop": args.int8_max_drop}),
            **(
                {} if args.int8_weight_bits is None else {"int8_weight_bits": args.int8_weight_bits}
            ),
            include_preprocessing=args.include_preprocessing,
            cache_images=not args.no_cache,
            skip_damaged=args.skip_damaged,
            overwrite=args.overwrite,
            verbose=args.verbose,
        )
    # Bad input, a refused folder or file, a failed download, a full or read-only disk.
    except (ValueError, OSError) as error:
        print(f"autoshuffle-finetune: error: {printable(str(error))}", file=sys.stderr)
        return 2
    print(summary(report))
    return 0


def summary(report: dict) -> str:
    """The lines printed at the end: validation accuracy, each file written, and each int8
    file's check (its accuracy beside the float model's, the drop and its bound, the top-1
    agreement), written or refused."""
    lines = [
        f"validation accuracy: {report['validation']['accuracy']:.4f} on "
        f"{report['validation']['examples']} images, {len(report['data']['classes'])} classes"
    ]
    for entry in report.get("files", {}).values():
        lines.append(
            f"  {entry['path']}  {entry['size_bytes'] / 1e6:.2f} MB  "
            f"accuracy {entry['accuracy']:.4f}"
        )
    if report.get("preset"):
        lines.append(f"  {report['preset']}  keras-hub preset (from_preset, --weights)")
    from keras_autoshuffle.finetuning.report import int8_check_line

    for key in ("int8", "onnx_int8", "openvino_int8"):
        if report.get(key):
            lines.append(f"  {int8_check_line(key, report[key])}")
            if report[key].get("refused"):
                lines.append(f"    {report[key]['refused']}")
    for name, why in report.get("not_exported", {}).items():
        lines.append(f"  {name} not written: {why}")
    from keras_autoshuffle_cli._terminal import printable

    return "\n".join(printable(line) for line in lines)  # paths and reasons: users' text


if __name__ == "__main__":
    sys.exit(main())
