"""Per-layer statistics of neural gradients (and, for contrast, weights and activations) during training.

At chosen steps the probe records, per layer and tensor kind, a histogram of log2|x| on fixed bin edges
(exact zeros, non-finite values and values outside the edges counted apart), moments, and optionally a
uniform reservoir of raw non-zero values for goodness-of-fit tests. It only reads tensors and draws from
its own generator, so probing never changes training.

`Probe.write(path)` stores one row per (step, layer, kind) in an .npz of parallel arrays:
layer, kind (str); step, epoch, count, zeros, nonfinite, underflow, overflow (int64); log2_mean, log2_std,
mean, std, absmax (float64); hist (rows x bins, int64); samples (rows x reservoir, float32, NaN-padded);
and the shared `edges` (bins + 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

KINDS = ("gradient", "weight", "activation")  # what a probe may be asked for (rows: also gradient_active)


@dataclass
class ProbeConfig:
    steps: list[int] = field(default_factory=list)  # explicit steps to probe
    every: int | None = None  # and/or every N steps
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    reservoir: int = 0  # raw values kept per row (0: none)
    log2_min: float = -50.0
    log2_max: float = 20.0
    bins_per_unit: int = 4

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"probe kinds must be among {KINDS}, got {sorted(unknown)}")
        if self.every is not None and self.every < 1:
            raise ValueError(f"probe every must be >= 1, got {self.every}")

    @property
    def edges(self) -> np.ndarray:
        count = round((self.log2_max - self.log2_min) * self.bins_per_unit)
        return np.linspace(self.log2_min, self.log2_max, count + 1)


class Probe:
    def __init__(self, config: ProbeConfig, layers: Sequence[tuple[str, nn.Module]], seed: int = 0) -> None:
        self.config = config
        self.layers = list(layers)
        self.rows: list[dict] = []
        self.step, self.epoch = 0, 0
        self._generator = torch.Generator().manual_seed(seed)
        self._due = False
        self._handles = []
        if "activation" in config.kinds:
            for name, module in self.layers:
                self._handles.append(module.register_forward_hook(self._activation_hook(name)))

    def begin_step(self, step: int, epoch: int) -> None:
        self.step, self.epoch = step, epoch
        every = self.config.every
        self._due = step in self.config.steps or (every is not None and step % every == 0)
        if self._due and "weight" in self.config.kinds:
            for name, module in self.layers:
                if getattr(module, "weight", None) is not None:
                    self.record(name, "weight", module.weight)

    def observe_gradient(self, name: str, gradient: Tensor, active: Tensor | None = None) -> None:
        """Observer for `Attachment.observers`: sees each layer's gradient before compression. With the
        mask of non-zero gradient at the following BatchNorm's output, also records those entries alone
        (kind "gradient_active": the population the reference code fits), so analyses show both."""
        if self._due and "gradient" in self.config.kinds:
            self.record(name, "gradient", gradient)
            if active is not None:
                self.record(name, "gradient_active", gradient[active])

    def _activation_hook(self, name: str):
        def hook(module: nn.Module, inputs, output) -> None:
            if self._due and module.training and isinstance(output, Tensor):
                self.record(name, "activation", output)

        return hook

    def record(self, name: str, kind: str, tensor: Tensor) -> None:
        values = tensor.detach().flatten().to(torch.float64).cpu()
        finite = torch.isfinite(values)
        count_finite = int(torch.count_nonzero(finite))
        # the finite values: all of them in the usual case, without a masked copy (the same reductions
        # over the same elements in the same order, so the same bits)
        finite_values = values if count_finite == values.numel() else values[finite]
        zeros = finite_values.numel() - int(torch.count_nonzero(finite_values))
        kept = finite_values if zeros == 0 else finite_values[finite_values != 0]
        log2 = torch.log2(kept.abs())
        edges = torch.from_numpy(self.config.edges)
        hist = torch.histc(log2, bins=edges.numel() - 1, min=float(edges[0]), max=float(edges[-1]))
        row = {
            "layer": name,
            "kind": kind,
            "step": self.step,
            "epoch": self.epoch,
            "count": values.numel(),
            "zeros": zeros,
            "nonfinite": values.numel() - count_finite,
            "underflow": int(torch.count_nonzero(log2 < edges[0])),
            "overflow": int(torch.count_nonzero(log2 > edges[-1])),
            "log2_mean": float(log2.mean()) if kept.numel() else np.nan,
            "log2_std": float(log2.std()) if kept.numel() > 1 else np.nan,
            "mean": float(finite_values.mean()) if count_finite else np.nan,
            "std": float(finite_values.std()) if count_finite > 1 else np.nan,
            "absmax": float(finite_values.abs().max()) if count_finite else np.nan,
            "hist": hist.to(torch.int64).numpy(),
            "samples": self._reservoir(kept),
        }
        self.rows.append(row)

    def _reservoir(self, kept: Tensor) -> np.ndarray:
        size = self.config.reservoir
        samples = np.full(size, np.nan, dtype=np.float32)
        if size and kept.numel():
            take = min(size, kept.numel())
            index = torch.randperm(kept.numel(), generator=self._generator)[:take]
            samples[:take] = kept[index].numpy()
        return samples

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        columns = {key: [row[key] for row in self.rows] for key in self.rows[0]} if self.rows else {}
        arrays = {key: np.asarray(value) for key, value in columns.items() if key not in ("hist", "samples")}
        bins = len(self.config.edges) - 1
        arrays["hist"] = np.stack(columns["hist"]) if self.rows else np.zeros((0, bins), np.int64)
        arrays["samples"] = (
            np.stack(columns["samples"]) if self.rows else np.zeros((0, self.config.reservoir), np.float32)
        )
        temporary = path.with_suffix(".tmp.npz")
        np.savez_compressed(temporary, edges=self.config.edges, **arrays)
        temporary.replace(path)
        return path

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def load_probe(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}
