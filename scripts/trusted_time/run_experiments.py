#!/usr/bin/env python3
"""Run the trusted-time experiments in one go, each in its own process with its own time budget.

    python scripts/trusted_time/run_experiments.py OUTDIR [--budget-s 520] [--only E1,E2]
        [--budgets E1=120,E2=150,...] [--dry-run] [--exp-args 'E2=--calls 500']

Order (priority): E1, E2, E6, E7, E5, E3, E4. Each experiment gets min(its budget, what is left of the run's
budget); one that overruns is ended (its process group, then every client of the run and every MPS daemon
it registered), and the next one starts. Everything is written as it comes to OUTDIR/results.jsonl (one
JSON object a line, with "exp" and "kind"); the experiments' and clients' output goes to OUTDIR/run.log;
OUTDIR/summary.json holds each experiment's summary record and status; a short table is printed last and
written to OUTDIR/summary.txt. With --dry-run (no GPU needed) the clients use the host-memory stand-in:
the processes, sandboxes, sockets, descriptors, timeouts and JSON paths all run, the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "src")]

from tt_common import Recorder, cmdline, gpu_snapshot, prepare_client_modules, tool, update_state  # noqa: E402
from tt_mps import cleanup_registered, find_control  # noqa: E402

EXPERIMENTS: list[tuple[str, str, list[str], float]] = [
    ("E1", "exp_e1.py", [], 120),
    ("E2", "exp_rig.py", ["--which", "E2"], 150),
    ("E6", "exp_e6.py", [], 60),
    ("E7", "exp_e7.py", [], 45),
    ("E5", "exp_e5.py", [], 90),
    ("E3", "exp_rig.py", ["--which", "E3"], 60),
    ("E4", "exp_rig.py", ["--which", "E4"], 60),
]
CUBINS = {  # name: (source, extra nvcc flags)
    "kernels": ("kernels.cu", []),
    "e5": ("e5_kernels.cu", []),
    "planted_cdp": ("planted_cdp.cu", ["-rdc=true"]),
    "planted_timer": ("planted_timer.cu", []),
}
MIN_EXPERIMENT_S = 15.0
RESERVE_S = 8.0
LOG_LIMIT = 15 << 20


def build(work: Path, rec: Recorder, dry: bool, timeout_s: float = 120.0, skip: bool = False) -> dict[str, Any]:
    """nvcc -cubin -arch=sm_90 for every source, in parallel. In a dry run without nvcc (or told to skip
    the build), placeholders."""
    out_dir = work / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    nvcc = None if (skip and dry) else tool("nvcc")
    results: dict[str, Any] = {}
    if nvcc is None:
        for name in CUBINS:
            if dry:
                (out_dir / f"{name}.cubin").write_bytes(b"dry run placeholder")
            results[name] = {"ok": dry, "error": "nvcc not found"}
        rec.write("build", nvcc=None, results=results)
        return results
    procs = {}
    t0 = time.monotonic()
    for name, (src, flags) in CUBINS.items():
        cmd = [nvcc, "-cubin", "-arch=sm_90", *flags, "-o", str(out_dir / f"{name}.cubin"), str(HERE / src)]
        procs[name] = (cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for name, (_cmd, p) in procs.items():
        try:
            text, _ = p.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            results[name] = {"ok": False, "error": "timeout"}
            continue
        results[name] = {"ok": p.returncode == 0, "s": round(time.monotonic() - t0, 2), "output": text[-1500:]}
    for path in out_dir.iterdir():
        os.chmod(path, 0o644)
    rec.write("build", nvcc=nvcc, results=results, wall_s=round(time.monotonic() - t0, 2))
    return results


def kill_clients(work: Path) -> list[int]:
    """Every client process of this run still alive (found by its module path under the work folder)."""
    marker = str(work / "py" / "tt_client.py")
    killed = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and marker in cmdline(int(entry)):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except OSError:
                pass
    return killed


def run_one(name: str, script: str, extra: list[str], budget: float, work: Path, out: Path, log: Any,
            dry: bool, rec: Recorder) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / script), "--out", str(out / "results.jsonl"), "--work", str(work),
           "--timeout", f"{max(5.0, budget - 4.0):.1f}", *(["--dry"] if dry else []), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    print(f"== {name}: budget {budget:.0f} s", flush=True)
    log.write(f"\n===== {name} {' '.join(cmd)}\n")
    log.flush()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=str(ROOT))
    status = "ok"
    try:
        rc = proc.wait(timeout=budget)
        if rc != 0:
            status = f"exit {rc}"
    except subprocess.TimeoutExpired:
        status = "timeout"
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        rc = proc.returncode
    wall = round(time.monotonic() - t0, 1)
    leftovers = {"clients_killed": kill_clients(work), "mps": cleanup_registered(work)}
    row = rec.write("status", experiment=name, status=status, rc=rc, wall_s=wall, budget_s=round(budget, 1),
                    **leftovers)
    print(f"== {name}: {status} in {wall} s", flush=True)
    return row


def parse_map(text: str | None, cast: Any = str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip().upper()] = cast(v.strip())
    return out


def load_results(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def verdict_lines(exp: str, s: dict[str, Any]) -> list[str]:
    """A few lines per experiment for the table printed last (everything is in summary.json)."""
    if not s:
        return ["no summary record"]
    if exp == "E1":
        lines = [f"MPS control: {s.get('mps_control') or 'absent'}; daemon up: {s.get('mps_start')}; shm: "
                 f"{s.get('mps_shm')}; client mode: {s.get('mps_mode')}; GO: {s.get('mps_go')}"]
        if s.get("mps_functional"):
            lines.append(f"MPS checks: {_fmt(s['mps_functional'])}")
        if s.get("threats"):
            lines.append(f"threat probes: {_fmt(s['threats'])}")
        if s.get("no_mps"):
            lines.append(f"no MPS: {_fmt(s['no_mps'])}")
        for key in ("mps_error", "no_mps_error"):
            if s.get(key):
                lines.append(f"{key}: {s[key][:200]}")
        return lines
    if exp == "E2":
        lines = []
        for label in ("mps", "no_mps"):
            m = s.get(label)
            if not m:
                continue
            if "error" in m:
                lines.append(f"{label}: error {m['error'][:160]}")
                continue
            lines.append(f"{label} ({m.get('mode')}; globaltimer step {m.get('gt_step_ns')} ns):")
            for size in ("empty", "20us", "100us", "empty_nonexclusive"):
                r = m.get(size)
                if r:
                    lines.append(f"  {size:>18}: n {r['n']}, c med {_fmt(r['c_med'])} us, IQR {_fmt(r['c_iqr'])}, "
                                 f"p99-p50 {_fmt(r['c_p99_p50'])}, gate {_fmt(r['gate_med'])}, done {_fmt(r['done_med'])}, "
                                 f"pass {r['pass']}" + (f", ERROR {r['error'][:120]}" if r.get("error") else ""))
        lines.append(f"MPS pass: {s.get('mps_pass')}")
        return lines
    if exp == "E3":
        lines = []
        for label in ("mps", "no_mps"):
            m = s.get(label)
            if not m:
                continue
            lines.append(f"{label} ({m.get('mode')}): {m.get('error', '')[:160]}")
            for key, r in m.items():
                if isinstance(r, dict) and "n" in r:
                    lines.append(f"  {key:>14}: n {r['n']}, bracket med {_fmt(r.get('br_med'))} us, gain "
                                 f"{_fmt(r.get('gain_us'))} us, complete {_fmt(r.get('complete_frac'))}, first B1 "
                                 f"{_fmt(r.get('first_b1_med_us'))} us, K before B1 end {r.get('k_before_b1_end')}")
        return lines
    if exp == "E4":
        lines = []
        for label in ("mps", "no_mps"):
            m = s.get(label)
            if m:
                sp = {k: v.get("speedup") for k, v in m.items() if isinstance(v, dict) and "speedup" in v}
                lines.append(f"{label} ({m.get('mode')}): |speedup-1| median {m.get('deviation_median_pct')} %, max "
                             f"{m.get('deviation_max_pct')} %, pass {m.get('pass')}; {_fmt(sp)}")
        return lines
    return [_fmt({k: v for k, v in s.items() if k not in ("exp", "kind", "t_s")})[:900]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("outdir")
    p.add_argument("--budget-s", type=float, default=520.0, help="the whole run, builds included")
    p.add_argument("--only", default=None, help="comma-separated experiments (E1..E7)")
    p.add_argument("--budgets", default=None, help="per experiment, e.g. E1=120,E2=150")
    p.add_argument("--exp-args", action="append", default=[], help="extra arguments, e.g. 'E2=--calls 500'")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--mps-control", default=None, help="the MPS control program (default: searched)")
    p.add_argument("--skip-build", action="store_true", help="dry run only: placeholder cubins, no nvcc")
    args = p.parse_args()
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("results.jsonl", "summary.json", "summary.txt", "run.log"):
        (out / name).unlink(missing_ok=True)
    rec = Recorder(out / "results.jsonl", "run")
    work = Path(tempfile.mkdtemp(prefix="tt-work-", dir="/tmp"))
    os.chmod(work, 0o755)
    only = [x.strip().upper() for x in args.only.split(",")] if args.only else None
    budgets = parse_map(args.budgets, float)
    extra = {}
    for item in args.exp_args:
        key, _, value = item.partition("=")
        extra[key.strip().upper()] = value.split()
    if args.mps_control:
        extra.setdefault("E1", []).extend(["--mps-control", args.mps_control])
    from cudal1.eval.sandbox import detect_sandbox

    sandbox = detect_sandbox()
    rec.write("start", argv=sys.argv, dry=args.dry_run, budget_s=args.budget_s, host=platform.node(),
              kernel=platform.release(), python=sys.version.split()[0], executable=sys.executable,
              uid=os.geteuid(), cpus=os.cpu_count(), sandbox=sandbox.to_dict(), bwrap=sandbox.bwrap,
              mps_control=args.mps_control or find_control()[0], gpu=gpu_snapshot(), work=str(work))
    print(f"work folder {work}; sandbox {sandbox.level} ({sandbox.bwrap}); dry run {args.dry_run}", flush=True)
    statuses: dict[str, Any] = {}
    with open(out / "run.log", "a") as log:
        try:
            prepare_client_modules(work)
            # what E1 finds out; set here so that any subset of the experiments runs (E1 overwrites it)
            update_state(work, mps_control=args.mps_control or find_control()[0],
                         plain_mode="sandbox" if sandbox.level != "none" else "plain",
                         mps_mode="sandbox" if sandbox.level != "none" else "uid")
            built = build(work, rec, args.dry_run, skip=args.skip_build)
            print("build: " + ", ".join(f"{k} {'ok' if v.get('ok') else 'FAILED'}" for k, v in built.items()), flush=True)
            if not built.get("kernels", {}).get("ok"):
                print("the kernels did not build: nothing can run", flush=True)
            else:
                for name, script, exp_args, default_budget in EXPERIMENTS:
                    if only and name not in only:
                        continue
                    left = deadline - time.monotonic() - RESERVE_S
                    budget = min(budgets.get(name, default_budget), left)
                    if budget < MIN_EXPERIMENT_S:
                        statuses[name] = rec.write("status", experiment=name, status="skipped: no time left",
                                                   left_s=round(left, 1))
                        print(f"== {name}: skipped (no time left)", flush=True)
                        continue
                    statuses[name] = run_one(name, script, exp_args + extra.get(name, []), budget, work, out, log,
                                             args.dry_run, rec)
        finally:
            leftovers = {"clients_killed": kill_clients(work), "mps": cleanup_registered(work)}
            rec.write("end", wall_s=round(time.monotonic() - t_start, 1), **leftovers)
    rows = load_results(out / "results.jsonl")
    summaries = {r["exp"]: r for r in rows if r.get("kind") == "summary"}
    crashes = {r["exp"]: r for r in rows if r.get("kind") == "crash"}
    report: dict[str, Any] = {}
    lines = [f"trusted-time experiments: {'DRY RUN, ' if args.dry_run else ''}{round(time.monotonic() - t_start)} s, "
             f"results in {out}/results.jsonl"]
    for name, _script, _a, _b in EXPERIMENTS:
        if only and name not in only:
            continue
        st = statuses.get(name, {})
        s = summaries.get(name, {})
        report[name] = {"status": st.get("status", "not run"), "wall_s": st.get("wall_s"),
                        "summary": {k: v for k, v in s.items() if k not in ("exp", "kind")}}
        lines.append(f"{name} [{st.get('status', 'not run')}, {st.get('wall_s', '-')} s]")
        if name in crashes:
            report[name]["crash"] = crashes[name].get("error")
            lines.append(f"    CRASHED: {str(crashes[name].get('error'))[:300]}")
        lines += ["    " + x for x in verdict_lines(name, report[name]["summary"])]
    (out / "summary.json").write_text(json.dumps(report, indent=1, default=str))
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    log_path = out / "run.log"
    if log_path.stat().st_size > LOG_LIMIT:
        data = log_path.read_bytes()
        log_path.write_bytes(data[: LOG_LIMIT // 4] + b"\n[... cut ...]\n" + data[-LOG_LIMIT // 2:])
    shutil.rmtree(work, ignore_errors=True)
    print(text, flush=True)


if __name__ == "__main__":
    main()
