"""Runner processes (cudal1.eval.runner_process, supply, isolated): started ahead, supervised, frozen, killed,
cleaned up; what a runner holds and what it may send back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudal1.eval.isolated import Limits, run_isolated
from cudal1.eval.reaper import NO_OWNER_GRACE_S
from cudal1.eval.runner_process import (
    FOLDER_PREFIX,
    RunnerFailed,
    RunnerProcess,
    process_tree,
    reap_stale_folders,
)
from cudal1.eval.shared.protocol import (
    EntryResult,
    ImportCandidate,
    ModelSettings,
    ReferenceReady,
    RunEntry,
    SetupReference,
    SetupTwin,
    TwinReady,
)
from cudal1.eval.supply import RunnerSupply, usable_cpu_count

PROBE = "tests.helpers.sandbox_probe"


def test_a_trusted_entry_runs_and_its_value_comes_back():
    outcome = run_isolated(f"{PROBE}:echo", {"x": [1, 2]}, limits=Limits(timeout_s=120))
    assert outcome.ok and outcome.value["payload"] == {"x": [1, 2]}


def test_an_entry_that_never_answers_costs_its_deadline_only():
    started = time.monotonic()
    outcome = run_isolated(f"{PROBE}:sleep", {"s": 3600}, limits=Limits(timeout_s=3))
    # Its 3 s deadline, not the hour it sleeps: 120 s is the margin a loaded machine needs to start a runner.
    assert outcome.timed_out and time.monotonic() - started < 120


def test_a_runner_that_misses_its_deadline_is_killed_with_everything_it_started():
    with RunnerProcess("cpu", warm=False) as runner:
        runner.wait_ready()
        with pytest.raises(RunnerFailed) as failure:
            runner.ask(RunEntry(entry=f"{PROBE}:sleep", payload={"s": 3600}), timeout_s=1.0)
        assert failure.value.timed_out and failure.value.killed_by_parent
        runner.proc.wait(timeout=10)
        assert all(not os.path.exists(f"/proc/{pid}") for pid in process_tree(runner.proc.pid)[1:])


def test_a_bare_runner_starts_and_serves_like_any_other():
    # The helper's runner skips the model runners' warm imports; its command line must still be understood.
    with RunnerProcess("cpu", warm=True, model_imports=False) as runner:
        assert runner.wait_ready().pid > 0
        reply = runner.ask(RunEntry(entry=f"{PROBE}:echo", payload={"x": 1}), timeout_s=60.0)
        assert isinstance(reply, EntryResult) and reply.value["payload"] == {"x": 1}


#: The parent's side of the evaluator: no runner may hold any of these modules.
PARENT_SIDE = ("cudal1.eval.config", "cudal1.eval.pipeline", "cudal1.eval.scheduler", "cudal1.eval.evaluation",
               "cudal1.eval.session", "cudal1.eval.clock.measure", "cudal1.eval.clock.timing", "cudal1.eval.planes",
               "cudal1.eval.device_helper", "cudal1.eval.compile", "cudal1.eval.sandbox", "cudal1.eval.supply",
               "cudal1.eval.runner_process", "cudal1.eval.correctness", "cudal1.eval.decoys", "cudal1.store",
               "cudal1.service", "cudal1.cli", "cudal1.policy")


def test_a_runner_holds_none_of_the_parents_modules():
    """A bare runner, and a model runner once it holds the reference, load the harness and the task's
    reference only: nothing of the trusted parent that could be read or rewritten there."""
    task = Path(__file__).resolve().parents[1] / "fixtures" / "candidates" / "refs" / "relu.py"
    for model_imports in (False, True):
        with RunnerProcess("cpu", warm=True, model_imports=model_imports) as runner:
            if model_imports:
                ready = runner.ask(SetupReference(model=ModelSettings(
                    device="cpu", task_id="relu", ref_source=task.read_text(), sizes="small", seed=1, threads=1,
                    exact_fp32=False, gpu_memory_fraction=0.45)), timeout_s=120.0)
                assert isinstance(ready, ReferenceReady), ready
            reply = runner.ask(RunEntry(entry="cudal1.eval.inside.runner:loaded_modules"), timeout_s=60.0)
            loaded = reply.value["modules"]
            held = [m for m in loaded if m.startswith(PARENT_SIDE)]
            assert not held, held
            assert "cudal1.eval.inside.runner" in loaded and "cudal1.eval.shared.protocol" in loaded


#: What the runners' modules may import of cudal1: the runner's halves, and the ground floor's vocabulary
#: plus the two leaf modules a role needs (the reference's loader, the build hooks' comment stripper).
RUNNER_PREFIXES = ("cudal1.eval.inside", "cudal1.eval.shared", "cudal1.core.", "cudal1.tasks.task",
                   "cudal1.analysis.cuda_source")


def _settings(task: Path) -> ModelSettings:
    return ModelSettings(device="cpu", task_id=task.stem, ref_source=task.read_text(), sizes="small", seed=1,
                         threads=1, exact_fp32=False, gpu_memory_fraction=0.45)


def test_a_candidates_runner_loads_only_what_it_runs():
    """The candidate's runner, as the evaluator starts it (its twin set up), and again after a `load_inline`
    candidate's build: cudal1's modules it has loaded. Before the lazy faces of `cudal1.tasks` and
    `cudal1.analysis`: 29 as the twin (`tasks.sources`, `tasks.builtin`, the hub and the schemas with it) and 42
    after the build (the whole static analyzer, for one comment stripper); now 26 and 28 (the faces' shared lazy
    lookup, `cudal1.core.lazy`, is one of them). Every module is one of `RUNNER_PREFIXES` (packages' `__init__`
    faces aside)."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    task = fixtures / "tasks" / "tiny_scale_add.py"
    with RunnerProcess("cpu", warm=True) as runner:
        ready = runner.ask(SetupTwin(model=_settings(task)), timeout_s=120.0)
        assert isinstance(ready, TwinReady), ready
        twin = runner.ask(RunEntry(entry="cudal1.eval.inside.runner:loaded_modules"), timeout_s=60.0).value["modules"]
        source = (fixtures / "eval" / "fallback_duplicate_module.py").read_text()
        runner.ask(ImportCandidate(cand_source=source, seed=1), timeout_s=120.0)  # its build fails at once
        built = runner.ask(RunEntry(entry="cudal1.eval.inside.runner:loaded_modules"), timeout_s=60.0).value["modules"]
    assert "cudal1.analysis.cuda_source" in built  # the build hooks ran
    assert len(twin) <= 26 < 29, twin
    assert len(built) <= 28 < 42, built
    faces = {"cudal1", "cudal1.eval", "cudal1.core", "cudal1.tasks", "cudal1.analysis"}
    stray = [m for m in built if m not in faces and not m.startswith(RUNNER_PREFIXES)]
    assert not stray, stray


def test_a_runners_output_is_capped_and_its_last_lines_kept():
    with RunnerProcess("cpu", warm=False) as runner:
        reply = runner.ask(RunEntry(entry=f"{PROBE}:spam", payload={"mb": 40}), timeout_s=120.0)
        assert isinstance(reply, EntryResult)
        time.sleep(0.2)  # the reader drains what is left in the pipe
        assert runner.output.total >= 40 << 20
        assert len(runner.output.head) + len(runner.output.tail) <= 80 << 10
        assert "the last line" in runner.output.text()


def test_freeze_stops_the_runner_and_thaw_resumes_it():
    with RunnerProcess("cpu", warm=False) as runner:
        runner.wait_ready()
        runner.freeze()
        time.sleep(0.2)
        with open(f"/proc/{runner.runner_pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        assert state in ("T", "t", "D") or runner.group is not None  # cgroup freezer: state D/S while frozen
        with pytest.raises(RunnerFailed):
            runner.ask(RunEntry(entry="os:getpid"), timeout_s=1.0)


def test_a_supply_starts_spares_ahead_and_tops_them_up():
    with RunnerSupply("cpu", spares=2) as supply:
        assert supply.n_ready == 0
        supply.fill()
        assert supply.n_ready == 2
        first = supply._ready[0]
        taken = supply.take()
        assert taken is first and supply.n_ready == 2
        taken.close()
        waiting = list(supply._ready)
    for runner in waiting:  # close() ended the ones never taken
        assert runner.proc.poll() is not None


def test_a_series_of_known_length_starts_no_more_runners_than_it_takes():
    with RunnerSupply("cpu", spares=3, total=2) as supply:
        supply.fill()
        taken = [supply.take(), supply.take()]
        assert supply.n_ready == 0 and supply._started == 2
        for runner in taken:
            runner.close()


def test_pool_sizes_follow_the_cores_this_process_may_use_not_the_host():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from cudal1.eval.supply import usable_cpu_count; print(usable_cpu_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1" and usable_cpu_count() >= 1


def test_a_restart_removes_what_a_killed_parent_left(tmp_path):
    # A private root: the other test workers' evaluations reap the shared temporary folder at the same time,
    # and one of them could take the left folder first (and its idle process before it started).
    # An owner no process can be (above the kernel's largest pid): a finished child's pid can be taken again
    # by then on a busy host, and the folder would look owned.
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1 if Path("/proc/sys/kernel/pid_max").exists() \
        else 2**22 + 1
    left = tmp_path / (FOLDER_PREFIX + "left")
    mine = tmp_path / (FOLDER_PREFIX + "mine")
    for folder, owner in ((left, dead), (mine, os.getpid())):
        folder.mkdir()
        (folder / "owner").write_text(str(owner))
    # What still runs in the left folder (as bubblewrap's idle init does, naming it in its arguments) is ended.
    # Python, not `sh -c`: a shell may exec its last command, and the folder would leave the command line.
    idle_code = "import time; time.sleep(60)"
    idle = subprocess.Popen([sys.executable, "-c", idle_code, str(left / "scratch")])
    bystander = subprocess.Popen([sys.executable, "-c", idle_code, str(mine / "scratch")])
    try:
        assert reap_stale_folders(root=tmp_path) == 1
        assert idle.wait(60) == -9 and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert not left.exists() and mine.exists()


def test_a_folder_being_made_is_not_taken_for_a_left_one(tmp_path):
    # A runner writes its folder's owner just after making it: a reap in between must leave it.
    fresh = tmp_path / (FOLDER_PREFIX + "fresh")
    fresh.mkdir()
    old = tmp_path / (FOLDER_PREFIX + "old")
    old.mkdir()
    past = time.time() - 2 * NO_OWNER_GRACE_S
    os.utime(old, (past, past))
    assert reap_stale_folders(root=tmp_path) == 1
    assert fresh.exists() and not old.exists()


def test_runners_die_with_a_parent_killed_by_sigkill(tmp_path):
    """An interrupted or killed CLI takes its runners with it: nothing it started keeps running."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from cudal1.eval.runner_process import RunnerProcess\n"
        "r = RunnerProcess('cpu', warm=False)\n"
        "r.wait_ready()\n"
        "print(' '.join(map(str, r.pids())), flush=True)\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert pids
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_malformed_failure_is_known_by_its_field_and_named_once():
    """A malformed reply is a typed fact (`RunnerFailed.malformed`, `MalformedReply.detail`), and its reason
    reads `protocol.malformed: <detail>` however it was made. The session once recognised the kind by the
    reason's prefix (`reason.startswith(MALFORMED)`) and added it where missing, so a detail that began with
    that text was taken as already named."""
    from types import SimpleNamespace

    from cudal1.core.types import Status
    from cudal1.eval.session import Session
    from cudal1.eval.shared.protocol import MALFORMED, MalformedReply, decode_reply

    with pytest.raises(MalformedReply) as caught:
        decode_reply(RunEntry(entry="os:getpid"), {"ok": True, "value": object()})
    assert str(caught.value) == f"{MALFORMED}: {caught.value.detail}" and MALFORMED not in caught.value.detail
    with pytest.raises(MalformedReply) as caught:
        decode_reply(RunEntry(entry="os:getpid"), [])
    assert caught.value.detail == "the reply to run_entry is not a reply"

    failure = RunnerFailed("the runner answered before its call was rung", malformed=True)
    assert failure.malformed and failure.reason == f"{MALFORMED}: the runner answered before its call was rung"
    echoed = RunnerFailed(f"{MALFORMED} text the candidate wrote", malformed=True)
    assert echoed.reason.count(MALFORMED) == 2  # named once by the parent, whatever the detail says
    verdict = Session._candidate_failed(SimpleNamespace(candidate_imported=True), echoed, "call 1", 1.0)
    assert verdict.status is Status.RUNTIME_ERROR and verdict.message.count(f"({MALFORMED}: ") == 1
    assert not RunnerFailed("protocol.malformed-looking crash text").malformed
