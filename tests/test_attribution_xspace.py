"""Small real XSpace files for the analyzer tests, written with the project's xplane_pb2.

`XSpaceBuilder` writes planes/lines/events in the real wire format (metadata ids, stat metadata,
display names, plane stats) so the real ingest reads them exactly like a capture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuanalyze.proto import xplane_pb2

MS = 1_000_000_000  # picoseconds per millisecond
T0_NS = 1_700_000_000_000_000_000


class PlaneBuilder:
    def __init__(self, plane: xplane_pb2.XPlane) -> None:
        self.plane = plane
        self._events: dict[tuple[str, str, tuple], int] = {}
        self._stats: dict[str, int] = {}

    def stat_id(self, name: str) -> int:
        if name not in self._stats:
            sid = len(self._stats) + 1
            self._stats[name] = sid
            self.plane.stat_metadata[sid].id = sid
            self.plane.stat_metadata[sid].name = name
        return self._stats[name]

    def _set(self, stat: xplane_pb2.XStat, name: str, value: Any) -> None:
        stat.metadata_id = self.stat_id(name)
        if isinstance(value, bool) or isinstance(value, int):
            stat.int64_value = int(value)
        elif isinstance(value, float):
            stat.double_value = value
        else:
            stat.str_value = str(value)

    def plane_stat(self, name: str, value: Any) -> None:
        self._set(self.plane.stats.add(), name, value)

    def metadata(self, name: str, display_name: str | None = None, **stats: Any) -> int:
        key = (name, display_name or "", tuple(sorted(stats.items())))
        if key not in self._events:
            mid = len(self._events) + 1
            self._events[key] = mid
            md = self.plane.event_metadata[mid]
            md.id = mid
            md.name = name
            if display_name:
                md.display_name = display_name
            for sname, value in stats.items():
                self._set(md.stats.add(), sname, value)
        return self._events[key]

    def line(self, name: str, line_id: int | None = None) -> xplane_pb2.XLine:
        for existing in self.plane.lines:
            if existing.name == name:
                return existing
        ln = self.plane.lines.add()
        ln.id = line_id if line_id is not None else len(self.plane.lines)
        ln.name = name
        ln.timestamp_ns = T0_NS
        return ln

    def event(self, line: str, name: str, start_ms: float, end_ms: float, display_name: str | None = None,
              event_stats: dict[str, Any] | None = None, **metadata_stats: Any) -> None:
        ln = self.line(line)
        ev = ln.events.add()
        ev.metadata_id = self.metadata(name, display_name, **metadata_stats)
        ev.offset_ps = round(start_ms * MS)
        ev.duration_ps = round((end_ms - start_ms) * MS)
        for sname, value in (event_stats or {}).items():
            self._set(ev.stats.add(), sname, value)


class XSpaceBuilder:
    def __init__(self) -> None:
        self.space = xplane_pb2.XSpace()
        self.space.hostnames.append("testhost")

    def plane(self, name: str, plane_id: int | None = None) -> PlaneBuilder:
        p = self.space.planes.add()
        p.id = plane_id if plane_id is not None else len(self.space.planes)
        p.name = name
        return PlaneBuilder(p)

    def tpu_core(self, ordinal: int, device_type: str = "TPU v3", peak_tflops: float = 61.5) -> PlaneBuilder:
        pb = self.plane(f"/device:TPU:{ordinal}")
        pb.plane_stat("device_type_string", device_type)
        pb.plane_stat("peak_teraflops_per_second", peak_tflops)
        pb.plane_stat("peak_hbm_bw_gigabytes_per_second", 900.0)
        return pb

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.space.SerializeToString())
        return path


def hlo_op(core: PlaneBuilder, short: str, start: float, end: float, category: str,
           shape: str = "f32[1024]", tf_op: str | None = None, flops: float = 0.0,
           bytes_accessed: float = 0.0, line: str = "XLA Ops") -> None:
    """An op on a TPU core's 'XLA Ops' line, named and annotated like XProf's device planes."""
    stats: dict[str, Any] = {"hlo_category": category, "program_id": 1, "shape_with_layout": shape,
                             "flops": flops, "bytes_accessed": bytes_accessed}
    if tf_op:
        stats["tf_op"] = tf_op
    kind = short.split(".")[0]
    core.event(line, f"%{short} = {shape} {kind}(...)", start, end, display_name=short, **stats)


def design_example_step(core: PlaneBuilder, offset_ms: float = 0.0, step: int = 0) -> None:
    """design.md's 10 ms step: infeed 0-2, fusions 2-8, all-reduce 6-9, optimizer 9-9.5 ms."""
    o = offset_ms
    core.event("Steps", str(step), o, o + 10, event_stats={"step_num": step, "group_id": step})
    core.event("XLA Modules", "jit_train_step(1)", o, o + 10, event_stats={"group_id": step})
    hlo_op(core, "infeed", o + 0, o + 2, "infeed", shape="bf16[8,224,224,3]")
    hlo_op(core, "fusion.1", o + 2, o + 5, "convolution fusion", flops=1e9, bytes_accessed=1e6)
    hlo_op(core, "fusion.2", o + 5, o + 8, "loop fusion", flops=2e8, bytes_accessed=4e6)
    hlo_op(core, "all-reduce.1", o + 6, o + 9, "all-reduce", shape="f32[25557032]",
           bytes_accessed=4 * 25557032, line="XLA Ops")
    hlo_op(core, "fusion.3", o + 9, o + 9.5, "loop fusion", tf_op="train/LARSOptimizer/update_weights")


def test_builder_writes_a_readable_xspace(tmp_path: Path) -> None:
    b = XSpaceBuilder()
    design_example_step(b.tpu_core(0))
    path = b.write(tmp_path / "host0.xplane.pb")
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    lines = {ln.name: len(ln.events) for ln in space.planes[0].lines}
    assert lines == {"Steps": 1, "XLA Modules": 1, "XLA Ops": 5}
