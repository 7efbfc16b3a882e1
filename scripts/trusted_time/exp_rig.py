"""E2, E3 and E4 on one rig: a helper H and runners R, each its own process and CUDA context.

Per runner H makes one shared page (a VMM allocation, its descriptor passed to R): a gate word H writes, a
done word R writes, per call a slot of %globaltimer stamps, and an output region. R enqueues its calls
ahead, each `wait gate >= i; K; write done = i`. H enqueues, behind a start word it releases once all is
queued: `E_pre; B1; E_start; write gate = i; wait done >= i; B2; E_end`, B1 and B2 being exclusive
cooperative kernels (one 1024-thread block per SM with all the opt-in shared memory, a grid barrier at their
start; B1 poisons the output and can flush L2, B2 counts the output words equal to i). The bracket is
E_end - E_start (H's events); K's own span, the gate latency (B1's end to K's first block) and the done
latency (K's last block to B2's first) come from the stamps.

E2: K empty, 20 us and 100 us (spinning blocks), 2000 calls each, with MPS (when E1 found it works) and
    without (time-sliced contexts: the A0 fallback). c = bracket - K. Pass with MPS: IQR(c) <= 1 us,
    p99(c) - p50(c) <= 3 us, gate and done latency medians <= 2.5 us each.
E3: malicious runners at 20 and 100 us against the honest one, with MPS and without: (a) the call on a side
    stream that waits only for B1 to begin, (b) done written before the call, (c) the output copied in after
    done, (d) a 20 ms spinner ahead of each batch, (e) an SM hog after done. Pass (study): (a), (b) shorten
    the bracket by <= 5 us; (c) leaves the output incomplete at B2; (d) shows as B1 delay; (e) only
    lengthens its own bracket. (f) (work queued into the reference's brackets) is not run here: it needs
    the reference runner of the real protocol.
E4: the same kernel as reference and candidate (two runners), a ~20 us elementwise op, a ~100 us and a
    ~200 us tiled SGEMM (in place of the conv), three evaluations (fresh processes) x 200 pairs, B1
    flushing 128 MiB, with MPS and without. Pass (study): |speedup - 1| median <= 1 %, max <= 5 %
    (`pass`); the stricter goal, median <= 0.5 %, max <= 3 % (`pass_goal`).
"""

from __future__ import annotations

import random
import time
from typing import Any

from tt_common import (
    Client,
    ClientError,
    Deadline,
    Recorder,
    close_all,
    describe,
    describe_error,
    experiment_args,
    gpu_snapshot,
    guarded,
    quantile,
    read_state,
    start_client,
)
from tt_mps import MpsDaemon, find_control

NO_STAMP = (1 << 64) - 1


class Rig:
    """H and its runners, set up and torn down together."""

    def __init__(self, work: str, mode: str, mps: tuple[str, str] | None, dry: bool, runners: int,
                 flush_bytes: int = 0, axpb_n: int = 0, gemm_n: int = 0):
        self.clients: list[Client] = []
        self.h = start_client("H", work, mode=mode, dry=dry, mps=mps)
        self.clients.append(self.h)
        reply = self.h.call("rig_h_setup", runners=runners, flush_bytes=flush_bytes, max_calls=64)
        self.setup = {k: v for k, v in reply.items() if k not in ("_fds", "ok", "id")}
        fds = reply["_fds"]
        self.r: list[Client] = []
        try:
            for i in range(runners):
                c = start_client(f"R{i}", work, mode=mode, dry=dry, mps=mps, cubins=("kernels", "e5"))
                self.clients.append(c)
                c.call("rig_r_setup", fds=[fds[i]], size=reply["sizes"][i], axpb_n=axpb_n, gemm_n=gemm_n)
                self.r.append(c)
        finally:
            import os

            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.seq = [1] * runners
        self.flush_vec = flush_bytes // 16

    def batch(self, per_runner: list[dict[str, Any]], order: list[int], excl: bool = True,
              out_words: list[int] | None = None, flush: bool = False, limit_s: float = 20.0) -> dict[str, Any]:
        """One batch: runner i enqueues `per_runner[i]['n']` calls (its other keys: the variant and kernel),
        H runs them in `order` (a list of runner indices, one per call)."""
        for i, spec in enumerate(per_runner):
            if spec.get("n", 0):
                self.r[i].call("rig_r_enqueue", timeout_s=15.0, seq0=self.seq[i], **spec)
        calls, nxt = [], list(self.seq)
        for i in order:
            calls.append([i, nxt[i]])
            nxt[i] += 1
        reply = self.h.call("rig_h_batch", timeout_s=limit_s + 10.0, calls=calls, excl=excl,
                            flush_vec=self.flush_vec if flush else 0, out_words=out_words, limit_s=limit_s)
        self.seq = nxt
        return reply

    def warm(self, seconds: float = 0.5) -> dict[str, Any]:
        """Busy calls of 100 us for `seconds`, discarded: the clocks ramp up before the first figure counts."""
        sm = int(self.h.info.get("sm_count", 1))
        t0 = time.monotonic()
        spec = {"n": 10, "kind": "spin", "k_ns": 100_000, "k_grid": sm, "k_block": 128}
        while time.monotonic() - t0 < seconds:
            self.batch([spec] * len(self.r), [i for i in range(len(self.r)) for _ in range(10)],
                       out_words=[sm * 128] * len(self.r))
        return {"s": round(time.monotonic() - t0, 2), "gpu": gpu_snapshot()}

    def close(self) -> None:
        close_all(self.clients)


def analyse(rows: list[dict[str, Any]], out_words: int) -> list[dict[str, Any]]:
    """Per call: the bracket, K's span, c, gate and done latencies (us), and what B2 saw."""
    out = []
    for row in rows:
        s = row["s"]
        ok = s[3] != NO_STAMP and s[4] > 0 and s[5] != NO_STAMP and s[2] > 0
        br = row["br_ms"] * 1e3
        call = {"r": row["r"], "seq": row["seq"], "br_us": br, "b1_us": row["b1_ms"] * 1e3}
        if ok:
            k = (s[4] - s[3]) / 1e3
            call.update(k_us=k, c_us=br - k, gate_us=(s[3] - s[2]) / 1e3, done_us=(s[5] - s[4]) / 1e3,
                        b2_us=(s[7] - s[5]) / 1e3, b1_wait_us=(s[1] - s[0]) / 1e3,
                        k_before_b1_end=s[3] < s[2], complete=s[8] == out_words, k_done_at_b2=s[12])
        out.append(call)
    return out


def stats(calls: list[dict[str, Any]], keys: tuple[str, ...] = ("br_us", "k_us", "c_us", "gate_us", "done_us",
                                                                   "b1_us", "b2_us", "b1_wait_us")) -> dict[str, Any]:
    return {k: describe([c[k] for c in calls if k in c]) for k in keys}


def series(calls: list[dict[str, Any]], key: str) -> list[float]:
    return [round(c[key], 3) for c in calls if key in c]


def mps_daemon(work: str, rec: Recorder) -> MpsDaemon | None:
    state = read_state(work)
    control = state.get("mps_control") or find_control()[0]
    if not control:
        return None
    daemon = MpsDaemon(work, control, private_shm=state.get("mps_private_shm", True))
    started = daemon.start()
    rec.write("mps_start", **started)
    if not started.get("ok"):
        daemon.quit()
        return None
    return daemon


def plans(work: str, want_mps: bool, want_plain: bool) -> list[tuple[str, str]]:
    state = read_state(work)
    out = []
    if want_mps and state.get("mps_control") and state.get("mps_ok", "mps_ok" not in state):
        out.append(("mps", state.get("mps_mode") or "sandbox"))
    if want_plain:
        out.append(("no_mps", state.get("plain_mode") or "plain"))
    return out


# --------------------------------------------------------------------------- E2


E2_SIZES = (("empty", 0, False), ("20us", 20_000, True), ("100us", 100_000, True))


def run_e2(args: Any, rec: Recorder, dl: Deadline) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    todo = plans(args.work, True, True)
    for idx, (label, mode) in enumerate(todo):
        share = dl.left() / (len(todo) - idx)
        t_mode = time.monotonic()
        daemon = mps_daemon(args.work, rec) if label == "mps" else None
        if label == "mps" and daemon is None:
            summary[label] = {"error": "MPS daemon did not start"}
            continue
        mps = (daemon.pipe, daemon.clients_shm) if daemon else None
        rig = None
        try:
            rig = Rig(args.work, mode, mps, args.dry, 1)
            sm = int(rig.h.info.get("sm_count", 1))
            tick = rig.h.call("gt_tick")
            rec.write("gt_tick", label=label, **tick)
            rec.write("rig", label=label, mode=mode, setup=rig.setup, h=rig.h.info, r=rig.r[0].info,
                      gpu=gpu_snapshot())
            rec.write("warmup", label=label, **rig.warm())
            configs = [(name, ns, wide, True, args.calls) for name, ns, wide in E2_SIZES]
            configs.append(("empty_nonexclusive", 0, False, False, max(100, args.calls // 4)))
            mode_out: dict[str, Any] = {"mode": mode, "gt_step_ns": tick.get("min_step_ns")}
            for ci, (name, ns, wide, excl, n) in enumerate(configs):
                left = share - (time.monotonic() - t_mode)
                cap = left / (len(configs) - ci)
                if cap < 2:
                    rec.write("skipped", label=label, config=name, reason="no time left")
                    continue
                grid, block = (sm, 128) if wide else (1, 32)
                calls: list[dict[str, Any]] = []
                t0 = time.monotonic()
                stalled = 0
                failure = None
                try:
                    while len(calls) < n and time.monotonic() - t0 < cap:
                        m = min(args.batch, n - len(calls))
                        spec = {"n": m, "variant": "honest", "kind": "spin", "k_ns": ns, "k_grid": grid,
                                "k_block": block}
                        reply = rig.batch([spec], [0] * m, excl=excl, out_words=[grid * block])
                        stalled += bool(reply.get("stalled"))
                        calls += analyse(reply["rows"], grid * block)
                except ClientError as exc:  # a stuck batch: keep what came, new processes for the next size
                    failure = str(exc)[-600:]
                    rig.close()
                    rig = Rig(args.work, mode, mps, args.dry, 1)
                st = stats(calls)
                c, gate, done = st["c_us"], st["gate_us"], st["done_us"]
                checks = None
                if c.get("n"):
                    checks = {"iqr_c_le_1us": c["iqr"] <= 1.0, "p99_minus_p50_c_le_3us": c["p99"] - c["median"] <= 3.0,
                              "gate_median_le_2.5us": gate.get("median", 99) <= 2.5,
                              "done_median_le_2.5us": done.get("median", 99) <= 2.5}
                incomplete = sum(1 for x in calls if x.get("complete") is False)
                rec.write("config", label=label, config=name, n=len(calls), exclusive=excl, k_grid=grid, k_block=block,
                          k_ns=ns, stalled_batches=stalled, incomplete_outputs=incomplete, stats=st, checks=checks,
                          error=failure,
                          wall_s=round(time.monotonic() - t0, 2), c_us=series(calls, "c_us"),
                          gate_us=series(calls, "gate_us"), done_us=series(calls, "done_us"),
                          br_us=series(calls, "br_us"))
                mode_out[name] = {"n": len(calls), "c_med": c.get("median"), "c_iqr": c.get("iqr"),
                                  "c_p99_p50": None if not c.get("n") else round(c["p99"] - c["median"], 3),
                                  "gate_med": gate.get("median"), "done_med": done.get("median"),
                                  "pass": None if checks is None else all(checks.values()),
                                  **({"error": failure[-160:]} if failure else {})}
            summary[label] = mode_out
        except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
            rec.write("error", label=label, error=describe_error(exc)[-1500:])
            summary[label] = {"error": describe_error(exc)[-300:]}
        finally:
            if rig is not None:
                rig.close()
            if daemon is not None:
                rec.write("mps_quit", **daemon.quit())
    mps = summary.get("mps", {})
    sized = [mps.get(n, {}).get("pass") for n, _, _ in E2_SIZES]
    summary["mps_pass"] = all(sized) if mps and all(v is not None for v in sized) else None
    return summary


# --------------------------------------------------------------------------- E3


E3_VARIANTS = ("honest", "a", "b", "c", "d", "e")


def _modes(args: Any, rec: Recorder, dl: Deadline, body: Any) -> dict[str, Any]:
    """Run `body(label, mode, mps, until)` with MPS (where E1 found it works) and then without, each with its
    share of the time left; each mode's MPS daemon is quit after it."""
    todo = plans(args.work, True, True)
    out: dict[str, Any] = {}
    for idx, (label, mode) in enumerate(todo):
        until = time.monotonic() + dl.left() / (len(todo) - idx)
        daemon = mps_daemon(args.work, rec) if label == "mps" else None
        if label == "mps" and daemon is None:
            out[label] = {"error": "MPS daemon did not start"}
            continue
        try:
            out[label] = body(label, mode, (daemon.pipe, daemon.clients_shm) if daemon else None, until)
        except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
            rec.write("error", label=label, error=describe_error(exc)[-1500:])
            out[label] = {"error": describe_error(exc)[-300:]}
        finally:
            if daemon is not None:
                rec.write("mps_quit", **daemon.quit())
    return out


def run_e3(args: Any, rec: Recorder, dl: Deadline) -> dict[str, Any]:
    def body(label: str, mode: str, mps: Any, until: float) -> dict[str, Any]:
        summary: dict[str, Any] = {"mode": mode}
        rig = Rig(args.work, mode, mps, args.dry, 1)
        try:
            sm = int(rig.h.info.get("sm_count", 1))
            rec.write("warmup", label=label, **rig.warm())
            sizes = (("20us", 20_000), ("100us", 100_000))
            slots = len(sizes) * len(E3_VARIANTS)
            done_slots = 0
            for size, ns in sizes:
                base = None
                for variant in E3_VARIANTS:
                    cap = (until - time.monotonic()) / max(1, slots - done_slots)
                    done_slots += 1
                    if cap < 1:
                        rec.write("skipped", label=label, size=size, variant=variant, reason="no time left")
                        continue
                    calls: list[dict[str, Any]] = []
                    t0 = time.monotonic()
                    try:
                        while len(calls) < args.calls_e3 and time.monotonic() - t0 < cap:
                            m = min(args.batch, args.calls_e3 - len(calls))
                            spec = {"n": m, "variant": variant, "kind": "spin", "k_ns": ns, "k_grid": sm,
                                    "k_block": 128, "spin_ns": 20_000_000, "hog_ns": 50_000}
                            reply = rig.batch([spec], [0] * m, out_words=[sm * 128])
                            rows = analyse(reply["rows"], sm * 128)
                            for i, row in enumerate(rows):
                                row["first_of_batch"] = i == 0
                            calls += rows
                    except ClientError as exc:
                        rec.write("error", label=label, size=size, variant=variant, error=describe_error(exc)[-1000:])
                        rig.close()
                        rig = Rig(args.work, mode, mps, args.dry, 1)
                        continue
                    st = stats(calls)
                    first_b1 = describe([c["b1_us"] for c in calls if c.get("first_of_batch")])
                    row = {"n": len(calls), "br_med": st["br_us"].get("median"), "c_med": st["c_us"].get("median"),
                           "complete_frac": (sum(1 for c in calls if c.get("complete")) / len(calls)) if calls else None,
                           "k_before_b1_end": sum(1 for c in calls if c.get("k_before_b1_end")),
                           "first_b1_med_us": first_b1.get("median")}
                    if variant == "honest":
                        base = row
                    if base is not None and row["br_med"] is not None and base["br_med"] is not None:
                        row["gain_us"] = round(base["br_med"] - row["br_med"], 3)  # how much shorter the bracket
                    rec.write("variant", label=label, size=size, variant=variant, stats=st, first_b1_us=first_b1,
                              br_us=series(calls, "br_us"), **row)
                    summary[f"{size}.{variant}"] = row
        finally:
            rig.close()
        return summary

    return _modes(args, rec, dl, body)


# --------------------------------------------------------------------------- E4


E4_KINDS = (("axpb_20us", "axpb"), ("gemm_100us", "gemm"), ("gemm_200us", "gemm"))


def run_e4(args: Any, rec: Recorder, dl: Deadline) -> dict[str, Any]:
    rng = random.Random(4)

    def body(label: str, mode: str, mps: Any, until: float) -> dict[str, Any]:
        summary: dict[str, Any] = {"mode": mode}
        deviations: list[float] = []
        for ev in range(args.evaluations):
            if until - time.monotonic() < 6:
                rec.write("skipped", label=label, evaluation=ev, reason="no time left")
                continue
            rig = None
            try:
                # fresh processes for every evaluation, as an evaluator starts them
                rig = Rig(args.work, mode, mps, args.dry, 2, flush_bytes=args.flush_mb << 20, axpb_n=args.axpb_n,
                          gemm_n=max(args.gemm_small, args.gemm_large))
                rec.write("warmup", label=label, evaluation=ev, **rig.warm(0.3))
                for ki, (kname, kind) in enumerate(E4_KINDS):
                    left_runs = (args.evaluations - ev) * len(E4_KINDS) - ki
                    cap = (until - time.monotonic()) / max(1, left_runs)
                    if cap < 1:
                        rec.write("skipped", label=label, evaluation=ev, kernel=kname, reason="no time left")
                        continue
                    spec = {"kind": kind, "gemm_n": args.gemm_small if kname == "gemm_100us" else args.gemm_large}
                    t0 = time.monotonic()
                    before = gpu_snapshot()
                    rig.batch([{"n": 4, **spec}, {"n": 4, **spec}], [0, 1] * 4, flush=True)  # warm-up
                    ref: list[float] = []
                    cand: list[float] = []
                    while len(ref) < args.pairs and time.monotonic() - t0 < cap:
                        m = min(args.batch // 2, args.pairs - len(ref))
                        order: list[int] = []
                        for _ in range(m):
                            order += rng.sample([0, 1], 2)
                        reply = rig.batch([{"n": m, **spec}, {"n": m, **spec}], order, flush=True)
                        for row in reply["rows"]:
                            (ref if row["r"] == 0 else cand).append(row["br_ms"] * 1e3)
                    after = gpu_snapshot()
                    med_r, med_c = quantile(ref, 0.5), quantile(cand, 0.5)
                    speedup = med_r / med_c if med_c == med_c and med_c > 0 else float("nan")
                    pair_ratios = [a / b for a, b in zip(ref, cand, strict=False) if b > 0]
                    dev = abs(speedup - 1.0) if speedup == speedup else None
                    if dev is not None:
                        deviations.append(dev)
                    rec.write("evaluation", label=label, evaluation=ev, kernel=kname, n=len(ref), speedup=speedup,
                              deviation=dev, pair_ratio=describe(pair_ratios, 5), ref_us=describe(ref),
                              cand_us=describe(cand), gpu_before=before, gpu_after=after,
                              wall_s=round(time.monotonic() - t0, 2), ref=[round(x, 3) for x in ref],
                              cand=[round(x, 3) for x in cand])
                    summary[f"{kname}.{ev}"] = {"speedup": None if dev is None else round(speedup, 4),
                                                "ref_med_us": round(med_r, 2) if med_r == med_r else None,
                                                "ref_iqr_us": describe(ref).get("iqr")}
            except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
                rec.write("error", label=label, evaluation=ev, error=describe_error(exc)[-1500:])
                summary[f"error.{ev}"] = describe_error(exc)[-200:]
            finally:
                if rig is not None:
                    rig.close()
        if deviations:
            summary["deviation_median_pct"] = round(100 * quantile(deviations, 0.5), 3)
            summary["deviation_max_pct"] = round(100 * max(deviations), 3)
            summary["pass"] = quantile(deviations, 0.5) <= 0.01 and max(deviations) <= 0.05
            summary["pass_goal"] = quantile(deviations, 0.5) <= 0.005 and max(deviations) <= 0.03
        return summary

    return _modes(args, rec, dl, body)


def main() -> None:
    def extra(p: Any) -> None:
        p.add_argument("--which", choices=("E2", "E3", "E4"), required=True)
        p.add_argument("--calls", type=int, default=2000, help="E2: calls per size")
        p.add_argument("--calls-e3", type=int, default=200, help="E3: calls per variant and size")
        p.add_argument("--batch", type=int, default=50, help="calls per batch (at most 64)")
        p.add_argument("--pairs", type=int, default=200, help="E4: pairs per evaluation and kernel")
        p.add_argument("--evaluations", type=int, default=3)
        p.add_argument("--axpb-n", type=int, default=8 << 20, help="E4: elements of the ~20 us op")
        p.add_argument("--gemm-small", type=int, default=768)
        p.add_argument("--gemm-large", type=int, default=1024)
        p.add_argument("--flush-mb", type=int, default=128, help="E4: what B1 rewrites (MiB)")

    args = experiment_args(__doc__.splitlines()[0], extra)
    args.batch = max(2, min(args.batch, 64))
    rec, dl = Recorder(args.out, args.which), Deadline(args.timeout)
    run = {"E2": run_e2, "E3": run_e3, "E4": run_e4}[args.which]
    summary = run(args, rec, dl)
    rec.write("summary", **summary)


if __name__ == "__main__":
    guarded(main, "E2")
