"""E1: MPS in the sandbox, go/no-go, with its threat probes; and the same functional checks without MPS.

With MPS (when `nvidia-cuda-mps-control` exists): a private control daemon (own pipe, log and shm folders),
two clients A and B as uid 65534 in the project's sandbox (`cudal1.eval.sandbox.wrap_command`, GPU device
nodes bound) plus the pipe folder and the daemon's shm bound in. The first start mode that makes MPS
clients is kept (the sandbox as it is; without its IPC namespace; without its PID namespace too; uid 65534
with no namespaces) and written to the state for E2-E7. Checks: both are clients of one server; a VMM
descriptor exported by A maps in B; B's cuStreamWaitValue32 is released by A's cuStreamWriteValue32; two
one-block spinners overlap in %globaltimer; blocks of A and B share SMs; an exclusive kernel in A waits for
B's resident block, and B's block waits for A's exclusive kernel. Threat probes: what B sees in /dev/shm
and the pipe folder and whether it can open it; control commands from B's sandbox; A and B with the pipe
folder made unreachable after their start (and a new client then); B faults: when A notices, how long
until a new client works; `quit` from a sandbox.
Without MPS (time-sliced contexts, the A0 fallback): the same functional checks.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tt_common import (
    Client,
    ClientError,
    Deadline,
    Recorder,
    close_all,
    close_fds,
    describe_error,
    experiment_args,
    gpu_snapshot,
    guarded,
    start_client,
    update_state,
)
from tt_mps import MpsDaemon, find_control

SPIN_NS = 20_000_000
MPS_MODES = ("sandbox", "sandbox_hostipc", "sandbox_hostpid", "uid")
# Words of the shared page (byte offsets)
SEM, MARK, GATE_OVERLAP, GATE_CORES, STARTED_B, STARTED_A = 0, 64, 128, 192, 256, 320


def _u64s(client: Client, ref: list[Any], count: int) -> list[int]:
    return client.call("read_words", ref=ref, count=count, width=8)["values"]


def functional(a: Client, b: Client, rec: Recorder, label: str, dl: Deadline) -> dict[str, Any]:
    """The functional checks between two clients; every figure recorded as it comes."""
    out: dict[str, Any] = {}
    sm = int(a.info.get("sm_count", 1))
    # 1. a VMM allocation exported by A, mapped by B, both ways
    try:
        reply = a.call("export", name="sh", nbytes=2 << 20)
        size, fds = reply["size"], reply["_fds"]
        try:
            b.call("import", fds=fds, name="sh", size=size)
        finally:
            close_fds(fds)
        a.call("fill", name="sh", seed=11)
        got = b.call("check", name="sh", seed=11)
        b.call("fill", name="sh", seed=12)
        back = a.call("check", name="sh", seed=12)
        out["vmm"] = {"ok": got["bad"] == 0 and back["bad"] == 0, "a_to_b_bad": got["bad"], "b_to_a_bad": back["bad"],
                      "words": got["words"]}
        a.call("write_words", ref=["sh", 0], values=[0] * 256)
    except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
        out["vmm"] = {"ok": False, "error": str(exc)}
        rec.write("check", label=label, name="vmm", **out["vmm"])
        return out
    rec.write("check", label=label, name="vmm", **out["vmm"])
    # 2. B's stream waits on a word that A's stream writes
    try:
        b.call("wait_value", ref=["sh", SEM], value=1)
        b.call("mark", ref=["sh", MARK], value=77)
        time.sleep(0.05)
        early = b.call("query")["done"]
        t_write = a.call("write_value", ref=["sh", SEM], value=1)["mono"]
        synced = b.call("sync", timeout_s=12.0, limit_s=10.0)
        mark = a.call("read_words", ref=["sh", MARK], count=1)["values"][0]
        out["memops"] = {"ok": (not early) and mark == 77, "released_before_write": early, "mark": mark,
                         "host_release_to_sync_ms": round((synced["mono"] - t_write) * 1e3, 3)}
    except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
        out["memops"] = {"ok": False, "error": str(exc)}
    rec.write("check", label=label, name="memops", **out["memops"])
    # 3. one-block spinners in A and B, released together: do they run at the same time?
    try:
        for c in (a, b):
            c.call("alloc", name="res1", nbytes=64 * sm)
            c.call("wait_value", ref=["sh", GATE_OVERLAP], value=1)
            c.call("spin", res=["res1", 0], ns=SPIN_NS)
        a.call("write_value", ref=["sh", GATE_OVERLAP], value=1)
        for c in (a, b):
            c.call("sync", timeout_s=17.0, limit_s=15.0)
        ra, rb = _u64s(a, ["res1", 0], 8), _u64s(b, ["res1", 0], 8)
        overlap = min(ra[1], rb[1]) - max(ra[0], rb[0])
        out["overlap"] = {"overlap_ms": overlap / 1e6, "spin_ms": SPIN_NS / 1e6,
                          "a": {"max_gap_us": ra[3] / 1e3, "gaps_over_20us": ra[4], "gap_ms": ra[5] / 1e6, "sm": ra[6]},
                          "b": {"max_gap_us": rb[3] / 1e3, "gaps_over_20us": rb[4], "gap_ms": rb[5] / 1e6, "sm": rb[6]},
                          "concurrent": overlap > 0.8 * SPIN_NS and ra[4] == 0 and rb[4] == 0}
    except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
        out["overlap"] = {"error": str(exc)}
    rec.write("check", label=label, name="overlap", **out["overlap"])
    # 4. blocks of A and B on the same SMs at the same time?
    try:
        for c in (a, b):
            c.call("wait_value", ref=["sh", GATE_CORES], value=1)
            c.call("spin", res=["res1", 0], ns=10_000_000, blocks=sm, threads=64)
        a.call("write_value", ref=["sh", GATE_CORES], value=1)
        for c in (a, b):
            c.call("sync", timeout_s=17.0, limit_s=15.0)
        va, vb = _u64s(a, ["res1", 0], 8 * sm), _u64s(b, ["res1", 0], 8 * sm)
        blocks_a = [(va[8 * i], va[8 * i + 1], va[8 * i + 6]) for i in range(sm)]
        blocks_b = [(vb[8 * i], vb[8 * i + 1], vb[8 * i + 6]) for i in range(sm)]
        shared = set()
        for t0, t1, s in blocks_a:
            for u0, u1, s2 in blocks_b:
                if s == s2 and min(t1, u1) > max(t0, u0):
                    shared.add(s)
        out["coresidence"] = {"sms_with_both": len(shared), "sms": sm,
                              "distinct_sms_a": len({x[2] for x in blocks_a}), "distinct_sms_b": len({x[2] for x in blocks_b})}
    except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
        out["coresidence"] = {"error": str(exc)}
    rec.write("check", label=label, name="coresidence", **out["coresidence"])
    # 5. exclusivity: A's exclusive kernel launched while B's block spins; then the reverse
    try:
        b.call("alloc", name="res2", nbytes=64)
        a.call("alloc", name="res2", nbytes=64)
        b.call("spin", res=["res2", 0], ns=30_000_000, started=["sh", STARTED_B])
        a.call("wait_value", ref=["sh", STARTED_B], value=1)
        cfg = a.call("exclusive", res=["res2", 0], hold_ns=1_000_000)
        a.call("sync", timeout_s=22.0, limit_s=20.0)
        b.call("sync", timeout_s=22.0, limit_s=20.0)
        spin_b = _u64s(b, ["res2", 0], 8)
        ex_a = _u64s(a, ["res2", 0], 4)
        first = {"excl_first_block_before_b_end_ms": (spin_b[1] - ex_a[0]) / 1e6,
                 "excl_all_resident_after_b_end_ms": (ex_a[1] - spin_b[1]) / 1e6,
                 "waited_for_b": ex_a[1] >= spin_b[1], "config": cfg.get("config"), "regs": cfg.get("regs"),
                 "cooperative_refused": cfg.get("cooperative_refused"),
                 "b_gaps_over_20us": spin_b[4], "b_max_gap_us": spin_b[3] / 1e3}
        a.call("exclusive", res=["res2", 0], hold_ns=20_000_000, started=["sh", STARTED_A])
        b.call("wait_value", ref=["sh", STARTED_A], value=1)
        b.call("spin", res=["res2", 0], ns=1_000_000)
        a.call("sync", timeout_s=22.0, limit_s=20.0)
        b.call("sync", timeout_s=22.0, limit_s=20.0)
        ex_a = _u64s(a, ["res2", 0], 4)
        spin_b = _u64s(b, ["res2", 0], 8)
        second = {"b_start_after_excl_end_ms": (spin_b[0] - ex_a[2]) / 1e6, "excluded_b": spin_b[0] >= ex_a[2],
                  "excl_hold_ms": (ex_a[2] - ex_a[1]) / 1e6}
        out["exclusive"] = {"a_waits_for_b": first, "b_waits_for_a": second,
                            "ok": first["waited_for_b"] and second["excluded_b"]}
    except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
        out["exclusive"] = {"ok": False, "error": str(exc)}
    rec.write("check", label=label, name="exclusive", **out["exclusive"])
    return out


def find_mode(daemon: MpsDaemon, work: str, dry: bool, rec: Recorder,
              dl: Deadline) -> tuple[str | None, Client | None, MpsDaemon]:
    """The first start mode whose clients are MPS clients. Clients outside a sandbox see the host's
    /dev/shm, so for them the daemon is restarted with the host's /dev/shm (returned: the daemon in use)."""
    for mode in MPS_MODES:
        if not dl.enough(10):
            break
        if mode == "uid" and daemon.shm_mode == "private":
            rec.write("mps_quit", reason="restart with the host's /dev/shm for uid-only clients", **daemon.quit())
            daemon = MpsDaemon(work, daemon.control, private_shm=False)
            started = daemon.start()
            rec.write("mps_start", **started)
            if not started.get("ok"):
                break
        try:
            c = start_client("A", work, mode=mode, dry=dry, mps=(daemon.pipe, daemon.clients_shm), timeout_s=15)
        except ClientError as exc:
            rec.write("mps_mode_try", mode=mode, ok=False, error=describe_error(exc)[-600:])
            continue
        servers = daemon.server_pids()
        ok = c.info.get("mps_enabled") == 1
        rec.write("mps_mode_try", mode=mode, ok=ok, mps_enabled=c.info.get("mps_enabled"), servers=servers,
                  info=c.info)
        if ok:
            return mode, c, daemon
        c.close()
    return None, None, daemon


def threat_probes(daemon: MpsDaemon, mode: str, a: Client, b: Client, work: str, dry: bool, rec: Recorder,
                  dl: Deadline) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mps = (daemon.pipe, daemon.clients_shm)
    # what B sees of the daemon's folders
    out["shm_seen_by_b"] = b.call("list_dir", path="/dev/shm")
    out["pipe_seen_by_b"] = b.call("list_dir", path=daemon.pipe)
    rec.write("threat", name="shm_listing", **out["shm_seen_by_b"])
    rec.write("threat", name="pipe_listing", **out["pipe_seen_by_b"])
    # control commands from B's sandbox
    cmds = {}
    for text in ("get_server_list", "get_default_active_thread_percentage", "set_default_active_thread_percentage 50",
                 "get_default_active_thread_percentage"):
        cmds[text] = b.call("run", argv=[daemon.control], input=text + "\n", limit_s=10.0, timeout_s=20.0)
    cmds["trusted_reads_percentage"] = daemon.command("get_default_active_thread_percentage")
    daemon.command("set_default_active_thread_percentage 100")
    out["control_from_b"] = cmds
    rec.write("threat", name="control_from_sandbox", commands=cmds)
    # the pipe folder unreachable after the clients' start (each probe leaves ~15 s for the no-MPS part)
    if dl.enough(40):
        probe: dict[str, Any] = {}
        os.chmod(daemon.pipe, 0)
        try:
            probe["a_launch_after"] = _try(lambda: a.call("launch_sync", timeout_s=10.0))
            probe["b_check_after"] = _try(lambda: (b.call("fill", name="sh", seed=5), b.call("check", name="sh", seed=5))[1])
            t0 = time.monotonic()
            try:
                c = start_client("C", work, mode=mode, dry=dry, mps=mps, timeout_s=15)
                probe["new_client"] = {"started": True, "mps_enabled": c.info.get("mps_enabled"),
                                       "s": round(time.monotonic() - t0, 2)}
                c.close()
            except ClientError as exc:
                probe["new_client"] = {"started": False, "error": describe_error(exc)[-400:], "s": round(time.monotonic() - t0, 2)}
        finally:
            os.chmod(daemon.pipe, 0o777)
        out["pipe_removed"] = probe
        rec.write("threat", name="pipe_unreachable_after_start", **probe)
    # B faults: when does A notice, and when does a new client work again?
    if dl.enough(45):
        fault: dict[str, Any] = {"servers_before": daemon.server_pids()}
        a.send("tick_loop", seconds=6.0 if not dry else 1.0)
        time.sleep(0.3)
        fault["b"] = _try(lambda: b.call("fault", timeout_s=25.0))
        try:
            ticks, _ = a.recv(15.0, "tick_loop")
            fault["a"] = ticks
            if ticks.get("error") and fault["b"].get("mono"):
                fault["a_error_after_fault_ms"] = round((ticks["error"]["mono"] - fault["b"]["mono"]) * 1e3, 1)
        except ClientError as exc:
            fault["a"] = {"error_reply": describe_error(exc)[-400:]}
        fault["a_alive"], fault["b_alive"] = a.alive(), b.alive()
        close_all([a, b])
        fault["servers_after_close"] = daemon.server_pids()
        t0 = time.monotonic()
        recovered = None
        tries = []
        while time.monotonic() - t0 < 30 and dl.enough(23):
            try:
                c = start_client("C", work, mode=mode, dry=dry, mps=mps, timeout_s=10)
                try:
                    c.call("launch_sync", timeout_s=10.0)
                    recovered = {"s": round(time.monotonic() - t0, 2), "mps_enabled": c.info.get("mps_enabled")}
                finally:
                    if recovered is None:
                        c.close()
                if recovered is not None:
                    out["_survivor"] = c
                    break
            except ClientError as exc:
                tries.append(describe_error(exc)[-200:])
                time.sleep(0.5)
        fault["recovery"] = recovered
        fault["failed_tries"] = tries[-5:]
        fault["servers_after"] = daemon.server_pids()
        out["fault"] = fault
        rec.write("threat", name="fault_containment", **fault)
    # `quit` sent from a sandbox
    c = out.pop("_survivor", None)
    if c is not None and not dl.enough(35):
        c.close()
    elif c is not None:
        from tt_mps import daemon_pids

        # `quit` lets the daemon finish with its clients first: whether it obeyed shows as refusing new
        # clients, and as exiting once its last client is gone
        q: dict[str, Any] = {"reply": c.call("run", argv=[daemon.control], input="quit\n", limit_s=10.0, timeout_s=20.0)}
        time.sleep(2.0)
        q["daemon_alive_after_2s"] = bool(daemon_pids(daemon.pipe))
        q["client_still_works"] = _try(lambda: c.call("launch_sync", timeout_s=10.0))
        try:
            d = start_client("D", work, mode=mode, dry=dry, mps=mps, timeout_s=10)
            q["new_client_after_quit"] = {"started": True, "mps_enabled": d.info.get("mps_enabled")}
            d.close()
        except ClientError as exc:
            q["new_client_after_quit"] = {"started": False, "error": describe_error(exc)[-300:]}
        c.close()
        time.sleep(2.0)
        q["daemon_alive_after_clients_closed"] = bool(daemon_pids(daemon.pipe))
        out["quit_from_sandbox"] = q
        rec.write("threat", name="quit_from_sandbox", **q)
    return out


def _try(fn: Any) -> dict[str, Any]:
    try:
        r = fn()
        return {"ok": True, **(r if isinstance(r, dict) else {})}
    except ClientError as exc:
        return {"ok": False, "error": describe_error(exc)[-400:]}


def main() -> None:
    args = experiment_args(__doc__.splitlines()[0], lambda p: p.add_argument("--mps-control", default=None))
    rec, dl = Recorder(args.out, "E1"), Deadline(args.timeout)
    from cudal1.eval.sandbox import detect_sandbox

    sandbox = detect_sandbox()
    rec.write("env", gpu=gpu_snapshot(), sandbox=sandbox.to_dict(), bwrap=sandbox.bwrap)
    control, searched = (args.mps_control, ["--mps-control"]) if args.mps_control else find_control()
    rec.write("mps_binary", path=control, searched=searched)
    update_state(args.work, mps_control=control, mps_ok=False, mps_mode=None,
                 sandbox_level=sandbox.level)
    summary: dict[str, Any] = {"mps_control": control, "sandbox": sandbox.level}
    if control is None:
        rec.note("nvidia-cuda-mps-control not found: MPS parts skipped")
        summary["mps"] = "absent"
    else:
        daemon = MpsDaemon(args.work, control)
        a = b = None
        try:
            started = daemon.start()
            rec.write("mps_start", **started)
            summary["mps_start"] = started.get("ok")
            if started.get("ok"):
                summary["mps_shm"] = started.get("shm")
                mode, a, daemon = find_mode(daemon, args.work, args.dry, rec, dl)
                summary["mps_mode"] = mode
                update_state(args.work, mps_private_shm=daemon.shm_mode == "private")
                if mode is not None:
                    b = start_client("B", args.work, mode=mode, dry=args.dry, mps=(daemon.pipe, daemon.clients_shm))
                    servers = daemon.server_pids()
                    clients = sorted({p for s in servers for p in daemon.client_pids(s)})
                    pids = {"a": a.info.get("host_pid"), "b": b.info.get("host_pid")}
                    same_server = {"servers": servers, "clients": clients, "pids": pids,
                                   "both_listed": pids["a"] in clients and pids["b"] in clients,
                                   "b_mps_enabled": b.info.get("mps_enabled")}
                    rec.write("check", label="mps", name="one_server", **same_server)
                    f = functional(a, b, rec, "mps", dl)
                    checks = [f.get("vmm", {}).get("ok"), f.get("memops", {}).get("ok"),
                              f.get("overlap", {}).get("concurrent"), f.get("exclusive", {}).get("ok"),
                              b.info.get("mps_enabled") == 1]
                    summary["mps_functional"] = {k: v for k, v in zip(
                        ("vmm", "memops", "concurrent", "exclusive", "both_mps"), checks, strict=True)}
                    summary["mps_go"] = all(bool(c) for c in checks)
                    # E2-E7 use MPS where the gate works across its clients (a dry run: where a mode was found)
                    usable = bool(f.get("memops", {}).get("ok")) or args.dry
                    update_state(args.work, mps_ok=usable, mps_mode=mode, mps_go=summary["mps_go"])
                    if dl.enough(30):
                        t = threat_probes(daemon, mode, a, b, args.work, args.dry, rec, dl)
                        a = b = None  # closed by the probes
                        summary["threats"] = {
                            "shm_entries": len(t.get("shm_seen_by_b", {}).get("entries", [])),
                            "shm_openable_rw": sum(1 for e in t.get("shm_seen_by_b", {}).get("entries", [])
                                                   if e.get("open_rw") is True),
                            "pipe_removed_clients_work": [t.get("pipe_removed", {}).get(k, {}).get("ok")
                                                          for k in ("a_launch_after", "b_check_after")],
                            "fault_a_error_ms": t.get("fault", {}).get("a_error_after_fault_ms"),
                            "fault_recovery_s": (t.get("fault", {}).get("recovery") or {}).get("s"),
                            "quit_from_sandbox_obeyed": (None if "quit_from_sandbox" not in t else
                                                         not t["quit_from_sandbox"]["daemon_alive_after_clients_closed"]),
                        }
        except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
            rec.write("error", where="mps", error=describe_error(exc)[-1500:])
            summary["mps_error"] = describe_error(exc)[-300:]
        finally:
            close_all([a, b])
            rec.write("mps_logs", **daemon.logs())
            rec.write("mps_quit", **daemon.quit())
    # Without MPS: time-sliced contexts (A0), in the project's sandbox where there is one
    mode = "sandbox" if sandbox.level != "none" else "plain"
    update_state(args.work, plain_mode=mode)
    if dl.enough(15):
        a = b = None
        try:
            a = start_client("A0", args.work, mode=mode, dry=args.dry)
            b = start_client("B0", args.work, mode=mode, dry=args.dry)
            f = functional(a, b, rec, "no_mps", dl)
            summary["no_mps"] = {"mode": mode, "vmm": f.get("vmm", {}).get("ok"), "memops": f.get("memops", {}).get("ok"),
                                 "overlap_ms": f.get("overlap", {}).get("overlap_ms"),
                                 "max_gap_us": [f.get("overlap", {}).get(k, {}).get("max_gap_us") for k in ("a", "b")],
                                 "exclusive": f.get("exclusive", {}).get("ok"),
                                 "excl_before_b_end_ms": f.get("exclusive", {}).get("a_waits_for_b", {}).get(
                                     "excl_first_block_before_b_end_ms")}
            update_state(args.work, plain_memops_ok=bool(f.get("memops", {}).get("ok")))
        except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
            rec.write("error", where="no_mps", error=describe_error(exc)[-1500:])
            summary["no_mps_error"] = describe_error(exc)[-300:]
        finally:
            close_all([a, b])
    rec.write("summary", **summary)


if __name__ == "__main__":
    guarded(main, "E1")
