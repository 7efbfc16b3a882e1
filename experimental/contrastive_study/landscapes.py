"""SYNTHETIC landscapes: procedurally generated recipe -> speedup functions for pre-training the improver.

Nothing here is measured, and nothing is fitted to the study's table (measured or surrogate): a landscape
is a random function over the recipe grammar with the kind of structure kernel tuning has. Its log speedup
is a base level, plus a main effect per field value, plus a few random pairwise interactions, plus 4 %
(family, recipe) noise; recipes over a random resource limit (a staged chunk too large) fail. Main effects
are drawn around a prior that depends on the task's features (wider vectors and more work in flight tend
to pay, staging tends to cost except for transposes, a worker per row is chosen by the row length ...),
with per-landscape deviations twice as large as the prior's own scale: the features say something, the
exemplars say more. An improver pre-trained on them learns to read scored exemplars (which field values the
better ones share) and to propose a recipe likely to beat the best shown.

Pre-training examples (`improver_example`): a landscape's features, k exemplars (uniformly drawn, or drawn
toward the good ones as a search would find them), their scores with 2 % noise, ascending; the target a
recipe better than the best shown, drawn with weight exp(gain / 0.25) among better ones within two fields
of the best shown (60 % of the time, `LOCAL_SHARE`) or anywhere (the rest). Without exemplars the target is drawn
from the landscape's top decile.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from experimental.contrastive_study.recipes import BY_TEXT, FIELDS, SPACE, distance, field_values

_FIELD_NAMES = tuple(FIELDS)
#: Share of pre-training targets drawn near the best exemplar shown (the rest: better recipes anywhere).
LOCAL_SHARE = 0.6


@dataclass
class Landscape:
    """A synthetic task: its features (as the study's tokens) and each recipe's speedup (0: it fails)."""

    features: list[str]
    speedups: dict[str, float]

    @property
    def best(self) -> float:
        return max(self.speedups.values())

    def correct(self) -> list[str]:
        return [r for r, s in self.speedups.items() if s > 0]


def _features(rng: random.Random) -> tuple[list[str], dict[str, float]]:
    kind = rng.choice(("ew", "row", "tr"))
    heavy = rng.random() < 0.5
    if kind == "ew":
        inputs, passes, row_out, log_r, log_c = rng.choice((1, 2)), 1, False, 0, rng.randint(24, 29)
    elif kind == "row":
        inputs, passes, row_out = 1, rng.randint(1, 3), rng.random() < 0.4
        log_c = rng.randint(7, 17)
        log_r = rng.randint(25, 28) - log_c
    else:
        inputs, passes, row_out = rng.choice((1, 2)), 1, False
        log_r = rng.randint(10, 16)
        log_c = rng.randint(24, 27) - log_r
    tokens = [kind, f"in{inputs}", "heavy" if heavy else "light", f"p{passes}", "rowout" if row_out else "fullout",
              f"r{log_r}", f"c{log_c}"]
    return tokens, {"kind": kind, "heavy": heavy, "passes": passes, "log_c": log_c, "inputs": inputs}


def _prior(field: str, value: object, f: dict) -> float:
    """The prior mean of a field value's main effect on log speedup, given the task's features."""
    kind = f["kind"]
    if field == "T":
        return {64: -0.25, 128: 0.0, 256: 0.1, 512: 0.05, 1024: -0.1}[value]  # type: ignore[index]
    if field == "V":
        return {1: -0.3, 2: -0.05, 4: 0.15}[value] * (0.6 if f["heavy"] else 1.0)  # type: ignore[index]
    if field == "I":
        return {1: -0.2, 2: 0.05, 4: 0.1, 8: 0.0}[value]  # type: ignore[index]
    if field == "L":
        return 0.08 if value == "G" else 0.0
    if field == "S":
        if kind == "tr":
            return 0.5 if value == 1 else -0.2
        return (0.05 * (f["passes"] - 1) - 0.12) if value == 1 else 0.0
    if field == "M":
        if kind == "row":  # a block per row pays for long rows, a warp per row for short ones
            return (0.06 * (f["log_c"] - 12)) if value == 1 else 0.0
        return -0.15 if value == 1 else 0.0
    raise ValueError(field)


def generate(rng: random.Random) -> Landscape:
    """One random landscape (see the module docstring)."""
    tokens, f = _features(rng)
    main = {(name, v): _prior(name, v, f) + rng.gauss(0.0, 0.22) for name, values in FIELDS.items() for v in values}
    pairs = rng.sample([(a, b) for i, a in enumerate(range(6)) for b in range(i + 1, 6)], 3)
    interactions = {(a, b, va, vb): rng.gauss(0.0, 0.15) for a, b in pairs
                    for va in FIELDS[_FIELD_NAMES[a]] for vb in FIELDS[_FIELD_NAMES[b]]}
    base = rng.gauss(0.4, 0.5)
    limit = rng.choice((8192, 16384, 32768, 65536))  # floats a staged block may hold
    speedups = {}
    for recipe in SPACE:
        values = field_values(recipe)
        if recipe.stage and recipe.threads * recipe.items * recipe.vec > limit:
            speedups[recipe.text] = 0.0
            continue
        x = base + sum(main[(name, v)] for name, v in zip(_FIELD_NAMES, values, strict=True))
        x += sum(interactions[(a, b, values[a], values[b])] for a, b in pairs)
        speedups[recipe.text] = math.exp(x + rng.gauss(0.0, 0.04))
    return Landscape(tokens, speedups)


def draw_exemplars(land: Landscape, k: int, rng: random.Random, noise: float = 0.02) -> list[tuple[str, float]]:
    """k distinct correct recipes with noisy scores, ascending: uniform, or (half the time) toward the good
    ones (weight proportional to speedup^3, as a search would have found them)."""
    correct = land.correct()
    k = min(k, len(correct))
    if rng.random() < 0.5:
        chosen = rng.sample(correct, k)
    else:
        chosen = []
        pool = list(correct)
        for _ in range(k):
            pick = rng.choices(pool, weights=[land.speedups[r] ** 3 for r in pool])[0]
            chosen.append(pick)
            pool.remove(pick)
    shown = [(r, land.speedups[r] * math.exp(rng.gauss(0.0, noise))) for r in chosen]
    return sorted(shown, key=lambda e: e[1])


def draw_target(land: Landscape, shown: list[tuple[str, float]], rng: random.Random) -> str:
    """A recipe better than the best shown (module docstring)."""
    correct = land.correct()
    if not shown:
        ranked = sorted(correct, key=land.speedups.__getitem__, reverse=True)[: max(1, len(correct) // 10)]
        return rng.choice(ranked)
    best = max(land.speedups[r] for r, _ in shown)
    better = [r for r in correct if land.speedups[r] > best]
    if not better:
        return max(shown, key=lambda e: land.speedups[e[0]])[0]
    if rng.random() < LOCAL_SHARE:
        top = BY_TEXT[max(shown, key=lambda e: e[1])[0]]  # the best as shown (scores are noisy)
        near = [r for r in better if distance(BY_TEXT[r], top) <= 2]
        better = near or better
    weights = [math.exp(math.log(land.speedups[r] / best) / 0.25) for r in better]
    return rng.choices(better, weights=weights)[0]


def improver_example(rng: random.Random, k_choices: tuple[int, ...] = (0, 1, 2, 3, 4, 4, 4, 6)
                     ) -> tuple[Landscape, list[tuple[str, float]], str]:
    """(landscape, exemplars, target) for one pre-training example."""
    land = generate(rng)
    shown = draw_exemplars(land, rng.choice(k_choices), rng)
    return land, shown, draw_target(land, shown, rng)

