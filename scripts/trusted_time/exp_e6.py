"""E6: locking the candidate's process from outside with cuCheckpointProcessLock.

This process (root, cuInit only, no context) locks a runner R (a client in the project's sandbox where there
is one, by its pid as seen from here) and unlocks it: (i) R idle, before and after R maps a VMM allocation
exported by a helper H; (ii) R with a 300 ms spinner running: a lock with a 2 s timeout (does it wait for
the kernel?) and one with 50 ms; (iii) R with a kernel queued behind a semaphore that nobody releases: a
lock with a 500 ms timeout (does it wait for queued work, or time out?), and when it locks, whether H's
release of the semaphore lets R's queued kernel run while R is locked; (iv) a CUDA call R makes while
locked: does it return only after the unlock? With MPS (when E1 found it works) case (i) again on an MPS
client. Pass (study): lock + unlock under ~1 ms, and case (iii) times out detectably.
"""

from __future__ import annotations

import time
from typing import Any

from tt_common import (
    Client,
    ClientError,
    Deadline,
    Recorder,
    close_all,
    close_fds,
    describe,
    describe_error,
    experiment_args,
    guarded,
    read_state,
    start_client,
)
from tt_cuda import make_cuda
from tt_mps import MpsDaemon

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}
SEM, MARK = 192, 256  # byte offsets in the shared page


def lock_cycle(cu: Any, pid: int, timeout_ms: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    rc = cu.checkpoint_lock(pid, timeout_ms)
    t1 = time.perf_counter()
    state = cu.checkpoint_state(pid)
    out = {"lock_rc": rc, "lock_ms": round((t1 - t0) * 1e3, 3), "state_after_lock": STATES.get(state, state)}
    if rc == 0:
        t2 = time.perf_counter()
        out["unlock_rc"] = cu.checkpoint_unlock(pid)
        out["unlock_ms"] = round((time.perf_counter() - t2) * 1e3, 3)
        out["state_after_unlock"] = STATES.get(cu.checkpoint_state(pid), None)
    return out


def idle_cycles(cu: Any, pid: int, n: int, rec: Recorder, label: str) -> dict[str, Any]:
    rows = [lock_cycle(cu, pid, 1000) for _ in range(n)]
    ok = [r for r in rows if r["lock_rc"] == 0]
    out = {"n": n, "locked": len(ok), "rcs": sorted({r["lock_rc"] for r in rows}),
           "lock_ms": describe([r["lock_ms"] for r in ok]), "unlock_ms": describe([r["unlock_ms"] for r in ok]),
           "first": rows[0] if rows else None}
    rec.write("idle", label=label, **out)
    return out


def run_cases(cu: Any, r: Client, h: Client, rec: Recorder, dl: Deadline, label: str) -> dict[str, Any]:
    """Cases (i)-(iv) of the module docstring; each recorded as it ends. A case that leaves R locked
    (its unlock failed) ends the series: R cannot answer any more."""
    pid = r.info.get("host_pid")
    out: dict[str, Any] = {"pid": pid, "state": STATES.get(cu.checkpoint_state(pid), None)}
    rec.write("target", label=label, pid=pid, state=out["state"], mode=r.mode)
    out["idle_before_vmm"] = idle_cycles(cu, pid, 20, rec, label + ".idle_before_vmm")
    reply = h.call("export", name="sh", nbytes=2 << 20)
    try:
        r.call("import", fds=reply["_fds"], name="sh", size=reply["size"])
    finally:
        close_fds(reply["_fds"])
    out["idle_with_vmm"] = idle_cycles(cu, pid, 20, rec, label + ".idle_with_vmm")

    def stuck(cyc: dict[str, Any]) -> bool:
        return cyc.get("lock_rc") == 0 and cyc.get("unlock_rc") not in (0, None)

    # (ii) a spinner running
    r.call("alloc", name="res", nbytes=64)
    for timeout_ms in (2000, 50):
        if not dl.enough(5):
            break
        r.call("spin", res=["res", 0], ns=300_000_000)
        t_launched = time.perf_counter()
        time.sleep(0.02)
        remaining_ms = 300.0 - (time.perf_counter() - t_launched) * 1e3
        cyc = lock_cycle(cu, pid, timeout_ms)
        cyc["spin_left_at_lock_ms"] = round(remaining_ms, 1)
        cyc["lock_waited_for_kernel"] = cyc["lock_ms"] >= 0.8 * remaining_ms
        rec.write("spinner", label=label, timeout_ms=timeout_ms, spin_ms=300, **cyc)
        out[f"spinner_timeout_{timeout_ms}ms"] = cyc
        if stuck(cyc):
            return out
        cyc["spinner_done_after"] = r.call("query", timeout_s=10.0)["done"]
        r.call("sync", timeout_s=5.0, limit_s=3.0)
    # (iii) a kernel queued behind a semaphore nobody releases
    if dl.enough(5):
        r.call("wait_value", ref=["sh", SEM], value=1)
        r.call("mark", ref=["sh", MARK], value=5)
        time.sleep(0.02)
        t0 = time.perf_counter()
        rc = cu.checkpoint_lock(pid, 500)
        lock_ms = (time.perf_counter() - t0) * 1e3
        cyc = {"lock_rc": rc, "lock_ms": round(lock_ms, 3), "state": STATES.get(cu.checkpoint_state(pid), None)}
        try:
            if rc == 0:
                # locked with work queued: does H's release let R's queued kernel run now?
                h.call("write_value", ref=["sh", SEM], value=1)
                time.sleep(0.2)
                cyc["mark_while_locked"] = h.call("read_words", ref=["sh", MARK], count=1)["values"][0]
                t2 = time.perf_counter()
                cyc["unlock_rc"] = cu.checkpoint_unlock(pid)
                cyc["unlock_ms"] = round((time.perf_counter() - t2) * 1e3, 3)
            else:
                h.call("write_value", ref=["sh", SEM], value=1)
            if not stuck(cyc):
                r.call("sync", timeout_s=10.0, limit_s=8.0)
                cyc["mark_after"] = h.call("read_words", ref=["sh", MARK], count=1)["values"][0]
        except ClientError as exc:
            cyc["error"] = str(exc)[-400:]
        rec.write("queued_blocked", label=label, **cyc)
        out["queued_blocked"] = cyc
        if stuck(cyc) or "error" in cyc:
            return out
    # (iv) a call made while locked
    if dl.enough(5):
        rc = cu.checkpoint_lock(pid, 1000)
        call: dict[str, Any] = {"lock_rc": rc}
        if rc == 0:
            r.send("launch_sync")
            time.sleep(0.2)
            t_unlock = time.monotonic()
            call["unlock_rc"] = cu.checkpoint_unlock(pid)
            try:
                reply, _ = r.recv(10.0, "launch_sync")
                call["returned_after_unlock_ms"] = round((reply["mono"] - t_unlock) * 1e3, 3)
                call["blocked_while_locked"] = reply["mono"] >= t_unlock
            except ClientError as exc:
                call["error"] = str(exc)[-400:]
        rec.write("call_while_locked", label=label, **call)
        out["call_while_locked"] = call
    return out


def main() -> None:
    args = experiment_args(__doc__.splitlines()[0])
    rec, dl = Recorder(args.out, "E6"), Deadline(args.timeout)
    state = read_state(args.work)
    summary: dict[str, Any] = {}
    cu = make_cuda(args.dry)
    try:
        cu.init_only()
    except Exception as exc:  # noqa: BLE001 - recorded
        rec.write("error", where="cuInit", error=str(exc))
        rec.write("summary", error=str(exc))
        return
    mode = state.get("plain_mode") or "plain"
    r = h = None
    try:
        h = start_client("H", args.work, mode=mode, dry=args.dry)
        r = start_client("R", args.work, mode=mode, dry=args.dry)
        cases = run_cases(cu, r, h, rec, dl, "no_mps")
        summary["mode"] = mode
        summary["idle_lock_ms"] = cases["idle_with_vmm"]["lock_ms"].get("median")
        summary["idle_unlock_ms"] = cases["idle_with_vmm"]["unlock_ms"].get("median")
        summary["idle_rcs"] = cases["idle_with_vmm"]["rcs"]
        summary["idle_rcs_before_vmm"] = cases["idle_before_vmm"]["rcs"]
        summary["spinner"] = {k: {x: v.get(x) for x in ("lock_rc", "lock_ms")} for k, v in cases.items()
                              if k.startswith("spinner")}
        summary["queued_blocked"] = {k: cases.get("queued_blocked", {}).get(k)
                                     for k in ("lock_rc", "lock_ms", "mark_while_locked", "mark_after")}
        summary["call_while_locked"] = cases.get("call_while_locked")
        lock, unlock = summary["idle_lock_ms"], summary["idle_unlock_ms"]
        q = cases.get("queued_blocked", {})
        summary["pass"] = (lock is not None and unlock is not None and lock + unlock < 1.0
                           and q.get("lock_rc", 0) != 0)
    except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
        rec.write("error", where="no_mps", error=describe_error(exc)[-1500:])
        summary["error"] = describe_error(exc)[-300:]
    finally:
        close_all([r, h])
    if mode != "plain" and summary.get("idle_rcs") != [0] and dl.enough(10):
        # the lock failed on a sandboxed runner: is it the sandbox (another PID namespace) or the call?
        r = None
        try:
            r = start_client("R_plain", args.work, mode="plain", dry=args.dry)
            summary["plain_idle"] = idle_cycles(cu, r.info["host_pid"], 10, rec, "plain.idle")
        except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
            rec.write("error", where="plain", error=describe_error(exc)[-1500:])
        finally:
            close_all([r])
    if state.get("mps_ok") and state.get("mps_control") and dl.enough(15):
        daemon = MpsDaemon(args.work, state["mps_control"], private_shm=state.get("mps_private_shm", True))
        r = None
        try:
            started = daemon.start()
            rec.write("mps_start", **started)
            if started.get("ok"):
                r = start_client("R_mps", args.work, mode=state.get("mps_mode") or "sandbox", dry=args.dry,
                                 mps=(daemon.pipe, daemon.clients_shm))
                pid = r.info.get("host_pid")
                summary["mps_idle"] = idle_cycles(cu, pid, 10, rec, "mps.idle")
        except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
            rec.write("error", where="mps", error=describe_error(exc)[-1500:])
        finally:
            close_all([r])
            rec.write("mps_quit", **daemon.quit())
    rec.write("summary", **summary)


if __name__ == "__main__":
    guarded(main, "E6")
