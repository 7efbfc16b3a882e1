"""Verdict -> reward, and reward smoothing: the one implementation the trainer and the TRL/verl adapters share.

Reward convention (CUDA-L1, design section 5): the speedup over eager for a CORRECT candidate with a finite,
positive speedup; a configured value for everything else, default 0.0 (the paper's "0 for failures"):

- a failure status: `failure_rewards[status]`;
- a CORRECT candidate whose speedup is missing, non-finite (inf, nan) or not positive:
  `failure_rewards["correct_unmeasured"]` (an infinite speedup is a broken timing, never a reward);
- a verdict turned down by a verdict policy that names a reward for violations (`cudal1.policy`, e.g.
  KernelGYM's -1 for a decoy): that reward.

Which speedup a correct candidate earns (`SPEEDUP_ESTIMATES`): `point` (default), the evaluator's speedup;
`lower`, the low end of its 95 % interval (`EvalResult.speedup_ci`, the calls' bootstrap widened by the runner
pair's null): a speedup that the measurement's own spread cannot tell from 1x earns about 1x, so noise between
evaluations is not rewarded as progress. Without an interval, the point.

A failure table may be keyed by `Status` or by the status's string value (`"hack_detected"`), so both the
trainer's YAML configs and the adapters' Python tables work. A value of None (TRL: ignore this sample for
this reward function) passes through as None.

Reward transforms (`transform_reward`, applied to the raw reward before any smoothing; `REWARD_TRANSFORMS`):
- `speedup` (default, the paper's): the raw reward as it is;
- `log`: ln(max(raw, floor)), floor 0.1 by default: relative improvements count the same at every speed
  (2x -> 4x earns what 1x -> 2x does), and a failure's 0 lands at ln(0.1) = -2.3, below any candidate
  faster than a tenth of the reference;
- `bounded`: min(max(raw, 0), bound), bound 3 by default (Dr.Kernel clips speedups to [0, 3]): a very
  large (and often suspicious) speedup earns no more than `bound`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cudal1.core.types import EvalResult, Status

DEFAULT_FAILURE_REWARD = 0.0
REWARD_TRANSFORMS = ("speedup", "log", "bounded")
SPEEDUP_ESTIMATES = ("point", "lower")
#: `bounded`: Dr.Kernel's cap on a speedup reward ([0, 3]).
DEFAULT_REWARD_BOUND = 3.0
#: `log`: the smallest raw reward taken before the logarithm (a failure's 0 maps to ln(0.1)).
DEFAULT_LOG_FLOOR = 0.1
#: The smoothing's dead band (`smooth_rewards(noise_floor=...)`), relative. Measured on the contrastive study's
#: noisy rewards (docs/log.md, 2026-12-07; docs/results/contrastive_study/advantages.json): on 140 groups of 8 a
#: GRPO-trained policy proposed, at about the noise between two evaluations of one kernel through the evaluator
#: on an H100 (sigma 1.7 %), 0.05 cut the advantages' noise share from 0.23 (TRL rescaling after the clip) to
#: 0.12, and a group of 8 correct candidates within 1 % of each other got mean |advantage| 0.21 instead of
#: 0.78; spreads above about 2.5 sigma are standardised as before. For an evaluator whose noise differs, take
#: a floor near 2.5 sigma.
DEFAULT_NOISE_FLOOR = 0.05
#: The failure-table key for a CORRECT candidate without a usable speedup.
CORRECT_UNMEASURED = "correct_unmeasured"

FailureRewards = Mapping[Status, float | None] | Mapping[str, float | None]


def failure_reward(key: Status | str, failure_rewards: FailureRewards | None = None) -> float | None:
    """The configured value for a status (or `CORRECT_UNMEASURED`), keyed by Status or by its string; default 0.0.
    A value that is not a finite number raises ValueError (`check_failure_rewards` says so when configured)."""
    table: Mapping = failure_rewards or {}
    # Both spellings, explicitly: not relying on how a str-valued Enum hashes and compares.
    names = (key, key.value) if isinstance(key, Status) else (key, *(s for s in Status if s.value == key))
    for name in names:
        if name in table:
            value = table[name]
            return None if value is None else finite(value, f"the failure reward of {name}")
    return DEFAULT_FAILURE_REWARD


def finite(value: object, what: str) -> float:
    """`value` as a finite float, else ValueError naming `what`: no NaN or inf is ever paid as a reward."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, not {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, not {number}")
    return number


def check_failure_rewards(failure_rewards: FailureRewards | None) -> None:
    """ValueError unless every configured failure reward is a finite number or None (TRL: skip the sample)."""
    for name, value in (failure_rewards or {}).items():
        if value is not None:
            finite(value, f"the failure reward of {getattr(name, 'value', name)}")


def reward_of(result: EvalResult, failure_rewards: FailureRewards | None = None,
              estimate: str = "point") -> float | None:
    """The raw reward of one verdict (see the module docstring); `estimate`: one of `SPEEDUP_ESTIMATES`."""
    if estimate not in SPEEDUP_ESTIMATES:
        raise ValueError(f"unknown speedup estimate {estimate!r}; choose one of {', '.join(SPEEDUP_ESTIMATES)}")
    if result.status is Status.CORRECT:
        speedup = result.speedup
        ci = result.timing.speedup_ci if result.timing is not None else None
        if estimate == "lower" and speedup is not None and ci and math.isfinite(ci[0]) and ci[0] > 0:
            speedup = min(speedup, ci[0])
        if isinstance(speedup, (int, float)) and math.isfinite(speedup) and speedup > 0:
            return float(speedup)
        return failure_reward(CORRECT_UNMEASURED, failure_rewards)
    policy_reward = result.protocol.get("policy_violation_reward")
    if policy_reward is not None and any(f.source == "policy" for f in result.flags):
        # the verdict policy says what breaking its rules earns
        return finite(policy_reward, "the verdict policy's violation reward")
    return failure_reward(result.status, failure_rewards)


def transform_reward(value: float, transform: str = "speedup", *, bound: float = DEFAULT_REWARD_BOUND,
                     floor: float = DEFAULT_LOG_FLOOR) -> float:
    """One raw reward through a transform of `REWARD_TRANSFORMS` (see the module docstring)."""
    value = finite(value, "a raw reward")
    if transform == "speedup":
        return value
    if transform == "log":
        return math.log(max(float(value), floor))
    if transform == "bounded":
        return min(max(float(value), 0.0), bound)
    raise ValueError(f"unknown reward transform {transform!r}; choose one of {', '.join(REWARD_TRANSFORMS)}")


def smooth_rewards(values: Sequence[float], *, normalize: bool = True, clip_k: float | None = 1.5,
                   group_size: int | None = None, eps: float = 1e-6, noise_floor: float = 0.0,
                   floor_scale: str = "mean") -> list[float]:
    """Reward smoothing: (optionally) normalize by mean/std, then clip to [-clip_k, clip_k] (None: no clip).

    `group_size` normalizes within consecutive groups of that many values instead of the whole batch. A set
    whose values are all equal normalizes to zeros (no preference among them). The clip applies to whatever
    comes out of the normalization; callers that do not normalize pass `clip_k=None` unless they mean to
    clip raw values (the trainer's `RewardConfig` clips normalized rewards only).

    `noise_floor` is a dead band: a set is divided by max(std, noise_floor x scale), scale being the mean of
    the set's absolute values (`floor_scale="mean"`, for speedups: a relative floor) or 1 (`"one"`, for
    log speedups, whose differences are already relative). A set of candidates within measurement noise of
    each other (all correct, 3 % apart) then gets small values instead of the full +-1 of a standardisation,
    while a set with real differences is normalized as before.
    """
    if floor_scale not in ("mean", "one"):
        raise ValueError(f"floor_scale must be mean or one, not {floor_scale!r}")
    vals = [finite(v, "a reward to smooth") for v in values]  # one NaN would make its whole group NaN
    if not vals:
        return []
    if normalize:
        size = group_size if group_size and group_size > 1 else len(vals)
        out: list[float] = []
        for start in range(0, len(vals), size):
            chunk = vals[start:start + size]
            mean = sum(chunk) / len(chunk)
            std = math.sqrt(sum((v - mean) ** 2 for v in chunk) / len(chunk))
            scale = sum(abs(v) for v in chunk) / len(chunk) if floor_scale == "mean" else 1.0
            std = max(std, noise_floor * scale)
            out.extend((v - mean) / (std + eps) if std > eps else 0.0 for v in chunk)
        vals = out
    if clip_k is None:
        return vals
    return [max(-clip_k, min(clip_k, v)) for v in vals]
