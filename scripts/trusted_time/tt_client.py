"""A client of the trusted-time experiments: one process, one CUDA context, commands over a socket.

    python tt_client.py FD NAME [--dry]

FD is an AF_UNIX SOCK_SEQPACKET socket; each message is a JSON object {"op": ..., ...}, each reply
{"ok": true, ...} or {"ok": false, "error": ...}; descriptors (VMM allocations) travel as SCM_RIGHTS.
The commands are the experiments' GPU steps: the rig's helper and runner sides (E2-E4), E1's probes, E5's
launcher, E6's target, E7's candidate and flusher. Nothing here decides anything: the experiment's main
process reads the numbers.
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

from tt_cuda import (
    CU_ACCESS_PROPERTY_PERSISTING,
    CU_ACCESS_PROPERTY_STREAMING,
    CU_EVENT_DISABLE_TIMING,
    CU_FUNC_ATTRIBUTE_NUM_REGS,
    CudaError,
    make_cuda,
)

MAX_MESSAGE = 1 << 20

# The rig's shared page (one VMM allocation per runner, made by the helper): words and regions.
GATE_OFF, DONE_OFF, B1FLAG_OFF, SEM_OFF, MARK_OFF = 0, 64, 128, 192, 256
STAMPS_OFF = 4096
SLOT_BYTES = 128  # 16 u64, kernels.cu
MAX_SLOTS = 4096
OUT_OFF = STAMPS_OFF + MAX_SLOTS * SLOT_BYTES  # 512 KiB + 4 KiB
OUT_WORDS_MAX = 262144
PAGE_BYTES = OUT_OFF + OUT_WORDS_MAX * 4


class Client:
    def __init__(self, sock: socket.socket, name: str, dry: bool):
        self.sock, self.name, self.dry = sock, name, dry
        self.cu = make_cuda(dry)
        self.modules: dict[str, int] = {}
        self.funcs: dict[tuple[str, str], int] = {}
        self.bufs: dict[str, tuple[int, int]] = {}  # name -> (ptr, bytes)
        self.streams: dict[str, int] = {}
        self.rig: dict[str, Any] = {}
        self.info: dict[str, Any] = {}

    # ------------------------------------------------------------------ plumbing

    def serve(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 8)
            except OSError:
                return
            if not data:
                return
            msg = json.loads(data)
            op = msg.pop("op")
            rid = msg.pop("id", None)
            if op == "exit":
                return
            try:
                handler = getattr(self, f"op_{op}")
                if fds:
                    msg["fds"] = fds
                result = handler(**msg)
                out_fds: list[int] = []
                if isinstance(result, tuple):
                    result, out_fds = result
                self._send({"ok": True, "id": rid, **(result or {})}, out_fds)
                for fd in out_fds:
                    os.close(fd)
            except Exception as exc:  # noqa: BLE001 - every failure goes back to the experiment
                code = getattr(exc, "code", None)
                self._send({"ok": False, "id": rid, "error": f"{type(exc).__name__}: {exc}", "code": code,
                            "trace": traceback.format_exc()[-1500:]}, [])

    def _send(self, reply: dict[str, Any], fds: list[int]) -> None:
        data = json.dumps(reply, default=str).encode()
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.send(data)

    def func(self, module: str, name: str) -> int:
        key = (module, name)
        if key not in self.funcs:
            self.funcs[key] = self.cu.function(self.modules[module], name)
        return self.funcs[key]

    def k(self, name: str) -> int:
        return self.func("kernels", name)

    def stream(self, name: str) -> int:
        if name not in self.streams:
            self.streams[name] = self.cu.stream()
        return self.streams[name]

    def buf(self, name: str) -> int:
        return self.bufs[name][0]

    def _ptr(self, ref: Any) -> int:
        """[buffer name, byte offset] -> device address."""
        name, off = ref
        return self.bufs[name][0] + int(off)

    def _exclusive_config(self, func: int) -> dict[str, int]:
        smem = self.info["smem_optin"]
        self.cu.set_max_dynamic_smem(func, smem)
        return {"grid": self.info["sm_count"], "block": 1024, "smem": smem,
                "blocks_per_sm": self.cu.occupancy(func, 1024, smem)}

    # ------------------------------------------------------------------ basics

    def op_init(self, cubins: dict[str, str]) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.cu.init()
        init_ms = (time.perf_counter() - t0) * 1e3
        for name, path in cubins.items():
            with open(path, "rb") as f:
                self.modules[name] = self.cu.load_module(f.read())
        cu = self.cu
        self.info = {
            "pid": os.getpid(), "uid": os.getuid(), "init_ms": round(init_ms, 1), "device": cu.device_name(),
            "driver": cu.driver_version(), "mps_enabled": cu.attr("mps_enabled"), "sm_count": cu.attr("sm_count"),
            "l2_bytes": cu.attr("l2_bytes"), "smem_optin": cu.attr("smem_optin"),
            "smem_per_sm": cu.attr("smem_per_sm"), "reserved_smem_per_block": cu.attr("reserved_smem_per_block"),
            "max_persisting_l2": cu.attr("max_persisting_l2"),
            "max_access_policy_window": cu.attr("max_access_policy_window"),
            "cooperative_launch": cu.attr("cooperative_launch"), "vmm": cu.attr("vmm"),
            "posix_fd_handles": cu.attr("posix_fd_handles"), "cc": [cu.attr("cc_major"), cu.attr("cc_minor")],
            "clock_khz": cu.attr("clock_khz"), "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
            "dry": self.dry,
        }
        return self.info

    def op_time(self) -> dict[str, Any]:
        return {"mono": time.monotonic()}

    def op_alloc(self, name: str, nbytes: int, fill32: int | None = None) -> dict[str, Any]:
        ptr = self.cu.alloc(nbytes)
        self.bufs[name] = (ptr, int(nbytes))
        if fill32 is not None:
            self.cu.memset32(ptr, fill32, int(nbytes) // 4)
        return {"bytes": int(nbytes)}

    def op_export(self, name: str, nbytes: int) -> tuple[dict[str, Any], list[int]]:
        ptr, size, fd = self.cu.vmm_export(nbytes)
        self.bufs[name] = (ptr, size)
        self.cu.memset32(ptr, 0, size // 4)
        return {"size": size}, [fd]

    def op_import(self, name: str, size: int, fds: list[int]) -> dict[str, Any]:
        for extra in fds[1:]:
            os.close(extra)
        ptr = self.cu.vmm_import(fds[0], size)
        self.bufs[name] = (ptr, int(size))
        return {"size": int(size)}

    def op_read_words(self, ref: Any, count: int, width: int = 4) -> dict[str, Any]:
        raw = self.cu.dtoh(self._ptr(ref), int(count) * width)
        fmt = {4: "I", 8: "Q"}[width]
        return {"values": list(struct.unpack(f"<{count}{fmt}", raw))}

    def op_write_words(self, ref: Any, values: list[int], width: int = 4) -> dict[str, Any]:
        fmt = {4: "I", 8: "Q"}[width]
        self.cu.htod(self._ptr(ref), struct.pack(f"<{len(values)}{fmt}", *values))
        return {}

    def op_fill(self, name: str, seed: int, stream: str = "main") -> dict[str, Any]:
        ptr, nbytes = self.bufs[name]
        self.cu.launch(self.k("fill_pattern"), self.info["sm_count"] * 4, 256,
                       [("p", ptr), ("u64", nbytes // 4), ("u32", seed)], self.stream(stream))
        self.cu.stream_sync(self.stream(stream), 30.0)
        return {}

    def op_check(self, name: str, seed: int, stream: str = "main") -> dict[str, Any]:
        ptr, nbytes = self.bufs[name]
        bad = self.cu.alloc(8)
        self.cu.memset32(bad, 0, 2)
        self.cu.launch(self.k("check_pattern"), self.info["sm_count"] * 4, 256,
                       [("p", ptr), ("u64", nbytes // 4), ("u32", seed), ("p", bad)], self.stream(stream))
        self.cu.stream_sync(self.stream(stream), 30.0)
        value = struct.unpack("<Q", self.cu.dtoh(bad, 8))[0]
        self.cu.free(bad)
        return {"bad": value, "words": nbytes // 4}

    def op_sync(self, stream: str = "main", limit_s: float = 30.0) -> dict[str, Any]:
        t0 = time.monotonic()
        self.cu.stream_sync(self.stream(stream), limit_s)
        return {"waited_s": round(time.monotonic() - t0, 6), "mono": time.monotonic()}

    def op_ctx_sync(self) -> dict[str, Any]:
        self.cu.ctx_sync()
        return {"mono": time.monotonic()}

    def op_wait_value(self, ref: Any, value: int, stream: str = "main") -> dict[str, Any]:
        self.cu.wait_value(self.stream(stream), self._ptr(ref), value)
        return {}

    def op_write_value(self, ref: Any, value: int, stream: str = "ctl") -> dict[str, Any]:
        self.cu.write_value(self.stream(stream), self._ptr(ref), value)
        return {"mono": time.monotonic()}

    def op_mark(self, ref: Any, value: int, stream: str = "main") -> dict[str, Any]:
        """A kernel that writes one word (work behind whatever the stream waits on)."""
        self.cu.launch(self.k("write_word"), 1, 32, [("p", self._ptr(ref)), ("u32", value)], self.stream(stream))
        return {}

    # ------------------------------------------------------------------ E1 probes

    def op_spin(self, res: Any, ns: int, blocks: int = 1, threads: int = 32, started: Any = None,
                stream: str = "main") -> dict[str, Any]:
        """spin_blocks: `blocks` blocks spin `ns` each, recording progress (res: 8 u64 per block)."""
        started_ptr = self._ptr(started) if started else 0
        self.cu.launch(self.k("spin_blocks"), blocks, threads, [("p", self._ptr(res)), ("u64", ns), ("p", started_ptr)],
                       self.stream(stream))
        return {"mono": time.monotonic()}

    def op_exclusive(self, res: Any, hold_ns: int, started: Any = None, stream: str = "main",
                     cooperative: bool = True) -> dict[str, Any]:
        """excl_probe: one block of 1024 threads per SM with all the opt-in shared memory (res: 4 u64)."""
        func = self.k("excl_probe")
        cfg = self._exclusive_config(func)
        self.cu.htod(self._ptr(res), struct.pack("<4Q", (1 << 64) - 1, 0, 0, 0))
        started_ptr = self._ptr(started) if started else 0
        args = [("p", self._ptr(res)), ("u64", hold_ns), ("p", started_ptr)]
        refused = None
        try:
            self.cu.launch(func, cfg["grid"], cfg["block"], args, self.stream(stream), smem=cfg["smem"],
                           cooperative=cooperative)
        except CudaError as exc:  # a cooperative launch refused (MPS limits): the same grid, plainly
            if not cooperative:
                raise
            refused = str(exc)
            self.cu.launch(func, cfg["grid"], cfg["block"], args, self.stream(stream), smem=cfg["smem"])
        return {"config": cfg, "regs": self.cu.func_attr(func, CU_FUNC_ATTRIBUTE_NUM_REGS), "mono": time.monotonic(),
                "cooperative_refused": refused}

    def op_tick_loop(self, seconds: float) -> dict[str, Any]:
        """Tiny kernels, each waited for, until `seconds` pass or one fails: when did the first fail?"""
        t0 = time.monotonic()
        n, first_error = 0, None
        s = self.stream("main")
        while time.monotonic() - t0 < seconds:
            try:
                self.cu.launch(self.k("noop"), 1, 32, [], s)
                self.cu.stream_sync(s)
                n += 1
            except CudaError as exc:
                first_error = {"mono": time.monotonic(), "call": exc.name, "code": exc.code, "text": exc.text}
                break
            time.sleep(0.001)
        return {"start": t0, "ticks": n, "error": first_error, "end": time.monotonic()}

    def op_fault(self) -> dict[str, Any]:
        s = self.stream("main")
        t0 = time.monotonic()
        try:
            self.cu.launch(self.k("fault_kernel"), 1, 32, [("u64", 8)], s)
            self.cu.stream_sync(s, 20.0)
            return {"faulted": False, "mono": t0}
        except (CudaError, TimeoutError) as exc:
            return {"faulted": True, "mono": t0, "error_mono": time.monotonic(), "code": getattr(exc, "code", None),
                    "error": str(exc)}

    def op_list_dir(self, path: str, limit: int = 200) -> dict[str, Any]:
        """What this process sees in `path`, and whether it can open each file (nothing is written)."""
        entries = []
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            return {"error": str(exc), "entries": []}
        for name in names[:limit]:
            full = os.path.join(path, name)
            entry: dict[str, Any] = {"name": name}
            try:
                st = os.lstat(full)
                entry.update(mode=oct(st.st_mode), uid=st.st_uid, size=st.st_size)
            except OSError as exc:
                entry["stat_error"] = str(exc)
            for flag, key in ((os.O_RDONLY, "open_r"), (os.O_RDWR, "open_rw")):
                try:
                    fd = os.open(full, flag | os.O_NONBLOCK)
                    if key == "open_r":
                        try:
                            head = os.read(fd, 4096)
                            entry["nonzero_bytes_of_first_4k"] = sum(1 for b in head if b)
                        except OSError:
                            pass
                    os.close(fd)
                    entry[key] = True
                except OSError as exc:
                    entry[key] = f"no: {exc.strerror}"
            entries.append(entry)
        return {"entries": entries, "count": len(names)}

    def op_run(self, argv: list[str], input: str = "", limit_s: float = 10.0) -> dict[str, Any]:
        """A program run from inside this client's sandbox (the MPS control tool)."""
        try:
            p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=limit_s)
            return {"rc": p.returncode, "out": p.stdout[-2000:], "err": p.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            return {"rc": None, "timeout": True}
        except OSError as exc:
            return {"rc": None, "error": str(exc)}

    # ------------------------------------------------------------------ the rig: helper side (E2-E4)

    def op_rig_h_setup(self, runners: int, flush_bytes: int, max_calls: int = 64) -> tuple[dict[str, Any], list[int]]:
        cu = self.cu
        pages, fds = [], []
        for r in range(runners):
            ptr, size, fd = cu.vmm_export(PAGE_BYTES)
            cu.memset32(ptr, 0, size // 4)
            self.bufs[f"page{r}"] = (ptr, size)
            pages.append((ptr, size))
            fds.append(fd)
        flush = cu.alloc(max(flush_bytes, 16)) if flush_bytes else 0
        start = cu.alloc(64)
        cu.memset32(start, 0, 16)
        b1, b2 = self.k("excl_b1"), self.k("excl_b2")
        cfg1, cfg2 = self._exclusive_config(b1), self._exclusive_config(b2)
        events = [cu.event() for _ in range(3 * max_calls)]
        self.rig = {"pages": pages, "flush": flush, "flush_bytes": flush_bytes, "start": start, "batch": 0,
                    "events": events, "max_calls": max_calls, "b1": b1, "b2": b2, "cfg": cfg1, "coop": True}
        main = self.stream("main")
        self.stream("ctl")
        # one cooperative launch of B1 on a scratch slot: where the driver refuses it (MPS limits), the
        # batches launch B1/B2 plainly (one block per SM still fits; `cooperative` says which ran)
        scratch = cu.alloc(SLOT_BYTES)
        coop_error = None
        try:
            cu.launch(self.k("rig_init"), 1, 32, [("p", scratch), ("u32", 1)], main)
            cu.launch(b1, cfg1["grid"], 1024, [("p", scratch), ("p", 0), ("u32", 0), ("p", 0), ("u64", 0), ("p", 0),
                                               ("u32", 0)], main, smem=cfg1["smem"], cooperative=True)
            cu.stream_sync(main, 10.0)
        except (CudaError, TimeoutError) as exc:
            coop_error = str(exc)
            self.rig["coop"] = False
        return ({"sizes": [p[1] for p in pages], "excl_b1": cfg1, "excl_b2": cfg2, "cooperative": self.rig["coop"],
                 "cooperative_error": coop_error,
                 "regs": [cu.func_attr(b1, CU_FUNC_ATTRIBUTE_NUM_REGS), cu.func_attr(b2, CU_FUNC_ATTRIBUTE_NUM_REGS)]},
                fds)

    def op_rig_h_batch(self, calls: list[list[int]], excl: bool = True, flush_vec: int = 0,
                       out_words: list[int] | None = None, limit_s: float = 20.0,
                       stall_s: float = 1.0) -> dict[str, Any]:
        """Per call (runner r, number seq): E_pre; B1; E_start; gate = seq; wait done >= seq; B2; E_end.
        All enqueued behind a start word, released once enqueued (or after `stall_s` if a full queue
        blocks the enqueue: then `stalled` says the batch's first calls may hold host time)."""
        cu, rig = self.cu, self.rig
        if len(calls) > rig["max_calls"]:
            raise ValueError("batch larger than the event pool")
        main, ctl = self.stream("main"), self.stream("ctl")
        rig["batch"] += 1
        b = rig["batch"]
        out_words = out_words or [0] * len(rig["pages"])
        cu.wait_value(main, rig["start"], b)
        by_runner: dict[int, list[int]] = {}
        for r, seq in calls:
            by_runner.setdefault(r, []).append(seq % MAX_SLOTS)
        init = self.k("rig_init")
        runs = {r: slot_runs(slots) for r, slots in by_runner.items()}
        for r, spans in runs.items():
            for lo, n in spans:
                cu.launch(init, -(-n * 16 // 256), 256,
                          [("p", rig["pages"][r][0] + STAMPS_OFF + lo * SLOT_BYTES), ("u32", n)], main)
        stalled = threading.Event()

        def release() -> None:
            stalled.set()
            try:
                cu.make_current()
                cu.write_value(ctl, rig["start"], b)
            except CudaError:
                pass

        timer = threading.Timer(stall_s, release)
        timer.start()
        t0 = time.perf_counter()
        ev = rig["events"]
        cfg = rig["cfg"]
        # Not exclusive: the same grid with only the shared memory B1 and B2 use themselves (a word per thread:
        # with none at all, their `smem[threadIdx.x]` was an illegal address, the variant's failure in E2).
        grid, block, smem = (cfg["grid"], 1024, cfg["smem"]) if excl else (cfg["grid"], 1024, 4 * 1024)
        try:
            for j, (r, seq) in enumerate(calls):
                page = rig["pages"][r][0]
                slot = page + STAMPS_OFF + (seq % MAX_SLOTS) * SLOT_BYTES
                cu.record(ev[3 * j], main)
                cu.launch(rig["b1"], grid, block, [("p", slot), ("p", page + B1FLAG_OFF), ("u32", seq),
                                                   ("p", rig["flush"]), ("u64", flush_vec if rig["flush"] else 0),
                                                   ("p", page + OUT_OFF), ("u32", out_words[r])],
                          main, smem=smem, cooperative=excl and rig["coop"])
                cu.record(ev[3 * j + 1], main)
                cu.write_value(main, page + GATE_OFF, seq)
                cu.wait_value(main, page + DONE_OFF, seq)
                cu.launch(rig["b2"], grid, block, [("p", slot), ("p", page + OUT_OFF), ("u32", out_words[r]),
                                                   ("u32", seq), ("p", 0)], main, smem=smem,
                          cooperative=excl and rig["coop"])
                cu.record(ev[3 * j + 2], main)
        finally:
            timer.cancel()
        enqueue_ms = (time.perf_counter() - t0) * 1e3
        if not stalled.is_set():
            cu.write_value(ctl, rig["start"], b)
        cu.stream_sync(main, limit_s)
        rows = []
        stamps: dict[tuple[int, int], list[int]] = {}
        for r, spans in runs.items():
            for lo, n in spans:
                raw = cu.dtoh(rig["pages"][r][0] + STAMPS_OFF + lo * SLOT_BYTES, n * SLOT_BYTES)
                for i in range(n):
                    stamps[(r, lo + i)] = list(struct.unpack_from("<16Q", raw, i * SLOT_BYTES))
        for j, (r, seq) in enumerate(calls):
            words = stamps[(r, seq % MAX_SLOTS)]
            rows.append({"r": r, "seq": seq, "b1_ms": cu.elapsed_ms(ev[3 * j], ev[3 * j + 1]),
                         "br_ms": cu.elapsed_ms(ev[3 * j + 1], ev[3 * j + 2]), "s": words})
        return {"rows": rows, "enqueue_ms": round(enqueue_ms, 3), "stalled": stalled.is_set()}

    def op_gt_tick(self, reads: int = 200000) -> dict[str, Any]:
        res = self.cu.alloc(64)
        s = self.stream("main")
        self.cu.launch(self.k("gt_tick"), 1, 32, [("p", res), ("u32", reads)], s)
        self.cu.stream_sync(s, 30.0)
        mind, maxd, changes, span = struct.unpack("<4Q", self.cu.dtoh(res, 32))
        self.cu.free(res)
        return {"min_step_ns": mind, "max_step_ns": maxd, "changes": changes, "span_ns": span, "reads": reads}

    # ------------------------------------------------------------------ the rig: runner side

    def op_rig_r_setup(self, size: int, fds: list[int], axpb_n: int = 0, gemm_n: int = 0,
                       pool: int = 64) -> dict[str, Any]:
        cu = self.cu
        for extra in fds[1:]:
            os.close(extra)
        self.bufs["page"] = (cu.vmm_import(fds[0], size), int(size))
        self.bufs["scratch"] = (cu.alloc(OUT_WORDS_MAX * 4), OUT_WORDS_MAX * 4)
        self.bufs["spinres"] = (cu.alloc(64 * self.info["sm_count"]), 64 * self.info["sm_count"])
        if axpb_n:
            for name in ("x", "y"):
                self.bufs[name] = (cu.alloc(axpb_n * 4), axpb_n * 4)
            self.op_fill("x", 7)
        if gemm_n:
            for name in ("A", "B", "C"):
                self.bufs[name] = (cu.alloc(gemm_n * gemm_n * 4), gemm_n * gemm_n * 4)
            cu.memset32(self.buf("A"), 0x3F000000, gemm_n * gemm_n)  # 0.5f
            cu.memset32(self.buf("B"), 0x3F800000, gemm_n * gemm_n)  # 1.0f
        self.rig = {"axpb_n": axpb_n, "gemm_n": gemm_n, "evk": [cu.event(CU_EVENT_DISABLE_TIMING) for _ in range(pool)]}
        self.stream("main"), self.stream("side")
        return {}

    def _call_kernel(self, stream: int, kind: str, seq: int, slot: int, out: int, k_ns: int, k_grid: int,
                     k_block: int, gemm_n: int = 0) -> None:
        cu = self.cu
        if kind == "spin":
            cu.launch(self.k("k_spin"), k_grid, k_block, [("p", slot), ("u64", k_ns), ("p", out), ("u32", seq)], stream)
        elif kind == "axpb":
            n4 = self.rig["axpb_n"] // 4
            cu.launch(self.k("axpb"), self.info["sm_count"] * 8, 256,
                      [("p", self.buf("y")), ("p", self.buf("x")), ("u64", n4), ("f32", 1.5), ("f32", 0.25)], stream)
        elif kind == "gemm":
            n = min(gemm_n or self.rig["gemm_n"], self.rig["gemm_n"])
            cu.launch(self.func("e5", "sgemm_tiled"), (-(-n // 32), -(-n // 32), 1), (32, 32, 1),
                      [("p", self.buf("A")), ("p", self.buf("B")), ("p", self.buf("C")), ("i32", n), ("i32", n),
                       ("i32", n)], stream)
        else:
            raise ValueError(f"unknown kernel kind {kind}")

    def op_rig_r_enqueue(self, seq0: int, n: int, variant: str = "honest", kind: str = "spin", k_ns: int = 0,
                         k_grid: int = 1, k_block: int = 32, spin_ns: int = 0, hog_ns: int = 0,
                         gemm_n: int = 0) -> dict[str, Any]:
        """Enqueue calls seq0 .. seq0+n-1 behind their gates. Variants (E3): a side-stream call that waits
        only for B1 to begin, b done before the call, c output copied after done, d a spinner ahead of the
        batch, e an SM hog after done."""
        cu = self.cu
        page = self.buf("page")
        main, side = self.stream("main"), self.stream("side")
        gate, done, b1flag, out = page + GATE_OFF, page + DONE_OFF, page + B1FLAG_OFF, page + OUT_OFF
        t0 = time.perf_counter()
        if variant == "d":
            cu.launch(self.k("spin_blocks"), 1, 32, [("p", self.buf("spinres")), ("u64", spin_ns), ("p", 0)], side)
        for seq in range(seq0, seq0 + n):
            slot = page + STAMPS_OFF + (seq % MAX_SLOTS) * SLOT_BYTES
            if variant == "a":
                evk = self.rig["evk"][seq % len(self.rig["evk"])]
                cu.wait_value(side, b1flag, seq)
                self._call_kernel(side, kind, seq, slot, out, k_ns, k_grid, k_block, gemm_n)
                cu.record(evk, side)
                cu.wait_value(main, gate, seq)
                cu.wait_event(main, evk)
                cu.write_value(main, done, seq)
            elif variant == "b":
                cu.wait_value(main, gate, seq)
                cu.write_value(main, done, seq)
                self._call_kernel(main, kind, seq, slot, out, k_ns, k_grid, k_block, gemm_n)
            elif variant == "c":
                cu.wait_value(main, gate, seq)
                self._call_kernel(main, kind, seq, slot, self.buf("scratch"), k_ns, k_grid, k_block, gemm_n)
                cu.write_value(main, done, seq)
                cu.copy_async(out, self.buf("scratch"), k_grid * k_block * 4, main)
            else:
                cu.wait_value(main, gate, seq)
                self._call_kernel(main, kind, seq, slot, out, k_ns, k_grid, k_block, gemm_n)
                cu.write_value(main, done, seq)
                if variant == "e":
                    cu.launch(self.k("k_spin"), self.info["sm_count"], 256, [("p", 0), ("u64", hog_ns), ("p", 0), ("u32", 0)],
                              main)
        return {"enqueue_ms": round((time.perf_counter() - t0) * 1e3, 3)}

    def op_rig_r_sync(self, limit_s: float = 20.0) -> dict[str, Any]:
        self.cu.stream_sync(self.stream("main"), limit_s)
        self.cu.stream_sync(self.stream("side"), limit_s)
        return {}

    # ------------------------------------------------------------------ E6: the locked process

    def op_launch_sync(self) -> dict[str, Any]:
        """A tiny kernel, waited for: the time it returned (blocks while this process is locked)."""
        t0 = time.monotonic()
        s = self.stream("main")
        self.cu.launch(self.k("noop"), 1, 32, [], s)
        self.cu.stream_sync(s)
        return {"start": t0, "mono": time.monotonic()}

    def op_query(self, stream: str = "main") -> dict[str, Any]:
        return {"done": self.cu.stream_done(self.stream(stream))}

    # ------------------------------------------------------------------ E7: persisting L2

    def op_e7_setup(self, w_bytes: int, persist_bytes: int, hit_ratio: float = 1.0) -> dict[str, Any]:
        cu = self.cu
        w = cu.alloc(w_bytes)
        cu.memset32(w, 0x3F800000, w_bytes // 4)
        out = cu.alloc(64)
        self.bufs["w"], self.bufs["sum"] = (w, w_bytes), (out, 64)
        plain, persist = self.stream("plain"), self.stream("persist")
        result: dict[str, Any] = {"limit_before": cu.get_limit_persisting()}
        result["set_limit_rc"] = cu.set_limit_persisting(persist_bytes)
        result["limit_after"] = cu.get_limit_persisting()
        result["window_rc"] = cu.access_window(persist, w, w_bytes, hit_ratio, CU_ACCESS_PROPERTY_PERSISTING,
                                               CU_ACCESS_PROPERTY_STREAMING)
        self.rig = {"e0": cu.event(), "e1": cu.event(), "plain": plain, "persist": persist}
        return result

    def op_e7_call(self, persist: bool, reps: int = 1) -> dict[str, Any]:
        cu, rig = self.cu, self.rig
        s = rig["persist"] if persist else rig["plain"]
        w, nbytes = self.bufs["w"]
        times = []
        for _ in range(reps):
            cu.record(rig["e0"], s)
            cu.launch(self.k("read_sum"), self.info["sm_count"] * 4, 256, [("p", w), ("u64", nbytes // 16),
                                                                         ("p", self.buf("sum"))], s)
            cu.record(rig["e1"], s)
            cu.stream_sync(s, 10.0)
            times.append(cu.elapsed_ms(rig["e0"], rig["e1"]))
        return {"ms": times}

    def op_e7_cleanup(self) -> dict[str, Any]:
        return {"reset_rc": self.cu.reset_persisting(), "limit0_rc": self.cu.set_limit_persisting(0)}

    def op_flush(self, nbytes: int, reset: bool) -> dict[str, Any]:
        """The helper's flush: optionally reset the persisting lines, then rewrite `nbytes` of its own."""
        cu = self.cu
        if "flush" not in self.bufs or self.bufs["flush"][1] < nbytes:
            self.bufs["flush"] = (cu.alloc(nbytes), nbytes)
        s = self.stream("main")
        reset_rc = cu.reset_persisting() if reset else None
        e0, e1 = self.rig.setdefault("fe0", cu.event()), self.rig.setdefault("fe1", cu.event())
        cu.record(e0, s)
        cu.memset32(self.buf("flush"), random.getrandbits(32), nbytes // 4, s)
        cu.record(e1, s)
        cu.stream_sync(s, 10.0)
        return {"ms": cu.elapsed_ms(e0, e1), "reset_rc": reset_rc}

    # ------------------------------------------------------------------ E5: the trusted launcher

    def op_e5_load(self, path: str, function: str | None = None) -> dict[str, Any]:
        """Whether the driver loads a cubin at all (a planted one with unresolved device-runtime calls), and
        then gives out its kernel (lazy loading may defer the failure to that point)."""
        with open(path, "rb") as f:
            image = f.read()
        try:
            module = self.cu.load_module(image)
        except CudaError as exc:
            return {"loaded": False, "code": exc.code, "text": exc.text}
        out: dict[str, Any] = {"loaded": True}
        if function:
            try:
                self.cu.function(module, function)
                out["function"] = True
            except CudaError as exc:
                out.update(function=False, code=exc.code, text=exc.text)
        return out

    def op_e5_run(self, spec: dict[str, Any], reps: int, flush_bytes: int, back_to_back: int = 100,
                  warmup: int = 10) -> dict[str, Any]:
        """Run a launch spec (module docstring of exp_e5.py): per call flush + events, and back to back."""
        import numpy as np

        cu = self.cu
        with open(spec["cubin"], "rb") as f:
            module = cu.load_module(f.read())
        dims = {k: int(v) for k, v in spec.get("dims", {}).items()}
        host: dict[str, Any] = {}
        rng = np.random.default_rng(int(spec.get("seed", 0)))
        for name, b in spec["buffers"].items():
            count = int(evaluate(str(b["count"]), dims))
            arr = rng.standard_normal(count, dtype=np.float32) if b.get("init") == "random" else np.zeros(count, np.float32)
            ptr = cu.alloc(arr.nbytes)
            cu.htod(ptr, arr.tobytes())
            self.bufs[f"e5.{name}"] = (ptr, arr.nbytes)
            host[name] = arr
        steps = []
        for step in spec["steps"]:
            func = cu.function(module, step["kernel"])
            args = []
            for a in step["args"]:
                if "buf" in a:
                    args.append(("p", self.buf(f"e5.{a['buf']}")))
                else:
                    kind = a["type"]
                    value = evaluate(str(a["value"]), dims)
                    args.append((kind, float(value) if kind == "f32" else int(value)))
            grid = tuple(int(evaluate(str(g), dims)) for g in step["grid"])
            block = tuple(int(evaluate(str(v), dims)) for v in step["block"])
            steps.append((func, grid, block, int(step.get("smem", 0)), args))
        s = self.stream("e5")
        flush = cu.alloc(flush_bytes)

        def run_steps() -> None:
            for func, grid, block, smem, args in steps:
                cu.launch(func, grid, block, args, s, smem=smem)

        t_warm = time.monotonic()
        while True:  # at least `warmup` calls and 100 ms of them, so the clocks have ramped up
            for _ in range(warmup):
                run_steps()
            cu.stream_sync(s, 30.0)
            if time.monotonic() - t_warm > 0.1:
                break
        check = verify(spec.get("check"), host, lambda n: cu.dtoh(self.buf(f"e5.{n}"), self.bufs[f"e5.{n}"][1]), dims)
        starts = [cu.event() for _ in range(reps)]
        ends = [cu.event() for _ in range(reps)]
        for i in range(reps):
            cu.memset32(flush, 0, flush_bytes // 4, s)
            cu.record(starts[i], s)
            run_steps()
            cu.record(ends[i], s)
        cu.stream_sync(s, 60.0)
        per_call = [cu.elapsed_ms(a, b) for a, b in zip(starts, ends, strict=True)]
        e0, e1 = cu.event(), cu.event()
        cu.record(e0, s)
        for _ in range(back_to_back):
            run_steps()
        cu.record(e1, s)
        cu.stream_sync(s, 60.0)
        queued_ms = cu.elapsed_ms(e0, e1) / max(back_to_back, 1)
        for name in host:
            cu.free(self.bufs.pop(f"e5.{name}")[0])
        cu.free(flush)
        return {"ms": per_call, "queued_ms_per_call": queued_ms, "check": check}


# --------------------------------------------------------------------------- helpers


def slot_runs(slots: list[int]) -> list[tuple[int, int]]:
    """Stamp slots as contiguous (first, count) runs."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(slots)):
        if out and out[-1][0] + out[-1][1] == s:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out




def evaluate(expr: str, dims: dict[str, int]) -> float:
    """A grid or size expression of the task's dimensions: numbers, names, + - * / // % ( ), ceil/min/max."""
    import ast
    import math
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
    funcs = {"ceil": math.ceil, "min": min, "max": max}

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name) and node.id in dims:
            return dims[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs
                and not node.keywords):
            return funcs[node.func.id](*[ev(a) for a in node.args])
        raise ValueError(f"not allowed in a launch spec expression: {ast.dump(node)[:80]}")

    return ev(ast.parse(expr, mode="eval"))


def verify(check: dict[str, Any] | None, host: dict[str, Any], read: Any, dims: dict[str, int]) -> dict[str, Any]:
    """The launcher's own check of the outputs against numpy (sum of partials, or a matrix product)."""
    import numpy as np

    if not check:
        return {"kind": None}
    if check["kind"] == "sum":
        got = float(np.frombuffer(read(check["into"]), np.float32).astype(np.float64).sum())
        want = float(host[check["of"]].astype(np.float64).sum())
        err = abs(got - want) / max(1.0, abs(want))
        return {"kind": "sum", "got": got, "want": want, "rel_err": err, "ok": err < 1e-3}
    if check["kind"] == "gemm":
        m, n, k = (dims[check[d]] for d in ("M", "N", "K"))
        a = host[check["A"]].reshape(m, k).astype(np.float64)
        b = host[check["B"]].reshape(k, n).astype(np.float64)
        got = np.frombuffer(read(check["C"]), np.float32).reshape(m, n).astype(np.float64)
        want = a @ b
        err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        return {"kind": "gemm", "rel_err": err, "ok": err < 1e-4}
    return {"kind": check["kind"], "ok": None}


def main() -> None:
    fd, name = int(sys.argv[1]), sys.argv[2]
    dry = "--dry" in sys.argv[3:]
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
    except OSError:
        pass
    Client(sock, name, dry).serve()


if __name__ == "__main__":
    main()
