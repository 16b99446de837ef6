"""Per-core op schedule: every core of the slice runs the same program; collectives finish when the last
participant arrives, so one slow host delays everyone (the waits land in the collective `-done` ops).

All cores are simulated together as numpy vectors (one entry per core), op by op; only the written
cores' start/duration rows are kept. Times are in ms from the start of the profile window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tpuanalyze.generator.cost_model import OP_OVERHEAD_US
from tpuanalyze.generator.program import AG_BUCKET_BASE, Program

HOST_JITTER = 0.002  # relative step-to-step compute jitter per host [est]
CORE_JITTER = 0.001  # per core
OP_JITTER = 0.01  # per op execution (same on all cores)
DEVICE_LOOP_GAP_MS = 0.01  # between steps inside an on-device loop (catalog §3.7)


@dataclass
class Segment:
    """One program execution's ops on the written cores: rows = ops, columns = written cores."""

    program: int  # 0 train, 1 eval
    step: int
    starts: np.ndarray  # (n_ops, W)
    durs: np.ndarray
    async_starts: np.ndarray  # (n_async, W)
    async_ends: np.ndarray
    async_ops: list[int]  # op index of each async span's start op


@dataclass
class Schedule:
    written_cores: np.ndarray  # global core indices, sorted
    segments: list[Segment] = field(default_factory=list)
    step_starts: list[float] = field(default_factory=list)  # train step k starts (global)
    step_ends: list[float] = field(default_factory=list)  # Steps event end (next start or eval start)
    eval_spans: list[tuple[int, float, float]] = field(default_factory=list)  # (after step, start, end)
    nominal_step_ms: float = 0.0
    host_wait_ms: np.ndarray | None = None  # (hosts, steps) infeed wait the host pipeline causes


def _walk(
    prog: Program,
    start: float,
    f: np.ndarray,
    wait: np.ndarray,
    eps: np.ndarray,
    keep: np.ndarray,
    partition: int,
    carry: dict[int, float] | None = None,
):
    """Run one program on all cores from a common start; returns kept rows, every core's end time and
    the completion time of each collective bucket (async ones may be waited for by the next step)."""
    n = len(prog.ops)
    cores = f.shape[0]
    t = np.full(cores, start)
    starts = np.empty((n, keep.size))
    durs = np.empty((n, keep.size))
    carry = carry or {}
    comm_free = max([start, *carry.values()])
    comm_end: dict[int, float] = dict(carry)
    async_ops: list[int] = []
    async_starts: list[np.ndarray] = []
    async_ends: list[np.ndarray] = []
    ovh = OP_OVERHEAD_US * 1e-3
    for j, op in enumerate(prog.ops):
        role = op.role
        if role == "compute":
            d = op.base_ms * (1 + eps[j]) * f + ovh
        elif role == "infeed":
            d = op.base_ms * (1 + eps[j]) + wait
        elif role == "fixed":
            d = np.full(cores, op.base_ms * (1 + eps[j]) + ovh)
        elif role == "async_start":
            d = np.full(cores, op.base_ms + ovh)
            begin = max(float((t + d).max()), comm_free)
            comm_free = begin + op.comm_ms
            comm_end[op.bucket] = comm_free
            async_ops.append(j)
            async_starts.append(t[keep].copy())
            # the Async XLA Ops span covers the transfer in flight: issue -> completion
            async_ends.append(np.maximum(t[keep], comm_free))
        elif role == "async_done":  # a bucket issued before the profile window is already complete
            d = np.maximum(t + ovh, comm_end.get(op.bucket, -np.inf)) - t
        elif role == "sync_global":
            begin = max(float(t.max()), comm_free)
            comm_free = begin + op.comm_ms * (1 + 0.2 * eps[j])
            d = np.maximum(comm_free - t, ovh)
        elif role == "sync_group":
            grp = np.repeat(t.reshape(-1, partition).max(axis=1), partition)
            d = grp + op.comm_ms * (1 + eps[j]) - t
        else:  # pragma: no cover - programs only use the roles above
            raise ValueError(role)
        starts[j] = t[keep]
        durs[j] = d[keep] if np.ndim(d) else d
        t = t + d
    a_s = np.array(async_starts) if async_starts else np.empty((0, keep.size))
    a_e = np.array(async_ends) if async_ends else np.empty((0, keep.size))
    return starts, durs, a_s, async_ops, a_e, t, comm_end


def nominal_step_ms(prog: Program, cores: int, partition: int) -> float:
    """Device step length with no input wait and no jitter: what a host pipeline has to keep up with."""
    ones = np.ones(cores)
    *_, t_end, comm = _walk(
        prog, 0.0, ones, np.zeros(cores), np.zeros(len(prog.ops)), np.arange(1), partition
    )
    # steady state: the next step's all-gather waits are part of the step too
    *_, t_end2, _ = _walk(
        prog,
        float(t_end.max()),
        ones,
        np.zeros(cores),
        np.zeros(len(prog.ops)),
        np.arange(1),
        partition,
        comm,
    )
    return float(t_end2.max()) - float(t_end.max())


def simulate(
    train: Program,
    evalp: Program,
    *,
    cores: int,
    cores_per_host: int,
    steps: int,
    keep: np.ndarray,
    partition: int,
    host_period_ms: np.ndarray,
    host_gap_ms: float | None,
    eval_every: int,
    straggler_host: int | None,
    rng: np.random.Generator,
) -> Schedule:
    """Schedule `steps` train steps (and evals every `eval_every`) on every core; keep the written ones.

    host_period_ms: per-host input pipeline time per step (ms); a host slower than the device step
    makes its cores wait in infeed. host_gap_ms: idle between steps (None = on-device loop)."""
    hosts = cores // cores_per_host
    host_of = np.arange(cores) // cores_per_host
    sched = Schedule(written_cores=keep)
    nominal = nominal_step_ms(train, cores, partition)
    sched.nominal_step_ms = nominal
    waits = np.zeros((hosts, steps))
    gap_base = DEVICE_LOOP_GAP_MS if host_gap_ms is None else host_gap_ms

    now = 0.0
    carry: dict[int, float] = {}
    for k in range(steps):
        host_f = 1 + HOST_JITTER * rng.standard_normal(hosts)
        if straggler_host is not None:
            host_f[straggler_host] *= 1.03
        f = host_f[host_of] * (1 + CORE_JITTER * rng.standard_normal(cores))
        period = host_period_ms * (1 + 0.01 * rng.standard_normal(hosts))
        # steady state: a host slower than the device step makes its cores wait for the difference
        waits[:, k] = np.maximum(0.0, period - nominal)
        eps = np.clip(OP_JITTER * rng.standard_normal(len(train.ops)), -0.03, 0.03)
        s, d, a_s, a_ops, a_e, t, comm = _walk(train, now, f, waits[host_of, k], eps, keep, partition, carry)
        carry = {b: e for b, e in comm.items() if b >= AG_BUCKET_BASE}
        sched.segments.append(Segment(0, k, s, d, a_s, a_e, a_ops))
        sched.step_starts.append(now)
        end = float(t.max())
        gap = gap_base * (1 + 0.05 * abs(rng.standard_normal()))
        if eval_every and (k + 1) % eval_every == 0 and k < steps - 1:
            # eval needs the gathered weights: it starts once the pending all-gathers are complete
            ev_start = max([end, *carry.values()]) + DEVICE_LOOP_GAP_MS
            sched.step_ends.append(ev_start)
            eps_e = np.clip(OP_JITTER * rng.standard_normal(len(evalp.ops)), -0.03, 0.03)
            es, ed, ea_s, ea_ops, ea_e, et, _ = _walk(
                evalp, ev_start, f, np.zeros(cores), eps_e, keep, partition
            )
            sched.segments.append(Segment(1, k, es, ed, ea_s, ea_e, ea_ops))
            ev_end = float(et.max())
            sched.eval_spans.append((k, ev_start, ev_end))
            now = ev_end + gap
        else:
            now = end + gap
            sched.step_ends.append(now)
    sched.host_wait_ms = waits
    return sched
