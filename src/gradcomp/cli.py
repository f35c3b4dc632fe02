"""`gradcomp <verb>` (also `python -m gradcomp <verb>`): the entry point every pipeline rule calls.

Verbs import what they need when they run, so that e.g. `gradcomp draw` does not load torch. A mistake in
what was asked for (a flag's value, a config value, a path, a folder holding a previous run, a file that is
not what the verb reads, runs an experiment cannot use, an output that cannot be written) prints one line,
`gradcomp: error: ...`, and exits with status 2 before any work; `--debug` shows the traceback instead.
Flags are checked as the config keys they set are (`gradcomp.choices`), when the command line is parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from gradcomp import __version__
from gradcomp.choices import DEVICES, choose, device, integer, positive
from gradcomp.training.config import ConfigError, TrainConfig
from gradcomp.training.datasets import DATASETS

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


def _writable(path: str | Path, what: str, folder: bool = False) -> None:
    """An output that cannot be written fails before the work that makes it: `path` (a file, or with
    `folder` a folder; made with its parents where missing) must lie in a writable folder."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise ConfigError(f"{what} {path} is {'not ' * folder}a folder")
    inside = path if folder else path.parent
    nearest = next(p for p in (inside, *inside.parents) if p.exists())
    if not nearest.is_dir() or not os.access(nearest, os.W_OK):
        raise ConfigError(f"{what} {path}: {nearest} is not a writable folder")


def _train(args: argparse.Namespace) -> None:
    from gradcomp.training.config import resolve_config
    from gradcomp.training.train import TrainingInterrupted, train

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
    import socket
    from datetime import datetime

    started = datetime.now().astimezone()  # before the imports: the manifest shows the whole start-up
    from gradcomp.training.config import resolve_config
    from gradcomp.training.train import check_model_config, train

    items = args.job
    configs = []
    for index, item in enumerate(items, start=1):
        try:
            spec = {**item["spec"], "out": item["out"], "resume": True, "progress": False}
            configs.append(resolve_config(None, **spec))
            _check_device(configs[-1])
            check_model_config(configs[-1])
        except ConfigError as error:
            raise ConfigError(f"--job item {index} ({item['run']}, seed {item['seed']}): {error}") from error
    if args.manifest:
        _writable(args.manifest, "--manifest")
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


def _read_runs(items: list[tuple[str, int, Path]]) -> dict:
    """--runs as run name -> RunGroup, each item's folder read (config.yaml, summary.json, its policy) and
    refused in one line naming the item where it is no finished training run."""
    import yaml

    from gradcomp.analysis.runs import RunGroup, load_run

    read: dict[str, dict[int, Any]] = {}
    for name, seed, folder in items:
        item = f"--runs {name}:{seed}={folder}"
        if seed in read.get(name, {}):
            raise ConfigError(f"{item}: run {name} at seed {seed} is given twice")
        try:
            run = load_run(name, seed, folder)
            run.policy  # noqa: B018 (parsed now, so that a bad one names its folder)
        except FileNotFoundError as error:
            raise ConfigError(f"{item}: no {error.filename}: not a finished training run") from None
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as error:
            raise ConfigError(
                f"{item}: not a training run's folder ({type(error).__name__}: {error})"
            ) from None
        read.setdefault(name, {})[seed] = run
    groups = {name: RunGroup(name, dict(sorted(runs.items()))) for name, runs in read.items()}
    for group in groups.values():
        first = group.first
        for run in group.runs.values():
            if (run.policy, run.config.get("forward_bits")) != (first.policy, group.forward_bits):
                raise ConfigError(
                    f"--runs {group.name}: seed {run.seed} ({run.folder}) and seed {first.seed} "
                    f"({first.folder}) were trained differently (policy, forward_bits); a run's seeds differ "
                    "only in the seed"
                )
    return groups


def _check_runs(experiment: Any, settings: Any, groups: dict) -> None:
    """The runs and seeds the experiment's settings name are all in --runs, each trained as it needs."""
    given = ", ".join(groups) or "none"
    missing = [run for run in settings.runs_read(list(groups)) if run not in groups]
    if missing:
        raise ConfigError(
            f"{experiment.id} reads runs {missing} (named by its settings), which --runs does not give "
            f"(given: {given}); add a RUN:SEED=FOLDER item for each seed of each"
        )
    chosen = getattr(settings, "seeds", None) if settings.reads_checkpoints else None
    for run in settings.runs_read(list(groups)) if chosen is not None else ():
        absent = sorted(set(chosen) - set(groups[run].seeds))
        if absent:
            raise ConfigError(
                f"{experiment.id} measures run {run} at seeds {list(chosen)} (setting seeds); --runs gives "
                f"no folder for seeds {absent}"
            )
    wrong = experiment.mistrained(
        settings, lambda run: (groups[run].policy, groups[run].forward_bits) if run in groups else None
    )
    if wrong:
        raise ConfigError(f"{experiment.id} setting {wrong[0]}")


def _compute(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from gradcomp.analysis.tables import write_result

    experiment = _experiment(args.id)
    torch.set_num_threads(args.threads)
    try:
        section = json.loads(Path(args.settings).read_text()) if args.settings else {}
        settings = experiment.params.from_config(section, f"experiments.{args.id}")
    except ValueError as error:  # not JSON, or a setting the experiment refuses
        where = f"--settings {args.settings}" if args.settings else "no --settings given"
        raise ConfigError(f"{where}: {error}") from error
    groups = _read_runs(args.runs)
    _check_runs(experiment, settings, groups)
    _writable(args.out_dir, "--out-dir", folder=True)
    np.random.seed(0)  # anything drawing from numpy's global generator: same inputs, same numbers
    result = experiment.compute(settings, groups)
    record = write_result(result, experiment.id, experiment.title, Path(args.out_dir) / experiment.prefix)
    print(f"{experiment.prefix}:")
    for line in [*record.findings, *(comparison["statement"] for comparison in record.comparisons)]:
        print(f"  {line}")


def _record(path: Path) -> Any:
    """The Record of an experiment's <ID>_<slug>.json, or one line saying why the file is none."""
    from gradcomp.analysis.tables import Record

    try:
        return Record.load(path)
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise ConfigError(
            f"{path} is not an experiment's numbers (the JSON gradcomp compute writes): "
            f"{type(error).__name__}: {error}"
        ) from None


def _draw(args: argparse.Namespace) -> None:
    import numpy as np

    from gradcomp.plots.lint import lint
    from gradcomp.plots.style import save_figure, titled

    path = Path(args.numbers)
    record = _record(path)
    experiment = _experiment(record.id)
    _writable(path.with_suffix(".png"), "the figure")
    np.random.seed(0)  # seaborn draws its strip-plot jitter from numpy: same numbers, same picture
    figure = titled(experiment.draw(record), record.title)
    for defect in lint(figure):
        print(f"{path.name}: figure lint: {defect}", file=sys.stderr)
    for written in save_figure(figure, path.with_suffix("")):
        print(written)


def _figures(folder: str) -> Path:
    """--figures, a folder holding experiments' JSONs, each readable; a folder that holds none is refused (a
    summary of nothing would look like one whose experiments all came out empty)."""
    from gradcomp.experiments import experiments

    figures = Path(folder)
    if not figures.is_dir():
        raise ConfigError(f"--figures {figures} is not a folder")
    found = [path for e in experiments().values() if (path := figures / f"{e.prefix}.json").is_file()]
    if not found:
        raise ConfigError(
            f"--figures {figures} holds no experiment's numbers (<ID>_<slug>.json, which gradcomp compute "
            "writes): nothing to summarise"
        )
    for path in found:
        _record(path)
    return figures


def _summary(args: argparse.Namespace) -> None:
    """SUMMARY.md of the experiments' JSONs in --figures."""
    from gradcomp.analysis.summary import write_summary

    figures = _figures(args.figures)
    _writable(args.out, "--out")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    print(write_summary(figures, args.out))


CLAIMS = "claims"  # the README's generated section: <!-- claims:begin --> ... <!-- claims:end -->


def _readme(args: argparse.Namespace) -> None:
    """The claims at a glance of --figures written between the README's claims markers (whatever stood there
    is replaced; the rest of the file is kept), each claim linked to its block in --figures' SUMMARY.md."""
    from gradcomp.analysis.summary import claims_at_a_glance
    from gradcomp.analysis.tables import fill_section

    readme = Path(args.readme)
    try:
        text = readme.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{readme}: cannot be read as text ({type(error).__name__}: {error})") from None
    try:
        fill_section(text, CLAIMS, "")  # the markers checked before any work
    except ValueError as error:
        raise ConfigError(f"{readme} {error}: the claims table goes between them") from None
    figures = _figures(args.figures)
    _writable(readme, "the README")
    link = Path(os.path.relpath(figures / "SUMMARY.md", readme.resolve().parent)).as_posix()
    readme.write_text(fill_section(text, CLAIMS, claims_at_a_glance(figures, summary_link=link)))
    print(readme)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _page(args: argparse.Namespace) -> None:
    from gradcomp.page import write_page

    if args.figure is not None:
        with Path(args.figure).open("rb") as file:
            if file.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                raise ConfigError(f"--figure {args.figure} is not a PNG file")
    _writable(args.out, "--out")
    try:
        print(write_page(args.out, args.markdown, args.figure))
    except UnicodeDecodeError as error:  # raised as the Markdown is read, before anything is written
        raise ConfigError(f"{args.markdown} is not UTF-8 text: {error}") from None


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


JOB_HELP = 'a JSON list of {"run": NAME, "seed": K, "out": FOLDER, "spec": {training config keys}}'


def _name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


# each --job item's keys: what its value must be, and the check
JOB_ITEM: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "run": ("a name", _name),
    "seed": ("an integer >= 0", lambda seed: type(seed) is int and seed >= 0),
    "out": ("a folder", _name),
    "spec": ("a mapping of training config keys", lambda spec: isinstance(spec, dict)),
}


def _job(text: str) -> list[dict[str, Any]]:
    """--job: a non-empty JSON list of {"run", "seed", "out", "spec"} items, each value of its kind."""
    items = None
    with contextlib.suppress(json.JSONDecodeError):
        items = json.loads(text)
    if not (
        isinstance(items, list)
        and items
        and all(isinstance(i, dict) and set(i) >= set(JOB_ITEM) for i in items)
    ):
        raise argparse.ArgumentTypeError(f"expected {JOB_HELP}, got {text!r}")
    for index, item in enumerate(items, start=1):
        for key, (kind, right) in JOB_ITEM.items():
            if not right(item[key]):
                raise argparse.ArgumentTypeError(f"item {index}: {key} must be {kind}, got {item[key]!r}")
    return items


def _run_folder(item: str) -> tuple[str, int, Path]:
    """A --runs item, RUN:SEED=FOLDER."""
    key, sep, folder = item.partition("=")
    run, colon, seed = key.rpartition(":")
    if not (sep and colon and seed.isdigit() and run and folder):
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
    compute.add_argument(
        "--threads",
        type=_checked("--threads", integer, 1),
        default=1,
        help="torch's intra-op threads (default 1, as training runs: a reduction split over threads sums in "
        "another order, so the numbers would depend on the machine's cores)",
    )
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

    readme = verbs.add_parser(
        "readme",
        parents=[debug],
        help="the claims at a glance of --figures, written between a README's claims markers",
    )
    readme.add_argument(
        "readme", help=f"Markdown file holding the lines <!-- {CLAIMS}:begin --> and <!-- {CLAIMS}:end -->"
    )
    readme.add_argument(
        "--figures",
        default="figures/default",
        help="folder of the experiments' outputs (default: %(default)s)",
    )
    readme.set_defaults(run=_readme)

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
