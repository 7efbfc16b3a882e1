"""Helpers for the results-store tests: sample results and functions run in worker processes.

Kept in a plain module (not a test file) so `multiprocessing` spawn children and `python -c` subprocesses
can import them by name.
"""

from __future__ import annotations

import sys

from cudal1.core.types import EvalResult, Flag, KernelClass, Mismatch, Severity, Status, TimingStats
from cudal1.store import ResultsStore, write_transaction

PROTOCOL = {"protocol_version": 3, "buckets": 7, "iterations": 100, "l2_flush": True}
ENVIRONMENT = {"gpu_name": "NVIDIA H200", "torch_version": "2.11.0", "cuda_version": "12.8",
               "device_type": "cuda", "hostname": "node-1"}
KILL_TXN_ROWS = 20  # rows per transaction written by `write_until_killed`


def make_result(i: int, *, status: Status = Status.CORRECT, task_id: str = "level1/1_matmul",
                gpu_name: str = "NVIDIA H200") -> EvalResult:
    """A fully populated EvalResult whose numbers depend on `i`."""
    timing = TimingStats(ref_ms=2.0 + i, candidate_ms=1.0 + i / 10, speedup=(2.0 + i) / (1.0 + i / 10),
                         stability=0.03, bucket_speedups=[1.9, 2.0, 2.1], speedup_warm=1.8,
                         ref_ms_warm=1.7, candidate_ms_warm=0.9, method="cuda_events", iterations=100)
    mismatch = Mismatch(output_index=0, trial=-1, max_abs_error=1e-3, max_rel_error=2e-3, bad_elements=3,
                        total_elements=4096, first_bad_index=[1, 2], expected=0.5, got=0.501)
    flags = [Flag(rule="extra_cuda_stream", severity=Severity.WARNING, message="creates a stream", line=12),
             Flag(rule="guard.global_state", severity=Severity.INFO, message="tf32 unchanged",
                  source="runtime")]
    return EvalResult(status=status, message=f"result {i}", task_id=task_id, candidate_hash=f"cand{i:04d}",
                      speedup=timing.speedup if status is Status.CORRECT else None, timing=timing,
                      flags=flags, kernel_class=KernelClass.CUSTOM_CUDA, mismatch=mismatch,
                      compile_log="nvcc: ok", baselines={"eager": 2.0, "cuda_graph": 1.4},
                      protocol=dict(PROTOCOL), environment={**ENVIRONMENT, "gpu_name": gpu_name},
                      duration_s=12.5)


def write_evaluations(path: str, worker: int, count: int, barrier) -> None:
    """Process body: wait for all workers, then store `count` evaluations as fast as possible."""
    barrier.wait()
    with ResultsStore(path) as store:
        task_hash = store.put_task(f"task{worker}", f"# task {worker}")
        for i in range(count):
            result = make_result(i, task_id=f"task{worker}")
            store.put_candidate(f"# worker {worker} candidate {i}", task_id=f"task{worker}")
            store.put_evaluation(result, task_hash=task_hash, key=f"w{worker}-{i}", label=f"worker{worker}")
            store.mark_done(f"run{worker}", str(i))


def write_until_killed(path: str) -> None:
    """Process body: commit transactions forever, printing each committed transaction number."""
    store = ResultsStore(path)
    conn = store.connect()
    with write_transaction(conn):
        conn.execute("CREATE TABLE IF NOT EXISTS kill_test (txn INTEGER NOT NULL, i INTEGER NOT NULL)")
    task_hash = store.put_task("task", "# task")
    big_log = "x" * 50_000  # large rows make it likely that the kill lands inside a write
    txn = 0
    while True:
        with write_transaction(conn):
            conn.executemany("INSERT INTO kill_test (txn, i) VALUES (?, ?)",
                             [(txn, i) for i in range(KILL_TXN_ROWS)])
        store.put_evaluation(make_result(txn).replace(compile_log=big_log), task_hash=task_hash,
                             key=f"k{txn}")
        sys.stdout.write(f"{txn}\n")
        sys.stdout.flush()
        txn += 1
