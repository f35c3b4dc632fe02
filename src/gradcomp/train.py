"""Training with compressed neural gradients: a handful of functions that read top to bottom.

`train(config)` builds the data, the timm model and the compression attachment, then trains with SGD or
AdamW, evaluating every epoch. It writes into `config.out`: `config.yaml` (the resolved configuration),
`metrics.jsonl` (one JSON line per logged step and per epoch), `summary.json`, `checkpoint.pt` (every epoch
and on SIGTERM/SIGINT, written atomically) and, when probing, `probe.npz`. With `resume=True` it continues
from the checkpoint and, on CPU with a fixed seed, ends exactly where an uninterrupted run ends.

Non-finite gradients: a step whose loss or gradient norm is NaN/Inf is skipped (no optimizer update), counted
in the metrics, and training stops with an error after `max_skipped_steps` consecutive ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn
from tqdm import tqdm

from gradcomp.attach import Attachment, Schedule, attach, select_layers
from gradcomp.data import ImageFolderSet, ImageSet, load_split
from gradcomp.models import create_model
from gradcomp.policies import NoCompression, Policy, parse_policy
from gradcomp.probe import Probe, ProbeConfig
from gradcomp.qat import quantize_forward

CHECKPOINT = "checkpoint.pt"
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "fashion-mnist": {"model": "resnet18", "batch_size": 128, "lr": 0.05, "epochs": 1},
    "cifar10": {"model": "resnet18", "cifar_stem": True, "batch_size": 128, "lr": 0.1, "epochs": 200},
    "cifar100": {"model": "resnet18", "cifar_stem": True, "batch_size": 128, "lr": 0.1, "epochs": 200},
    "imagenet": {"model": "resnet18", "batch_size": 256, "lr": 0.1, "epochs": 90, "weight_decay": 1e-4},
    "synthetic": {"model": "resnet10t", "batch_size": 32, "lr": 0.05, "epochs": 2},
}


@dataclass
class TrainConfig:
    out: str = "runs/train"
    model: str = "resnet18"
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    subset_per_class: int | None = None
    test_subset_per_class: int | None = None
    cifar_stem: bool = False
    model_kwargs: dict = field(default_factory=dict)
    # compression
    policy: Any = "none"
    layer_types: list | None = None  # None: the policy's placement (Policy.layer_types)
    include: list = field(default_factory=lambda: ["*"])
    exclude: list = field(default_factory=list)
    placement: str = "output"
    refresh: Any = "step"  # "step", "epoch" or an integer K
    warmup_steps: int = 0
    # optimisation
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 128
    eval_batch_size: int = 500
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "cosine"
    warmup_epochs: float = 0.0
    milestones: list = field(default_factory=list)  # epochs, for lr_schedule=step
    gamma: float = 0.1
    label_smoothing: float = 0.0
    max_skipped_steps: int = 20
    workers: int = 4  # DataLoader workers for streamed datasets (ImageNet)
    # run
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    log_every: int = 20
    progress: bool = True
    resume: bool = False
    probe: dict | None = None
    forward_bits: int | None = None  # QAT: quantize conv/linear inputs and weights in the forward pass

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be sgd or adamw, got {self.optimizer!r}")
        if self.lr_schedule not in ("cosine", "step", "constant"):
            raise ValueError(f"lr_schedule must be cosine, step or constant, got {self.lr_schedule!r}")
        for name in ("epochs", "batch_size", "eval_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


def resolve_config(file: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Defaults, then the dataset's defaults, then the YAML file, then explicit overrides (None = unset)."""
    values: dict[str, Any] = {}
    if file is not None:
        values = yaml.safe_load(Path(file).read_text()) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{file}: a training config must be a mapping of keys to values")
    values.update({key: value for key, value in overrides.items() if value is not None})
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown training config keys {unknown}; known keys: {sorted(known)}")
    dataset = values.get("dataset", TrainConfig.dataset)
    merged = {**DATASET_DEFAULTS.get(dataset, {}), **values}
    if isinstance(merged.get("refresh"), str) and merged["refresh"].isdigit():
        merged["refresh"] = int(merged["refresh"])
    return TrainConfig(**merged)


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


def _atomic_write(path: Path, write) -> None:
    """Write via a temporary file, fsync and rename: a reader never sees a half-written file."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)


def evaluate(
    model: nn.Module, data: ImageSet | ImageFolderSet, batch_size: int, device: torch.device
) -> tuple[float, float]:
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for images, labels in data.batches(batch_size, shuffle=False):
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(1) == labels).sum())
    model.train()
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
    "policy",
    "layer_types",
    "include",
    "exclude",
    "placement",
    "refresh",
    "batch_size",
    "optimizer",
    "lr",
    "lr_schedule",
    "seed",
    "cifar_stem",
    "model_kwargs",
)


def _load_checkpoint(path: Path, device: torch.device, config: TrainConfig) -> dict:
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False)
    except Exception as error:
        raise RuntimeError(
            f"checkpoint {path} is unreadable ({type(error).__name__}: {error}); remove it to start over"
        ) from error
    saved = checkpoint.get("config", {})
    changed = [key for key in _RESUME_KEYS if saved.get(key) != getattr(config, key)]
    if changed:
        details = ", ".join(f"{key}: {saved.get(key)!r} -> {getattr(config, key)!r}" for key in changed)
        raise ValueError(f"cannot resume {path}: the configuration changed ({details})")
    return checkpoint


@dataclass
class _Run:
    """Everything a training run holds; `state` is the part of the progress that goes into checkpoints."""

    config: TrainConfig
    out: Path
    device: torch.device
    train_set: ImageSet | ImageFolderSet
    test_set: ImageSet | ImageFolderSet
    model: nn.Module
    policy: Policy
    attachment: Attachment | None
    probe: Probe | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    steps_per_epoch: int
    total_steps: int
    state: dict = field(
        default_factory=lambda: {
            "epoch": 0,
            "batch": 0,
            "step": 0,
            "wall_seconds": 0.0,
            "best_test_accuracy": None,
            "final_test_accuracy": None,
            "epoch_loss": 0.0,
            "epoch_correct": 0,
            "epoch_seen": 0,
            "skipped_steps": 0,
            "consecutive_skips": 0,
            "last_sparsity": None,
            "layers": {},
            "metrics_bytes": 0,
        }
    )

    @property
    def metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def log(self, record: dict) -> None:
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def sparsity(self) -> float | None:
        if self.attachment is None or isinstance(self.policy, NoCompression):
            return None
        return self.attachment.sparsity()

    def save_checkpoint(self) -> None:
        self.state["metrics_bytes"] = self.metrics_path.stat().st_size
        checkpoint = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "state": dict(self.state),
            "config": dataclasses.asdict(self.config),
            "rng": {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
            },
            "attachment": self.attachment.state_dict() if self.attachment is not None else None,
        }
        _atomic_write(self.out / CHECKPOINT, lambda handle: torch.save(checkpoint, handle))

    def restore(self, checkpoint: dict) -> None:
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.state.update(checkpoint["state"])
        torch.set_rng_state(checkpoint["rng"]["torch"])
        random.setstate(checkpoint["rng"]["python"])
        np.random.set_state(checkpoint["rng"]["numpy"])
        if self.attachment is not None and checkpoint["attachment"] is not None:
            self.attachment.load_state_dict(checkpoint["attachment"])
        with self.metrics_path.open("ab") as handle:  # drop lines logged after the checkpoint
            handle.truncate(self.state["metrics_bytes"])


def _build(config: TrainConfig) -> _Run:
    out = Path(config.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OSError(f"cannot create the output directory {out}: {error}") from error
    if not os.access(out, os.W_OK):
        raise PermissionError(f"output directory {out} is not writable")
    if config.threads:
        torch.set_num_threads(config.threads)
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
    _seed_everything(config.seed)

    train_set = load_split(config.dataset, config.data_dir, True, config.subset_per_class, config.workers)
    test_set = load_split(
        config.dataset, config.data_dir, False, config.test_subset_per_class, config.workers
    )
    model = create_model(
        config.model,
        train_set.num_classes,
        train_set.in_chans,
        train_set.image_size,
        config.cifar_stem,
        **config.model_kwargs,
    ).to(device)
    if config.forward_bits is not None:
        quantize_forward(model, config.forward_bits)

    policy = parse_policy(config.policy)
    probe_config = ProbeConfig(**config.probe) if config.probe else None
    layer_types = policy.layer_types if config.layer_types is None else config.layer_types
    layers = (layer_types, config.include, config.exclude)
    attachment = None
    if not isinstance(policy, NoCompression) or probe_config:
        schedule = Schedule(config.refresh, config.warmup_steps)
        attachment = attach(model, policy, *layers, config.placement, schedule, seed=config.seed)
    probe = None
    if probe_config:
        probe = Probe(probe_config, select_layers(model, *layers), seed=config.seed)
        attachment.observers.append(probe.observe_gradient)

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
    steps_per_epoch = train_set.steps_per_epoch(config.batch_size, drop_last=True)
    if steps_per_epoch == 0:
        raise ValueError(f"batch_size {config.batch_size} exceeds the {len(train_set)} training images")
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(config, steps_per_epoch, total_steps))
    return _Run(
        config,
        out,
        device,
        train_set,
        test_set,
        model,
        policy,
        attachment,
        probe,
        optimizer,
        scheduler,
        steps_per_epoch,
        total_steps,
    )


def _train_step(run: _Run, images: torch.Tensor, labels: torch.Tensor) -> float:
    """One optimizer step (skipped when the loss or gradients are not finite); returns the loss."""
    state, config = run.state, run.config
    if run.attachment is not None:
        run.attachment.begin_step(state["step"], epoch_start=state["batch"] == 0)
    if run.probe is not None:
        run.probe.begin_step(state["step"], state["epoch"])
    images, labels = images.to(run.device), labels.to(run.device)
    logits = run.model(images)
    loss = nn.functional.cross_entropy(logits, labels, label_smoothing=config.label_smoothing)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in run.model.parameters() if p.grad is not None]
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    if torch.isfinite(loss) and torch.isfinite(grad_norm):
        run.optimizer.step()
        state["consecutive_skips"] = 0
    else:
        state["skipped_steps"] += 1
        state["consecutive_skips"] += 1
        if state["consecutive_skips"] > config.max_skipped_steps:
            run.save_checkpoint()
            raise FloatingPointError(
                f"{state['consecutive_skips']} consecutive steps had non-finite loss or gradients (step "
                f"{state['step']}); stopped. The weights are those from before the first of them."
            )
    run.scheduler.step()
    loss_value = float(loss.detach())
    state["step"] += 1
    state["batch"] += 1
    state["epoch_loss"] += loss_value * labels.numel() if math.isfinite(loss_value) else 0.0
    state["epoch_correct"] += int((logits.argmax(1) == labels).sum())
    state["epoch_seen"] += labels.numel()
    return loss_value


def _end_epoch(run: _Run, started: float, wall_before: float) -> None:
    """Evaluate, log the epoch, reset the per-epoch counters and checkpoint."""
    state, config = run.state, run.config
    test_loss, test_accuracy = evaluate(run.model, run.test_set, config.eval_batch_size, run.device)
    sparsity = run.sparsity()
    best = state["best_test_accuracy"]
    state.update(
        final_test_accuracy=test_accuracy,
        best_test_accuracy=test_accuracy if best is None else max(best, test_accuracy),
        last_sparsity=sparsity,
        wall_seconds=wall_before + time.perf_counter() - started,
        layers=run.attachment.layer_summary() if run.attachment is not None else {},
    )
    run.log(
        {
            "kind": "epoch",
            "epoch": state["epoch"],
            "step": state["step"],
            "train_loss": state["epoch_loss"] / max(1, state["epoch_seen"]),
            "train_accuracy": state["epoch_correct"] / max(1, state["epoch_seen"]),
            "test_loss": test_loss,
            "test_accuracy": test_accuracy,
            "gradient_sparsity": sparsity,
            "skipped_steps": state["skipped_steps"],
            "wall_seconds": state["wall_seconds"],
        }
    )
    if config.progress:
        note = f", gradient sparsity {sparsity:.4f}" if sparsity is not None else ""
        tqdm.write(
            f"epoch {state['epoch'] + 1}: test accuracy {test_accuracy:.4f}, loss {test_loss:.4f}{note}"
        )
    state.update(epoch=state["epoch"] + 1, batch=0, epoch_loss=0.0, epoch_correct=0, epoch_seen=0)
    if run.attachment is not None:
        run.attachment.reset_counts()
    run.save_checkpoint()


def train(config: TrainConfig) -> dict:
    """Train as configured, writing the run's files into config.out; returns the summary."""
    run = _build(config)
    state = run.state
    checkpoint_path = run.out / CHECKPOINT
    if config.resume and checkpoint_path.exists():
        run.restore(_load_checkpoint(checkpoint_path, run.device, config))
    else:
        run.metrics_path.write_text("")
    (run.out / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))

    started, wall_before = time.perf_counter(), state["wall_seconds"]
    with _StopRequested() as stop:
        while state["epoch"] < config.epochs and state["step"] < run.total_steps:
            run.model.train()
            bar = tqdm(
                total=run.steps_per_epoch,
                initial=state["batch"],
                leave=False,
                dynamic_ncols=True,
                desc=f"epoch {state['epoch'] + 1}/{config.epochs}",
                disable=not config.progress,
            )
            batches = run.train_set.batches(
                config.batch_size, True, config.seed, state["epoch"], state["batch"], drop_last=True
            )
            for images, labels in batches:
                if state["step"] >= run.total_steps:
                    break
                loss = _train_step(run, images, labels)
                bar.update()
                if state["step"] % config.log_every == 0:
                    sparsity = run.attachment.sparsity() if run.attachment is not None else None
                    run.log(
                        {
                            "kind": "step",
                            "step": state["step"],
                            "epoch": state["epoch"],
                            "loss": loss,
                            "lr": run.scheduler.get_last_lr()[0],
                            "gradient_sparsity": sparsity,
                            "skipped_steps": state["skipped_steps"],
                        }
                    )
                    postfix = {
                        "loss": f"{loss:.3f}",
                        "acc": f"{state['epoch_correct'] / state['epoch_seen']:.3f}",
                    }
                    if sparsity is not None:
                        postfix["sparsity"] = f"{sparsity:.3f}"
                    bar.set_postfix(postfix)
                if stop.signal is not None:
                    state["wall_seconds"] = wall_before + time.perf_counter() - started
                    run.save_checkpoint()
                    bar.close()
                    raise TrainingInterrupted(
                        f"stopped by signal {stop.signal} at step {state['step']}; "
                        f"checkpoint saved in {run.out}, rerun with --resume to continue"
                    )
            bar.close()
            _end_epoch(run, started, wall_before)

    summary = {
        "final_test_accuracy": state["final_test_accuracy"],
        "best_test_accuracy": state["best_test_accuracy"],
        "epochs": state["epoch"],
        "steps": state["step"],
        "wall_seconds": state["wall_seconds"],
        "gradient_sparsity": state["last_sparsity"],
        "skipped_steps": state["skipped_steps"],
        "policy": run.policy.describe(),
        "model": config.model,
        "dataset": config.dataset,
        "layers": state["layers"],
    }
    _atomic_write(
        run.out / "summary.json", lambda handle: handle.write(json.dumps(summary, indent=2).encode())
    )
    if run.probe is not None:
        run.probe.write(run.out / "probe.npz")
        run.probe.close()
    if run.attachment is not None:
        run.attachment.detach()
    return summary
