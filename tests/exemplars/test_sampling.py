"""Exemplar samplers: bucket frequencies match the paper's formula; island and random properties."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from cudal1.exemplars.db import ScoredCode
from cudal1.exemplars.sampling import (
    BucketSampler,
    BucketSamplingConfig,
    IslandSampler,
    IslandSamplingConfig,
    RandomSampler,
    bucketize,
    make_sampler,
)


def pool_of(scores) -> list[ScoredCode]:
    return [ScoredCode(code=f"x = {i}  # score {s}\n", score=s) for i, s in enumerate(scores)]


# Known buckets with width 0.1: [1.0,1.1) -> {1.02, 1.04, 1.06}; [1.5,1.6) -> {1.55};
# [2.0,2.1) -> {2.01, 2.09}; [3.0,3.1) -> {3.05}; [0.3,0.4) -> {0.3}: bucket means 1.04, 1.55, 2.05, 3.05, 0.3
SCORES = [1.02, 1.04, 1.06, 1.55, 2.01, 2.09, 3.05, 0.3]
BUCKET_OF = {1.02: 10, 1.04: 10, 1.06: 10, 1.55: 15, 2.01: 20, 2.09: 20, 3.05: 30, 0.3: 3}
MEANS = {10: 1.04, 15: 1.55, 20: 2.05, 30: 3.05, 3: 0.3}


def exact_pair_probabilities(tau: float) -> dict[frozenset, float]:
    """P(the two distinct buckets drawn are {i, j}) for successive draws without replacement, with weights
    exp((mean_b - mean of means) / tau)."""
    grand = sum(MEANS.values()) / len(MEANS)
    w = {b: math.exp((m - grand) / tau) for b, m in MEANS.items()}
    total = sum(w.values())
    return {frozenset((i, j)): w[i] / total * w[j] / (total - w[i]) + w[j] / total * w[i] / (total - w[j])
            for i, j in itertools.combinations(w, 2)}


def test_bucketize_known_buckets():
    buckets = bucketize(pool_of(SCORES), 0.1, "linear")
    assert {k: sorted(c.score for c in v) for k, v in buckets.items()} == {
        3: [0.3], 10: [1.02, 1.04, 1.06], 15: [1.55], 20: [2.01, 2.09], 30: [3.05]}


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_bucket_sampling_frequencies_match_the_formula(tau):
    sampler = BucketSampler(BucketSamplingConfig(n=2, bucket_width=0.1, temperature=tau, scale="linear"), rng=1234)
    pool = pool_of(SCORES)
    draws = 20000
    pairs: Counter = Counter()
    within: Counter = Counter()
    for _ in range(draws):
        chosen = sampler.sample(pool)
        assert len(chosen) == 2 and chosen[0].score <= chosen[1].score
        buckets = frozenset(BUCKET_OF[c.score] for c in chosen)
        assert len(buckets) == 2  # two distinct buckets
        pairs[buckets] += 1
        within.update(c.score for c in chosen if BUCKET_OF[c.score] == 10)
    expected = exact_pair_probabilities(tau)
    assert math.isclose(sum(expected.values()), 1.0)
    for pair, p in expected.items():
        # 4.5 standard errors: a false alarm is ~1e-5 per pair; a wrong formula is off by far more
        tolerance = 4.5 * math.sqrt(p * (1 - p) / draws) + 1e-3
        assert abs(pairs[pair] / draws - p) <= tolerance, (sorted(pair), pairs[pair] / draws, p)
    # one code uniformly from the chosen bucket
    picks = sum(within.values())
    for score in (1.02, 1.04, 1.06):
        assert abs(within[score] / picks - 1 / 3) < 0.03


def test_bucket_sampling_with_fewer_buckets_than_n_and_first_draw_probabilities():
    sampler = BucketSampler(BucketSamplingConfig(n=3, temperature=1.0, scale="linear"), rng=0)
    pool = pool_of([1.01, 1.02, 2.5])
    assert sorted(c.score for c in sampler.sample(pool))[-1] == 2.5 and len(sampler.sample(pool)) == 2
    assert sampler.sample(pool_of([1.5])) == pool_of([1.5])
    assert sampler.sample([]) == []
    probs = sampler.bucket_probabilities(pool)
    assert probs[25] / probs[10] == pytest.approx(math.exp(2.5 - 1.015))


def test_the_default_scale_is_relative_a_pool_ten_times_faster_is_sampled_alike():
    """The paper's units are absolute: the same relative spread at 10x gives a 20x bucket e^10 the weight of
    a 10x one. Read in ln(speedup) (the default), Δs and τ are relative: scaling every score leaves the
    bucket probabilities as they were, and a bucket twice as fast weighs e^(ln 2 / τ) times more."""
    slow = pool_of([1.0, 1.2, 1.5, 2.0])
    fast = pool_of([10.0, 12.0, 15.0, 20.0])
    log = BucketSampler()
    assert log.config.scale == "log" and log.config.temperature == 0.7
    assert sorted(log.bucket_probabilities(slow).values()) == pytest.approx(
        sorted(log.bucket_probabilities(fast).values()))
    by_score = dict(zip([1.0, 2.0], [log.bucket_probabilities(slow)[k] for k in (0, 6)], strict=True))
    assert by_score[2.0] / by_score[1.0] == pytest.approx(math.exp(math.log(2.0) / 0.7))
    linear = BucketSampler(BucketSamplingConfig(temperature=1.0, scale="linear"))
    top_slow, top_fast = max(linear.bucket_probabilities(slow).values()), max(linear.bucket_probabilities(fast).values())
    assert top_fast > 0.99 > 0.5 > top_slow  # absolute units: at 10x the best bucket takes everything
    with pytest.raises(ValueError, match="scale"):
        BucketSamplingConfig(scale="sqrt")


def test_seeded_samplers_are_reproducible():
    pool = pool_of(SCORES)
    for name in ("bucket", "island", "random"):
        a = [make_sampler(name, rng=7).sample(pool, task_id="t") for _ in range(1)]
        b = [make_sampler(name, rng=7).sample(pool, task_id="t") for _ in range(1)]
        assert a == b
        shared = random.Random(3)
        assert make_sampler(name, rng=shared).rng is shared


def test_random_sampler_distinct_uniform():
    sampler = RandomSampler(rng=5)
    pool = pool_of([1.0, 2.0, 3.0, 4.0])
    counts: Counter = Counter()
    for _ in range(4000):
        chosen = sampler.sample(pool)
        assert len({c.code for c in chosen}) == 2 and chosen[0].score <= chosen[1].score
        counts.update(c.score for c in chosen)
    assert all(abs(v / 8000 - 0.25) < 0.03 for v in counts.values())
    assert len(sampler.sample(pool[:1])) == 1


def test_island_assignment_by_hash_is_deterministic_and_partitions_the_pool():
    pool = pool_of([1.0 + i / 10 for i in range(12)])
    config = IslandSamplingConfig(num_islands=4, migrate_every=0)
    islands_a = IslandSampler(config, rng=1).islands(pool, task_id="t")
    islands_b = IslandSampler(config, rng=99).islands(list(reversed(pool)), task_id="t")
    assert islands_a == islands_b and len(islands_a) == 4
    assert sorted(c.code for island in islands_a for c in island) == sorted(c.code for c in pool)


def test_island_sample_properties():
    pool = pool_of([1.0 + i / 10 for i in range(12)])
    sampler = IslandSampler(IslandSamplingConfig(n=2, num_islands=4, migrate_every=0), rng=3)
    islands = sampler.islands(pool, task_id="t")
    home = {c.code: k for k, island in enumerate(islands) for c in island}
    same_island = 0
    for _ in range(300):
        chosen = sampler.sample(pool, task_id="t")
        assert len(chosen) == 2 and chosen[0].code != chosen[1].code and chosen[0].score <= chosen[1].score
        same_island += home[chosen[0].code] == home[chosen[1].code]
    sizes = [len(i) for i in islands]
    if min(sizes) >= 2:
        assert same_island == 300  # both from the sampled island whenever it has two codes
    else:
        assert same_island > 0
    assert sampler.sample(pool[:1], task_id="tiny") == pool[:1]


@pytest.mark.parametrize("scale", ["linear", "log"])
def test_island_softmax_prefers_high_scores_within_an_island(scale):
    pool = pool_of([1.0, 1.0, 1.0, 6.0])
    config = IslandSamplingConfig(n=1, num_islands=1, migrate_every=0, temperature=1.0, scale=scale)
    sampler = IslandSampler(config, rng=11)
    hits = sum(sampler.sample(pool, task_id="t")[0].score == 6.0 for _ in range(2000))
    gap = 5.0 if scale == "linear" else math.log(6.0)  # in the scale's units
    expected = math.exp(gap) / (math.exp(gap) + 3)
    assert abs(hits / 2000 - expected) < 0.03


def test_island_migration_copies_a_best_code_into_the_worst_island():
    pool = pool_of([1.0 + i / 10 for i in range(8)])
    no_mig = IslandSampler(IslandSamplingConfig(num_islands=4, migrate_every=0), rng=0).islands(pool, task_id="t")
    mig = IslandSampler(IslandSamplingConfig(num_islands=4, migrate_every=8), rng=0).islands(pool, task_id="t")
    best = [max((c.score for c in island), default=-1) for island in no_mig]
    worst = best.index(min(best))
    extra = {c.code for c in mig[worst]} - {c.code for c in no_mig[worst]}
    assert len(extra) == 1
    (moved,) = extra
    donors = [k for k in range(4) if k != worst and any(c.code == moved for c in no_mig[k])]
    assert donors and max(c.score for c in no_mig[donors[0]]) == next(c.score for c in pool if c.code == moved)
    assert sum(len(i) for i in mig) == len(pool) + 1


def test_island_reset_reseeds_worst_half():
    pool = pool_of([1.0 + i / 10 for i in range(8)])
    sampler = IslandSampler(IslandSamplingConfig(num_islands=4, migrate_every=0, reset_every=8), rng=0)
    islands = sampler.islands(pool, task_id="t")
    assert sum(len(i) == 1 for i in islands) >= 2  # two reset islands hold one seeded code each
    assert max(c.score for c in pool) in {c.score for island in islands for c in island}


def test_make_sampler_errors_and_dict_config():
    assert make_sampler("bucket", {"n": 3, "temperature": 0.5}).config.n == 3
    with pytest.raises(ValueError, match="unknown exemplar sampler"):
        make_sampler("greedy")
    with pytest.raises(ValueError):
        make_sampler("bucket", IslandSamplingConfig())
    with pytest.raises(ValueError):
        BucketSamplingConfig(bucket_width=0)
