"""Reading finished training runs (the folders `gradcomp train` writes) for analysis."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from gradcomp.policies import Chain, FloatingPoint, Integer, NoCompression, Policy, Prune, parse_policy


@dataclass
class Run:
    name: str
    folder: Path
    config: dict
    summary: dict

    @property
    def policy(self) -> Policy:
        return parse_policy(self.config["policy"])

    @property
    def accuracy(self) -> float:
        return float(self.summary["final_test_accuracy"])

    def metrics(self) -> list[dict]:
        lines = (self.folder / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def effective_bits(self) -> float:
        """Bits per gradient element of the run's compressed neural gradients (activation path).

        fp: 1 + E + M. int: b (per-row scales are negligible). prune: a 1-bit occupancy mask, a sign for each
        survivor and 31 more bits for the survivors above the threshold (lognormal fraction per layer, from
        the layer's mu, sigma and threshold); chains multiply the survivors by the next stage's bits.
        none: 32 (float32)."""
        return _bits(self.policy, self.summary)


def load_runs(folders: dict[str, Path | str]) -> dict[str, Run]:
    runs = {}
    for name, folder in folders.items():
        folder = Path(folder)
        config = yaml.safe_load((folder / "config.yaml").read_text())
        summary = json.loads((folder / "summary.json").read_text())
        runs[name] = Run(name, folder, config, summary)
    return runs


def _above_threshold_fraction(summary: dict) -> float:
    fractions = []
    for layer in summary["layers"].values():
        if layer.get("threshold") and layer.get("sigma"):
            z = (math.log(layer["threshold"]) - layer["mu"]) / layer["sigma"]
            fractions.append(0.5 * math.erfc(z / math.sqrt(2)))
    return sum(fractions) / len(fractions) if fractions else 0.0


def _bits(policy: Policy, summary: dict) -> float:
    if isinstance(policy, NoCompression):
        return 32.0
    if isinstance(policy, FloatingPoint):
        return float(1 + policy.fmt.exp_bits + policy.fmt.man_bits)
    if isinstance(policy, Integer):
        return float(policy.bits)
    if isinstance(policy, Prune):
        density = 1.0 - float(summary["gradient_sparsity"])
        return 1.0 + density + 31.0 * _above_threshold_fraction(summary)
    if isinstance(policy, Chain) and len(policy.policies) == 2 and isinstance(policy.policies[0], Prune):
        density = 1.0 - float(summary["gradient_sparsity"])
        return 1.0 + density * _bits(policy.policies[1], summary)
    raise ValueError(f"no bit count for policy {policy.describe()}")


def load_trained_model(run: Run, device: str = "cpu") -> nn.Module:
    """The run's final model (its checkpoint), rebuilt as in training, forward quantization included."""
    from gradcomp.data import load_split
    from gradcomp.models import create_model
    from gradcomp.qat import quantize_forward

    config = run.config
    test = load_split(config["dataset"], config["data_dir"], False, 1)
    model = create_model(
        config["model"],
        test.num_classes,
        test.in_chans,
        test.image_size,
        config["cifar_stem"],
        **config["model_kwargs"],
    )
    if config.get("forward_bits"):
        quantize_forward(model, config["forward_bits"])
    checkpoint = torch.load(run.folder / "checkpoint.pt", map_location=device, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    return model.to(device)
