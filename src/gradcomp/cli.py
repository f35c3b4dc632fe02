"""`gradcomp <verb>` (also `python -m gradcomp <verb>`): the entry point every pipeline rule calls.

Verbs import what they need when they run, so that e.g. `gradcomp draw` does not load torch. A mistake in
what was asked for (a flag's value, a config value, a path, a folder holding a previous run) prints one line,
`gradcomp: error: ...`, and exits with status 2 before any work; `--debug` shows the traceback instead.
Flags are checked as the config keys they set are (`gradcomp.choices`), when the command line is parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from gradcomp import __version__
from gradcomp.choices import DEVICES, choose, device, integer, positive
from gradcomp.config import ConfigError, TrainConfig
from gradcomp.datasets import DATASETS

# what a user can get wrong; other exceptions are bugs and keep their traceback. DatasetNotFound, a missing
# --config file and an output folder that cannot be made or written are OSErrors.
USER_ERRORS = (ConfigError, OSError)


def _info(args: argparse.Namespace) -> None:
    import torch

    from gradcomp._backend import COMPILE_ENV, compile_enabled, interpreter_enabled, triton_available

    cuda = torch.cuda.is_available()
    print(f"gradcomp {__version__}, torch {torch.__version__}")
    print(f"CUDA available: {cuda}" + (f" ({torch.cuda.get_device_name()})" if cuda else ""))
    print(f"triton importable: {triton_available()}; TRITON_INTERPRET: {interpreter_enabled()}")
    route = "Triton kernels" if cuda and triton_available() else "vectorised torch (no CUDA device)"
    cpu = "compiled by torch.compile where it can" if compile_enabled() else f"eager ({COMPILE_ENV}=0)"
    print(f"ops on CUDA tensors run: {route}; ops on CPU tensors run: vectorised torch, {cpu}")


def _check_device(config: TrainConfig) -> None:
    """A CUDA device where there is none fails now, in one line, rather than at the first tensor moved."""
    if not config.device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(config.device.partition(":")[2] or 0) >= count:
        raise ConfigError(
            f"device {config.device}: torch sees {count} CUDA devices (torch.cuda.is_available() is "
            f"{torch.cuda.is_available()}); use --device cpu, or auto (CUDA where available)"
        )


def _train(args: argparse.Namespace) -> None:
    import os

    from gradcomp.config import resolve_config
    from gradcomp.train import TrainingInterrupted, train

    overrides = {key: getattr(args, key) for key in TRAIN_FLAGS}
    overrides["resume"] = args.resume or None
    overrides["overwrite"] = args.overwrite or None
    overrides["progress"] = args.progress
    config = resolve_config(args.config, **overrides)
    _check_device(config)
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
    """Train a job's (run, seed) pairs one after the other in this process; each resumes from its checkpoint
    (a finished one only rewrites its summary). Every pair's config is checked before any trains."""
    import os
    import socket
    from datetime import datetime

    started = datetime.now().astimezone()  # before the imports: the manifest shows the whole start-up
    from gradcomp.config import resolve_config
    from gradcomp.train import train

    items = args.job
    configs = [
        resolve_config(None, **{**item["spec"], "out": item["out"], "resume": True, "progress": False})
        for item in items
    ]
    for config in configs:
        _check_device(config)
    main = os.environ.get("RANK", "0") == "0"  # under torchrun rank 0 alone reports
    trained = []
    for index, (item, config) in enumerate(zip(items, configs, strict=True), start=1):
        began = datetime.now().astimezone()
        summary = train(config)
        ended = datetime.now().astimezone()
        trained.append(
            {
                "run": item["run"],
                "seed": item["seed"],
                "out": item["out"],
                "started": began.isoformat(),
                "finished": ended.isoformat(),
                "steps": summary["steps"],
                "final_test_accuracy": summary["final_test_accuracy"],
            }
        )
        if main:
            seconds = (ended - began).total_seconds()
            accuracy = summary["final_test_accuracy"]
            print(
                f"[{index}/{len(items)}] {config.out}: test accuracy {accuracy:.4f} ({seconds:.1f} s)",
                flush=True,
            )
    if main and args.manifest:
        manifest = {
            "host": socket.gethostname(),
            "started": started.isoformat(),
            "finished": datetime.now().astimezone().isoformat(),
            "items": trained,
        }
        Path(args.manifest).parent.mkdir(parents=True, exist_ok=True)
        Path(args.manifest).write_text(json.dumps(manifest, indent=1) + "\n")


def _experiment(experiment_id: str):
    from gradcomp.experiments import experiments

    registry = experiments()
    if experiment_id not in registry:
        raise ConfigError(f"unknown experiment {experiment_id!r}; known: {', '.join(registry)}")
    return registry[experiment_id]


def _compute(args: argparse.Namespace) -> None:
    import numpy as np

    from gradcomp.analysis.runs import load_groups
    from gradcomp.analysis.tables import write_result

    experiment = _experiment(args.id)
    try:
        section = json.loads(Path(args.settings).read_text()) if args.settings else {}
        settings = experiment.params.from_config(section, f"experiments.{args.id}")
    except ValueError as error:  # not JSON, or a setting the experiment refuses
        raise ConfigError(f"--settings {args.settings}: {error}") from error
    folders: dict[str, dict[int, Path]] = {}
    for run, seed, folder in args.runs:
        folders.setdefault(run, {})[seed] = folder
    groups = load_groups(folders)
    np.random.seed(0)  # anything drawing from numpy's global generator: same inputs, same numbers
    result = experiment.compute(settings, groups)
    record = write_result(result, experiment.id, experiment.title, Path(args.out_dir) / experiment.prefix)
    print(f"{experiment.prefix}:")
    for line in [*record.findings, *(comparison["statement"] for comparison in record.comparisons)]:
        print(f"  {line}")


def _draw(args: argparse.Namespace) -> None:
    import numpy as np

    from gradcomp.analysis.tables import Record
    from gradcomp.plots.style import save_figure

    path = Path(args.numbers)
    record = Record.load(path)
    experiment = _experiment(record.id)
    np.random.seed(0)  # seaborn draws its strip-plot jitter from numpy: same numbers, same picture
    for written in save_figure(experiment.draw(record), record.title, path.with_suffix("")):
        print(written)


def _summary(args: argparse.Namespace) -> None:
    from gradcomp.analysis.summary import write_summary

    print(write_summary(Path(args.figures), args.out))


def _page(args: argparse.Namespace) -> None:
    from gradcomp.page import write_page

    print(write_page(args.out, args.markdown, args.figure))


DEBUG_HELP = "on an error, show the traceback instead of the one-line message"

# flag -> (help, the `gradcomp.choices` check and its bounds, or () where the config checks the value whole);
# each overrides the config key of the same name
TRAIN_FLAGS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "model": ("timm model name (default: per dataset, e.g. resnet18)", ()),
    "dataset": (" | ".join(DATASETS), (choose, tuple(DATASETS))),
    "data_dir": ("dataset location (CIFAR/ImageNet; Fashion-MNIST defaults to the Debian package)", ()),
    "policy": ("NAME[:key=value,...][+NAME...], e.g. prune:sparsity=0.85 or int:bits=5,scheme=bhq", ()),
    "epochs": ("training epochs", (integer, 1)),
    "max_steps": ("stop after this many optimizer steps", (integer, 1)),
    "batch_size": ("global training batch size (split evenly over torchrun's processes)", (integer, 1)),
    "lr": ("peak learning rate (finite, > 0)", (positive,)),
    "seed": ("random seed (data order, init, compression), >= 0", (integer, 0)),
    "out": ("output directory", ()),
    "subset_per_class": ("train on the first N images of each class", (integer, 1)),
    "refresh": ("statistics refresh: step | epoch | K (every K steps)", ()),
    "device": (" | ".join(DEVICES) + " | cuda:K", (device,)),
    "checkpoint_every": ("also checkpoint every N steps (every epoch in any case)", (integer, 1)),
}


def _number(text: str) -> int | float | str:
    """A flag's text as the number it spells, else as it is (for the check to refuse, naming it)."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def _checked(name: str, check: Callable[..., Any], *bounds: Any) -> Callable[[str], Any]:
    """An argparse type: the flag's value checked as the config checks its key, so that a bad value is
    argparse's one-line error."""

    def convert(text: str) -> Any:
        try:
            return check(name, _number(text), *bounds)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


JOB_KEYS = {"run", "seed", "out", "spec"}
JOB_HELP = 'a JSON list of {"run": NAME, "seed": K, "out": FOLDER, "spec": {training config keys}}'


def _job(text: str) -> list[dict[str, Any]]:
    """--job: a JSON list of {"run", "seed", "out", "spec"} items."""
    with contextlib.suppress(json.JSONDecodeError):
        items = json.loads(text)
        if isinstance(items, list) and all(isinstance(i, dict) and set(i) >= JOB_KEYS for i in items):
            return items
    raise argparse.ArgumentTypeError(f"expected {JOB_HELP}, got {text!r}")


def _run_folder(item: str) -> tuple[str, int, Path]:
    """A --runs item, RUN:SEED=FOLDER."""
    key, sep, folder = item.partition("=")
    run, colon, seed = key.rpartition(":")
    if not (sep and colon and seed.isdigit()):
        raise argparse.ArgumentTypeError(f"items are RUN:SEED=FOLDER, got {item!r}")
    return run, int(seed), Path(folder)


class _Parser(argparse.ArgumentParser):
    """argparse, whose mistakes are one line too (not its usage and the verb's name first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gradcomp: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gradcomp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gradcomp {__version__}")
    debug = argparse.ArgumentParser(add_help=False)  # --debug before or after the verb
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    verbs = parser.add_subparsers(dest="verb", required=True)

    verbs.add_parser(
        "info", parents=[debug], help="versions, devices and which implementation the ops use"
    ).set_defaults(run=_info)

    train = verbs.add_parser(
        "train", parents=[debug], help="train a timm model with compressed neural gradients"
    )
    train.add_argument("--config", help="YAML file of training config keys (flags override it)")
    for flag, (text, check) in TRAIN_FLAGS.items():
        kind = _checked(flag, *check) if check else str
        train.add_argument("--" + flag.replace("_", "-"), dest=flag, type=kind, help=text)
    previous = train.add_mutually_exclusive_group()
    previous.add_argument(
        "--resume", action="store_true", help="continue from OUT/checkpoint.pt when it exists (else start)"
    )
    previous.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the files of a previous run in OUT (other files stay), then start",
    )
    train.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    train.set_defaults(run=_train)

    run = verbs.add_parser(
        "run",
        parents=[debug],
        help="a pipeline training job: runs at seeds one after the other (each resumes from its checkpoint)",
    )
    run.add_argument("--job", required=True, type=_job, help=JOB_HELP)
    run.add_argument(
        "--manifest", help="JSON file written at the end: each pair's folder, accuracy and times"
    )
    run.set_defaults(run=_run)

    compute = verbs.add_parser(
        "compute", parents=[debug], help="one experiment's numbers (JSON, CSV, Markdown) from its runs"
    )
    compute.add_argument("id", help="experiment ID, e.g. A5")
    compute.add_argument("--settings", help="JSON file: the experiment's config section (default: none)")
    compute.add_argument(
        "--runs", nargs="*", default=[], type=_run_folder, help="RUN:SEED=FOLDER of finished training runs"
    )
    compute.add_argument("--out-dir", required=True)
    compute.set_defaults(run=_compute)

    draw = verbs.add_parser(
        "draw", parents=[debug], help="one experiment's figure (PNG, PDF) from the JSON its compute wrote"
    )
    draw.add_argument("numbers", help="the experiment's <ID>_<slug>.json")
    draw.set_defaults(run=_draw)

    summary = verbs.add_parser(
        "summary", parents=[debug], help="SUMMARY.md from every experiment's headline numbers"
    )
    summary.add_argument("--figures", required=True, help="folder of the experiments' outputs")
    summary.add_argument("--out", required=True, help="Markdown file to write")
    summary.set_defaults(run=_summary)

    page = verbs.add_parser(
        "page", parents=[debug], help="a report page (HTML) of a Markdown file, with a figure embedded"
    )
    page.add_argument("markdown", help="SUMMARY.md or an experiment's <ID>_<slug>.md")
    page.add_argument("--figure", help="PNG to show after the page's title")
    page.add_argument("--out", required=True, help="HTML file to write")
    page.set_defaults(run=_page)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        print(f"gradcomp: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
