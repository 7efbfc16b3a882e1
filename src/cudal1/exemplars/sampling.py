"""Exemplar selection for the contrastive prompt: `bucket` (the paper), `island` (FunSearch-style), `random`.

Each strategy is an object built from a dataclass config and a seed (or a `random.Random`), and selected
by name with `make_sampler(name, config, rng=...)`. `sample(pool, task_id=...)` takes a task's scored codes
(e.g. `ExemplarDB.list(task_id)`) and returns up to `n` distinct ones **ordered ascending by score, so the
best implementation comes last**, right before the model is asked to beat it (the paper shows previous
implementations with their scores; it does not publish their order, so this is our choice).

Bucket sampling (CUDA-L1, design section 5): scores are put in buckets of width `bucket_width` (Δs); a
bucket's score is the mean of its members; N distinct buckets are drawn one after another without
replacement, each with probability proportional to exp((bucket_mean - mean of all bucket means) / τ)
among those not yet drawn; then one code is drawn uniformly from each chosen bucket. Δs and τ are not
published. `scale` says in which units they are read: `log` (the default) buckets and weighs ln(score), so
both are relative: Δs = 0.1 is a bucket of 10.5 % at any speed, and τ = 0.7 (about ln 2) gives a bucket
twice as fast e^1 = 2.7 times the weight of another, at 1x as at 10x; `linear` reads them in speedup units,
as the paper writes them (Δs = 0.1: 1.00-1.10x, 1.10-1.20x, ...; with τ = 1 a 20x bucket outweighs a 10x one
by e^10, and at 0.3x every code shares two buckets). The island sampler's τ is read on the same `scale`.
With fewer buckets than N, every bucket is used once (fewer than N codes come back).

Limits: `island` keeps its island assignment, migrations and resets in memory, per task, for the life of
the sampler object; a new object rebuilds islands from the hashes (migrations are then lost).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cudal1.exemplars.db import ScoredCode, normalized_hash

__all__ = ["BucketSampler", "BucketSamplingConfig", "IslandSampler", "IslandSamplingConfig", "RandomSampler",
           "RandomSamplingConfig", "SAMPLERS", "ExemplarSampler", "ScoredCode", "make_sampler",
           "softmax_weights", "bucketize"]


def _make_rng(rng: random.Random | int | None) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


def softmax_weights(values: Sequence[float], temperature: float) -> list[float]:
    """exp((v - mean(values)) / τ), normalised to sum 1. Shifted by the max before exp to avoid overflow,
    which changes no ratio."""
    if not values:
        return []
    mean = sum(values) / len(values)
    logits = [(v - mean) / temperature for v in values]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def _draw_distinct(weights: Sequence[float], k: int, rng: random.Random) -> list[int]:
    """Indices of k distinct items drawn one by one, each ∝ weight among those left (successive sampling)."""
    left = list(range(len(weights)))
    chosen: list[int] = []
    while left and len(chosen) < k:
        pick = rng.choices(left, weights=[weights[i] for i in left], k=1)[0]
        chosen.append(pick)
        left.remove(pick)
    return chosen


def _ascending(codes: list[ScoredCode]) -> list[ScoredCode]:
    return sorted(codes, key=lambda c: c.score)


def _key(code: ScoredCode) -> str:
    return str(code.meta.get("norm_hash") or normalized_hash(code.code))


#: The units a sampler reads scores in (module docstring).
SCALES = ("log", "linear")
#: The smallest score `log` reads (a speedup of 0 would have no logarithm).
_LOG_FLOOR = 1e-6


def scaled(score: float, scale: str) -> float:
    """A score in the sampler's units: ln(score) (`log`) or the score itself (`linear`)."""
    return math.log(max(score, _LOG_FLOOR)) if scale == "log" else score


def bucketize(pool: Sequence[ScoredCode], bucket_width: float, scale: str = "linear") -> dict[int, list[ScoredCode]]:
    """Codes grouped by floor(scaled score / bucket_width); keys ascending."""
    buckets: dict[int, list[ScoredCode]] = {}
    for code in pool:
        buckets.setdefault(math.floor(scaled(code.score, scale) / bucket_width + 1e-9), []).append(code)
    return dict(sorted(buckets.items()))


class ExemplarSampler(Protocol):
    """Chooses the previous implementations shown in a contrastive prompt."""

    name: str

    def sample(self, pool: Sequence[ScoredCode], *, task_id: str = "") -> list[ScoredCode]:
        """Up to `n` distinct codes of `pool`, ascending by score."""
        ...


@dataclass
class BucketSamplingConfig:
    """CUDA-L1's score-bucket sampling."""

    n: int = field(default=2, metadata={"help": "Exemplars per prompt (the paper: N=2)."})
    bucket_width: float = field(default=0.1, metadata={
        "help": "Bucket width Δs in the scale's units (log: 0.1 is a 10.5 % bucket; linear: 1.0-1.1x, 1.1-1.2x, "
                "...). Not published; our default."})
    temperature: float = field(default=0.7, metadata={
        "help": "τ of the softmax over bucket means, in the scale's units (log: 0.7, about ln 2). Not published; "
                "our default."})
    scale: str = field(default="log", metadata={
        "help": "Units of scores, Δs and τ: log (ln of the speedup: relative) or linear (speedup units, the "
                "paper's)."})

    def __post_init__(self) -> None:
        if self.n < 1 or self.bucket_width <= 0 or self.temperature <= 0:
            raise ValueError("set n >= 1, bucket_width > 0 and temperature > 0")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {', '.join(SCALES)}, not {self.scale!r}")


class BucketSampler:
    """Draw N distinct score buckets (softmax over bucket means), then one code uniformly from each."""

    name = "bucket"

    def __init__(self, config: BucketSamplingConfig | None = None, *, rng: random.Random | int | None = None):
        self.config = config or BucketSamplingConfig()
        self.rng = _make_rng(rng)

    def bucket_probabilities(self, pool: Sequence[ScoredCode]) -> dict[int, float]:
        """Probability of each bucket as the *first* draw (for inspection and tests)."""
        buckets = bucketize(pool, self.config.bucket_width, self.config.scale)
        return dict(zip(buckets, softmax_weights(self._means(buckets.values()), self.config.temperature),
                        strict=True))

    def _means(self, buckets: Any) -> list[float]:
        """Each bucket's mean score, in the scale's units."""
        scale = self.config.scale
        return [sum(scaled(c.score, scale) for c in members) / len(members) for members in buckets]

    def sample(self, pool: Sequence[ScoredCode], *, task_id: str = "") -> list[ScoredCode]:
        """Up to `n` codes from distinct buckets, ascending by score."""
        buckets = list(bucketize(pool, self.config.bucket_width, self.config.scale).values())
        means = self._means(buckets)
        weights = softmax_weights(means, self.config.temperature)
        chosen = _draw_distinct(weights, self.config.n, self.rng)
        return _ascending([self.rng.choice(buckets[i]) for i in chosen])


@dataclass
class RandomSamplingConfig:
    """Uniform sampling (the paper's weakest ablation)."""

    n: int = field(default=2, metadata={"help": "Exemplars per prompt."})

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("set n >= 1")


class RandomSampler:
    """N distinct codes uniformly at random."""

    name = "random"

    def __init__(self, config: RandomSamplingConfig | None = None, *, rng: random.Random | int | None = None):
        self.config = config or RandomSamplingConfig()
        self.rng = _make_rng(rng)

    def sample(self, pool: Sequence[ScoredCode], *, task_id: str = "") -> list[ScoredCode]:
        """Up to `n` distinct codes, ascending by score."""
        return _ascending(self.rng.sample(list(pool), min(self.config.n, len(pool))))


@dataclass
class IslandSamplingConfig:
    """FunSearch-style islands."""

    n: int = field(default=2, metadata={"help": "Exemplars per prompt."})
    num_islands: int = field(default=4, metadata={"help": "Islands K; a code's island is its hash modulo K."})
    temperature: float = field(default=0.7, metadata={
        "help": "τ of the softmax over scores within an island, in the scale's units."})
    scale: str = field(default="log", metadata={
        "help": "Units of scores and τ: log (ln of the speedup: relative) or linear (speedup units)."})
    migrate_every: int = field(default=16, metadata={
        "help": "Every M new codes, the best code of a random island is copied into the worst island "
                "(worst = lowest best score). 0 disables migration."})
    reset_every: int = field(default=0, metadata={
        "help": "Every R new codes, empty the worst half of the islands and seed each with the best code "
                "of a surviving island (FunSearch's reset). 0 (default) disables resets."})

    def __post_init__(self) -> None:
        if self.n < 1 or self.num_islands < 1 or self.temperature <= 0:
            raise ValueError("set n >= 1, num_islands >= 1 and temperature > 0")
        if self.migrate_every < 0 or self.reset_every < 0:
            raise ValueError("migrate_every and reset_every must be >= 0 (0 disables)")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {', '.join(SCALES)}, not {self.scale!r}")


@dataclass
class _IslandState:
    members: list[set[str]]  # island -> keys of its codes
    seen: set[str] = field(default_factory=set)  # keys assigned so far (reset codes stay out)
    additions: int = 0


class IslandSampler:
    """Pick an island uniformly among non-empty ones, then codes in it by softmax over their scores."""

    name = "island"

    def __init__(self, config: IslandSamplingConfig | None = None, *, rng: random.Random | int | None = None):
        self.config = config or IslandSamplingConfig()
        self.rng = _make_rng(rng)
        self._states: dict[str, _IslandState] = {}

    def islands(self, pool: Sequence[ScoredCode], *, task_id: str = "") -> list[list[ScoredCode]]:
        """The current islands of a task's pool (after assigning any new codes)."""
        by_key = {_key(c): c for c in pool}
        state = self._sync(task_id, by_key)
        return [[by_key[k] for k in sorted(island) if k in by_key] for island in state.members]

    def sample(self, pool: Sequence[ScoredCode], *, task_id: str = "") -> list[ScoredCode]:
        """Up to `n` distinct codes, mostly from one island (topped up from others if it is small)."""
        islands = [island for island in self.islands(pool, task_id=task_id) if island]
        chosen: list[ScoredCode] = []
        taken: set[str] = set()
        self.rng.shuffle(islands)  # uniform island first, then others in random order for top-up
        for island in islands:
            candidates = [c for c in island if _key(c) not in taken]
            weights = softmax_weights([scaled(c.score, self.config.scale) for c in candidates],
                                      self.config.temperature)
            for i in _draw_distinct(weights, self.config.n - len(chosen), self.rng):
                chosen.append(candidates[i])
                taken.add(_key(candidates[i]))
            if len(chosen) >= self.config.n:
                break
        return _ascending(chosen)

    def _sync(self, task_id: str, by_key: dict[str, ScoredCode]) -> _IslandState:
        """Assign new codes to islands by hash, then migrate/reset when their periods come around."""
        cfg = self.config
        state = self._states.setdefault(task_id, _IslandState([set() for _ in range(cfg.num_islands)]))
        for key in sorted(set(by_key) - state.seen):
            state.seen.add(key)
            state.members[int(key[:8], 16) % cfg.num_islands].add(key)
            state.additions += 1
            if cfg.migrate_every and state.additions % cfg.migrate_every == 0:
                self._migrate(state, by_key)
            if cfg.reset_every and state.additions % cfg.reset_every == 0:
                self._reset(state, by_key)
        return state

    def _best_score(self, island: set[str], by_key: dict[str, ScoredCode]) -> float:
        scores = [by_key[k].score for k in island if k in by_key]
        return max(scores) if scores else -math.inf

    def _best_key(self, island: set[str], by_key: dict[str, ScoredCode]) -> str | None:
        present = [k for k in island if k in by_key]
        return max(present, key=lambda k: (by_key[k].score, k)) if present else None

    def _migrate(self, state: _IslandState, by_key: dict[str, ScoredCode]) -> None:
        order = sorted(range(len(state.members)), key=lambda i: self._best_score(state.members[i], by_key))
        worst = order[0]
        donors = [i for i in order[1:] if self._best_key(state.members[i], by_key) is not None]
        if not donors:
            return
        best = self._best_key(state.members[self.rng.choice(donors)], by_key)
        state.members[worst].add(best)  # type: ignore[arg-type]

    def _reset(self, state: _IslandState, by_key: dict[str, ScoredCode]) -> None:
        order = sorted(range(len(state.members)), key=lambda i: self._best_score(state.members[i], by_key))
        half = len(order) // 2
        survivors = [i for i in order[half:] if self._best_key(state.members[i], by_key) is not None]
        if not survivors:
            return
        for i in order[:half]:
            seed = self._best_key(state.members[self.rng.choice(survivors)], by_key)
            state.members[i] = {seed} if seed is not None else set()


SAMPLERS: dict[str, tuple[type, type]] = {
    "bucket": (BucketSampler, BucketSamplingConfig),
    "island": (IslandSampler, IslandSamplingConfig),
    "random": (RandomSampler, RandomSamplingConfig),
}


def make_sampler(name: str, config: Any = None, *, rng: random.Random | int | None = None) -> ExemplarSampler:
    """A sampler by name ('bucket', 'island', 'random'); `config` may be its config object or a dict."""
    if name not in SAMPLERS:
        raise ValueError(f"unknown exemplar sampler {name!r}; choose one of {sorted(SAMPLERS)}")
    sampler_cls, config_cls = SAMPLERS[name]
    if isinstance(config, dict):
        config = config_cls(**config)
    elif config is not None and not isinstance(config, config_cls):
        raise ValueError(f"sampler {name!r} takes a {config_cls.__name__}, got {type(config).__name__}")
    return sampler_cls(config, rng=rng)
