"""Write the sampled hosts of a simulated run: per host, lay out its cores' op intervals in picoseconds,
encode the XSpace, and sweep the same intervals for the ground truth. Hosts are independent, so many
are written in parallel by forked worker processes (same bytes as sequential)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tpuanalyze.generator.ground_truth import CATEGORIES, COLLECTIVE_KINDS, sweep
from tpuanalyze.generator.program import Program
from tpuanalyze.generator.scenarios import Scenario
from tpuanalyze.generator.timeline import Schedule
from tpuanalyze.generator.xspace_writer import (
    LINE_ASYNC,
    LINE_MODULES,
    LINE_OPS,
    LINE_STEPS,
    SID,
    RunMetadata,
    device_line_events,
    device_plane_header,
    host_cpu_plane,
    line_bytes,
    metadata_plane,
    write_space,
)

T0_NS = (
    1_000_000_000  # line timestamp: ns since the profiler session start (ps since the epoch overflow int64)
)
PS_PER_MS = 1_000_000_000
KIND_INDEX = {name: i for i, name in enumerate(CATEGORIES)}


@dataclass
class HostResult:
    host: int
    sweep: dict[str, np.ndarray]
    category_time_ps: np.ndarray
    infeed_ps: list[float]
    bytes_written: int


def _ps(ms: np.ndarray, lead_ms: float) -> np.ndarray:
    return np.round((ms + lead_ms) * PS_PER_MS).astype(np.int64)


@dataclass
class HostWriter:
    """Everything shared by the hosts of one run; `write(i, host)` writes the i-th sampled host."""

    run_dir: Path
    slice_name: str
    cores_per_host: int
    steps: int
    train: Program
    evalp: Program
    sched: Schedule
    meta: RunMetadata
    lead_ms: float
    step_starts: np.ndarray  # ps
    step_ends: np.ndarray
    periods: np.ndarray
    host_gap: float | None
    scen: Scenario
    info: dict
    categories: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.categories = sorted({o.category for o in self.train.ops})
        self._train_cat = np.array([self.categories.index(o.category) for o in self.train.ops])
        waits = [
            o.category in COLLECTIVE_KINDS and o.role in ("async_done", "sync_global") for o in self.train.ops
        ]
        self._wait_op = np.array(waits + [False] * len(self.evalp.ops))  # indexed by md - train_base
        self._coll = {
            p: np.array(
                [
                    COLLECTIVE_KINDS.index(o.category) if o.category in COLLECTIVE_KINDS else -1
                    for o in prog.ops
                ]
            )
            for p, prog in ((0, self.train), (1, self.evalp))
        }
        self._kinds = {
            0: np.array([KIND_INDEX[o.kind] for o in self.train.ops]),
            1: np.array([KIND_INDEX[o.kind] for o in self.evalp.ops]),
        }

    def write(self, i: int, host: int) -> HostResult:
        cph, meta = self.cores_per_host, self.meta
        cols = slice(i * cph, (i + 1) * cph)
        ops: dict[str, list] = {k: [] for k in ("md", "s", "e", "grp", "train", "kind")}
        asy: dict[str, list] = {k: [] for k in ("md", "s", "e", "grp", "train")}
        mod: dict[str, list] = {k: [] for k in ("md", "s", "e", "grp", "train")}
        for seg in self.sched.segments:
            is_train = seg.program == 0
            base = meta.train_base if is_train else meta.eval_base
            n = seg.starts.shape[0]
            s = _ps(seg.starts[:, cols], self.lead_ms)
            e = _ps(seg.starts[:, cols] + seg.durs[:, cols], self.lead_ms)
            for key, val in (
                ("md", base + np.arange(n)),
                ("s", s),
                ("e", e),
                ("grp", np.full(n, seg.step)),
                ("train", np.full(n, is_train)),
                ("kind", self._kinds[seg.program]),
            ):
                ops[key].append(val)
            if seg.async_ops:
                a_e = np.minimum(
                    _ps(seg.async_ends[:, cols], self.lead_ms), self.step_ends[-1]
                )  # capture stops
                n_a = len(seg.async_ops)
                for key, val in (
                    ("md", base + np.array(seg.async_ops)),
                    ("s", _ps(seg.async_starts[:, cols], self.lead_ms)),
                    ("e", a_e),
                    ("grp", np.full(n_a, seg.step)),
                    ("train", np.full(n_a, is_train)),
                ):
                    asy[key].append(val)
            for key, val in (
                ("md", np.array([meta.module_train if is_train else meta.module_eval])),
                ("s", s[:1]),
                ("e", e[-1:]),
                ("grp", np.array([seg.step])),
                ("train", np.array([is_train])),
            ):
                mod[key].append(val)
        o = {k: np.concatenate(v) for k, v in ops.items()}
        empty = {
            "md": np.empty(0, np.int64),
            "s": np.empty((0, cph), np.int64),
            "e": np.empty((0, cph), np.int64),
            "grp": np.empty(0, np.int64),
            "train": np.empty(0, bool),
        }
        a = {k: np.concatenate(v) for k, v in asy.items()} if asy["md"] else empty
        mo = {k: np.concatenate(v) for k, v in mod.items()}

        # ground truth from exactly these intervals, plus the eval program spans
        ev = ~mo["train"]
        gt_s = np.concatenate([o["s"], a["s"], mo["s"][ev]])
        gt_e = np.concatenate([o["e"], a["e"], mo["e"][ev]])
        gt_c = np.concatenate(
            [
                o["kind"],
                np.full(len(a["md"]), KIND_INDEX["collectives"]),
                np.full(int(ev.sum()), KIND_INDEX["eval"]),
            ]
        )
        coll = [self._coll[seg.program] for seg in self.sched.segments]
        coll_async = [self._coll[seg.program][seg.async_ops] for seg in self.sched.segments if seg.async_ops]
        gt_k = np.concatenate(coll + coll_async + [np.full(int(ev.sum()), -1)])
        swept = sweep(gt_s, gt_e, gt_c, np.stack([self.step_starts, self.step_ends], axis=1), gt_k)
        # op time per hlo_category in train steps (XLA Ops line), for the visibility checks
        train_rows = o["train"]
        cat_time = np.bincount(
            self._train_cat[o["md"][train_rows] - meta.train_base],
            weights=(o["e"] - o["s"])[train_rows].sum(axis=1),
            minlength=len(self.categories),
        )
        infeed_rows = train_rows & (o["md"] == meta.train_base)
        infeed_ps = (o["e"] - o["s"])[infeed_rows].sum(axis=0).tolist()

        # collective waits carry XProf's all_reduce_unique_id (same on every core: step and op), so
        # XProf can split all-reduce time into compute (min across cores) and sync
        wait_ops = self._wait_op[o["md"] - meta.train_base] & o["train"]
        ar_id = o["grp"] * 100_000 + (o["md"] - meta.train_base)
        ops_lines = device_line_events(
            o["md"],
            o["s"],
            o["e"] - o["s"],
            o["grp"],
            o["train"],
            [(SID["all_reduce_unique_id"], ar_id, wait_ops)],
        )
        async_lines = device_line_events(a["md"], a["s"], a["e"] - a["s"], a["grp"], a["train"])
        mod_lines = device_line_events(
            mo["md"],
            mo["s"],
            mo["e"] - mo["s"],
            mo["grp"],
            mo["train"],
            [(SID["run_id"], np.arange(len(mo["md"])) + 1, None)],
        )
        steps = np.arange(self.steps)
        step_lines = device_line_events(
            meta.step_base + steps,
            np.repeat(self.step_starts[:, None], cph, axis=1),
            np.repeat((self.step_ends - self.step_starts)[:, None], cph, axis=1),
            steps,
            None,
            [(SID["step_num"], steps, None)],
        )
        hostname = f"{self.slice_name}-w-{host}"
        planes = []
        for c in range(cph):
            body = (
                line_bytes(LINE_STEPS, "Steps", T0_NS, step_lines[c])
                + line_bytes(LINE_MODULES, "XLA Modules", T0_NS, mod_lines[c])
                + line_bytes(LINE_OPS, "XLA Ops", T0_NS, ops_lines[c])
                + line_bytes(LINE_ASYNC, "Async XLA Ops", T0_NS, async_lines[c])
            )
            planes.append(device_plane_header(c, hostname, host * cph + c) + meta.bytes_ + body)
        lead = self.lead_ms
        starts = [t + lead for t in self.sched.step_starts]
        waits = self.sched.host_wait_ms[host] if self.sched.host_wait_ms is not None else np.zeros(self.steps)
        cpu = host_cpu_plane(
            starts,
            [t + float(w) for t, w in zip(starts, waits, strict=True)],
            float(self.periods[host]),
            self.scen.host_processing_share,
            cph,
            self.host_gap,
            T0_NS,
            [(k, s + lead, e + lead) for k, s, e in self.sched.eval_spans],
            self.scen.eval_distributed,
        )
        planes.append(cpu.SerializeToString())
        # as JAX writes it (a real capture keeps HLO protos here); the run's configuration is NOT written:
        # the analyzer must find chips, batch and workload from what real traces carry
        planes.append(metadata_plane({}).SerializeToString())
        size = write_space(self.run_dir / f"{hostname}.xplane.pb", hostname, planes)
        return HostResult(host, swept, cat_time, infeed_ps, size)


_WRITER: HostWriter | None = None  # the forked workers' copy


def _write_in_worker(job: tuple[int, int]) -> HostResult:
    assert _WRITER is not None
    return _WRITER.write(*job)


def _worker_started() -> None:
    """A forked writer leaves Ctrl-C and SIGTERM to the main process: the pool stops its workers with
    SIGTERM, and the CLI's handler they inherit would print a traceback from each."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_hosts(writer: HostWriter, hosts: list[int], workers: int | None = None) -> Iterator[HostResult]:
    """Write every sampled host, in order; in forked worker processes when there are many."""
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if len(hosts) >= 16 else 1
    jobs = list(enumerate(hosts))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for job in jobs:
            yield writer.write(*job)
        return
    global _WRITER
    _WRITER = writer
    try:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_worker_started) as pool:
            yield from pool.imap(_write_in_worker, jobs, chunksize=4)
    finally:
        _WRITER = None
