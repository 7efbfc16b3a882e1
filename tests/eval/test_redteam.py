"""Red team of the trust boundary: each candidate of tests/fixtures/redteam through the real CLI.

Every case says what the attack would gain in a harness that shares the candidate's interpreter, user,
file system or network, and checks, through `cudal1 eval --json` on the CPU, that (1) nothing is scored
`correct` with a fake speedup and (2) escapes have no effect outside the sandbox. Honest controls must be
`correct`. The fixtures disguise their names, so these exercise the runtime defences, not the static rules.
"""

from __future__ import annotations

import json
import os
import re
import site
import time
from pathlib import Path

import pytest

from cudal1.cli.main import main
from cudal1.eval.sandbox import detect_sandbox
from tests.helpers.selection import quick_few

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REDTEAM = FIXTURES / "redteam"
RELU = FIXTURES / "candidates" / "refs" / "relu.py"
FAST = ["--device", "cpu", "--trials", "2", "--buckets", "3", "--json", "--no-store"]
needs_sandbox = pytest.mark.skipif(detect_sandbox().level == "none", reason="no sandbox on this host")

#: (fixture, statuses it may end with). "no fake speedup" is checked for all of them.
EXPECTED = {
    "forge_reply.py": None,  # any verdict, as long as no fake speedup
    "patch_harness_clock.py": {"hack_detected"},
    "skip_cache_flush.py": {"hack_detected"},
    "patch_tolerances.py": {"incorrect"},
    "patch_code_object.py": {"incorrect", "hack_detected"},
    "patch_builtins.py": {"incorrect", "runtime_error", "hack_detected"},
    "predict_seeds.py": {"incorrect"},
    "global_forward_hook.py": {"hack_detected"},
    "function_mode.py": {"hack_detected"},
    "profile_hook.py": {"hack_detected"},
    "interval_timer.py": {"hack_detected"},
    "mutate_timed_inputs.py": {"incorrect", "hack_detected"},
    "pointer_cache_timed.py": {"incorrect", "correct", "hack_detected"},
    "lazy_after_trials.py": {"incorrect", "hack_detected"},
    "background_precompute.py": {"hack_detected"},
    "read_secrets.py": {"runtime_error"},
    "kill_the_parent.py": {"runtime_error", "correct"},
    "honest_out_param.py": {"correct"},
    "honest_boilerplate.py": {"correct"},
}


def evaluate(candidate: Path, capsys, *extra: str) -> dict:
    assert main(["eval", "--ref", str(RELU), "--candidate", str(candidate), *FAST, *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def assert_no_fake_speedup(result: dict) -> None:
    """A trick that fires gains nothing: either it is not correct, or it is no faster than relu itself, as far
    as its own measurement can tell (the low end of its 95 % interval, which widens with the machine's noise: a
    loaded 2-core host read honest twins up to 1.3x apart; a trick that worked would gain several times)."""
    if result["status"] != "correct":
        return
    low = ((result.get("timing") or {}).get("speedup_ci") or [result["speedup"]])[0]
    assert min(result["speedup"] or 0.0, low or 0.0) < 1.3, result


#: Every run: a forger, the flush skipper, a tolerance patcher, a precompute, a secret reader, the timed-input
#: attacks and an honest control; the rest of the round with `-m slow`.
QUICK = ["forge_reply.py", "skip_cache_flush.py", "patch_tolerances.py", "background_precompute.py",
         "read_secrets.py", "pointer_cache_timed.py", "mutate_timed_inputs.py", "honest_out_param.py"]


@needs_sandbox
@pytest.mark.parametrize("name", quick_few(sorted(EXPECTED), QUICK))
def test_attack_gains_nothing(name, capsys, monkeypatch):
    monkeypatch.setenv("CUDAL1_SERVER_TOKEN", "tok-s3cret-redteam")  # a secret in the parent's environment
    result = evaluate(REDTEAM / name, capsys)
    assert_no_fake_speedup(result)
    if EXPECTED[name] is not None:
        assert result["status"] in EXPECTED[name], (name, result["status"], result["message"])
    assert "tok-s3cret-redteam" not in json.dumps(result), "a secret of the parent reached the verdict"


#: With the static analysis off, what the runtime alone decides (the first filter can be disguised further).
RUNTIME_ONLY = {
    "patch_code_object.py": {"incorrect"},
    "patch_builtins.py": {"incorrect", "runtime_error", "hack_detected"},  # the runtime guard sees torch.equal
    "pointer_cache_timed.py": {"incorrect", "correct"},
    "lazy_after_trials.py": {"incorrect"},
    "mutate_timed_inputs.py": {"incorrect"},
}


@needs_sandbox
@pytest.mark.parametrize("name", quick_few(sorted(RUNTIME_ONLY), ["patch_builtins.py", "pointer_cache_timed.py"]))
def test_runtime_alone_catches_what_static_analysis_names(name):
    from cudal1.eval import EvalConfig, evaluate_candidate
    from cudal1.tasks.sources import load_file

    cfg = EvalConfig(device="cpu", correctness_trials=2, buckets=3, skip_static=True)
    result = evaluate_candidate(load_file(RELU), (REDTEAM / name).read_text(), cfg)
    assert result.status.value in RUNTIME_ONLY[name], (name, result.status, result.message)
    assert_no_fake_speedup(result.to_dict())


def _marked(tmp_path: Path, name: str, mark: str, port: int = 9) -> Path:
    text = (REDTEAM / name).read_text().replace("cudal1-redteam", mark).replace("PORT = 9", f"PORT = {port}")
    path = tmp_path / name
    path.write_text(text)
    return path


@needs_sandbox
def test_planted_files_do_not_appear(tmp_path, capsys, monkeypatch):
    mark = f"redteam-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.chdir(tmp_path)
    evaluate(_marked(tmp_path, "write_everywhere.py", mark), capsys)
    places = [Path(p) for p in site.getsitepackages() + [os.path.dirname(os.__file__)]]
    places += [Path.home(), Path.home() / ".cache" / "cudal1", Path("/work"), tmp_path]
    planted = [str(p) for place in places for p in (place / mark, place / f"{mark}.pth") if p.exists()]
    assert planted == [], planted


@needs_sandbox
def test_a_detached_daemon_does_not_outlive_the_verdict(tmp_path, capsys):
    mark = f"redteam-daemon-{os.getpid()}-{time.monotonic_ns()}"
    result = evaluate(_marked(tmp_path, "daemon_escape.py", mark), capsys)
    time.sleep(0.5)
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive.append(pid)
        except OSError:
            continue
    assert alive == []
    assert result["status"] in ("hack_detected", "correct")
    assert result["status"] == "hack_detected" or any(f["rule"] == "guard.processes" for f in result["flags"])


def test_constants_too_costly_to_compute_do_not_stall_the_trusted_side():
    """The static analysis reads module constants in the parent: a candidate that makes them cost minutes and
    gigabytes (the analysis alone took over 60 s before they were bounded) must not stall the evaluation. Its
    own runner does compute them on import, in the sandbox: that import times out at the step deadline."""
    import subprocess
    import sys

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "eval", "--ref", str(RELU), "--candidate",
                           str(REDTEAM / "constant_bomb.py"), *FAST], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The import in its runner is what timed out (a step's limit, 30 s or more), not the parent's analysis, which reads
    # the constants bounded (it took over 60 s before): the phase's own time, with a loaded machine's margin.
    step = re.search(r"^importing .* did not finish within (\d+) s", result["message"])
    assert result["status"] == "timeout" and step and int(step.group(1)) < 600, result  # a step's, not the 600 s
    assert result["protocol"]["phase_s"]["static"] < 30 and time.monotonic() - started > 0


@needs_sandbox
def test_the_loopback_is_out_of_reach(tmp_path, capsys, listener):
    port, seen = listener
    evaluate(_marked(tmp_path, "phone_home.py", "x", port), capsys)
    assert seen == []


def test_a_memory_hog_is_stopped_before_the_machine_suffers(capsys):
    """12 GiB asked for on a small task: the derived limit (a few GiB) stops it, with a reason. On a loaded
    2-core host touching the pages can take longer than the step's time limit: then that limit stops it."""
    result = evaluate(REDTEAM / "memory_hog.py", capsys)
    assert (result["status"] == "runtime_error" and "memory limit" in result["message"]) or \
        (result["status"] == "timeout" and "did not finish within" in result["message"]), result


def test_a_hung_candidate_times_out_within_two_minutes_by_default(capsys):
    started = time.monotonic()
    assert main(["eval", "--ref", str(RELU), "--candidate", str(REDTEAM / "hang_forever.py"), "--device", "cpu",
                 "--json", "--no-store"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Cut by a step's default limit (max(30 s, 50x the reference's step)), not by the evaluation's 600 s: the limit the verdict names, not a
    # wall time a loaded machine stretches (starting runners under load takes a minute or more).
    step = re.search(r"did not finish within (\d+) s", result["message"])
    assert result["status"] == "timeout" and step and int(step.group(1)) < 600, result  # a step's, not the 600 s
    assert time.monotonic() - started > 0


GPU_EXPECTED = {
    "gpu_prepare_precompute.py": {"hack_detected"},
    # The host clock names the side stream (`guard.stream_escape`); the GPU clock (the default) waits for the
    # whole device before a call's done word, so the side work is in the candidate's own time: slower.
    "gpu_leftover_work.py": {"hack_detected", "correct"},
    "gpu_memory_hog.py": {"runtime_error"},
}


@pytest.mark.gpu
@needs_sandbox
@pytest.mark.parametrize("name", sorted(GPU_EXPECTED))
def test_gpu_attack_gains_nothing(name, capsys):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert main(["eval", "--ref", str(RELU), "--candidate", str(REDTEAM / name), "--device", "cuda", "--trials",
                 "3", "--buckets", "3", "--json", "--no-store"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print(name, result["status"], result["message"][:200], result.get("protocol", {}).get("clock"))
    assert_no_fake_speedup(result)
    assert result["status"] in GPU_EXPECTED[name], (name, result["status"], result["message"])


@pytest.mark.gpu
def test_gpu_honest_controls_and_the_null_test(capsys):
    """Honest controls on the GPU: correct, with the clock figures inside their tolerance."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for name in ("honest_out_param.py", "honest_boilerplate.py", "honest_joined_stream.py",
                 "honest_torch_compile.py"):
        assert main(["eval", "--ref", str(RELU), "--candidate", str(REDTEAM / name), "--device", "cuda",
                     "--json", "--no-store"]) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        print(name, result["status"], result["speedup"], result.get("protocol", {}).get("clock"))
        assert result["status"] == "correct", result["message"]
