"""Training with compressed neural gradients: a handful of functions that read top to bottom.

`train(config)` builds the data, the timm model and the compression attachment, then trains with SGD or
AdamW, evaluating every epoch. It writes into `config.out`: `config.yaml` (the resolved configuration),
`metrics.jsonl` (one JSON line per logged step and per epoch, and with `noise_every` one per noise step and
layer, written at the epoch's end), `summary.json` (with a guard or switch_step, the switches),
`checkpoint.pt` (every epoch, every `checkpoint_every` steps and on SIGTERM/SIGINT, written atomically) and,
when probing, `probe.npz`. With
`resume=True` it continues from the checkpoint (and starts afresh when there is none) and, on CPU with a fixed
seed, ends exactly where an uninterrupted run ends, also after a kill -9. A folder holding a previous run's
checkpoint or summary is refused unless `resume` or `overwrite` (delete those files, then start) says what to
do with it, so that a rerun never silently replaces results.

Several processes (`torchrun --nproc_per_node=N`, see `gradcomp.training.distributed`):
DistributedDataParallel, and `batch_size` is the global batch, split evenly over the ranks (each takes a
disjoint shard of every batch of the epoch's order), so the number of steps and the learning-rate schedule do
not depend on N. Rank 0 alone writes files and shows progress; checkpoints hold every rank's random state and
compression statistics, so a resumed run (same N) ends where an uninterrupted one ends. Loss, accuracy,
skipped steps and test figures are over all ranks. Compression is per rank: each rank fits its statistics (mu,
sigma, threshold, scale) to its own gradients and draws its own random bits; the reported sparsity is rank 0's
unless `reduce_statistics` sums the counts of all ranks, and the fitted statistics reported are always rank
0's. The precision guard's switches are shared (`gradcomp.training.noise_monitor`): every rank compresses
the same layers.

Non-finite gradients: a step whose loss or gradient norm is NaN/Inf (on any rank) is skipped (no optimizer
update, buffers such as BatchNorm running statistics restored), counted in the metrics, and training stops
with an error after `max_skipped_steps` consecutive ones, so the weights never take a non-finite value. A
skipped step takes no part in the epoch's train_loss and train_accuracy, nor (`Attachment.discard_step`) in
the gradient sparsity, the per-layer counts, the average bits and the noise ratios.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import yaml
from torch import nn
from tqdm import tqdm

from gradcomp.training.attachment import Attachment, attach, select_layers
from gradcomp.training.config import ConfigError, TrainConfig
from gradcomp.training.data import ImageFolderSet, ImageSet, load_split
from gradcomp.training.datasets import DATASETS
from gradcomp.training.distributed import ALONE, Processes, setup
from gradcomp.training.models import check_model, create_model
from gradcomp.training.policies import NoCompression
from gradcomp.training.probe import Probe, ProbeConfig
from gradcomp.training.qat import quantize_forward

CHECKPOINT = "checkpoint.pt"
# what a run writes into its folder: `overwrite` deletes these (and nothing else there) before starting
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", CHECKPOINT, "probe.npz")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _lr_factor(config: TrainConfig, steps_per_epoch: int, total_steps: int):
    warmup = config.warmup_epochs * steps_per_epoch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if config.lr_schedule == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        if config.lr_schedule == "step":
            return config.gamma ** sum(step >= m * steps_per_epoch for m in config.milestones)
        return 1.0

    return factor


def _atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write a temporary file in the same folder, fsync it, rename it over `path`, fsync the folder: a reader
    (a rerun after a crash or kill -9) finds the previous file or the complete new one, never a half-written
    one. On failure (disk full) the temporary file is removed and `path` is untouched."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with temporary.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # makes the rename itself durable
    finally:
        os.close(folder)


def evaluate(
    model: nn.Module,
    data: ImageSet | ImageFolderSet,
    batch_size: int,
    device: torch.device,
    processes: Processes = ALONE,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> tuple[float, float]:
    """Test loss and accuracy; several processes each evaluate a shard and add up (same model on each)."""
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for images, labels in data.batches(batch_size, shuffle=False, shard=processes.shard):
            if not labels.numel():  # a final batch smaller than the number of ranks
                continue
            images, labels = images.to(device, memory_format=memory_format), labels.to(device)
            logits = model(images)
            loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(1) == labels).sum())
    model.train()
    loss_sum, correct = processes.all_sum(torch.tensor([loss_sum, correct], dtype=torch.float64)).tolist()
    return loss_sum / len(data), correct / len(data)


class _StopRequested:
    """SIGTERM/SIGINT set a flag; the loop checkpoints after the current step and exits."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self) -> _StopRequested:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class TrainingInterrupted(RuntimeError):
    """Raised after a signal-triggered checkpoint; rerun with resume to continue."""


# keys that must match between a checkpoint and the run resuming it (epochs and max_steps may grow)
_RESUME_KEYS = (
    "model",
    "dataset",
    "subset_per_class",
    "compression",
    "batch_size",
    "optimizer",
    "lr",
    "lr_schedule",
    "seed",
    "stem",
    "model_kwargs",
)


_CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "state", "config", "ranks")


def _load_checkpoint(path: Path, device: torch.device, config: TrainConfig, world_size: int) -> dict:
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False)
        missing = [key for key in _CHECKPOINT_KEYS if key not in checkpoint]
        if missing:
            raise KeyError(f"no {', '.join(missing)}")
    except Exception as error:
        raise RuntimeError(
            f"checkpoint {path} is unreadable ({type(error).__name__}: {error}); remove it to start over"
        ) from error
    saved, current = checkpoint["config"], config.to_dict()
    changed = [key for key in _RESUME_KEYS if saved.get(key) != current[key]]
    if changed:
        details = ", ".join(f"{key}: {saved.get(key)!r} -> {current[key]!r}" for key in changed)
        raise ConfigError(f"cannot resume {path}: the configuration changed ({details})")
    if len(checkpoint["ranks"]) != world_size:
        raise ConfigError(
            f"cannot resume {path}: it was written by {len(checkpoint['ranks'])} training processes and this "
            f"run has {world_size}; resume with torchrun --nproc_per_node={len(checkpoint['ranks'])}"
        )
    return checkpoint


@dataclass
class Progress:
    """Where a run stands: what checkpoints save and a resumed run restores."""

    epoch: int = 0
    batch: int = 0  # batches done in the current epoch
    step: int = 0
    wall_seconds: float = 0.0
    best_test_accuracy: float | None = None
    final_test_accuracy: float | None = None
    epoch_loss: float = 0.0  # summed over the epoch's samples so far
    epoch_correct: int = 0
    epoch_seen: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    last_sparsity: float | None = None
    layers: dict = field(default_factory=dict)  # per-layer compression figures of the last epoch
    noise_rows: int = 0  # rows of the attachment's noise-ratio history logged so far
    metrics_bytes: int = 0  # metrics.jsonl's length at the last checkpoint

    def start_epoch(self) -> None:
        self.epoch += 1
        self.batch, self.epoch_loss, self.epoch_correct, self.epoch_seen = 0, 0.0, 0, 0


@dataclass
class _Run:
    """Everything a training run holds; `progress` is the part that goes into checkpoints."""

    config: TrainConfig
    out: Path
    device: torch.device
    processes: Processes
    train_set: ImageSet | ImageFolderSet
    test_set: ImageSet | ImageFolderSet
    model: nn.Module
    net: nn.Module  # what the training step calls: the model, or its DistributedDataParallel wrapper
    attachment: Attachment | None
    probe: Probe | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    steps_per_epoch: int
    total_steps: int
    memory_format: torch.memory_format
    progress: Progress = field(default_factory=Progress)
    _clock: float = 0.0  # time.perf_counter() less the wall time of earlier calls, from `start_clock`

    def start_clock(self) -> None:
        self._clock = time.perf_counter() - self.progress.wall_seconds

    def elapsed(self) -> float:
        """Wall seconds of training, over every call that resumed this run."""
        return time.perf_counter() - self._clock

    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def log(self, record: dict) -> None:
        if self.processes.is_main:
            with self.metrics_path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")

    def sparsity(self) -> float | None:
        """Sparsity since the last reset: this rank's, or all ranks' with reduce_statistics (collective)."""
        if self.attachment is None or isinstance(self.config.policy, NoCompression):
            return None
        return self.attachment.sparsity(self._total)

    def noise_rows(self) -> list[dict]:
        """The noise-ratio rows (per noise step and layer) not yet logged."""
        if self.attachment is None:
            return []
        rows = self.attachment.noise_ratios()[self.progress.noise_rows :]
        self.progress.noise_rows += len(rows)
        return rows

    def layer_summary(self) -> dict:
        return self.attachment.layer_summary(self._total) if self.attachment is not None else {}

    @property
    def _total(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return self.processes.all_sum if self.config.reduce_statistics else None

    def save_checkpoint(self) -> None:
        """Collective: every rank hands over its random state and compression statistics, rank 0 writes."""
        attachment = self.attachment.state_dict() if self.attachment is not None else None
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
        own = {"rng": rng, "attachment": _to_device(attachment, "cpu")}
        ranks = self.processes.gather(own)
        self.processes.on_main(lambda: self._write_checkpoint(ranks))

    def _write_checkpoint(self, ranks: list[dict]) -> None:
        path = self.out / CHECKPOINT
        self.progress.metrics_bytes = self.metrics_path.stat().st_size
        checkpoint = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "state": dataclasses.asdict(self.progress),
            "config": self.config.to_dict(),
            "ranks": ranks,
        }
        try:
            _atomic_write(path, lambda handle: torch.save(checkpoint, handle))
        except OSError as error:
            raise OSError(
                error.errno,
                f"cannot write the checkpoint {path} ({error.strerror or error}); the previous checkpoint, "
                "if any, is unchanged",
            ) from error

    def restore(self, checkpoint: dict) -> None:
        """Every rank loads the same model, optimizer and progress, its own random state and statistics."""
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.progress = Progress(**checkpoint["state"])
        own = checkpoint["ranks"][self.processes.rank]
        torch.set_rng_state(own["rng"]["torch"].cpu())
        random.setstate(own["rng"]["python"])
        np.random.set_state(own["rng"]["numpy"])
        if self.attachment is not None and own["attachment"] is not None:
            self.attachment.load_state_dict(_to_device(own["attachment"], self.device))
        if self.processes.is_main:
            with self.metrics_path.open("ab") as handle:  # drop lines logged after the checkpoint
                handle.truncate(self.progress.metrics_bytes)


def _to_device(tree: Any, device: torch.device | str) -> Any:
    """Every tensor of nested dicts and lists moved to `device` (checkpoint parts exchanged between ranks)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {key: _to_device(value, device) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_to_device(value, device) for value in tree]
    return tree


def _refusal(config: TrainConfig) -> str | None:
    """Why a run may not start in `config.out` (None: it may): a previous run's results are there and neither
    `resume` nor `overwrite` says what to do with them."""
    out = Path(config.out)
    held = [name for name in ("summary.json", CHECKPOINT) if (out / name).is_file()]
    if not held or config.resume or config.overwrite:
        return None
    state = "a finished run" if "summary.json" in held else "an interrupted run"
    return (
        f"{out} holds {state} ({', '.join(held)}); pass --resume to continue it, or --overwrite to delete "
        "its files and start afresh (config keys resume / overwrite)"
    )


def _check_output_folder(config: TrainConfig, processes: Processes) -> None:
    """Rank 0 looks (the other ranks may not see its file system) and every rank raises the same error."""
    refusal = processes.gather(_refusal(config) if processes.is_main else None)[0]
    if refusal is not None:
        raise ConfigError(refusal)


def _remove_run_files(out: Path) -> None:
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
        (out / f"{name}.tmp").unlink(missing_ok=True)  # left by a write that a kill -9 interrupted


def _make_output_directory(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OSError(f"cannot create the output directory {out}: {error}") from error
    if not os.access(out, os.W_OK):
        raise PermissionError(f"output directory {out} is not writable")


def check_model_config(config: TrainConfig) -> None:
    """What only the model can tell is wrong with a run's config, refused before any data is loaded: the
    model's name, kwargs and stem (`check_model`), and compression (or a probe) whose layer_types / include /
    exclude select none of its layers. The model is built on the meta device (no memory) at the dataset's
    registered shape; one that cannot be built there is checked when it is built for real."""
    check_model(config.model, config.stem, config.model_kwargs)
    compression = config.compression
    if isinstance(compression.policy, NoCompression) and not config.probe:
        return  # nothing is attached
    dataset = DATASETS[config.dataset]
    try:
        with torch.device("meta"):
            model = create_model(
                config.model,
                dataset.classes,
                dataset.channels,
                dataset.image_size,
                config.stem,
                **config.model_kwargs,
            )
    except Exception:  # built for real later, where attach checks the selection
        return
    try:
        select_layers(model, compression.types, compression.include, compression.exclude)
    except ValueError as error:
        raise ConfigError(f"{config.model}: {error} (config keys layer_types, include, exclude)") from None


def _build(config: TrainConfig, processes: Processes, device: torch.device) -> _Run:
    """Everything a run needs, checked cheapest first; the output folder is made last, so that a run which
    cannot start leaves none behind. The returned run's config records the data folder actually read."""
    out = Path(config.out)
    _check_output_folder(config, processes)
    if config.batch_size % processes.world_size:
        raise ConfigError(
            f"batch_size {config.batch_size} (the global batch) must be a multiple of the "
            f"{processes.world_size} training processes"
        )
    check_model_config(config)
    if config.threads:
        torch.set_num_threads(config.threads)
    _seed_everything(config.seed)

    train_set = load_split(config.dataset, config.data_dir, True, config.subset_per_class, config.workers)
    test_set = load_split(
        config.dataset, config.data_dir, False, config.test_subset_per_class, config.workers
    )
    source = train_set.source
    steps_per_epoch = train_set.steps_per_epoch(config.batch_size, drop_last=True)
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size {config.batch_size} exceeds the {len(train_set)} training images")
    config = dataclasses.replace(
        config, data_dir=None if source is None else str(source), **_warmup_in_steps(config, steps_per_epoch)
    )
    model = create_model(
        config.model,
        train_set.num_classes,
        train_set.in_chans,
        train_set.image_size,
        config.stem,
        **config.model_kwargs,
    ).to(device)
    if config.forward_bits is not None:
        quantize_forward(model, config.forward_bits)
    memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)

    compression = config.compression
    probe_config = ProbeConfig(**config.probe) if config.probe else None
    attachment = None
    if not isinstance(compression.policy, NoCompression) or probe_config:
        # each rank draws its own random bits (rank 0 those of a single-process run)
        attachment = attach(model, compression, seed=config.seed + 1_000_003 * processes.rank)
    probe = None
    if probe_config and processes.is_main:  # the probe records rank 0's gradients
        layers = select_layers(model, compression.types, compression.include, compression.exclude)
        probe = Probe(probe_config, layers, seed=config.seed)
        attachment.observers.append(probe.observe_gradient)
    net = model
    if processes.active:
        net = nn.parallel.DistributedDataParallel(model, [device] if device.type == "cuda" else None)

    decay = [p for p in model.parameters() if p.ndim > 1]  # no weight decay on biases and norm parameters
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    else:
        optimizer = torch.optim.AdamW(groups, lr=config.lr)
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(config, steps_per_epoch, total_steps))
    processes.on_main(lambda: _make_output_directory(out))
    return _Run(
        config=config,
        out=out,
        device=device,
        processes=processes,
        train_set=train_set,
        test_set=test_set,
        model=model,
        net=net,
        attachment=attachment,
        probe=probe,
        optimizer=optimizer,
        scheduler=scheduler,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        memory_format=memory_format,
    )


def _warmup_in_steps(config: TrainConfig, steps_per_epoch: int) -> dict[str, Any]:
    """`uncompressed_epochs` as the compression's warmup_steps (rounded), which is what the run records."""
    if config.uncompressed_epochs is None:
        return {}
    steps = round(config.uncompressed_epochs * steps_per_epoch)
    compression = dataclasses.replace(config.compression, warmup_steps=steps)
    return {"compression": compression, "uncompressed_epochs": None}


def _train_step(run: _Run, images: torch.Tensor, labels: torch.Tensor) -> float:
    """One optimizer step (skipped on every rank when the loss or gradients of any rank are not finite);
    returns the loss of the global batch."""
    progress, config = run.progress, run.config
    if run.attachment is not None:
        run.attachment.begin_step(progress.step, epoch_start=progress.batch == 0)
    if run.probe is not None:
        run.probe.begin_step(progress.step, progress.epoch)
    images, labels = images.to(run.device, memory_format=run.memory_format), labels.to(run.device)
    buffers = list(run.model.buffers())
    saved_buffers = [buffer.clone() for buffer in buffers]  # a non-finite forward corrupts running statistics
    logits = run.net(images)
    loss = nn.functional.cross_entropy(logits, labels, label_smoothing=config.label_smoothing)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in run.model.parameters() if p.grad is not None]
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    correct = (logits.argmax(1) == labels).sum()
    # summed over ranks: the global batch's loss and hits, and NaN/Inf when any rank had a non-finite value
    loss_sum, grad_norms, correct = run.processes.all_sum(
        torch.stack([loss.detach().double(), grad_norm.double(), correct.double()])
    ).tolist()
    applied = math.isfinite(loss_sum) and math.isfinite(grad_norms)
    if applied:
        run.optimizer.step()
        progress.consecutive_skips = 0
    else:
        for buffer, saved in zip(buffers, saved_buffers, strict=True):
            buffer.copy_(saved)
        if run.attachment is not None:  # its compressed gradients leave the sparsity and noise records
            run.attachment.discard_step()
        progress.skipped_steps += 1
        progress.consecutive_skips += 1
        if progress.consecutive_skips > config.max_skipped_steps:
            run.save_checkpoint()
            raise FloatingPointError(
                f"{progress.consecutive_skips} consecutive steps had non-finite loss or gradients (step "
                f"{progress.step}); stopped. The weights are those from before the first of them."
            )
    with warnings.catch_warnings():  # a skipped step still advances the schedule: steps are its clock
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        run.scheduler.step()
    loss_value = loss_sum / run.processes.world_size
    seen = labels.numel() * run.processes.world_size
    progress.step += 1
    progress.batch += 1
    if applied:  # the epoch's loss and accuracy are those of the steps that trained
        progress.epoch_loss += loss_value * seen
        progress.epoch_correct += int(correct)
        progress.epoch_seen += seen
    return loss_value


def _end_epoch(run: _Run) -> None:
    """Evaluate, log the epoch, reset the per-epoch counters and checkpoint."""
    progress, config = run.progress, run.config
    run.processes.broadcast_buffers(run.model)  # every rank evaluates rank 0's model, which is checkpointed
    test_loss, test_accuracy = evaluate(
        run.model, run.test_set, config.eval_batch_size, run.device, run.processes, run.memory_format
    )
    sparsity = run.sparsity()
    best = progress.best_test_accuracy
    progress.final_test_accuracy = test_accuracy
    progress.best_test_accuracy = test_accuracy if best is None else max(best, test_accuracy)
    progress.last_sparsity = sparsity
    progress.wall_seconds = run.elapsed()
    progress.layers = run.layer_summary()
    run.log(
        {
            "kind": "epoch",
            "epoch": progress.epoch,
            "step": progress.step,
            "train_loss": progress.epoch_loss / progress.epoch_seen if progress.epoch_seen else None,
            "train_accuracy": progress.epoch_correct / progress.epoch_seen if progress.epoch_seen else None,
            "test_loss": test_loss,
            "test_accuracy": test_accuracy,
            "gradient_sparsity": sparsity,
            "skipped_steps": progress.skipped_steps,
            "wall_seconds": progress.wall_seconds,
        }
    )
    if config.progress and run.processes.is_main:
        note = f", gradient sparsity {sparsity:.4f}" if sparsity is not None else ""
        tqdm.write(
            f"epoch {progress.epoch + 1}: test accuracy {test_accuracy:.4f}, loss {test_loss:.4f}{note}"
        )
    for row in run.noise_rows():
        run.log({"kind": "noise", **row})
    progress.start_epoch()
    if run.attachment is not None:
        run.attachment.reset_counts()
    run.save_checkpoint()


def train(config: TrainConfig) -> dict:
    """Train as configured, writing the run's files into config.out; returns the summary.

    Under torchrun every rank calls this and gets the same summary, except the compression figures, which are
    each rank's own unless `reduce_statistics` (rank 0's are written); see the module docstring."""
    processes, device = setup(config.device)
    try:
        return _train(config, processes, device)
    finally:
        processes.close()


def _train(config: TrainConfig, processes: Processes, device: torch.device) -> dict:
    """The run's phases: build (or resume) it, train epoch by epoch, write its results."""
    run = _build(config, processes, device)
    resumed_at = _resume(run)
    run.start_clock()
    with _StopRequested() as stop:
        while run.progress.epoch < run.config.epochs and run.progress.step < run.total_steps:
            _train_epoch(run, stop)
            _end_epoch(run)
    summary = _summary(run)
    processes.on_main(lambda: _write_results(run, summary, resumed_at))
    if run.probe is not None:
        run.probe.close()
    if run.attachment is not None:
        run.attachment.detach()
    return summary


def _resume(run: _Run) -> int:
    """Restore the checkpoint where the config resumes and one exists, start the run's files; returns the
    step training continues from."""
    config, processes = run.config, run.processes
    checkpoint_path = run.out / CHECKPOINT
    resuming = processes.any(config.resume and checkpoint_path.exists())
    if resuming:
        run.restore(_load_checkpoint(checkpoint_path, run.device, config, processes.world_size))

    def start_files() -> None:
        if config.overwrite:
            _remove_run_files(run.out)
        if not resuming:
            run.metrics_path.write_text("")
        (run.out / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))

    processes.on_main(start_files)
    return run.progress.step


def _train_epoch(run: _Run, stop: _StopRequested) -> None:
    """The remaining steps of the current epoch, logging every `log_every` steps and checkpointing on the
    schedule or when a signal asks to stop."""
    progress, config = run.progress, run.config
    run.model.train()
    bar = tqdm(
        total=run.steps_per_epoch,
        initial=progress.batch,
        leave=False,
        dynamic_ncols=True,
        desc=f"epoch {progress.epoch + 1}/{config.epochs}",
        disable=not (config.progress and run.processes.is_main),
    )
    batches = run.train_set.batches(
        config.batch_size,
        True,
        config.seed,
        progress.epoch,
        progress.batch,
        drop_last=True,
        shard=run.processes.shard,
    )
    for images, labels in batches:
        if progress.step >= run.total_steps:
            break
        loss = _train_step(run, images, labels)
        bar.update()
        if progress.step % config.log_every == 0:
            _log_step(run, loss, bar)
        stopping = run.processes.any(stop.signal is not None)  # a signal to any rank stops them all
        periodic = config.checkpoint_every and progress.step % config.checkpoint_every == 0
        if stopping or (periodic and progress.batch < run.steps_per_epoch):
            progress.wall_seconds = run.elapsed()
            run.save_checkpoint()
        if stopping:
            bar.close()
            raise TrainingInterrupted(
                f"stopped by a signal at step {progress.step}; "
                f"checkpoint saved in {run.out}, rerun with --resume to continue"
            )
    bar.close()


def _log_step(run: _Run, loss: float, bar: tqdm) -> None:
    progress = run.progress
    sparsity = run.sparsity()
    run.log(
        {
            "kind": "step",
            "step": progress.step,
            "epoch": progress.epoch,
            "loss": loss,
            "lr": run.scheduler.get_last_lr()[0],
            "gradient_sparsity": sparsity,
            "skipped_steps": progress.skipped_steps,
        }
    )
    postfix = {"loss": f"{loss:.3f}"}
    if progress.epoch_seen:
        postfix["acc"] = f"{progress.epoch_correct / progress.epoch_seen:.3f}"
    if sparsity is not None:
        postfix["sparsity"] = f"{sparsity:.3f}"
    bar.set_postfix(postfix)


def _summary(run: _Run) -> dict:
    progress, config = run.progress, run.config
    summary = {
        "final_test_accuracy": progress.final_test_accuracy,
        "best_test_accuracy": progress.best_test_accuracy,
        "epochs": progress.epoch,
        "steps": progress.step,
        "wall_seconds": progress.wall_seconds,
        "gradient_sparsity": progress.last_sparsity,
        "skipped_steps": progress.skipped_steps,
        "policy": config.policy.describe(),
        "seed": config.seed,
        "model": config.model,
        "dataset": config.dataset,
        "processes": run.processes.world_size,
        "layers": progress.layers,
    }
    if config.compression.switching:
        summary["switches"] = run.attachment.switch_report(summary)
    return summary


def _write_results(run: _Run, summary: dict, resumed_at: int) -> None:
    text = json.dumps(summary, indent=2).encode()
    _atomic_write(run.out / "summary.json", lambda handle: handle.write(text))
    # the probe holds the steps trained in this call: a finished run resumed (e.g. again in a pipeline job)
    # keeps the probe.npz its training wrote
    if run.probe is not None and run.progress.step > resumed_at:
        run.probe.write(run.out / "probe.npz")
