"""Held-out landscapes relabelled so that their optimum moves away from the training siblings'
(experimental.contrastive_study.perturb), on the SURROGATE table."""

from __future__ import annotations

from experimental.contrastive_study.perturb import perturb_table
from experimental.contrastive_study.recipes import FIELDS
from experimental.contrastive_study.surrogate import surrogate_table
from experimental.contrastive_study.table import Table


def test_relabelling_moves_every_held_out_optimum_and_keeps_every_measurement():
    data = surrogate_table()
    out = perturb_table(data, fields=3, seed=0)
    before, after = Table(data), Table(out)
    assert out["perturbation"]["fields"] == 3 and set(out["perturbation"]["tasks"]) == set(after.split()[1])
    for tid, entry in out["tasks"].items():
        cells = [sorted(repr(c) for c in t.tasks[tid]["cells"].values()) for t in (before, after)]
        assert cells[0] == cells[1]  # the same measurements, other names
        if not entry["held_out"]:
            assert entry["cells"] == data["tasks"][tid]["cells"]
            continue
        record = out["perturbation"]["tasks"][tid]
        assert len(record["maps"]) == 3 and record["fields_moved"] >= 1
        assert after.best_recipe(tid) == record["best_recipe_shown"] != before.best_recipe(tid)
        assert after.best(tid) == before.best(tid)
        for name, mapping in record["maps"].items():  # a permutation of the field's values, none left in place
            values = [str(v) for v in FIELDS[name]]
            assert sorted(mapping) == sorted(values) and all(str(b) != a for a, b in mapping.items())
    assert perturb_table(data, fields=3, seed=0)["perturbation"] == out["perturbation"]  # fixed by its seed
    assert perturb_table(data, fields=3, seed=1)["perturbation"] != out["perturbation"]
