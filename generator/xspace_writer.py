"""Write one host's XSpace: a `/device:TPU:N` plane per TensorCore (lines Steps, XLA Modules, XLA Ops,
Async XLA Ops), `/host:CPU` with the input pipeline and launch threads, and `/host:metadata`.

The layout follows a real TPU capture (traces/real/tpu_v6e_4chip_jax_inference.xplane.pb): event
metadata names are HLO text, display names the short op names, and op stats (hlo_category,
program_id, flops, bytes_accessed, shape_with_layout, tf_op) live on the event metadata. Plane
metadata is serialised once per run and reused; events are encoded column-wise (generator.wire).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tpuanalyze.generator.program import Program
from tpuanalyze.generator.topology import HBM_GBPS_PER_CORE, PEAK_TFLOPS_PER_CORE
from tpuanalyze.generator.wire import encode_events, length_delimited

from tpuanalyze.proto import xplane_pb2 as pb

STAT_NAMES = (
    "core_details",
    "device_type_string",
    "peak_teraflops_per_second",
    "peak_hbm_bw_gigabytes_per_second",
    "has_megacore",
    "group_id",
    "step_num",
    "run_id",
    "program_id",
    "hlo_category",
    "flops",
    "model_flops",
    "bytes_accessed",
    "shape_with_layout",
    "tf_op",
    "hlo_module",
    "replica_id",
    "queue_id",
    "core_type",
    "symbol_id",
    "all_reduce_unique_id",
)
SID = {name: i + 1 for i, name in enumerate(STAT_NAMES)}
LINE_STEPS, LINE_MODULES, LINE_OPS, LINE_ASYNC = 1, 2, 3, 4
DEVICE_TYPE = "TPU v3"


@dataclass
class RunMetadata:
    """Event metadata ids shared by every TPU plane of the run."""

    bytes_: bytes  # serialized event_metadata + stat_metadata map entries
    train_base: int  # metadata id of train op 0
    eval_base: int
    module_train: int
    module_eval: int
    step_base: int


def _stat(sid: int, value) -> pb.XStat:
    if isinstance(value, str):
        return pb.XStat(metadata_id=sid, str_value=value)
    if isinstance(value, float):
        return pb.XStat(metadata_id=sid, double_value=value)
    if isinstance(value, bytes):
        return pb.XStat(metadata_id=sid, bytes_value=value)
    if value >= 2**63:
        return pb.XStat(metadata_id=sid, uint64_value=value)
    return pb.XStat(metadata_id=sid, int64_value=int(value))


def build_run_metadata(train: Program, evalp: Program, steps: int) -> RunMetadata:
    plane = pb.XPlane()
    for name, sid in SID.items():
        plane.stat_metadata[sid].id = sid
        plane.stat_metadata[sid].name = name
    next_id = 1

    def add_program(prog: Program) -> int:
        nonlocal next_id
        base = next_id
        for symbol, op in enumerate(prog.ops, start=1):
            md = plane.event_metadata[next_id]
            md.id = next_id
            md.name = op.hlo
            md.display_name = op.short
            md.stats.extend(
                [
                    _stat(SID["hlo_category"], op.category),
                    pb.XStat(metadata_id=SID["program_id"], uint64_value=prog.program_id),
                    # XProf keys op metrics by (program_id, symbol_id): without it ops are dropped
                    pb.XStat(metadata_id=SID["symbol_id"], uint64_value=symbol),
                    _stat(SID["flops"], op.flops),
                    _stat(SID["bytes_accessed"], op.bytes_accessed),
                    _stat(SID["shape_with_layout"], op.shape),
                    _stat(SID["tf_op"], op.tf_op),
                ]
            )
            next_id += 1
        return base

    train_base = add_program(train)
    eval_base = add_program(evalp)
    modules = []
    for prog in (train, evalp):
        md = plane.event_metadata[next_id]
        md.id = next_id
        md.name = f"{prog.name}({prog.program_id})"
        md.stats.append(pb.XStat(metadata_id=SID["program_id"], uint64_value=prog.program_id))
        modules.append(next_id)
        next_id += 1
    step_base = next_id
    for s in range(steps):
        md = plane.event_metadata[next_id]
        md.id = next_id
        md.name = str(s)
        next_id += 1
    return RunMetadata(plane.SerializeToString(), train_base, eval_base, modules[0], modules[1], step_base)


def core_details(hostname: str, ordinal: int, global_chip: int, global_core: int) -> bytes:
    """XProf's CoreDetails message (hostname=1, device_ordinal=2, core_num=3, local_chip_id=4,
    global_chip_id=5, global_core_id=6), encoded by hand: it is not part of xplane.proto."""

    def varint(v: int) -> bytes:
        out = bytearray()
        while True:
            b, v = v & 0x7F, v >> 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)

    h = hostname.encode()
    return (
        b"\x0a"
        + varint(len(h))
        + h
        + b"\x10"
        + varint(ordinal)
        + b"\x18"
        + varint(ordinal % 2)
        + b"\x20"
        + varint(ordinal // 2)
        + b"\x28"
        + varint(global_chip)
        + b"\x30"
        + varint(global_core)
    )


def device_plane_header(ordinal: int, hostname: str, global_core: int) -> bytes:
    plane = pb.XPlane(id=ordinal, name=f"/device:TPU:{ordinal}")
    plane.stats.extend(
        [
            _stat(SID["core_details"], core_details(hostname, ordinal, global_core // 2, global_core)),
            _stat(SID["device_type_string"], DEVICE_TYPE),
            _stat(SID["peak_teraflops_per_second"], PEAK_TFLOPS_PER_CORE),
            _stat(SID["peak_hbm_bw_gigabytes_per_second"], HBM_GBPS_PER_CORE),
            _stat(SID["has_megacore"], 0),
        ]
    )
    return plane.SerializeToString()


def line_bytes(line_id: int, name: str, timestamp_ns: int, events: bytes) -> bytes:
    header = pb.XLine(id=line_id, display_id=line_id, name=name, display_name=name, timestamp_ns=timestamp_ns)
    return length_delimited(3, header.SerializeToString() + events)


def host_cpu_plane(
    step_starts_ms: list[float],
    ready_ms: list[float],
    period_ms: float,
    processing_share: float,
    cores_per_host: int,
    host_gap_ms: float | None,
    timestamp_ns: int,
    eval_spans: list[tuple[int, float, float]],
    eval_distributed: bool,
) -> pb.XPlane:
    """Host threads: tf.data processing (`Iterator::...`), infeed enqueue per core, and the launch loop.

    The batch of step k is processed, then enqueued core by core, finishing when the device's infeed of
    step k completes (`ready_ms`); a host slower than the device therefore shows as infeed wait."""
    plane = pb.XPlane(id=0, name="/host:CPU")
    names = [
        "Iterator::Model::MapAndBatch::ParallelInterleaveV4::ParseExampleAndDecodeCrop",
        "input_pipeline_task0/while/InfeedQueue/enqueue:InfeedEnqueueTuple",  # TF op "name:type"
        "TpuExecute::train_step",
        "EvalMetrics::compute",
    ]
    for i, n in enumerate(names, start=1):
        plane.event_metadata[i].id = i
        plane.event_metadata[i].name = n
    for i, n in enumerate(("step_num", "device_ordinal"), start=1):
        plane.stat_metadata[i].id = i
        plane.stat_metadata[i].name = n

    def line(tid: int, name: str) -> pb.XLine:
        return plane.lines.add(id=tid, display_id=tid, name=f"{name}/{tid}", timestamp_ns=timestamp_ns)

    main = line(1000, "python3")
    proc = [line(1001, "tf_data_private_threadpool"), line(1002, "tf_data_private_threadpool")]
    enq = line(1100, "InfeedEnqueueThread")
    ps = 1e9  # ms -> ps
    proc_ms = processing_share * period_ms
    enq_ms = (1 - processing_share) * period_ms / cores_per_host
    launch = host_gap_ms if host_gap_ms is not None else 0.005
    for k, (start, ready) in enumerate(zip(step_starts_ms, ready_ms, strict=True)):
        t = ready - period_ms
        ev = proc[k % 2].events.add(metadata_id=1, offset_ps=int(t * ps), duration_ps=int(proc_ms * ps))
        ev.stats.add(metadata_id=1, int64_value=k)
        t += proc_ms
        for c in range(cores_per_host):
            e = enq.events.add(metadata_id=2, offset_ps=int(t * ps), duration_ps=max(1, int(enq_ms * ps)))
            e.stats.add(metadata_id=2, int64_value=c)
            t += enq_ms
        # the first launch is cut at the line's start: an event never begins before its line (and host)
        begin = max(0.0, start - launch)
        m = main.events.add(
            metadata_id=3, offset_ps=int(begin * ps), duration_ps=max(1, int((start - begin) * ps))
        )
        m.stats.add(metadata_id=1, int64_value=k)
    if not eval_distributed:
        for _k, s, e in eval_spans:
            main.events.add(metadata_id=4, offset_ps=int(s * ps), duration_ps=int((e - s) * ps))
    for ln in plane.lines:  # events in time order per line
        evs = sorted(ln.events, key=lambda x: x.offset_ps)
        del ln.events[:]
        ln.events.extend(evs)
    return plane


def metadata_plane(info: dict) -> pb.XPlane:
    """`/host:metadata` with the given plane stats (the writer passes none: a real capture keeps HLO
    protos here and states no run configuration, so neither does the generator)."""
    plane = pb.XPlane(id=0, name="/host:metadata")
    for i, (key, value) in enumerate(info.items(), start=1):
        plane.stat_metadata[i].id = i
        plane.stat_metadata[i].name = key
        plane.stats.append(_stat(i, value))
    return plane


def device_line_events(
    md_ids: np.ndarray,
    starts_ps: np.ndarray,
    durs_ps: np.ndarray,
    group: np.ndarray | None,
    present: np.ndarray | None,
    extra: list[tuple[int, np.ndarray, np.ndarray | None]] | None = None,
) -> list[bytes]:
    """Encode one line for every core of a host at once: arrays are (n_events, cores) column-major."""
    n, w = starts_ps.shape
    md = np.tile(md_ids, w)
    stats = []
    if group is not None:
        stats.append((SID["group_id"], np.tile(group, w), None if present is None else np.tile(present, w)))
    for sid, vals, pres in extra or []:
        stats.append((sid, np.tile(vals, w), None if pres is None else np.tile(pres, w)))
    return encode_events(md, starts_ps.T.reshape(-1), durs_ps.T.reshape(-1), stats, groups=[n] * w)


def write_space(path, hostname: str, planes: list[bytes]) -> int:
    data = b"".join(length_delimited(1, p) for p in planes) + length_delimited(4, hostname.encode())
    with open(path, "wb") as fh:
        fh.write(data)
    return len(data)
