"""What run a trace is, from the trace alone: platform, workload, devices captured and in the job, batch.

Every fact comes from what real XLA captures write (docs/json.md, ``identity``):

- platform: the device planes' ``device_type_string`` (TPU), ``device_vendor`` and
  ``compute_cap_major``/``compute_cap_minor`` (GPU), or host-only XLA CPU ops (CPU);
- workload: the XLA programs executed (module names without their ``(fingerprint)``), the one with the
  most device time first, plus the model's name scope (first ``tf_op`` component that is not a
  ``jit(...)`` wrapper) and the per-example input shape (the infeed shape without its batch dimension);
- devices and chips captured: device planes, TensorCores per chip from the planes' ``core_details``;
- devices in the job: the collectives' ``replica_groups`` in the HLO text (``[G,S]<=[...]``: G groups of
  S devices; ``{{0,1},{2,3}}``: the ids listed), and ``global_chip_id`` as a lower bound;
- batch: the infeed shape's leading dimension (what one core receives per step).

A fact the trace does not state is ``None`` with a note saying so; nothing is guessed silently.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import duckdb
from tpuanalyze.analyzer.event_partials import partial

_FINGERPRINT = re.compile(r"\s*\([0-9A-Fa-fx]+\)\s*$")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")
_LIST_GROUPS = re.compile(r"replica_groups=\{(\{[\d,\s{}]*\})\}")
_JIT_SCOPE = re.compile(r"^(jit|pmap|xmap|pjit|shard_map)\(.*\)$|^jit_")
_LEADING_DIM = re.compile(r"^\(?\s*([a-z]+[0-9]*)\[(\d+)((?:,\d+)*)\]")


def program_name(module: str | None) -> str | None:
    """``jit_train_step(1234567)`` -> ``jit_train_step``: the program without its compile fingerprint."""
    if not module:
        return None
    return _FINGERPRINT.sub("", str(module)).strip() or None


# --- platform ------------------------------------------------------------------------------------------

# GPU compute capability -> architecture (vendor, (major, minor)); unknown ones keep the number.
_NVIDIA = {(6, 0): "Pascal (sm_60)", (7, 0): "Volta (sm_70)", (7, 5): "Turing (sm_75)",
           (8, 0): "Ampere (sm_80)", (8, 6): "Ampere (sm_86)", (8, 9): "Ada (sm_89)",
           (9, 0): "Hopper (sm_90)", (10, 0): "Blackwell (sm_100)"}
_AMD = {(9, 0): "CDNA2 (gfx90a)", (9, 4): "CDNA3 (gfx94x)", (9, 5): "CDNA4 (gfx950)"}


def tpu_generation(device_type: str | None) -> str | None:
    """``TPU v6 Lite`` -> ``v6e``, ``TPU v5`` -> ``v5p``, ``TPU v3`` -> ``v3`` (Cloud TPU names)."""
    match = re.match(r"^TPU\s*v?(\d+)\s*(lite|e|p)?", device_type or "", re.IGNORECASE)
    if not match:
        return None
    number, suffix = int(match.group(1)), (match.group(2) or "").lower()
    if suffix in ("lite", "e"):
        return f"v{number}e"
    if suffix == "p" or number == 5:
        return f"v{number}p"
    return f"v{number}"


def _gpu_platform(stats: dict[str, Any]) -> dict[str, Any]:
    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    vendor = stats.get("device_vendor")
    if vendor is None and major is not None:
        vendor = "NVIDIA"  # CUDA captures predate the device_vendor stat
    vendor = str(vendor) if vendor is not None else None
    generation = None
    if major is not None:
        key = (int(major), int(minor or 0))
        names = _AMD if (vendor or "").upper() == "AMD" else _NVIDIA
        generation = names.get(key, f"compute capability {key[0]}.{key[1]}")
    device_type = " ".join(p for p in (vendor, generation or "GPU") if p) if vendor or generation else "GPU"
    return {"kind": "gpu", "vendor": vendor, "device_type": device_type, "generation": generation}


def _platform(con: duckdb.DuckDBPyConnection, run_id: int, fallback_type: str | None,
              notes: list[str]) -> dict[str, Any]:
    rows = con.execute(
        "SELECT kind, device_type, stats FROM planes WHERE run_id = ? AND kind IN ('tpu', 'gpu') "
        "ORDER BY num_events > 0 DESC, plane_index", [int(run_id)]).fetchall()
    if rows and rows[0][0] == "tpu":
        device_type = next((r[1] for r in rows if r[1]), None)
        generation = tpu_generation(device_type)
        if device_type is None:
            notes.append("platform: TPU planes without device_type_string: TPU generation unknown")
        return {"kind": "tpu", "vendor": "Google", "device_type": device_type or "TPU",
                "generation": generation}
    if rows:
        import json

        stats: dict[str, Any] = {}
        for _, _, text in rows:
            for key, value in (json.loads(text) if text else {}).items():
                stats.setdefault(key, value)
        platform = _gpu_platform(stats)
        if platform["generation"] is None:
            notes.append("platform: GPU planes state no compute capability: GPU generation unknown")
        return platform
    kind = (fallback_type or "").lower()
    if kind.startswith("gpu"):
        notes.append("platform: GPU (from the trace's kernels); the trace names no GPU model or generation")
        return {"kind": "gpu", "vendor": None, "device_type": "GPU", "generation": None}
    if kind.startswith("tpu"):
        return {"kind": "tpu", "vendor": "Google", "device_type": fallback_type,
                "generation": tpu_generation(fallback_type)}
    if not kind:
        notes.append("platform: no device planes and no XLA ops: platform unknown")
        return {"kind": None, "vendor": None, "device_type": None, "generation": None}
    return {"kind": "cpu", "vendor": None, "device_type": "CPU", "generation": None}


# --- workload ------------------------------------------------------------------------------------------

def _programs(con: duckdb.DuckDBPyConnection, run_id: int,
              rel: dict[str, str] | None = None) -> list[tuple[str, float, str]]:
    """(program, device seconds, how known), most time first: XLA Modules executions, else op time."""
    # the module lines' events summed per metadata id first, then named: the metadata join over every
    # execution, and the join producing them, were 1.4 CPU s on a 512-host pod (0.4 this way)
    rows = con.execute(
        """WITH ids AS (
               SELECT r.host, r.plane_index, r.metadata_id, sum(r.duration_ps) AS ps
               FROM event_rows r
               SEMI JOIN (SELECT run_id, host, plane_index, line_index FROM lines
                          WHERE run_id = $run AND name = 'XLA Modules') l
                 ON l.run_id = r.run_id AND l.host = r.host AND l.plane_index = r.plane_index
                AND l.line_index = r.line_index
               WHERE r.run_id = $run GROUP BY ALL)
           SELECT coalesce(m.hlo_module, m.name) AS module, sum(i.ps) / 1e12
           FROM ids i JOIN event_metadata m ON m.run_id = $run AND m.host = i.host
                                           AND m.plane_index = i.plane_index AND m.metadata_id = i.metadata_id
           GROUP BY 1""", {"run": int(run_id)}).fetchall()
    source = "XLA module executions"
    if not rows:
        rows = con.execute(f"SELECT hlo_module, sum(ps) / 1e12 FROM {partial(rel, 'module_op_time', run_id)} "
                           "GROUP BY 1").fetchall()
        source = "XLA ops' hlo_module"
    totals: dict[str, float] = {}
    for module, seconds in rows:
        name = program_name(module)
        if name:
            totals[name] = totals.get(name, 0.0) + float(seconds or 0.0)
    return [(name, sec, source) for name, sec in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]


# Name scopes every framework writes around a model's own (TF's gradients/, JAX's jit(f)/, ...).
_GENERIC_SCOPES = {"gradients", "eval", "train", "train_step", "eval_step", "input_pipeline", "host_call",
                   "optimizer", "main", "while", "body", "cond", "transpose", "jvp", "vmap"}


def _model_scope(con: duckdb.DuckDBPyConnection, run_id: int, program: str | None,
                 rel: dict[str, str] | None = None) -> str | None:
    """The most common model name scope of the program's framework ops (``resnet_model``, ``bert``): the
    first ``tf_op`` path component that is neither a JAX wrapper (``jit(f)``) nor a generic scope."""
    rows = con.execute(f"SELECT tf_op, hlo_module, sum(n) FROM {partial(rel, 'model_scopes', run_id)} "
                       "GROUP BY ALL").fetchall()
    counts: dict[str, int] = {}
    for tf_op, module, n in rows:
        if program and module and program_name(module) != program:
            continue
        for part in str(tf_op).split("/")[:-1]:
            part = part.strip().rstrip(":")
            name = re.sub(r"\(.*\)$", "", part)
            if part and not _JIT_SCOPE.match(part) and name.lower() not in _GENERIC_SCOPES:
                counts[part] = counts.get(part, 0) + int(n)
                break
    return max(sorted(counts), key=lambda k: counts[k]) if counts else None


def _infeed(con: duckdb.DuckDBPyConnection, run_id: int,
            rel: dict[str, str] | None = None) -> tuple[int | None, str | None]:
    """Leading dimension and per-example shape of the most executed infeed."""
    rows = con.execute(f"SELECT text, sum(n) AS n FROM {partial(rel, 'infeed_texts', run_id)} GROUP BY 1 "
                       "ORDER BY n DESC, 1 LIMIT 1").fetchall()
    if not rows:
        return None, None
    text = str(rows[0][0])
    text = text.split("=", 1)[1].strip() if text.startswith("%") and "=" in text else text
    match = _LEADING_DIM.match(text)
    if not match:
        return None, None
    return int(match.group(2)), f"{match.group(1)}[*{match.group(3)}]"


# --- devices -------------------------------------------------------------------------------------------

def _core_details(encoded: str) -> dict[int, int]:
    """XProf's CoreDetails (varint fields: device_ordinal=2, core_num=3, local_chip_id=4, global_chip_id=5,
    global_core_id=6) from the plane stat's base64 text; absent fields are 0 as in protobuf."""
    try:
        data = base64.b64decode(encoded)
    except (ValueError, TypeError):
        return {}
    out: dict[int, int] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            out[field], pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            pos += length
        else:
            return out
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
    return value, pos


def _replica_groups(con: duckdb.DuckDBPyConnection, run_id: int,
                    rel: dict[str, str] | None = None) -> tuple[int | None, int | None]:
    """(devices the collectives span, largest all-reduce/reduce-scatter group) from the HLO text."""
    rows = con.execute(f"SELECT DISTINCT name FROM {partial(rel, 'replica_texts', run_id)}").fetchall()
    devices: int | None = None
    replicas: int | None = None
    for (text,) in rows:
        iota = _IOTA_GROUPS.search(text)
        if iota:
            groups, size = int(iota.group(1)), int(iota.group(2))
            total = groups * size
        else:
            listed = _LIST_GROUPS.search(text)
            if not listed:
                continue
            members = [[int(x) for x in re.findall(r"\d+", g)] for g in re.findall(r"\{([\d,\s]*)\}",
                                                                                    listed.group(1))]
            members = [m for m in members if m]
            if not members:
                continue
            size = max(len(m) for m in members)
            total = max(max(m) for m in members) + 1
        devices = max(devices or 0, total)
        if re.search(r"\b(all-reduce|reduce-scatter)(-start)?\(", text):
            replicas = max(replicas or 0, size)
    return devices, replicas


def _devices(con: duckdb.DuckDBPyConnection, run_id: int, platform: dict[str, Any],
             analysed_devices: int, notes: list[str], rel: dict[str, str] | None = None) -> dict[str, Any]:
    hosts = int(con.execute("SELECT count(*) FROM hosts WHERE run_id = ?", [int(run_id)]).fetchone()[0])
    planes = con.execute(
        "SELECT host, num_events, json_extract_string(stats, '$.core_details') FROM planes "
        "WHERE run_id = ? AND kind IN ('tpu', 'gpu')", [int(run_id)]).fetchall()
    devices = len(planes) or analysed_devices
    with_events = sum(1 for p in planes if p[1]) if planes else analysed_devices
    per_chip: int | None = 1
    chips_at_least = None
    if platform["kind"] == "tpu":
        details = [(host, _core_details(cd)) for host, _, cd in planes if cd]
        if details:
            per_host_chip: dict[tuple[str, int], int] = {}
            for host, d in details:
                per_host_chip[(host, d.get(4, 0))] = per_host_chip.get((host, d.get(4, 0)), 0) + 1
            per_chip = max(per_host_chip.values())
            chips_at_least = max(d.get(5, 0) for _, d in details) + 1
        else:  # TPU v2/v3 chips hold 2 TensorCores, each its own device plane (catalog §2)
            per_chip = 2 if platform.get("generation") in ("v2", "v3") else 1
            notes.append(f"chips: no core_details on the TPU planes; {per_chip} core(s) per chip assumed "
                         f"from the generation")
    job_devices, replicas = _replica_groups(con, run_id, rel)
    chips = max(1, devices // per_chip) if devices else None
    job_chips = max(1, job_devices // per_chip) if job_devices else None
    if job_chips is not None and chips is not None and job_chips < chips:
        job_chips = None  # groups over a subset (e.g. model-parallel only): not the job's size
    if job_chips is None and chips_at_least is not None and chips is not None and chips_at_least > chips:
        notes.append(f"chips in the job: not stated; the planes' global chip ids reach {chips_at_least - 1}, "
                     f"so the job has at least {chips_at_least} chips")
    elif job_chips is None:
        notes.append("chips in the job: not stated by the trace (no collective replica groups); "
                     "the captured devices are all that is known")
    hosts_in_job = None
    if job_chips is not None and chips and hosts:
        hosts_in_job = max(hosts, round(job_chips / (chips / hosts)))
    return {
        "hosts_captured": hosts, "hosts_in_job": hosts_in_job,
        "devices_captured": devices, "devices_with_events": with_events,
        "cores_per_chip": per_chip if platform["kind"] == "tpu" else None,
        "chips_captured": chips, "chips_in_job": job_chips, "chips_at_least": chips_at_least,
        "devices_in_job": job_devices if job_chips is not None else None,
        "replicas": replicas,
    }


def run_identity(con: duckdb.DuckDBPyConnection, run_id: int, fallback_device_type: str | None = None,
                 analysed_devices: int = 0, rel: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``identity`` object of a run's JSON summary (docs/json.md). ``rel``: the run's relations,
    with the map's partials of the event readers where it has them (analyzer/event_partials.py)."""
    notes: list[str] = []
    platform = _platform(con, run_id, fallback_device_type, notes)
    programs = _programs(con, run_id, rel)
    program = programs[0][0] if programs else None
    if program is None:
        notes.append("workload: the trace names no XLA program")
    scope = _model_scope(con, run_id, program, rel)
    per_core, example = _infeed(con, run_id, rel)
    devices = _devices(con, run_id, platform, analysed_devices, notes, rel)
    replicas = devices["replicas"]
    if per_core is None:
        notes.append("batch: not stated (no infeed in the trace)")
    global_batch = per_core * replicas if per_core is not None and replicas else None
    label_parts = [p for p in (program, scope, example) if p]
    return {
        "platform": platform,
        "workload": {
            "program": program,
            "programs": [name for name, _, _ in programs],
            "program_source": programs[0][2] if programs else None,
            "model_scope": scope,
            "input_shape": example,
            "label": " · ".join(label_parts) if label_parts else None,
        },
        **{k: v for k, v in devices.items()},
        "chips": devices["chips_in_job"] or devices["chips_captured"],
        "chips_source": "replica groups of the collectives" if devices["chips_in_job"] else
        ("captured devices (the trace does not state the job's size)" if devices["chips_captured"] else None),
        "per_core_batch": float(per_core) if per_core is not None else None,
        "global_batch": global_batch,
        "batch_source": "leading dimension of the infeed shape" if per_core is not None else None,
        "notes": notes,
    }


# --- comparing runs ------------------------------------------------------------------------------------

def platform_key(identity: dict[str, Any]) -> str | None:
    """``tpu v3`` / ``gpu NVIDIA Volta (sm_70)`` / ``cpu``: what must match for runs to be compared."""
    p = identity.get("platform") or {}
    if not p.get("kind"):
        return None
    return " ".join(str(x) for x in (p["kind"], p.get("vendor") if p["kind"] == "gpu" else None,
                                     p.get("generation")) if x)


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What makes two runs incomparable: a different platform or workload (facts both traces state)."""
    out = []
    pa, pb = platform_key(a), platform_key(b)
    if pa and pb and pa != pb:
        out.append(f"platform {pa} vs {pb}")
    elif bool(pa) != bool(pb):
        out.append(f"platform {pa or 'unknown'} vs {pb or 'unknown'}")
    wa, wb = a.get("workload") or {}, b.get("workload") or {}
    for key, label in (("program", "program"), ("model_scope", "model"), ("input_shape", "input")):
        if wa.get(key) and wb.get(key) and wa[key] != wb[key]:
            out.append(f"{label} {wa[key]} vs {wb[key]}")
    if not out and bool(wa.get("program")) != bool(wb.get("program")):
        out.append(f"program {wa.get('program') or 'unknown'} vs {wb.get('program') or 'unknown'}")
    return out


def comparable_key(identity: dict[str, Any]) -> tuple | None:
    """Runs with equal keys form one scaling series; None when platform or workload is unknown."""
    w = identity.get("workload") or {}
    platform = platform_key(identity)
    if not platform or not w.get("program"):
        return None
    return (platform, w.get("program"), w.get("model_scope"), w.get("input_shape"))
