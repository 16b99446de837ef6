"""The run's identity (analyzer/identity.py) as short labelled lines for the terminal and HTML headers:
what ran, on what, on how many chips of how many, with what batch; "not stated" where the trace is silent."""

from __future__ import annotations

from typing import Any


def _platform(identity: dict[str, Any]) -> str:
    p = identity.get("platform") or {}
    if not p.get("kind"):
        return "unknown"
    device = p.get("device_type") or p["kind"].upper()
    generation = p.get("generation")
    return f"{device} ({generation})" if generation and generation not in device else device


def _chips(identity: dict[str, Any]) -> str:
    captured, in_job = identity.get("chips_captured"), identity.get("chips_in_job")
    hosts, hosts_job = identity.get("hosts_captured"), identity.get("hosts_in_job")
    noun = "chip" if (identity.get("platform") or {}).get("kind") == "tpu" else "device"
    text = f"{captured if captured is not None else '?'} {noun}{'' if captured == 1 else 's'} captured"
    if in_job:
        text += f" of {in_job} in the job (collectives' replica groups)"
    elif identity.get("chips_at_least"):
        text += f"; the job has at least {identity['chips_at_least']} (global chip ids)"
    else:
        text += "; job size not stated"
    if hosts:
        text += f" · {hosts} host{'s' if hosts != 1 else ''}" + (f" of {hosts_job}" if hosts_job else "")
    return text


def _batch(identity: dict[str, Any]) -> str:
    per_core = identity.get("per_core_batch")
    if per_core is None:
        return "not stated"
    text = f"{per_core:g} per core"
    if identity.get("global_batch"):
        text += f" · {identity['global_batch']:g} global"
    return text + " (infeed shape)"


def identity_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) rows: device (platform and generation), workload, chips, batch."""
    identity = summary.get("identity") or {}
    if not identity:
        return []
    workload = (identity.get("workload") or {}).get("label") or "not stated (no XLA program named)"
    rows = [("device", _platform(identity)), ("workload", workload)]
    mode = (identity.get("workload") or {}).get("mode")
    if mode:  # why the findings' advice is worded as it is (docs/findings.md, platforms and workloads)
        rows.append(("mode", f"{mode} ({identity['workload'].get('mode_evidence') or 'no evidence'})"))
    return rows + [("chips", _chips(identity)), ("batch", _batch(identity))]
