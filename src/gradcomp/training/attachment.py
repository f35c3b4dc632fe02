"""Put a compression policy on the neural gradients of any torch / timm model.

`attach(model, config)` takes a `CompressionConfig` (or just a policy): it selects layers by type (by default
where the policy's paper acts: convolutions for prune and fp, convolutions and linear layers for int) and by
fully-qualified-name patterns, and compresses the gradient with respect to each selected layer's output
(placement "output", the default: the gradient that feeds both the input-gradient and the weight-gradient
GEMMs) or input (placement "input", e.g. the BatchNorm inputs where the lognormal paper prunes, section 2.8).

* One-stream policies (none, prune, fp) use an identity autograd Function applied in a forward hook. It marks
  its input dirty instead of returning a view, so in-place ops that follow (timm's ReLU(inplace=True),
  `x += shortcut`) keep working; module full-backward hooks would break there.
* Two-stream policies (int, with a separate weight-gradient quantizer) wrap the layer's forward in a
  Function that records the layer's local graph once and, in backward, differentiates it twice: the input
  gradient from the activation-path quantizer and the parameter gradients from the weight-path quantizer.
  No second forward pass.

Where the policy reads it (`Policy.uses_bn_output`: prune's reference fit), the attachment also notes which
entries of the gradient at the output of the BatchNorm that consumes a compressed output are non-zero: an
identity Function on that BatchNorm's output (for timm's BatchNormAct, on its activation's input) records
the mask in backward, just before the BatchNorm's backward produces the gradient compressed here. The pairing
is by tensor identity at forward time, so it follows whatever graph the model builds.

Steps: the attachment counts training steps itself (a forward pass with gradients enabled after a backward
pass through the compressed layers begins the next step), so a plain training loop needs no call; a loop
that calls `begin_step(step, epoch_start)` drives the count instead (needed for refresh="epoch", whose
epoch boundaries the attachment cannot see). Statistics are refreshed on the schedule (every step, every K
steps, or at the first step of each epoch), and a refresh that fitted nothing finite (an all-zero gradient,
e.g. a residual branch behind a zero-initialised BatchNorm weight at the first step) is repeated at the next
step rather than kept for the whole interval. Compression starts after `warmup_steps`. Random seeds derive
from (seed, step, layer, stream), so compression never draws from torch's global generator.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from gradcomp import choices
from gradcomp._backend import Backend
from gradcomp.rng import mix32, resolve_seed
from gradcomp.training.compress import (
    GradientCopy,
    LayerStats,
    check_dtype,
    compress,
    pair_compressor,
    plan,
)
from gradcomp.training.config import CompressionConfig
from gradcomp.training.noise_monitor import NoiseMonitor, monitorable
from gradcomp.training.policies import Chain, Policy

LAYER_TYPES: dict[str, tuple[type[nn.Module], ...]] = {
    "conv": (nn.Conv1d, nn.Conv2d, nn.Conv3d),
    "linear": (nn.Linear,),
    "bn": (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d),
}
# sees (layer name, gradient before compression, mask of non-zero BatchNorm-output gradient or None)
GradientObserver = Callable[[str, Tensor, Tensor | None], None]
StepHook = Callable[["Attachment", int], None]  # sees (attachment, step) as each step begins
Reduce = Callable[[Tensor], Tensor]  # sums a tensor over training processes
# the attachment holding each attached layer: a second one on the same layer would compress twice
_ATTACHED: weakref.WeakKeyDictionary[nn.Module, Attachment] = weakref.WeakKeyDictionary()


@dataclass
class LayerState:
    """One compressed layer: its statistics and what compression did to it since the last reset."""

    name: str
    index: int
    feature_axis: int = -1  # the axis of the layer's output features: 1 for convolutions (N, C, ...)
    stats: LayerStats = field(default_factory=LayerStats)
    refresh: bool = True
    fitted: bool = False  # refreshed in the last step: its fit is checked when the next one begins
    backwards: int = 0  # backward passes through the layer in this step
    zeros: Tensor | None = None  # int64 count of zeros in the compressed gradients (on device, no sync)
    counted_before: Tensor | None = None  # the count at the last `reset_counts`
    numel: int = 0  # elements compressed since the last reset
    attainable: Tensor | None = None  # int64 sum over refreshes of max(target zeros, own zeros) (pruning)
    attainable_numel: int = 0  # elements that was counted over since the last reset
    output: Callable[[], Tensor | None] = lambda: None  # weak reference to the last compressed output
    bn_output: Tensor | None = None  # the following BatchNorm's output gradient, this backward
    policy: Policy | None = None  # the fallback once the layer switched (None: the attachment's)
    switched_at: int | None = None  # the step it switched (guard or switch_step)
    trained: list[int] = field(default_factory=lambda: [0, 0])  # elements under the policy, the fallback


@dataclass
class _Tallies:
    """The counts of every layer as a step began, so that `Attachment.discard_step` can take the step's
    share out again: the device counters in one stacked copy (one launch, no sync) and the host counts."""

    counters: Tensor | None
    present: list[tuple[bool, bool]]  # per layer: whether its zero and attainable counters existed
    host: list[tuple[int, int, int, int]]  # per layer: numel, attainable_numel, trained (policy, fallback)

    @classmethod
    def of(cls, layers: list[LayerState]) -> _Tallies:
        tensors = [t for layer in layers for t in (layer.zeros, layer.attainable) if t is not None]
        return cls(
            torch.stack(tensors) if tensors else None,
            [(layer.zeros is not None, layer.attainable is not None) for layer in layers],
            [(layer.numel, layer.attainable_numel, *layer.trained) for layer in layers],
        )

    def restore(self, layers: list[LayerState]) -> None:
        """The counts of `sparsity`, `layer_summary` and `switch_report` as they were (the zero counter
        itself keeps counting, as pruning's calibration reads it: the step's zeros join `counted_before`)."""
        start = iter(() if self.counters is None else self.counters.unbind())
        for layer, (zeros, attainable), host in zip(layers, self.present, self.host, strict=True):
            zeros_then = next(start) if zeros else 0
            layer.attainable = next(start).clone() if attainable else None
            if layer.zeros is not None:
                added = layer.zeros - zeros_then
                layer.counted_before = added if layer.counted_before is None else layer.counted_before + added
            layer.numel, layer.attainable_numel, *layer.trained = host


class Attachment:
    """Handle returned by `attach`: counts steps and refreshes statistics on the schedule, reports them
    (`sparsity`, `layer_summary`), calls step hooks, and detaches (`detach`, or leaving a `with` block)."""

    def __init__(self, config: CompressionConfig, seed: int | None = 0, backend: Backend = "auto") -> None:
        self.config = config
        self.seed = resolve_seed(seed)
        self.backend = choices.choose("backend", backend, choices.BACKENDS)
        self.layers: list[LayerState] = []
        self.observers: list[GradientObserver] = []
        self.step = 0
        self._begun = False  # a step has begun
        self._driven = 0  # begin_step calls: the caller counts the steps
        self._backward = False  # a backward pass reached the compressed layers since the step began
        self._step_hooks: list[StepHook] = []
        self._warned: set[str] = set()
        self._undo: list[Callable[[], None]] = []
        self._step_start: _Tallies | None = None  # the counts as the step began (`discard_step`)
        self.noise = NoiseMonitor(config) if config.noise_every is not None else None

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # --- schedule -------------------------------------------------------------------------------------------
    def begin_step(self, step: int, epoch_start: bool = False) -> None:
        """Begin training step `step` (call before its forward pass, every step, with increasing steps):
        the caller counts the steps from then on. Only needed for refresh="epoch" (mark each epoch's first
        step with `epoch_start`) or to key the random bits to one's own step count."""
        if self._begun and step <= self.step:
            self._warn(
                "repeated step",
                f"begin_step({step}) after step {self.step}: steps must increase, or the random bits of "
                "the earlier step are drawn again",
            )
        self._driven += 1
        self._begin(step, epoch_start)

    def _auto_step(self, module: nn.Module, inputs: object) -> None:
        """Forward pre-hook of the model: a forward pass with gradients after a backward begins a step."""
        if self._driven or not torch.is_grad_enabled():
            return
        if not self._begun:
            if self.config.refresh == "epoch":
                self._warn(
                    "epoch",
                    "refresh='epoch' needs the epoch boundaries, which the attachment cannot see: "
                    "statistics are fitted at the first step only; call attachment.begin_step(step, "
                    "epoch_start=...) before each step",
                )
            self._begin(0, epoch_start=True)
        elif self._backward:
            self._begin(self.step + 1, epoch_start=False)

    def _begin(self, step: int, epoch_start: bool) -> None:
        refresh = self.config.refresh
        due = (
            refresh == "step"
            or (refresh == "epoch" and epoch_start)
            or (isinstance(refresh, int) and step % refresh == 0)
        )
        self._refit_unfitted(due)
        if self.noise is not None:  # the last noise step to the host, and the guard's reading of it
            self.noise.record()
            noise_step = self.noise.undecided
            compressed = {layer.index for layer in self.layers if layer.policy is None}
            for index in self.noise.decide(compressed):
                self._switch(self.layers[index], noise_step)
        if self.config.switch_step is not None and step >= self.config.switch_step:
            for layer in self.layers:
                self._switch(layer, step)
        plan(self.policy, [layer.stats for layer in self.layers if layer.policy is None], due)
        self.step, self._begun, self._backward = step, True, False
        if self.noise is not None and self.noise.due(step) and step >= self.config.warmup_steps:
            self.noise.pending = step
        for layer in self.layers:
            layer.refresh = layer.refresh or due
            layer.backwards = 0
        self._step_start = _Tallies.of(self.layers)
        for hook in list(self._step_hooks):
            hook(self, step)

    def _record_noise(self) -> None:
        """A noise step whose backward pass has run, to the host (reports read it; nothing is decided here,
        so reading never changes what the guard does, on this rank or any other)."""
        if self.noise is not None and self._backward:
            self.noise.record()

    def discard_step(self) -> None:
        """Leave the current step out of the records: call it when a step's update is not applied (e.g. a
        loss or gradient that is not finite, as `gradcomp train` and GradScaler skip them). Its compressed
        elements leave the counts of `sparsity`, `layer_summary` and `switch_report`, and a noise step's
        values are dropped; statistics it fitted that are not finite are fitted again at the next step."""
        if self._step_start is not None:
            self._step_start.restore(self.layers)
        if self.noise is not None and self.noise.pending == self.step:
            self.noise.discard()

    def _switch(self, layer: LayerState, step: int) -> None:
        if layer.policy is None:
            layer.policy, layer.stats, layer.switched_at = self.config.fallback, LayerStats(), step

    @property
    def _noise_step(self) -> bool:
        return self.noise is not None and self.noise.pending == self.step

    def _refit_unfitted(self, due: bool) -> None:
        """Layers whose last refresh fitted a non-finite value refresh again (one host sync, only in the
        step after a refresh that the schedule does not repeat)."""
        fitted = [layer for layer in self.layers if layer.fitted]
        for layer in fitted:
            layer.fitted = False
        if due:  # every layer refreshes anyway
            return
        checks = [(layer, values) for layer in fitted if (values := layer.stats.fitted_values())]
        if not checks:
            return
        device = checks[0][1][0].device
        finite = torch.stack(
            [torch.stack([v.to(device).float() for v in values]).isfinite().all() for _, values in checks]
        )
        unfitted = [layer for (layer, _), ok in zip(checks, finite.tolist(), strict=True) if not ok]
        for layer in unfitted:
            layer.refresh = True
        if unfitted:
            self._warn(
                "refit",
                f"{len(unfitted)} layers (e.g. {unfitted[0].name}) fitted nothing finite at step {self.step} "
                f"(all-zero gradients) and fit again at the next; statistics from the first steps of a new "
                f"network describe the rest of a refresh={self.config.refresh!r} interval poorly: consider "
                "warmup_steps (the reference code prunes after half an epoch)",
            )

    def add_step_hook(self, hook: StepHook) -> Callable[[], None]:
        """Call `hook(attachment, step)` as each step begins, when the statistics and counts of the step
        before are complete (e.g. to log `layer_summary()` to one's own logger); returns its remover."""
        self._step_hooks.append(hook)
        return lambda: self._step_hooks.remove(hook) if hook in self._step_hooks else None

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"gradcomp.attach: {message}", RuntimeWarning, stacklevel=3)

    @property
    def policy(self) -> Policy:
        return self.config.policy

    @property
    def active(self) -> bool:
        return self.step >= self.config.warmup_steps

    # --- the backward side ----------------------------------------------------------------------------------
    @property
    def _step_seed(self) -> int:
        return mix32(self.seed ^ mix32(self.step))

    def _seed(self, layer: LayerState, stream: int) -> int:
        return mix32(self._step_seed ^ (layer.index * 2 + stream))

    @property
    def tracks_bn_output(self) -> bool:
        """Whether the BatchNorm-output masks are recorded: the policy or an observer reads them."""
        return self.policy.uses_bn_output or bool(self.observers)

    def compress(self, layer: LayerState, g: Tensor, weight_path: bool = False, count: bool = True) -> Tensor:
        """The compressed gradient for one GEMM of `layer` (the weight-gradient one when weight_path)."""
        copy = self._copy(layer, g, weight_path, count)
        if copy is None:
            return g
        policy = layer.policy or self.policy
        return self._after(layer, policy, copy, compress(policy, copy, layer.stats), count)

    def compress_both(self, layer: LayerState, g: Tensor) -> tuple[Tensor, Tensor]:
        """(the weight-gradient copy, the input-gradient copy): `compress` of each, one after the other,
        but that a policy that quantizes both together (`pair_compressor`) does so."""
        policy = layer.policy or self.policy
        pair = pair_compressor(policy)
        if not self.active or pair is None:
            return self.compress(layer, g, weight_path=True, count=False), self.compress(layer, g)
        weight, inputs = self._copy(layer, g, True, False), self._copy(layer, g, False, True)
        assert weight is not None and inputs is not None  # active
        out_weight, out_inputs = pair(policy, weight, inputs, layer.stats)
        return (
            self._after(layer, policy, weight, out_weight, False),
            self._after(layer, policy, inputs, out_inputs, True),
        )

    def _copy(self, layer: LayerState, g: Tensor, weight_path: bool, count: bool) -> GradientCopy | None:
        """`compress`'s bookkeeping before the policy runs, and the copy it gets (None while inactive)."""
        bn_output = (
            layer.bn_output if layer.bn_output is not None and layer.bn_output.shape == g.shape else None
        )
        if not weight_path:
            layer.bn_output = None  # this backward's is used once
            if self.observers:
                active = None if bn_output is None else bn_output != 0
                for observe in self.observers:
                    observe(layer.name, g, active)
        if count:  # once per layer and backward pass
            layer.backwards += 1
            if layer.backwards == 2 and self._driven < 2:
                self._warn(
                    "repeated backward",
                    f"two backward passes through {layer.name} in step {self.step} without a new "
                    "forward pass or begin_step: the step's statistics and random bits are used again",
                )
            self._backward = True
        if not self.active:
            return None
        if count and layer.zeros is None:
            layer.zeros = torch.zeros((), dtype=torch.int64, device=g.device)
        policy = layer.policy or self.policy
        count_input = count and layer.refresh and policy.reports_attainable
        if count_input and layer.attainable is None:
            layer.attainable = torch.zeros((), dtype=torch.int64, device=g.device)
        return GradientCopy(
            g,
            self._seed(layer, 1 if weight_path else 0),
            refresh=layer.refresh,
            weight_path=weight_path,
            bn_output=bn_output,
            zeros=layer.zeros if count else None,
            attainable=layer.attainable if count_input else None,
            layer=layer.name,
            feature_axis=layer.feature_axis,
            backend=self.backend,
            run_seed=self.seed,
            step_seed=self._step_seed,
        )

    def _after(
        self, layer: LayerState, policy: Policy, copy: GradientCopy, out: Tensor, count: bool
    ) -> Tensor:
        """`compress`'s bookkeeping after the policy ran: the noise monitor and the counts."""
        if self._noise_step and (copy.weight_path or not policy.two_streams):
            self.noise.observe(layer.index, policy, copy, out, layer.stats)
        if count:
            layer.fitted = layer.fitted or layer.refresh
            layer.refresh = False
            layer.numel += out.numel()
            layer.trained[layer.policy is not None] += out.numel()
            layer.attainable_numel += copy.g.numel() if copy.attainable is not None else 0
        return out

    # --- reporting ------------------------------------------------------------------------------------------
    def reset_counts(self) -> None:
        """Start the counts of `sparsity` and `layer_summary` afresh: the counters keep counting (the
        calibration of pruning reads them), their values now are what later counts are taken from."""
        for layer in self.layers:
            layer.counted_before = None if layer.zeros is None else layer.zeros.clone()
            layer.numel, layer.attainable, layer.attainable_numel = 0, None, 0
        if self._step_start is not None:  # a step discarded later takes out what it added since
            self._step_start = _Tallies.of(self.layers)

    def _counts(self, total: Reduce | None) -> list[tuple[float, float, float, float]]:
        """(zeros, elements) of every layer's compressed gradients since the last reset, then the zeros
        pruning could reach and the elements they were counted over (where the policy counts them), summed
        by `total`."""
        none = torch.zeros((), dtype=torch.float64)
        zeros = [none if x.zeros is None else _since(x.zeros, x.counted_before) for x in self.layers]
        own = [none if x.attainable is None else _since(x.attainable, None) for x in self.layers]
        numel = [[float(x.numel), float(x.attainable_numel)] for x in self.layers]
        numel = torch.tensor(numel, dtype=torch.float64).reshape(-1, 2)
        counts = torch.stack([torch.stack(zeros), numel[:, 0], torch.stack(own), numel[:, 1]], 1)
        return [tuple(row) for row in (counts if total is None else total(counts)).tolist()]

    def sparsity(self, total: Reduce | None = None) -> float | None:
        """Fraction of zeros in the compressed gradients since the last reset (one host sync). `total` sums
        the counts over training processes (then every process reports the figure of all of them)."""
        counts = self._counts(total)
        elements = sum(row[1] for row in counts)
        return sum(row[0] for row in counts) / elements if elements else None

    def layer_summary(self, total: Reduce | None = None) -> dict[str, dict]:
        """Per layer: achieved sparsity and the elements it was counted over (summed by `total`, as in
        `sparsity`; for pruning also "attainable", the sparsity it could reach: at each refresh since the
        last reset the larger of the target's zeros and those the gradient had already), then this process's
        statistics from the layer's last refresh (None where the policy has none): the fitted (mu, sigma) of
        ln|g| over the non-zeros, threshold, FP scale and format, the share s0 of zeros at the following
        BatchNorm's output where the fit excluded them, heterogeneous pruning's truncation, allocated sparsity
        and cosine, and for integer policies the gradient's range (max - min) and the activation path's bins
        (2^bits - 1). A chain reports its first member's statistics (those of the uncompressed gradient) and,
        under "members", each member's own: a later member's are measured on its predecessor's output (e.g. an
        FP member's mu and sigma after pruning)."""
        summary = {}
        for layer, (zeros, numel, own, counted) in zip(self.layers, self._counts(total), strict=True):
            policy = layer.policy or self.policy
            counts = {"sparsity": zeros / numel if numel else None, "elements": int(numel)}
            if self.policy.reports_attainable:
                counts["attainable"] = own / counted if counted else None
            if self.config.switching:
                counts["switched_at"] = layer.switched_at
            if isinstance(policy, Chain):
                parts = layer.stats.parts or [LayerStats() for _ in policy.policies]
                members = [
                    {"policy": member.describe(), **_statistics(member, part)}
                    for member, part in zip(policy.policies, parts, strict=True)
                ]
                summary[layer.name] = {**counts, **members[0], "members": members}
                del summary[layer.name]["policy"]
            else:
                summary[layer.name] = {**counts, **_statistics(policy, layer.stats)}
        return summary

    def noise_ratios(self) -> list[dict]:
        """One row per (noise step, layer): the predicted and measured noise ratio of the layer's weight
        gradient and their parts (`gradcomp.training.noise_monitor`); empty without noise_every."""
        if self.noise is None:
            return []
        self._record_noise()
        return list(self.noise.history)

    def switch_report(self, summary: dict | None = None) -> dict[str, object]:
        """The switches to the fallback (layer -> step; the guard's or switch_step's), the share of the
        compressed elements that took the fallback since training began, and the average bits per gradient
        element over training: the policy's and the fallback's, weighted by the elements each compressed
        (`summary`: the run's, for policies whose bits depend on it, e.g. pruning's measured sparsity; by
        default this attachment's own `sparsity()` and `layer_summary()`, one host sync; None where that is
        unknown: nothing counted since the last reset)."""
        self._record_noise()
        switches = {layer.name: layer.switched_at for layer in self.layers if layer.switched_at is not None}
        policy, fallback = (sum(layer.trained[k] for layer in self.layers) for k in (0, 1))
        share = fallback / (policy + fallback) if policy + fallback else 0.0
        summary = summary or {"gradient_sparsity": self.sparsity(), "layers": self.layer_summary()}
        parts = [(1 - share, self.policy), (share, self.config.fallback)]
        bits = [(weight, policy.bits_per_element(summary)) for weight, policy in parts if weight]
        average = None if any(b is None for _, b in bits) else sum(weight * b for weight, b in bits)
        return {"switched": switches, "fallback_share": share, "average_bits": average}

    def state_dict(self) -> dict:
        """Statistics, pending refreshes and counts of every layer, and the noise ratios and guard (for
        checkpoints; a noise step whose backward pass has run is brought to the host first, one still
        measuring is restored as pending)."""
        self._record_noise()
        return {
            "step": self.step,
            "backward": self._backward,
            "noise": None if self.noise is None else self.noise.state(),
            "layers": {
                layer.name: {
                    "stats": layer.stats.state(),
                    "refresh": layer.refresh,
                    "zeros": layer.zeros,
                    "counted_before": layer.counted_before,
                    "numel": layer.numel,
                    "attainable": layer.attainable,
                    "attainable_numel": layer.attainable_numel,
                    "trained": list(layer.trained),
                    "switched_at": layer.switched_at,
                }
                for layer in self.layers
            },
        }

    def load_state_dict(self, state: dict) -> None:
        self.step, self._begun, self._backward = state["step"], True, state.get("backward", True)
        for layer in self.layers:
            saved = state["layers"].get(layer.name)
            if saved is not None:
                layer.stats = LayerStats.from_state(saved["stats"])
                layer.refresh, layer.zeros, layer.numel = saved["refresh"], saved["zeros"], saved["numel"]
                layer.counted_before = saved.get("counted_before")
                layer.attainable = saved.get("attainable")
                layer.attainable_numel = saved.get("attainable_numel", 0)
                layer.trained = list(saved.get("trained", (0, 0)))
                layer.switched_at = saved.get("switched_at")
                layer.policy = None if layer.switched_at is None else self.config.fallback
        if self.noise is not None and state.get("noise") is not None:
            self.noise.load(state["noise"])

    def detach(self) -> None:
        """Remove every hook and wrapper: the model is as before `attach`."""
        while self._undo:
            self._undo.pop()()


def _statistics(policy: Policy, stats: LayerStats) -> dict[str, object]:
    """The statistics one (non-chain) policy reports for a layer, as numbers (None where unknown: before
    any refresh, NaN, e.g. the BatchNorm share of a layer without a following BatchNorm)."""
    values = {name: _number(stats.report(name)) for name in policy.reports}
    return {**values, **policy.constants}


def _since(counter: Tensor, before: Tensor | None) -> Tensor:
    """A counter's count since `before` (its value at a reset), as a float64 on the host."""
    return (counter if before is None else counter - before).to("cpu", torch.float64)


def _number(value: Tensor | float | None) -> float | None:
    number = None if value is None else float(value)
    return None if number is None or math.isnan(number) else number


class _LayerIdentity(torch.autograd.Function):
    """Identity in forward that remembers the attachment and layer for its backward. Marks its input dirty
    (returns it as the output) rather than returning a view, so that later in-place ops on the activation
    stay legal."""

    @staticmethod
    def forward(ctx, x: Tensor, attachment: Attachment, layer: LayerState) -> Tensor:
        ctx.attachment, ctx.layer = attachment, layer
        ctx.mark_dirty(x)
        return x


class _CompressOutputGradient(_LayerIdentity):
    """Compresses the gradient in backward."""

    @staticmethod
    def backward(ctx, g: Tensor):
        return ctx.attachment.compress(ctx.layer, g), None, None


class _RecordActive(_LayerIdentity):
    """Notes in backward where the gradient (a BatchNorm's output gradient) is non-zero, for the layer whose
    output that BatchNorm normalised."""

    @staticmethod
    def backward(ctx, g: Tensor):
        if ctx.attachment.tracks_bn_output:
            ctx.layer.bn_output = g  # read by the layer's compression (no copy, no launch)
        return g, None, None


class _TwoStreamLayer(torch.autograd.Function):
    """Runs a layer once, keeping its local graph; backward differentiates it separately for the input (with
    the activation-path gradient) and for the parameters (with the weight-path gradient)."""

    @staticmethod
    def forward(
        ctx, attachment: Attachment, layer: LayerState, forward: Callable, x: Tensor, *params: Tensor
    ):
        with torch.enable_grad():
            local_input = x.detach().requires_grad_(x.requires_grad)
            out = forward(local_input)
        ctx.attachment, ctx.layer, ctx.out, ctx.local_input = attachment, layer, out, local_input
        ctx.params = params
        return out.detach()

    @staticmethod
    def backward(ctx, g: Tensor):
        needs_input = ctx.local_input.requires_grad
        input_grad = None
        param_grads: Sequence[Tensor | None] = ()
        g_weight, g_input = _two_copies(ctx.attachment, ctx.layer, g, bool(ctx.params), needs_input)
        if ctx.params:
            param_grads = torch.autograd.grad(
                ctx.out, ctx.params, g_weight, allow_unused=True, retain_graph=True
            )
        if needs_input:
            (input_grad,) = torch.autograd.grad(ctx.out, ctx.local_input, g_input)
        del ctx.out, ctx.local_input
        return None, None, None, input_grad, *param_grads


class _TwoStreamConv(torch.autograd.Function):
    """`_TwoStreamLayer` for a plain convolution (`_plain_convolution`): its gradients from aten's
    convolution backward directly, one call per copy with the arguments and output masks autograd gives it
    (the same results), without a local graph and two passes of the autograd engine (a fifth of a small
    network's step on CPUs)."""

    @staticmethod
    def forward(ctx, attachment: Attachment, layer: LayerState, conv: nn.Module, x: Tensor, weight, bias):
        ctx.attachment, ctx.layer, ctx.conv, ctx.bias = attachment, layer, conv, bias is not None
        ctx.save_for_backward(x, weight)
        return conv._conv_forward(x, weight, bias)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, weight = ctx.saved_tensors
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[3:6]
        g_weight, g_input = _two_copies(ctx.attachment, ctx.layer, g, needs_weight or needs_bias, needs_input)
        conv = ctx.conv
        options = (conv.stride, conv.padding, conv.dilation, False, conv.output_padding, conv.groups)
        bias_sizes = [weight.shape[0]] if ctx.bias else None
        input_grad = weight_grad = bias_grad = None
        if needs_weight or needs_bias:
            mask = [False, needs_weight, needs_bias]
            _, weight_grad, bias_grad = torch.ops.aten.convolution_backward(
                g_weight, x, weight, bias_sizes, *options, mask
            )
        if needs_input:
            input_grad = torch.ops.aten.convolution_backward(
                g_input, x, weight, bias_sizes, *options, [True, False, False]
            )[0]
        return None, None, None, input_grad, weight_grad, bias_grad


def _two_copies(
    attachment: Attachment, layer: LayerState, g: Tensor, weights: bool, inputs: bool
) -> tuple[Tensor | None, Tensor | None]:
    """(the weight-gradient copy where the parameters need one, the input-gradient copy where the input
    does): the weight path is counted when it is the only one (e.g. the first layer)."""
    if weights and inputs:
        return attachment.compress_both(layer, g)
    if weights:
        return attachment.compress(layer, g, weight_path=True), None
    return None, attachment.compress(layer, g)


def _plain_convolution(module: nn.Module) -> bool:
    """Whether `_TwoStreamConv` computes what the module's forward and autograd do: torch's own
    convolution class (no subclass forward), zero padding given as numbers, no parametrization, no forward
    of the instance's own."""
    return (
        type(module) in (nn.Conv1d, nn.Conv2d, nn.Conv3d)
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
        and not torch.nn.utils.parametrize.is_parametrized(module)
        and "forward" not in vars(module)
    )


def select_layers(
    model: nn.Module,
    types: Sequence[str] = ("conv", "linear"),
    include: Sequence[str] = ("*",),
    exclude: Sequence[str] = (),
) -> list[tuple[str, nn.Module]]:
    """(name, module) of the layers of the given types whose names match an include and no exclude pattern."""
    unknown = set(types) - set(LAYER_TYPES)
    if unknown:
        raise ValueError(f"unknown layer types {sorted(unknown)}; choose from {sorted(LAYER_TYPES)}")
    chosen = _matching(model, tuple(cls for t in types for cls in LAYER_TYPES[t]), include, exclude)
    if not chosen:
        raise ValueError(
            f"no layer of types {list(types)} matches include={list(include)} exclude={list(exclude)}"
        )
    return chosen


def _matching(
    model: nn.Module, classes: tuple[type[nn.Module], ...], include: Sequence[str], exclude: Sequence[str]
) -> list[tuple[str, nn.Module]]:
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, classes)
        and any(fnmatch.fnmatchcase(name, p) for p in include)
        and not any(fnmatch.fnmatchcase(name, p) for p in exclude)
    ]


def attach(
    model: nn.Module,
    config: CompressionConfig | Policy | str,
    seed: int | None = 0,
    backend: Backend = "auto",
) -> Attachment:
    """Compress the neural gradients of the layers of `model` that `config` selects (see the module doc);
    a policy (or policy string) alone compresses at its own placement, refreshing statistics every step.
    Attach before wrapping the model (DistributedDataParallel, torch.compile). The returned `Attachment`
    counts the steps itself (or follows `begin_step`), reports statistics and detaches, also as a context
    manager: ``with attach(model, "prune:sparsity=0.85") as handle: ...``.

    `seed` keys the random bits: each element's depend on (seed, step, layer, stream) only (None draws a
    seed from torch's generator, as the ops do). `backend` chooses the ops' implementation ("auto": the
    Triton kernels on CUDA; "triton" forces them, e.g. on CPU tensors under TRITON_INTERPRET=1 to count their
    launches; "torch").

    What would fail at the first backward pass, or do nothing, fails here, before anything is put on the
    model: a seed that is no integer, an unknown backend, layers of a dtype the policy cannot compute in, a
    compiled model, layers another attachment holds (detach it first), keep_last / keep_worst that keep
    every selected layer or rank layers without a noise ratio. A failure while the hooks go on removes
    those already on: a refused attach leaves the model as it was. A policy whose own placement selects
    under half of the model's convolution and linear layers (prune or fp on a transformer) warns, naming
    `layer_types`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"attach takes a torch.nn.Module, got {type(model).__name__}")
    _check_not_compiled(model)
    if not isinstance(config, CompressionConfig):
        config = CompressionConfig(policy=config)
    attachment = Attachment(config, seed, backend)
    chosen = select_layers(model, config.types, config.include, config.exclude)
    taken = [name for name, module in chosen if module in _ATTACHED]
    if taken:
        raise RuntimeError(
            f"{len(taken)} of the layers (e.g. {taken[0]!r}) already have an attachment: call its detach() "
            "(or attach in a with block) before attaching again, or each backward pass compresses twice"
        )
    for name, module in chosen:
        floats = [t for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]
        if floats:  # the layer's gradients come in its parameters' dtype
            check_dtype(config.policy, floats[0].dtype, f"layer {name!r}")
    _check_kept(config, chosen)
    if config.layer_types is None:
        _warn_small_share(model, config, chosen)
    try:  # everything is checked: install, and undo what was installed if anything still fails
        _install(model, attachment, chosen)
    except BaseException:
        attachment.detach()
        raise
    return attachment


def _install(model: nn.Module, attachment: Attachment, chosen: list[tuple[str, nn.Module]]) -> None:
    """The hooks and wrappers of an attachment, each with its remover in `attachment._undo`."""
    config = attachment.config
    attachment._undo.append(model.register_forward_pre_hook(attachment._auto_step).remove)
    for index, (name, module) in enumerate(chosen):
        layer = LayerState(name, index, 1 if isinstance(module, LAYER_TYPES["conv"]) else -1)
        attachment.layers.append(layer)
        if attachment.noise is not None:
            attachment._undo.extend(
                attachment.noise.watch(index, name, module, lambda: attachment._noise_step)
            )
        _ATTACHED[module] = attachment
        attachment._undo.append(functools.partial(_ATTACHED.pop, module, None))
        if config.policy.two_streams:
            attachment._undo.append(_wrap_forward(module, attachment, layer))
        elif config.placement == "output":
            handle = module.register_forward_hook(_output_hook(attachment, layer))
            attachment._undo.append(handle.remove)
        else:
            handle = module.register_forward_pre_hook(_input_hook(attachment, layer))
            attachment._undo.append(handle.remove)
    if config.placement == "output" and not config.policy.two_streams:
        for module in model.modules():
            if isinstance(module, LAYER_TYPES["bn"]):
                attachment._undo.extend(_track_bn_output(module, attachment))
    for layer in attachment.layers[len(attachment.layers) - config.keep_last :]:
        attachment._switch(layer, 0)  # kept in high precision from the start


def _check_kept(config: CompressionConfig, chosen: list[tuple[str, nn.Module]]) -> None:
    """keep_last and keep_worst must leave a layer under the policy, and keep_worst can rank only the
    layers that have a noise ratio (a weight that takes a gradient) and are not kept already."""
    kept = config.keep_last + config.keep_worst
    if kept and kept >= len(chosen):
        keys = " + ".join(
            f"{key}={getattr(config, key)}" for key in ("keep_last", "keep_worst") if getattr(config, key)
        )
        raise ValueError(
            f"{keys} keeps every one of the {len(chosen)} selected layers in the fallback, so nothing is "
            f"compressed by {config.policy.label}: keep fewer layers, or train with the fallback alone"
        )
    rankable = [name for name, module in chosen[: len(chosen) - config.keep_last] if monitorable(module)]
    if config.keep_worst > len(rankable):
        raise ValueError(
            f"keep_worst={config.keep_worst} ranks layers by their noise ratio, and {len(rankable)} of the "
            "selected layers have one (a convolution or linear layer whose weight takes a gradient, not "
            "kept by keep_last)"
        )


def _check_not_compiled(model: nn.Module) -> None:
    """Hooks added to a compiled model are not in its compiled graph (the one-stream policies would compress
    nothing, silently): refuse a model that is, or holds, a module compiled by torch.compile."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing is compiled
    for name, module in model.named_modules():
        if (
            (eval_frame is not None and isinstance(module, eval_frame.OptimizedModule))
            or getattr(module, "_compiled_call_impl", None) is not None  # module.compile()
            or hasattr(module.__dict__.get("forward"), "_torchdynamo_orig_callable")  # forward replaced
        ):
            raise RuntimeError(
                f"{f'its module {name!r}' if name else 'the model'} is compiled by torch.compile: attach to "
                "the model before compiling it (compression hooks added later are not in the compiled graph)"
            )


def _warn_small_share(
    model: nn.Module, config: CompressionConfig, chosen: list[tuple[str, nn.Module]]
) -> None:
    """A policy's own placement is its paper's (convolutions for prune and fp), which on another
    architecture may miss most GEMMs (a ViT's linear layers): the figures would then describe a few layers
    while reading as the whole model's."""
    gemms = _matching(model, LAYER_TYPES["conv"] + LAYER_TYPES["linear"], config.include, config.exclude)
    covered = {name for name, _ in chosen}
    missed = [name for name, _ in gemms if name not in covered]
    if 2 * len(missed) <= len(gemms):
        return
    warnings.warn(
        f"gradcomp.attach: {config.policy.label} acts on {' and '.join(config.types)} layers (its paper's "
        f"placement), {len(gemms) - len(missed)} of the model's {len(gemms)} convolution and linear layers: "
        f"the other {len(missed)} (e.g. {', '.join(missed[:3])}) keep exact gradients and sparsity() counts "
        "none of them; layer_types=['conv', 'linear'] (CompressionConfig, or the layer_types config key) "
        "compresses them too",
        UserWarning,
        stacklevel=3,
    )


def _output_hook(attachment: Attachment, layer: LayerState):
    def hook(module: nn.Module, inputs, output):
        if isinstance(output, Tensor) and output.requires_grad:
            output = _CompressOutputGradient.apply(output, attachment, layer)
            layer.output = weakref.ref(output)
        return output

    return hook


def _track_bn_output(bn: nn.Module, attachment: Attachment) -> list[Callable[[], None]]:
    """Hooks that pair `bn` with the compressed layer whose output it normalises and wrap the BatchNorm's
    output (for timm's BatchNormAct, the input of its activation) in `_RecordActive`."""
    current: list[LayerState | None] = [None]

    def find_layer(module: nn.Module, inputs) -> None:
        current[0] = None
        if attachment.tracks_bn_output and inputs and isinstance(inputs[0], Tensor):
            current[0] = next((x for x in attachment.layers if x.output() is inputs[0]), None)

    def wrap(tensor):
        layer = current[0]
        if layer is None or not isinstance(tensor, Tensor) or not tensor.requires_grad:
            return tensor
        current[0] = None
        return _RecordActive.apply(tensor, attachment, layer)

    handles = [bn.register_forward_pre_hook(find_layer)]
    act = getattr(bn, "act", None)
    if isinstance(act, nn.Module) and not isinstance(act, nn.Identity):
        handles.append(act.register_forward_pre_hook(lambda m, inputs: (wrap(inputs[0]), *inputs[1:])))
    else:
        handles.append(bn.register_forward_hook(lambda m, inputs, output: wrap(output)))
    return [handle.remove for handle in handles]


def _input_hook(attachment: Attachment, layer: LayerState):
    def hook(module: nn.Module, inputs):
        if inputs and isinstance(inputs[0], Tensor) and inputs[0].requires_grad:
            # the input may be a view or saved elsewhere: compress a fresh alias of it
            return (_CompressOutputGradient.apply(inputs[0] * 1, attachment, layer), *inputs[1:])
        return None

    return hook


def _wrap_forward(module: nn.Module, attachment: Attachment, layer: LayerState) -> Callable[[], None]:
    original = module.forward
    plain = _plain_convolution(module)

    def forward(x: Tensor, *args, **kwargs):
        if not torch.is_grad_enabled():
            return original(x, *args, **kwargs)
        if plain and not args and not kwargs and not torch.is_autocast_enabled(x.device.type):
            return _TwoStreamConv.apply(attachment, layer, module, x, module.weight, module.bias)
        params = tuple(p for p in module.parameters() if p.requires_grad)  # parametrized weights too
        return _TwoStreamLayer.apply(
            attachment, layer, lambda inp: original(inp, *args, **kwargs), x, *params
        )

    module.forward = forward

    def undo() -> None:
        del module.forward

    return undo
