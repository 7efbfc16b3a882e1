"""The per-task exemplar database of contrastive RL and the strategies that pick exemplars for a prompt."""

from cudal1.exemplars.db import AddResult, ExemplarDB, ScoredCode, normalize_source, normalized_hash
from cudal1.exemplars.sampling import (
    SAMPLERS,
    BucketSampler,
    BucketSamplingConfig,
    ExemplarSampler,
    IslandSampler,
    IslandSamplingConfig,
    RandomSampler,
    RandomSamplingConfig,
    make_sampler,
)

__all__ = [
    "AddResult",
    "BucketSampler",
    "BucketSamplingConfig",
    "ExemplarDB",
    "ExemplarSampler",
    "IslandSampler",
    "IslandSamplingConfig",
    "RandomSampler",
    "RandomSamplingConfig",
    "SAMPLERS",
    "ScoredCode",
    "make_sampler",
    "normalize_source",
    "normalized_hash",
]
