"""Several processes writing one store at once, and a writer killed mid-write (cudal1.store)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import _store_workers
from _store_workers import KILL_TXN_ROWS, write_evaluations

import cudal1.store
from cudal1.store import ResultsStore

WORKERS = 4
EVALS_PER_WORKER = 50


def test_concurrent_writer_processes_all_land(tmp_path):
    """Four spawned processes open a *new* store at once (racing on schema creation) and write 50 each."""
    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=write_evaluations, args=(path, w, EVALS_PER_WORKER, barrier))
             for w in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WORKERS  # a "database is locked" would exit non-zero

    with ResultsStore(path) as store:
        rows = store.query_evaluations()
        assert len(rows) == WORKERS * EVALS_PER_WORKER
        assert len({r["id"] for r in rows}) == len(rows)
        for w in range(WORKERS):
            assert len(store.query_evaluations(label=f"worker{w}")) == EVALS_PER_WORKER
            assert store.done_items(f"run{w}") == {str(i) for i in range(EVALS_PER_WORKER)}
            assert store.get_evaluation(f"w{w}-{EVALS_PER_WORKER - 1}") is not None
        assert store.schema_version == 1
    with sqlite3.connect(path) as conn:
        assert [r[0] for r in conn.execute("SELECT version FROM schema_version")] == [1]


def test_killed_writer_leaves_consistent_store(tmp_path):
    """A process committing in a loop is SIGKILLed; the file passes integrity_check and keeps every commit."""
    path = tmp_path / "killed.sqlite"
    src_dir = Path(cudal1.store.__file__).resolve().parents[2]
    helpers_dir = Path(_store_workers.__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src_dir), str(helpers_dir)])}
    code = "import _store_workers, sys; _store_workers.write_until_killed(sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    committed: list[int] = []
    try:
        while len(committed) < 40:
            line = proc.stdout.readline()
            assert line, f"writer exited early: {proc.stderr.read()}"
            committed.append(int(line))
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    committed += [int(x) for x in rest.split()]
    assert proc.returncode == -signal.SIGKILL

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        per_txn = dict(conn.execute("SELECT txn, COUNT(*) FROM kill_test GROUP BY txn").fetchall())
    assert set(committed) <= set(per_txn)  # every reported commit is there
    assert set(per_txn.values()) == {KILL_TXN_ROWS}  # no transaction is half written

    with ResultsStore(path) as store:  # still usable for writing
        for txn in committed:
            assert store.get_evaluation(f"k{txn}") is not None
        store.put_meta("after_kill", {"ok": True})
        assert store.get_meta("after_kill") == {"ok": True}


def _write_from_forked_child(store: ResultsStore, queue) -> None:
    store.put_meta("from_child", {"pid": os.getpid()})
    queue.put(store.get_meta("from_child")["pid"])


def test_store_used_after_fork_opens_its_own_connection(tmp_path):
    """A store opened in the parent keeps working in a forked child and in the parent afterwards."""
    ctx = multiprocessing.get_context("fork")
    with ResultsStore(tmp_path / "r.sqlite") as store:
        store.put_meta("from_parent", {"v": 1})  # the parent's connection is open at fork time
        queue = ctx.Queue()
        proc = ctx.Process(target=_write_from_forked_child, args=(store, queue))
        proc.start()
        child_pid = queue.get(timeout=60)
        proc.join(timeout=60)
        assert proc.exitcode == 0 and child_pid == proc.pid
        assert store.get_meta("from_child") == {"pid": proc.pid}
        store.put_meta("from_parent", {"v": 2})
        assert store.get_meta("from_parent") == {"v": 2}
