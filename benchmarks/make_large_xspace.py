"""Write one large, realistic XSpace file (default >= 2 million events) for the ingest benchmark.

Why: ingest speed and memory only show at scale, and the benchmark must compare contenders on the
same bytes. The file looks like one TPU v3 host of a training run: ``--cores`` planes
``/device:TPU:N`` with lines ``Steps``, ``XLA Modules`` and ``XLA Ops`` (HLO text as event metadata
name, short op name as display name, metadata stats hlo_category / program_id / flops /
bytes_accessed / shape_with_layout / tf_op / source, per-event stats on steps and modules), plane stats
(device_type_string "TPU v3", peak_teraflops_per_second, peak_hbm_bw_gigabytes_per_second), a
``/host:CPU`` plane with TraceMe threads (``train`` step annotations with step_num, runtime events),
``/host:metadata`` and ``Task Environment`` planes, as JAX/TF write them.

It is deterministic for a seed. To be fast, the events are not built as protobuf messages one by one:
each line's repeated ``events`` field is encoded in bulk with numpy (the generator's
``tpuanalyze.generator.wire``: varints for metadata_id, offset_ps, duration_ps) and spliced after the
line's other fields, which protobuf's wire format allows (fields may come in any order; repeated fields
concatenate). The result is parsed back with ``xplane_pb2`` as a check unless ``--no-verify``.

Usage::

    python benchmarks/make_large_xspace.py                     # -> /tmp/tpuanalyze_bench/...xplane.pb
    python benchmarks/make_large_xspace.py --events 5000000 --out /tmp/big/host0.xplane.pb
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tpuanalyze.generator import wire

from tpuanalyze.proto import xplane_pb2

DEFAULT_OUT = Path("/tmp/tpuanalyze_bench/plugins/profile/2026_01_01_00_00_00/tpu-host-0.xplane.pb")
PROFILE_START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
STEP_GAP_PS = 40_000_000  # 40 us of host overhead between steps
HOST_THREADS = ("python3", "tf_XLAPjRtTpuClient/0", "tf_XLAPjRtTpuClient/1", "tf_data_iterator_get_next")


@dataclass(frozen=True)
class OpKind:
    """One kind of HLO op in the synthetic step program."""

    short: str
    opcode: str
    category: str
    base_ps: int
    flops: float
    bytes_accessed: float
    shape: str
    tf_op: str


OP_KINDS = (  # short name, opcode, hlo_category, base duration ps, flops, bytes, shape, tf_op
    OpKind("infeed", "infeed", "infeed", 300_000_000, 0, 25e6,
           "(bf16[128,224,224,3]{3,2,1,0}, token[])", "infeed"),
    OpKind("convolution", "convolution", "convolution", 900_000_000, 2.4e11, 4.0e7,
           "bf16[128,56,56,256]{3,2,1,0}", "resnet50/conv2d/Conv2D"),
    OpKind("fusion", "fusion", "loop fusion", 250_000_000, 3.0e9, 2.0e7,
           "bf16[128,56,56,256]{3,2,1,0}", "resnet50/batch_normalization/FusedBatchNormV3"),
    OpKind("convolution_fusion", "fusion", "convolution fusion", 700_000_000, 1.8e11, 3.0e7,
           "bf16[128,28,28,512]{3,2,1,0}", "resnet50/conv2d_1/Conv2D"),
    OpKind("reduce", "reduce", "reduce", 120_000_000, 1.0e8, 8.0e6, "f32[256]{0}", "resnet50/Mean"),
    OpKind("all-reduce", "all-reduce", "all-reduce", 1_500_000_000, 2.5e7, 1.0e8,
           "f32[25557032]{0}", "cross_replica_sum/CrossReplicaSum"),
    OpKind("copy", "copy", "data formatting", 80_000_000, 0, 6.0e6,
           "bf16[128,224,224,3]{0,3,2,1}", "transpose"),
    OpKind("fusion.opt", "fusion", "loop fusion", 200_000_000, 1.0e8, 3.0e8,
           "f32[25557032]{0}", "Momentum/update/ApplyMomentum"),
)


@dataclass(frozen=True)
class LargeSpec:
    events: int = 2_000_000
    cores: int = 8
    ops_per_step: int = 480
    seed: int = 0


# ---------------------------------------------------------------- bulk wire encoding
# The generator's column-wise encoder (tpuanalyze.generator.wire) writes the events of each line.


def encode_events(metadata_ids: np.ndarray, offsets_ps: np.ndarray, durations_ps: np.ndarray) -> bytes:
    """Wire bytes of ``repeated XEvent events = 4`` for many events without per-event Python work."""
    return wire.encode_events(metadata_ids, offsets_ps, durations_ps)[0]


def _length_delimited(tag: int, payload: bytes) -> bytes:
    return wire.length_delimited(tag >> 3, payload)


def serialize_plane(plane: xplane_pb2.XPlane, line_events: list[bytes]) -> bytes:
    """Serialize ``plane`` with each line's events spliced in from pre-encoded bytes."""
    lines = list(plane.lines)
    del plane.lines[:]
    head = plane.SerializeToString()
    parts = [head]
    for line, events in zip(lines, line_events, strict=True):
        parts.append(_length_delimited(0x1A, line.SerializeToString() + events))
    return b"".join(parts)


# ---------------------------------------------------------------- content


class _Stats:
    """Stat metadata of one plane, created on first use."""

    def __init__(self, plane: xplane_pb2.XPlane) -> None:
        self.plane = plane
        self.ids: dict[str, int] = {}

    def id(self, name: str) -> int:
        if name not in self.ids:
            sid = len(self.ids) + 1
            self.ids[name] = sid
            self.plane.stat_metadata[sid].id = sid
            self.plane.stat_metadata[sid].name = name
        return self.ids[name]

    def add(self, container, name: str, value) -> None:  # noqa: ANN001 - any message with .stats
        stat = container.stats.add(metadata_id=self.id(name))
        if isinstance(value, str):
            stat.str_value = value
        elif isinstance(value, float):
            stat.double_value = value
        elif isinstance(value, np.uint64) or (isinstance(value, int) and value >= 2**63):
            stat.uint64_value = int(value)
        else:
            stat.int64_value = int(value)


def _event_metadata(plane: xplane_pb2.XPlane, mid: int, name: str, display: str = "") -> None:
    meta = plane.event_metadata[mid]
    meta.id = mid
    meta.name = name
    if display:
        meta.display_name = display


def _step_program(rng: np.random.Generator, ops_per_step: int) -> np.ndarray:
    """Indices into OP_KINDS for one step: infeed, forward/backward compute, all-reduce, optimizer."""
    compute = rng.choice([1, 2, 3, 4, 6], size=ops_per_step - 6, p=[0.3, 0.35, 0.2, 0.1, 0.05])
    return np.concatenate([[0], compute, [5, 5, 5], [7, 7]])


def build_tpu_plane(spec: LargeSpec, core: int, steps: int, rng: np.random.Generator) -> tuple[bytes, int]:
    """One TPU core plane; returns its bytes and its mean step period (ps)."""
    plane = xplane_pb2.XPlane(id=core + 1, name=f"/device:TPU:{core}")
    stats = _Stats(plane)
    stats.add(plane, "device_type_string", "TPU v3")
    stats.add(plane, "peak_teraflops_per_second", 123.0)
    stats.add(plane, "peak_hbm_bw_gigabytes_per_second", 900.0)
    program_id = 7_312_345_678_901_234_567

    # Event metadata: one per HLO instruction of the step program (HLO text name, short display name).
    program = _step_program(np.random.default_rng(spec.seed), spec.ops_per_step)
    op_mid = np.arange(1, len(program) + 1, dtype=np.int64)
    for i, kind_index in enumerate(program):
        kind = OP_KINDS[kind_index]
        short = f"{kind.short}.{i}"
        hlo = f'%{short} = {kind.shape} {kind.opcode}(%param.{i % 97}), metadata={{op_name="{kind.tf_op}"}}'
        _event_metadata(plane, int(op_mid[i]), hlo, short)
        meta = plane.event_metadata[int(op_mid[i])]
        stats.add(meta, "hlo_category", kind.category)
        stats.add(meta, "program_id", np.uint64(program_id))
        stats.add(meta, "flops", int(kind.flops))  # int64, as TPU captures write them
        stats.add(meta, "bytes_accessed", int(kind.bytes_accessed))
        stats.add(meta, "shape_with_layout", kind.shape)
        stats.add(meta, "tf_op", kind.tf_op)
        stats.add(meta, "source", f"resnet_model.py:{100 + i % 400}")
    step_mid, module_mid = len(program) + 1, len(program) + 2
    _event_metadata(plane, step_mid, "train_step")
    _event_metadata(plane, module_mid, f"jit_train_step({program_id})", "jit_train_step")

    # Op durations: the kind's base time with per-core, per-op jitter; ops run back to back.
    base = np.array([OP_KINDS[k].base_ps for k in program], dtype=np.int64)
    jitter = rng.lognormal(0.0, 0.15, size=(steps, len(program)))
    durations = np.maximum((base[None, :] * jitter).astype(np.int64), 1)
    gaps = rng.integers(1_000, 50_000, size=(steps, len(program)))
    ends = np.cumsum(durations + gaps, axis=1)
    step_len = ends[:, -1] + STEP_GAP_PS
    step_start = np.concatenate([[0], np.cumsum(step_len)[:-1]]) + 1_000_000 * core
    op_start = step_start[:, None] + ends - durations

    steps_line = xplane_pb2.XLine(id=1, name="Steps", display_name="Steps", timestamp_ns=2_000)
    modules_line = xplane_pb2.XLine(id=2, name="XLA Modules", timestamp_ns=2_000)
    ops_line = xplane_pb2.XLine(id=3, name="XLA Ops", timestamp_ns=2_000)
    for step in range(steps):
        ev = steps_line.events.add(metadata_id=step_mid, offset_ps=int(step_start[step]),
                                   duration_ps=int(step_len[step] - STEP_GAP_PS))
        stats.add(ev, "group_id", step)
        stats.add(ev, "step_num", step)
        ev = modules_line.events.add(metadata_id=module_mid, offset_ps=int(step_start[step]),
                                     duration_ps=int(step_len[step] - STEP_GAP_PS))
        stats.add(ev, "run_id", 1_000_000 + step)
        stats.add(ev, "group_id", step)
        stats.add(ev, "program_id", np.uint64(program_id))
    op_events = encode_events(
        np.tile(op_mid, steps), op_start.reshape(-1), durations.reshape(-1)
    )
    plane.lines.extend([steps_line, modules_line, ops_line])
    return serialize_plane(plane, [b"", b"", op_events]), int(step_len.mean())


def build_host_plane(steps: int, step_ps: int, rng: np.random.Generator) -> tuple[bytes, int]:
    """``/host:CPU``: a step annotation per step on the python thread plus runtime TraceMe events."""
    plane = xplane_pb2.XPlane(id=0, name="/host:CPU")
    stats = _Stats(plane)
    names = ["train", "PjitFunction(train_step)", "ExecuteHelper", "TpuExecutable::ExecuteAsync",
             "IteratorGetNext", "ParallelMapV2::Produce", "Rendezvous", "TransferToDevice"]
    for mid, name in enumerate(names, start=1):
        _event_metadata(plane, mid, name)
    line_events: list[bytes] = []
    total = 0
    for tid, thread in enumerate(HOST_THREADS):
        line = xplane_pb2.XLine(id=1000 + tid, name=thread, timestamp_ns=1_000)
        if tid == 0:  # step annotations carry per-event stats, as StepTraceAnnotation writes them
            for step in range(steps):
                ev = line.events.add(metadata_id=1, offset_ps=step * step_ps, duration_ps=step_ps - 10_000)
                stats.add(ev, "step_num", step)
                stats.add(ev, "_r", 1)
            total += steps
        per_step = 24
        mids = rng.integers(2, len(names) + 1, size=steps * per_step)
        offsets = (np.repeat(np.arange(steps, dtype=np.int64) * step_ps, per_step)
                   + np.tile(np.arange(per_step, dtype=np.int64) * (step_ps // per_step), steps) + 5_000)
        durs = rng.integers(1_000_000, step_ps // per_step - 10_000, size=steps * per_step)
        line_events.append(encode_events(mids, offsets, durs))
        total += steps * per_step
        plane.lines.append(line)
    return serialize_plane(plane, line_events), total


def build_space(spec: LargeSpec) -> tuple[bytes, int]:
    """The whole XSpace's bytes and its event count."""
    host_per_step = 24 * len(HOST_THREADS) + 1
    per_step = spec.cores * (spec.ops_per_step + 2) + host_per_step
    steps = -(-spec.events // per_step)
    rng = np.random.default_rng(spec.seed)
    parts = []
    meta_plane = xplane_pb2.XPlane(id=0, name="/host:metadata")
    meta_stats = _Stats(meta_plane)
    meta_stats.add(meta_plane, "jax_version", "0.4.x (synthetic)")
    parts.append(_length_delimited(0x0A, meta_plane.SerializeToString()))
    step_periods = []
    total = 0
    for core in range(spec.cores):
        plane_bytes, step_period = build_tpu_plane(spec, core, steps, rng)
        parts.append(_length_delimited(0x0A, plane_bytes))
        total += steps * (spec.ops_per_step + 2)
        step_periods.append(step_period)
    step_ps = max(step_periods)
    host_bytes, host_events = build_host_plane(steps, step_ps, rng)
    parts.append(_length_delimited(0x0A, host_bytes))
    total += host_events
    env = xplane_pb2.XPlane(id=0, name="Task Environment")
    env_stats = _Stats(env)
    env_stats.add(env, "profile_start_time", np.uint64(PROFILE_START_NS))
    env_stats.add(env, "profile_stop_time", np.uint64(PROFILE_START_NS + steps * step_ps // 1000 + 10_000))
    parts.append(_length_delimited(0x0A, env.SerializeToString()))
    parts.append(_length_delimited(0x22, b"tpu-host-0"))
    return b"".join(parts), total


def write_large_xspace(out: Path = DEFAULT_OUT, spec: LargeSpec = LargeSpec(), verify: bool = True) -> int:
    """Write the file; returns its number of events (checked by a real parse when ``verify``)."""
    data, total = build_space(spec)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    if verify:
        space = xplane_pb2.XSpace()
        space.ParseFromString(data)
        parsed = sum(len(line.events) for plane in space.planes for line in plane.lines)
        if parsed != total:
            raise AssertionError(f"wrote {total} events but parsed {parsed}")
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--events", type=int, default=LargeSpec.events, help="at least this many events")
    parser.add_argument("--cores", type=int, default=LargeSpec.cores, help="TPU core planes")
    parser.add_argument("--seed", type=int, default=LargeSpec.seed)
    parser.add_argument("--no-verify", action="store_true", help="skip parsing the file back")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    spec = LargeSpec(events=args.events, cores=args.cores, seed=args.seed)
    total = write_large_xspace(args.out, spec, verify=not args.no_verify)
    seconds = time.perf_counter() - started
    size_mb = args.out.stat().st_size / 1e6
    print(f"{args.out}: {total} events, {size_mb:.1f} MB, written in {seconds:.1f} s")


if __name__ == "__main__":
    main()
