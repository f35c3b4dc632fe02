"""`gradcomp <verb>` (also `python -m gradcomp <verb>`): the entry point every pipeline rule calls."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gradcomp import __version__
from gradcomp._backend import COMPILE_ENV, compile_enabled, interpreter_enabled, triton_available
from gradcomp.analysis.tables import write_table


def _info(args: argparse.Namespace) -> None:
    cuda = torch.cuda.is_available()
    print(f"gradcomp {__version__}, torch {torch.__version__}")
    print(f"CUDA available: {cuda}" + (f" ({torch.cuda.get_device_name()})" if cuda else ""))
    print(f"triton importable: {triton_available()}; TRITON_INTERPRET: {interpreter_enabled()}")
    route = "Triton kernels" if cuda and triton_available() else "vectorised torch (no CUDA device)"
    cpu = "compiled by torch.compile where it can" if compile_enabled() else f"eager ({COMPILE_ENV}=0)"
    print(f"ops on CUDA tensors run: {route}; ops on CPU tensors run: vectorised torch, {cpu}")


def _theory(args: argparse.Namespace) -> None:
    from gradcomp import fp_theory

    switch_rows, mse_rows = [], []
    jobs = [(bits, kind) for bits in args.bits for kind in args.kinds]
    for bits, kind in tqdm(jobs, desc="FP theory", unit="format family"):
        for exp_bits, sigma in fp_theory.switch_points(bits, kind, sigma_max=args.sigma_max).items():
            switch_rows.append({"bits": bits, "grid": kind, "exp_bits": exp_bits, "from_sigma_log2": sigma})
        sigmas = torch.tensor(args.sigmas, dtype=torch.float64)
        for exp_bits, mse in fp_theory.mse_by_exp_bits(bits, sigmas, kind).items():
            for sigma, value in zip(args.sigmas, mse.tolist(), strict=True):
                mse_rows.append(
                    {
                        "bits": bits,
                        "grid": kind,
                        "sigma_log2": sigma,
                        "exp_bits": exp_bits,
                        "relative_mse": value,
                    }
                )
    write_table(
        switch_rows,
        args.switch_points,
        "Sigma (log2) from which E exponent bits minimise the relative MSE at the optimal scale",
    )
    write_table(mse_rows, args.mse, "Relative quantization MSE of a lognormal at the MSE-optimal scale")


def _sparsity(args: argparse.Namespace) -> None:
    from gradcomp.analysis.synthetic import achieved_sparsity_rows

    rows = achieved_sparsity_rows(args.sigmas, args.targets, args.zero_fractions, args.numel, args.seed)
    write_table(
        rows, args.out, "Target vs achieved sparsity of stochastic pruning on synthetic lognormal gradients"
    )


def _train(args: argparse.Namespace) -> None:
    import os

    from gradcomp.train import TrainingInterrupted, resolve_config, train

    overrides = {key: getattr(args, key) for key in TRAIN_FLAGS}
    overrides["resume"] = args.resume or None
    overrides["progress"] = args.progress
    config = resolve_config(args.config, **overrides)
    try:
        summary = train(config)
    except TrainingInterrupted as stop:  # SIGTERM/SIGINT: a message, not a traceback (exit status 1)
        raise SystemExit(f"{config.out}: {stop}") from None
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 alone reports
        return
    accuracy = summary["final_test_accuracy"]
    sparsity = summary["gradient_sparsity"]
    print(
        f"{config.out}: test accuracy {accuracy:.4f} after {summary['steps']} steps"
        + (f", gradient sparsity {sparsity:.4f}" if sparsity is not None else "")
    )


def _run(args: argparse.Namespace) -> None:
    from gradcomp.train import resolve_config, train

    spec = json.loads(args.spec)
    config = resolve_config(None, **{**spec, "out": args.out, "resume": True, "progress": False})
    summary = train(config)
    print(f"{config.out}: test accuracy {summary['final_test_accuracy']:.4f}")


def _figure(args: argparse.Namespace) -> None:
    from gradcomp.plots import FigureInputs, experiments

    registry = experiments()
    if args.id not in registry:
        raise SystemExit(f"unknown experiment {args.id!r}; known: {', '.join(registry)}")
    experiment = registry[args.id]
    runs = dict(item.split("=", 1) for item in args.runs)
    inputs = FigureInputs(
        {name: Path(folder) for name, folder in runs.items()},
        json.loads(args.params),
        Path(args.out_dir),
        experiment.prefix,
    )
    np.random.seed(0)  # seaborn draws its strip-plot jitter from numpy: same inputs, same picture
    headline = experiment.make(inputs)
    print(f"{experiment.prefix}: {headline}")


def _summary(args: argparse.Namespace) -> None:
    from gradcomp.analysis.summary import write_summary

    print(write_summary(Path(args.figures), args.out))


# flag -> (type, help); each overrides the config key of the same name
TRAIN_FLAGS = {
    "model": (str, "timm model name (default: per dataset, e.g. resnet18)"),
    "dataset": (str, "fashion-mnist | cifar10 | cifar100 | imagenet | synthetic"),
    "data_dir": (str, "dataset location (CIFAR/ImageNet; Fashion-MNIST defaults to the Debian package)"),
    "policy": (str, "NAME[:key=value,...][+NAME...], e.g. prune:sparsity=0.85 or int:bits=5,scheme=bhq"),
    "epochs": (int, "training epochs"),
    "max_steps": (int, "stop after this many optimizer steps"),
    "batch_size": (int, "global training batch size (under torchrun split evenly over the processes)"),
    "lr": (float, "peak learning rate"),
    "seed": (int, "random seed (data order, init, compression)"),
    "out": (str, "output directory"),
    "subset_per_class": (int, "train on the first N images of each class"),
    "refresh": (str, "statistics refresh: step | epoch | K (every K steps)"),
    "device": (str, "auto | cpu | cuda"),
    "checkpoint_every": (int, "also checkpoint every N steps (every epoch in any case)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradcomp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gradcomp {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True)

    verbs.add_parser("info", help="versions, devices and which implementation the ops use").set_defaults(
        run=_info
    )

    theory = verbs.add_parser(
        "theory", help="analytic FP quantization MSE of a lognormal and optimal E/M split"
    )
    theory.add_argument("--bits", type=int, nargs="+", default=[4, 5, 6, 8])
    theory.add_argument(
        "--kinds", nargs="+", default=["ideal", "saturate", "inf"], choices=["ideal", "saturate", "inf"]
    )
    theory.add_argument("--sigmas", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0])
    theory.add_argument("--sigma-max", type=float, default=20.0)
    theory.add_argument(
        "--switch-points", required=True, help="CSV path (a Markdown copy is written beside it)"
    )
    theory.add_argument("--mse", required=True, help="CSV path (a Markdown copy is written beside it)")
    theory.set_defaults(run=_theory)

    sparsity = verbs.add_parser(
        "sparsity", help="target vs achieved pruning sparsity on synthetic lognormal data"
    )
    sparsity.add_argument("--sigmas", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    sparsity.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.85, 0.9, 0.95])
    sparsity.add_argument("--zero-fractions", type=float, nargs="+", default=[0.0, 0.3])
    sparsity.add_argument("--numel", type=int, default=1 << 18)
    sparsity.add_argument("--seed", type=int, default=0)
    sparsity.add_argument("--out", required=True, help="CSV path (a Markdown copy is written beside it)")
    sparsity.set_defaults(run=_sparsity)

    train = verbs.add_parser("train", help="train a timm model with compressed neural gradients")
    train.add_argument("--config", help="YAML file of training config keys (flags override it)")
    for flag, (kind, text) in TRAIN_FLAGS.items():
        train.add_argument("--" + flag.replace("_", "-"), dest=flag, type=kind, help=text)
    train.add_argument(
        "--resume", action="store_true", help="continue from OUT/checkpoint.pt when it exists (else start)"
    )
    train.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    train.set_defaults(run=_train)

    run = verbs.add_parser("run", help="one pipeline training run (resumes from its checkpoint if any)")
    run.add_argument("--spec", required=True, help="JSON mapping of training config keys")
    run.add_argument("--out", required=True, help="output directory")
    run.set_defaults(run=_run)

    figure = verbs.add_parser("figure", help="one experiment's figure, table and headline numbers")
    figure.add_argument("id", help="experiment ID, e.g. A5")
    figure.add_argument("--runs", nargs="*", default=[], help="NAME=FOLDER of finished training runs")
    figure.add_argument("--params", default="{}", help="JSON: the experiment's config section")
    figure.add_argument("--out-dir", required=True)
    figure.set_defaults(run=_figure)

    summary = verbs.add_parser("summary", help="SUMMARY.md from every experiment's headline numbers")
    summary.add_argument("--figures", required=True, help="folder of the experiments' outputs")
    summary.add_argument("--out", required=True, help="Markdown file to write")
    summary.set_defaults(run=_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
