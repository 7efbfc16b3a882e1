"""Held-out landscapes whose optimum moves away from the training siblings': the measured table, relabelled.

Each held-out family has a training sibling whose measured landscape correlates 0.92-0.99 with its own (mish
with gelu and swish, rmsnorm with layernorm, ...), so a prior learnt on the training tasks finds a held-out
task's optimum without any feedback. `perturb_table` breaks that and nothing else: for every held-out task it
draws `fields` of the six recipe fields and, for each drawn field, a permutation of its values with no value
left in place, and relabels the task's cells through them, so that the recipe a policy writes, `T64 ...`,
gets the measured cell of `T1024 ...`. Every number of the landscape is still a measurement of that task
(the same speedups, spreads and failures, the same interactions between fields), only which names reach
them changed: what the training tasks taught about the drawn fields is wrong there, what they taught about
the others still holds. A draw that leaves the task's best recipe where it was is drawn again.

The permutations are fixed by `seed` and recorded in the table (`perturbation`), and in the study's results.
"""

from __future__ import annotations

import copy
import hashlib
import random
from typing import Any

from experimental.contrastive_study.recipes import BY_TEXT, FIELDS, SPACE, Recipe, field_values

_NAMES = tuple(FIELDS)


def _derangement(values: tuple, rng: random.Random) -> list:
    out = list(values)
    while any(a == b for a, b in zip(out, values, strict=True)):
        rng.shuffle(out)
    return out


def _relabel(recipe: Recipe, maps: dict[str, dict]) -> str:
    """The recipe whose measured cell `recipe` names after relabelling."""
    values = [maps.get(name, {}).get(v, v) for name, v in zip(_NAMES, field_values(recipe), strict=True)]
    return Recipe(*values).text


def draw_relabelling(task_id: str, fields: int, seed: int) -> dict[str, dict]:
    """field -> {shown value: measured value} for `fields` fields of one task (deterministic in its inputs)."""
    rng = random.Random(int(hashlib.sha256(f"perturb|{seed}|{task_id}".encode()).hexdigest()[:12], 16))
    return {name: dict(zip(FIELDS[name], _derangement(FIELDS[name], rng), strict=True))
            for name in sorted(rng.sample(_NAMES, fields), key=_NAMES.index)}


def perturb_table(data: dict[str, Any], fields: int = 3, seed: int = 0) -> dict[str, Any]:
    """A copy of a table's data (`table.json`'s) whose held-out tasks are relabelled (module docstring); the
    drawn permutations and each task's best recipe before and after are under `perturbation`."""
    if not 1 <= fields <= len(_NAMES):
        raise ValueError(f"fields must be in 1..{len(_NAMES)}, got {fields}")
    out = copy.deepcopy(data)
    record: dict[str, Any] = {"fields": fields, "seed": seed, "tasks": {}}
    for tid, entry in out["tasks"].items():
        if not entry["held_out"]:
            continue
        cells = data["tasks"][tid]["cells"]
        best_before = max(cells, key=lambda r: _speedup(cells[r]))
        for attempt in range(100):
            maps = draw_relabelling(tid, fields, seed + 1000 * attempt)
            relabelled = {r.text: cells[_relabel(r, maps)] for r in SPACE}
            best_after = max(relabelled, key=lambda r: _speedup(relabelled[r]))
            if best_after != best_before:
                break
        entry["cells"] = relabelled
        record["tasks"][tid] = {"maps": {k: {str(a): b for a, b in m.items()} for k, m in maps.items()},
                                "best_recipe_measured": best_before, "best_recipe_shown": best_after,
                                "fields_moved": sum(x != y for x, y in zip(field_values(BY_TEXT[best_before]),
                                                                           field_values(BY_TEXT[best_after]),
                                                                           strict=True))}
    out["perturbation"] = record
    return out


def _speedup(cell: dict[str, Any]) -> float:
    return float(cell["speedup"]) if cell.get("status") == "correct" else 0.0
