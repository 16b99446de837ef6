"""Generator speed: a 4096-chip ResNet-50 run with 2 hosts written, and with all 512 hosts written,
beside a baseline in the same run: the same host file built event by event with the `xplane_pb2` API
(the obvious writer). Output goes to a temporary folder (1.2 GB for 512 hosts), removed afterwards.

    python benchmarks/bench_generate.py [--steps 10] [--keep]

Results: benchmarks/results/bench_generate.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from tpuanalyze.generator import generate

from tpuanalyze.proto import xplane_pb2 as pb

RESULTS = Path(__file__).resolve().parent / "results" / "bench_generate.md"


def rebuild_with_protobuf_api(path: Path) -> tuple[float, int]:
    """Baseline: rebuild one host file's content event by event with the protobuf API and serialise."""
    src = pb.XSpace()
    src.ParseFromString(path.read_bytes())
    events = [(p.name, [(line, list(line.events)) for line in p.lines]) for p in src.planes]
    t0 = time.perf_counter()
    out = pb.XSpace(hostnames=src.hostnames)
    n = 0
    for plane, (_name, lines) in zip(src.planes, events, strict=True):
        dst = out.planes.add(id=plane.id, name=plane.name)
        dst.stats.extend(plane.stats)
        for k, v in plane.event_metadata.items():
            dst.event_metadata[k].CopyFrom(v)
        for k, v in plane.stat_metadata.items():
            dst.stat_metadata[k].CopyFrom(v)
        for line, evs in lines:
            dl = dst.lines.add(
                id=line.id,
                display_id=line.display_id,
                name=line.name,
                display_name=line.display_name,
                timestamp_ns=line.timestamp_ns,
            )
            for e in evs:
                ne = dl.events.add(
                    metadata_id=e.metadata_id, offset_ps=e.offset_ps, duration_ps=e.duration_ps
                )
                for s in e.stats:
                    ne.stats.add(metadata_id=s.metadata_id, int64_value=s.int64_value)
                n += 1
    data = out.SerializeToString()
    elapsed = time.perf_counter() - t0
    assert len(data) > 0
    return elapsed, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="keep the generated folder")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tpuanalyze_bench_generate_"))
    try:
        t0 = time.perf_counter()
        two = generate("resnet50", 4096, steps=args.steps, hosts=2, out=tmp / "two")
        t_two = time.perf_counter() - t0
        t0 = time.perf_counter()
        full = generate("resnet50", 4096, steps=args.steps, out=tmp / "full")
        t_full = time.perf_counter() - t0
        truth = json.loads((full / "ground_truth.json").read_text())
        files = sorted(full.glob("*.xplane.pb"))
        size = sum(f.stat().st_size for f in files)
        baseline_s, events_per_host = rebuild_with_protobuf_api(files[0])
        ours_per_host = t_full / len(files)
        two_bytes = sum(f.stat().st_size for f in two.glob("*.xplane.pb"))
        all_events = len(files) * events_per_host
        lines = [
            "# bench_generate",
            "",
            f"ResNet-50, 4096 chips (512 hosts x 16 cores), {args.steps} steps, seed 0, on the CI box.",
            "",
            "| what | wall time | files | bytes | events |",
            "|---|---|---|---|---|",
            f"| generate --hosts 2 | {t_two:.2f} s | 2 | {two_bytes:,} | {2 * events_per_host:,} |",
            f"| generate, all 512 hosts | {t_full:.1f} s | {len(files)} | {size:,} | {all_events:,} |",
            f"| ours per host (+ ground truth) | {ours_per_host * 1e3:.0f} ms | 1 | | {events_per_host:,} |",
            f"| baseline: same host built event by event with xplane_pb2 | {baseline_s * 1e3:.0f} ms | 1 | | "
            f"{events_per_host:,} |",
            "",
            f"Ours writes {all_events / t_full:,.0f} events/s end to end (all 8192 cores modelled once);",
            f"the protobuf-API baseline would take ~{baseline_s * len(files):.0f} s for the hosts' events",
            f"alone ({baseline_s / ours_per_host:.1f}x ours per host). Ground truth step "
            f"{truth['step_time_ms']:.2f} ms.",
        ]
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
