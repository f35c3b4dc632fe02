"""How each policy compresses a layer's neural gradient: the torch side of `gradcomp.training.policies`.

`compress(policy, copy, stats)` returns the compressed gradient of one `GradientCopy` (the gradient, the
random seed, which GEMM's copy it is, the following BatchNorm's output gradient where the attachment knows
it). Per-layer statistics live in a `LayerStats` (tensors on the gradient's device): they are refreshed from
the current gradient when the copy says so (the attachment's schedule: every step, every K steps or once per
epoch) and reused otherwise. On CUDA a layer's work per step is a few kernel launches and never a host
sync: prune and fp with statistics refreshed every step take the fit (two launches: one pass over the
gradient, one tiny program for the solve) and the op (one launch, the zero count for the reported sparsity
fused in).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gradcomp._backend import Backend
from gradcomp.choices import KERNEL_DTYPES, integer
from gradcomp.formats import FPFormat
from gradcomp.formats.block import BlockFormat
from gradcomp.lognormal import cosine_threshold, expected_sparsity, fit_lognormal, truncation_k
from gradcomp.ops import (
    gaussian_threshold,
    laplace_threshold,
    nm_prune,
    quantize_block,
    quantize_fp,
    quantize_int,
    quantize_luq,
    stochastic_prune,
    topk_threshold,
)
from gradcomp.ops.block import quantize_block_pair
from gradcomp.ops.int_quant import quantize_columns
from gradcomp.ops.stats import (
    FIT_FIELDS,
    Calibration,
    add_zero_count,
    clip_free_log2_scale,
    fit_statistics,
    log2_scale,
)
from gradcomp.rng import resolve_seed
from gradcomp.theory import fp as fp_theory
from gradcomp.training.policies import (
    NM,
    Block,
    Chain,
    FloatingPoint,
    Integer,
    Luq,
    NoCompression,
    Policy,
    Prune,
)

_LN2 = math.log(2.0)
CHAIN_SEED_STRIDE = 7919  # member k of a chain draws its random bits from seed + k * CHAIN_SEED_STRIDE
FIT_RULES = {"bn_nonzero": "mixture", "reference": "reference", "all": "all"}  # Prune.fit -> fit_statistics


def chain_seed(seed: int, member: int) -> int:
    """The seed of a chain's member `member` (0 for the first) when the chain's seed is `seed`."""
    return seed + CHAIN_SEED_STRIDE * member


@dataclass(frozen=True)
class GradientCopy:
    """What a compressor receives: one copy of a layer's output gradient and how to treat it."""

    g: Tensor
    seed: int
    refresh: bool = True  # fit the statistics on this gradient (else reuse the layer's last ones)
    weight_path: bool = False  # the copy fed to the weight-gradient GEMM (differs for two-stream policies)
    bn_output: Tensor | None = None  # the gradient at the following BatchNorm's output, if known
    zeros: Tensor | None = None  # int64 counter to which the compressed gradient's zeros are added
    attainable: Tensor | None = None  # int64 counter of the zeros pruning can reach (see fit_statistics)
    layer: str = ""  # the layer's name (per-group settings)
    run_seed: int = 0  # the run's seed, and the step's (the same for every layer): what random choices made
    step_seed: int = 0  # once per run or once per step draw from (a block transform's signs)
    feature_axis: int = -1  # the axis of the output features (N:M blocks run along it)
    backend: Backend = "auto"

    def __post_init__(self) -> None:
        """A seed of None draws one (as the ops do); numpy integers are taken as ints."""
        object.__setattr__(self, "seed", resolve_seed(self.seed))
        object.__setattr__(self, "feature_axis", integer("feature_axis", self.feature_axis))


@dataclass
class LayerStats:
    """What a layer's compressor remembers between refreshes (tensors on the gradient's device)."""

    fit: Tensor | None = None  # float64 over FIT_FIELDS (mu, sigma of ln|g|, ...) from the last refresh
    moments: Tensor | None = None  # the log_moments the fit came from
    threshold: Tensor | None = None  # pruning alpha
    scale: Tensor | float | None = None  # FP scale (a power of two)
    numel: int = 0  # elements of the last compressed gradient
    # heterogeneous pruning (Prune.min_cosine, cosine_groups)
    min_cosine: float | None = None  # this layer's cosine limit
    truncation: Tensor | None = None  # k of the truncated cosine, at the last fit
    target: float | None = None  # the common sparsity allocated by `plan`, before the layer's cosine limit
    cosine: Tensor | None = None  # measured cosine between pruned and original gradient, last step
    # calibrated pruning (Prune.calibrate; gradcomp.lognormal.Calibration)
    correction: Tensor | None = None  # added to the target the threshold is solved for
    mark: Tensor | None = None  # the zero counter's value at the last refresh
    counter: Tensor | None = None  # the zero counter the mark belongs to
    pruned: int = 0  # elements pruned since the mark
    # dynamic loss scaling (FloatingPoint scaling="dynamic"): the shared scale's state, copied in every layer
    overflow: Tensor | None = None  # whether this layer's scaled gradient exceeded the format this step
    clean_steps: Tensor | None = None  # steps since the scale last changed without an overflow
    range: Tensor | None = None  # integer quantizers: max - min of the gradient, what PTQ's bins span
    parts: list[LayerStats] = field(default_factory=list)  # one per member of a chain

    @property
    def mu(self) -> Tensor | None:
        return self.report("mu")

    @property
    def sigma(self) -> Tensor | None:
        return self.report("sigma")

    def report(self, name: str) -> Tensor | float | None:
        """A reported statistic: a field of the fit, "allocated" (heterogeneous pruning's common sparsity)
        or an attribute."""
        if name in ("mu", "sigma", "bn_zero_share"):
            return None if self.fit is None else self.fit[FIT_FIELDS.index(name)]
        return self.target if name == "allocated" else getattr(self, name)

    def fitted_values(self) -> list[Tensor]:
        """The values of this layer and of each chain member that a refresh sets from the gradient: one of
        them non-finite means the gradient had nothing to fit (e.g. all zeros)."""
        own = [self.report(name) for name in ("mu", "sigma", "threshold", "scale", "range")]
        tensors = [value for value in own if isinstance(value, Tensor)]
        return tensors + [value for part in self.parts for value in part.fitted_values()]

    def state(self) -> dict[str, Any]:
        """Every field, for checkpoints (`from_state` reads it back)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**values, "parts": [part.state() for part in self.parts]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LayerStats:
        """A checkpoint's statistics; fields it lacks (older versions) take their defaults."""
        known = {f.name for f in dataclasses.fields(cls)} - {"parts"}
        values = {key: value for key, value in state.items() if key in known}
        return cls(**values, parts=[cls.from_state(part) for part in state.get("parts", [])])


# the gradient dtypes a policy's ops take, where not every float dtype: quantize_block computes in float32
POLICY_DTYPES: dict[type[Policy], tuple[str, ...]] = {Block: KERNEL_DTYPES}


def check_dtype(policy: Policy, dtype: torch.dtype, where: str) -> None:
    """Refuse a gradient dtype that `policy` (or a member of the chain) cannot compute in, before its first
    backward pass fails inside autograd."""
    name = str(dtype).removeprefix("torch.")
    for member in policy.policies if isinstance(policy, Chain) else (policy,):
        accepted = POLICY_DTYPES.get(type(member), (name,))
        if name not in accepted:
            raise TypeError(
                f"{member.label} takes {', '.join(accepted)} gradients, and {where} is {name}: convert the "
                "model (e.g. model.float()) or choose another policy"
            )


Compressor = Callable[[Policy, GradientCopy, LayerStats], Tensor]
Planner = Callable[[Policy, list[LayerStats], bool], None]
_COMPRESSORS: dict[type[Policy], Compressor] = {}
_PLANNERS: dict[type[Policy], Planner] = {}


def _implements(policy_type: type[Policy]):
    def wrap(fn: Compressor) -> Compressor:
        _COMPRESSORS[policy_type] = fn
        return fn

    return wrap


def plan(policy: Policy, layers: list[LayerStats], refresh: bool) -> None:
    """Decisions that need every layer's statistics, made before each step from the last one's: heterogeneous
    pruning's allocation (before a refresh), dynamic loss scaling's update (every step). A no-op for
    policies that treat layers independently."""
    planner = _PLANNERS.get(type(policy))
    if planner is not None:
        planner(policy, layers, refresh)


def compress(policy: Policy, copy: GradientCopy, stats: LayerStats) -> Tensor:
    """`policy` applied to the gradient copy, with and into the layer's statistics."""
    return _COMPRESSORS[type(policy)](policy, copy, stats)


@_implements(NoCompression)
def _none(policy: NoCompression, copy: GradientCopy, stats: LayerStats) -> Tensor:
    return add_zero_count(copy.g, copy.zeros)


THRESHOLDS = {"gaussian": gaussian_threshold, "laplace": laplace_threshold, "topk": topk_threshold}


@_implements(Prune)
def _prune(policy: Prune, copy: GradientCopy, stats: LayerStats) -> Tensor:
    g = copy.g
    if copy.refresh or stats.threshold is None:
        stats.numel = g.numel()
        mask = copy.bn_output if policy.uses_bn_output else None
        if policy.estimator == "lognormal":
            sparsity = policy.sparsity if stats.target is None else stats.target
            rule = FIT_RULES[policy.fit]
            calibration = _calibration(copy, stats) if policy.calibrated else None
            stats.moments, stats.fit, _ = fit_statistics(
                g,
                mask,
                sparsity,
                rule,
                backend=copy.backend,
                calibration=calibration,
                count_zeros_into=copy.attainable,
                min_zeros=math.floor(sparsity * g.numel()),
            )
            stats.threshold = stats.fit[3]
            stats.min_cosine = policy.cosine_limit(copy.layer) if policy.heterogeneous else None
            if stats.min_cosine is not None:
                stats.threshold = _cosine_capped_threshold(policy, g, mask, stats)
        else:  # the baselines model every entry; the fit is reported
            stats.moments, stats.fit, _ = fit_statistics(
                g,
                backend=copy.backend,
                count_zeros_into=copy.attainable,
                min_zeros=math.floor(policy.sparsity * g.numel()),
            )
            stats.threshold = THRESHOLDS[policy.estimator](g, policy.sparsity)
    out = stochastic_prune(g, stats.threshold, copy.seed, copy.backend, count_zeros_into=copy.zeros)
    stats.pruned += g.numel()
    if stats.min_cosine is not None:
        stats.cosine = torch.nn.functional.cosine_similarity(
            g.detach().flatten().double(), out.detach().flatten().double(), dim=0
        )
    return out


def _calibration(copy: GradientCopy, stats: LayerStats) -> Calibration | None:
    """The layer's calibration state, from the zeros the attachment counts (none without a counter: a
    chain's member, a direct call); no miss is learnt at the first refresh or across a new counter (e.g.
    one restored from a checkpoint)."""
    if copy.zeros is None:
        return None
    if stats.correction is None:
        stats.correction = torch.zeros((), dtype=torch.float64, device=copy.g.device)
        stats.mark = torch.zeros((), dtype=torch.int64, device=copy.g.device)
    learn = copy.zeros is stats.counter and stats.threshold is not None
    elements = stats.pruned if learn else 0
    stats.counter, stats.pruned = copy.zeros, 0
    threshold = stats.threshold if learn else stats.correction
    return Calibration(stats.correction, copy.zeros, stats.mark, elements, threshold)


def _cosine_capped_threshold(policy: Prune, g: Tensor, mask: Tensor | None, stats: LayerStats) -> Tensor:
    """The threshold at the allocated sparsity, lowered where the layer's predicted cosine would fall below
    its limit (NaN fits: no constraint)."""
    mu, sigma = stats.fit[0], stats.fit[1]
    stats.truncation = _truncation(policy, g, mask, stats)
    alpha_n = cosine_threshold(sigma, stats.min_cosine, stats.truncation)
    return torch.fmin(stats.threshold, alpha_n * torch.exp(mu))


def _truncation(policy: Prune, g: Tensor, mask: Tensor | None, stats: LayerStats) -> Tensor:
    """k of the truncated cosine: the policy's, or the reference's per-layer standardised N/300-th largest
    ln|g| over the fitted non-zeros (N: their count, read on the host)."""
    if policy.truncation is not None:
        return torch.tensor(policy.truncation, dtype=torch.float64, device=g.device)
    fitted = g.detach() if mask is None or policy.fit == "all" else g.detach() * (mask != 0)
    magnitude = fitted.abs().flatten().nan_to_num(nan=0.0, posinf=0.0)
    values = magnitude[magnitude > 0]
    if values.numel() < 2:
        return torch.tensor(math.nan, dtype=torch.float64, device=g.device)
    return truncation_k(values.double().log(), stats.fit[0], stats.fit[1])


def _allocate(policy: Prune, layers: list[LayerStats], refresh: bool) -> None:
    """Heterogeneous pruning: the common sparsity q with sum_l n_l min(q, Q_l) = sparsity * sum_l n_l, where
    Q_l is the layer's expected sparsity at its cosine-limited threshold (its last fit, both parts of the
    mixture where it has them), at most `max_sparsity`; layers without a limit are capped there only, and
    layers without a fit count at the target. q by bisection (the sum increases with q). One host sync."""
    if not policy.heterogeneous or not refresh:
        return
    cap = _MAX_ALLOCATED if policy.max_sparsity is None else policy.max_sparsity
    sizes = [max(stats.numel, 1) for stats in layers]
    limits = [cap if stats.min_cosine is None else policy.sparsity for stats in layers]
    fitted = [
        i
        for i, stats in enumerate(layers)
        if stats.min_cosine is not None and stats.fit is not None and stats.truncation is not None
    ]
    if fitted:  # one batched solve over the layers, not one per layer
        for i, value in zip(fitted, _cosine_limited_sparsity([layers[i] for i in fitted]), strict=True):
            if math.isfinite(value):
                limits[i] = min(value, cap)
    total = sum(sizes)

    def overall(q: float) -> float:
        return sum(n * min(q, limit) for n, limit in zip(sizes, limits, strict=True)) / total

    lo, hi = policy.sparsity, cap
    if overall(hi) <= policy.sparsity:
        q = hi  # the limits leave the target out of reach: every layer at its limit
    else:
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if overall(mid) < policy.sparsity else (lo, mid)
        q = hi
    for stats in layers:
        stats.target = q


def _cosine_limited_sparsity(layers: list[LayerStats]) -> list[float]:
    """Each layer's expected sparsity at the threshold where its predicted cosine meets its limit: the
    zeros it has plus each fitted part's expected new zeros (the unmasked part's lognormal and, where the
    mixture rule fitted them, the masked part's)."""
    fit = torch.stack([stats.fit for stats in layers]).cpu()
    moments = torch.stack([_two_parts(stats.moments) for stats in layers]).cpu()  # (L, 2, 4)
    k = torch.stack([stats.truncation.double() for stats in layers]).cpu()
    cosine = torch.tensor([stats.min_cosine for stats in layers], dtype=torch.float64)
    mu, sigma = fit[:, 0], fit[:, 1]
    usable = torch.isfinite(mu) & torch.isfinite(sigma) & torch.isfinite(k)
    sigma, k, mu = sigma.where(usable, 1.0), k.where(usable, 0.0), mu.where(usable, 0.0)
    log_alpha = torch.log(cosine_threshold(sigma, cosine, k)) + mu
    numel = torch.tensor([stats.numel for stats in layers], dtype=torch.float64)
    zeros = moments[..., 3].sum(1)
    parts_mu, parts_sigma = fit_lognormal(moments)  # (L, parts)
    count = moments[..., 0]
    new_zeros = count * expected_sparsity(log_alpha[:, None] - parts_mu, parts_sigma.clamp_min(1e-6))
    new_zeros = torch.where(count > 0, new_zeros, 0.0).sum(1)
    limit = (zeros + new_zeros) / numel
    return [value if ok else math.nan for value, ok in zip(limit.tolist(), usable.tolist(), strict=True)]


def _two_parts(moments: Tensor) -> Tensor:
    """log_moments as (2, 4): a fit without a mask has one part, the second is then empty."""
    parts = moments.reshape(-1, 4)
    return parts if parts.shape[0] == 2 else torch.cat([parts, torch.zeros_like(parts)])


_MAX_ALLOCATED = 0.999  # the largest sparsity heterogeneous pruning gives a layer without max_sparsity
_PLANNERS[Prune] = _allocate


@_implements(FloatingPoint)
def _floating_point(policy: FloatingPoint, copy: GradientCopy, stats: LayerStats) -> Tensor:
    g = copy.g
    if policy.scaling == "global":
        stats.scale = policy.global_scale  # a number: a kernel argument
    elif policy.scaling == "dynamic":
        if stats.scale is None:  # plan() updates it after every step
            stats.scale = torch.tensor(policy.global_scale, dtype=torch.float32, device=g.device)
            stats.clean_steps = torch.zeros((), dtype=torch.int64, device=g.device)
        magnitude = g.detach().abs().nan_to_num(nan=0.0, posinf=math.inf).amax()
        stats.overflow = magnitude * stats.scale > policy.fmt.max_value
    elif copy.refresh or stats.scale is None:
        points = scale_points(policy.fmt, policy.scaling, g.device)
        stats.moments, stats.fit, _ = fit_statistics(
            g, scale_points=points, backend=copy.backend, max_value=scale_bound(policy)
        )
        stats.scale = stats.fit[4]
    return quantize_fp(
        g, policy.fmt, stats.scale, policy.rounding, copy.seed, copy.backend, count_zeros_into=copy.zeros
    )


def _dynamic_scale(policy: FloatingPoint, layers: list[LayerStats], refresh: bool) -> None:
    """After a step: halve the shared scale if any layer overflowed, double it after `growth_interval`
    clean steps (GradScaler's update), on the device without a host sync."""
    compressed = [stats for stats in layers if stats.overflow is not None]  # those the step reached
    if policy.scaling != "dynamic" or not compressed:
        return
    overflow = torch.stack([stats.overflow for stats in compressed]).any()
    shared = compressed[0]  # every layer that compressed holds the shared scale and count
    clean = torch.where(overflow, 0, shared.clean_steps + 1)
    grow = clean >= (policy.growth_interval or 2000)
    scale = torch.where(overflow, shared.scale / 2, torch.where(grow, shared.scale * 2, shared.scale))
    clean = torch.where(grow, 0, clean)
    for stats in layers:
        stats.scale, stats.clean_steps, stats.overflow = scale, clean, None


_PLANNERS[FloatingPoint] = _dynamic_scale


def layer_log2_scale(policy: FloatingPoint, mu2: Tensor, sigma2: Tensor, amax: Tensor) -> Tensor:
    """log2 of the power-of-two scale `policy` gives a layer whose log2|g| has mean mu2 and std sigma2 and
    whose largest finite |g| is amax (0-d tensors, on their device; `ops.stats.largest_finite`); what
    compression uses, and what analyses predict from."""
    if policy.scaling in ("global", "dynamic"):
        return torch.tensor(math.log2(policy.global_scale), dtype=mu2.dtype, device=mu2.device)
    bound = scale_bound(policy)
    floor = None if bound is None else clip_free_log2_scale(amax.to(mu2.device), bound)
    return log2_scale(mu2, sigma2, scale_points(policy.fmt, policy.scaling, mu2.device), floor)


def scale_bound(policy: FloatingPoint) -> float | None:
    """The value that bounds a per-layer rule's scale from below (the scale keeps the layer's largest
    magnitude within it), or None: the format's largest value for the MSE-optimal rule, whose lognormal
    optimum can lie below that clip-free scale on a real gradient (whose tail ends where a lognormal's does
    not) and there flush the whole layer, while the tensor's own least MSE never lies below it
    (`ops.stats.clip_free_log2_scale`); None for the reference's rule, kept as the reference has it."""
    return policy.fmt.max_value if policy.scaling == "per_layer_optimal" else None


@functools.cache
def scale_points(fmt: FPFormat, scaling: str, device: torch.device) -> Tensor:
    """A per-layer scale rule as points (sigma2, log2-scale offset), float64 (2, P) on `device` (made once):
    the reference's rule puts the log2 mean at 2^-3 whatever sigma2; the MSE-optimal one interpolates the
    optimal offset of a lognormal against sigma2 (gradcomp.theory.fp)."""
    if scaling == "per_layer_mean":
        return torch.tensor([[0.0, 1.0], [-3.0, -3.0]], dtype=torch.float64, device=device)
    sigmas = torch.linspace(0.1, 8.0, 40, dtype=torch.float64)
    return torch.stack([sigmas, fp_theory.optimal_log2_scale(fmt.positive_values(), sigmas)[0]]).to(device)


@_implements(Integer)
def _integer(policy: Integer, copy: GradientCopy, stats: LayerStats) -> Tensor:
    g = copy.g
    # the range is reported only: each call quantizes on its gradient's own range
    if g.numel() and (copy.refresh or stats.range is None):
        low, high = torch.aminmax(g.detach())
        stats.range = (high - low).float()
    scheme = policy.weight_path if copy.weight_path else "same"
    seed, backend, zeros = copy.seed, copy.backend, copy.zeros
    if scheme == "same":
        return quantize_int(g, policy.bits, policy.scheme, seed, backend, count_zeros_into=zeros)
    if scheme == "none":
        return add_zero_count(g, zeros)
    if scheme == "column" and g.dim() > 1:  # one scale per feature (flattened channel, row, column)
        rows = g.reshape(g.shape[0], -1)
        return quantize_columns(rows, policy.weight_bits, seed, backend, zeros).reshape(g.shape)
    # ptq, or a 1-D gradient's one column group
    return quantize_int(g, policy.weight_bits, "ptq", seed, backend, count_zeros_into=zeros)


def _plan_chain(policy: Chain, layers: list[LayerStats], refresh: bool) -> None:
    for index, member in enumerate(policy.policies):
        plan(member, [stats.parts[index] for stats in layers if len(stats.parts) > index], refresh)


_PLANNERS[Chain] = _plan_chain


@_implements(Chain)
def _chain(policy: Chain, copy: GradientCopy, stats: LayerStats) -> Tensor:
    if len(stats.parts) != len(policy.policies):
        stats.parts = [LayerStats() for _ in policy.policies]
    g, last = copy.g, len(policy.policies) - 1
    for index, (member, own) in enumerate(zip(policy.policies, stats.parts, strict=True)):
        zeros = copy.zeros if index == last else None  # the chain's output is what the count is of
        member_copy = dataclasses.replace(copy, g=g, seed=chain_seed(copy.seed, index), zeros=zeros)
        g = compress(member, member_copy, own)
    return g


@_implements(Luq)
def _luq(policy: Luq, copy: GradientCopy, stats: LayerStats) -> Tensor:
    g, zeros = copy.g, copy.zeros
    return quantize_luq(g, policy.bits, policy.samples, copy.seed, copy.backend, count_zeros_into=zeros)


@_implements(NM)
def _nm(policy: NM, copy: GradientCopy, stats: LayerStats) -> Tensor:
    axis = copy.feature_axis if copy.g.dim() > 1 else -1
    return nm_prune(copy.g, policy.n, policy.m, axis, copy.seed, copy.backend, count_zeros_into=copy.zeros)


@_implements(Block)
def _block(policy: Block, copy: GradientCopy, stats: LayerStats) -> Tensor:
    """Blocks along the reduction axis of the copy's GEMM: the output features for the input gradient, the
    other axes (flattened) for the weight gradient; each copy with its own settings (`Block.copy`)."""
    return _block_result(copy, quantize_block(*_block_arguments(policy, copy), copy.backend, copy.zeros))


def _block_pair(
    policy: Block, weight: GradientCopy, inputs: GradientCopy, stats: LayerStats
) -> tuple[Tensor, Tensor]:
    """`_block` of both copies of one gradient, quantized together (`quantize_block_pair`)."""
    arguments = zip(_block_arguments(policy, weight), _block_arguments(policy, inputs), strict=True)
    out = quantize_block_pair(*arguments, weight.backend, (weight.zeros, inputs.zeros))
    return _block_result(weight, out[0]), _block_result(inputs, out[1])


_PAIR_COMPRESSORS: dict[type[Policy], Callable[..., tuple[Tensor, Tensor]]] = {Block: _block_pair}


def pair_compressor(policy: Policy) -> Callable[..., tuple[Tensor, Tensor]] | None:
    """What compresses a gradient's weight-gradient and input-gradient copies together, (policy, weight
    copy, input copy, stats) -> both results, where the policy has one (the block formats: one call); else
    None: `compress` each."""
    return _PAIR_COMPRESSORS.get(type(policy))


def _block_arguments(policy: Block, copy: GradientCopy) -> tuple[Tensor, BlockFormat, int, int, int | None]:
    """quantize_block's tensor, format, axis, seed and sign seed for one copy (`block_layout`'s tensor and
    axis; the sign seed of the copy's sign mode: None for a fresh one with each call's seed, or none)."""
    settings = policy.copy(copy.weight_path)
    fmt = settings.format
    sign_seed = {"step": copy.step_seed, "run": copy.run_seed}.get(settings.signs) if fmt.hadamard else None
    laid_out, axis = block_layout(copy.g, copy.weight_path, copy.feature_axis)
    return laid_out, fmt, axis, copy.seed, sign_seed


def _block_result(copy: GradientCopy, out: Tensor) -> Tensor:
    """The quantized `block_layout` tensor in the gradient's shape."""
    g = copy.g
    if g.dim() < 2 or not copy.weight_path:
        return out
    return out.view(g.movedim(copy.feature_axis, 0).shape).movedim(0, copy.feature_axis)


def block_layout(g: Tensor, weight_path: bool, feature_axis: int) -> tuple[Tensor, int]:
    """The tensor a block policy quantizes for one copy and the axis its blocks run along: the output
    features for the input-gradient copy, the other axes (flattened, one row per feature) for the
    weight-gradient copy; a 1-D gradient along itself."""
    if g.dim() < 2:
        return g, -1
    if not weight_path:
        return g, feature_axis
    features = g.movedim(feature_axis, 0)
    return features.reshape(features.shape[0], -1), -1
