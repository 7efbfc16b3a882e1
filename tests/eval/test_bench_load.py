"""`scripts/bench_load.py`: its honest candidates exist and run where it says, and its load starts and stops."""

from __future__ import annotations

from tests.helpers.scripts import load_script


def test_the_cpu_candidates_are_honest_and_need_no_gpu():
    bench = load_script("bench_load")
    candidates = bench.honest_candidates("cpu")
    labels = [label for label, _, _, _ in candidates]
    assert len(labels) == len(set(labels)) >= 10
    assert {"chain_20us/honest", "relu_scale/null", "honest/torch_add_out.py"} <= set(labels)
    assert not any("cuda" in label or "triton" in label or "raw_" in label for label in labels)
    assert all("class ModelNew" in source and expected == "correct" for _, _, source, expected in candidates)
    assert len(bench.honest_candidates("cuda")) > len(candidates)  # the CUDA ones join on a GPU


def test_the_host_load_runs_while_the_block_runs_and_stops_after():
    bench = load_script("bench_load")
    with bench.HostLoad("2") as load:
        assert len(load.procs) == 2 and all(p.is_alive() for p in load.procs)
    assert not any(p.is_alive() for p in load.procs)
    assert bench.HostLoad("0").count == 0 and bench.HostLoad("3mem").count == 3
