"""Generator of realistic TPU-v3 pod traces (XSpace, laid out like a real capture) with exact ground truth.

    from tpuanalyze.generator import generate
    run_dir = generate("resnet50", chips=32, steps=10, scenario="input-bound", out=Path("logdir"))

See docs/generator.md for the trace layout, the recognition rules and the cost model.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tpuanalyze.generator.cost_model import StepCosts, allreduce_ms, step_costs
from tpuanalyze.generator.ground_truth import BREAKDOWN_KEYS, TruthAccumulator
from tpuanalyze.generator.program import Program, build_eval_program, build_train_program
from tpuanalyze.generator.run_writer import PS_PER_MS, HostWriter, write_hosts
from tpuanalyze.generator.scenarios import SCENARIOS, Scenario, get_scenario
from tpuanalyze.generator.timeline import nominal_step_ms, simulate
from tpuanalyze.generator.topology import Topology, topology_for
from tpuanalyze.generator.visibility import check_visibility
from tpuanalyze.generator.workloads import MODELS, Model, Preset, at_scale_config, config_for, get_model
from tpuanalyze.generator.xspace_writer import build_run_metadata

from tpuanalyze.errors import TpuAnalyzeError

__all__ = ["generate", "MODELS", "SCENARIOS", "plan_run", "RunPlan"]


def _program_id(*parts: str) -> int:
    text = "/".join(parts)
    return (zlib.crc32(text.encode()) << 32) | zlib.crc32(text[::-1].encode())


def _sample_hosts(total: int, k: int, must: list[int]) -> list[int]:
    """k hosts spread over the slice, always including host 0 and any straggler."""
    picked = set(must)
    for h in np.linspace(0, total - 1, num=k).round().astype(int):
        if len(picked) >= k:
            break
        picked.add(int(h))
    h = 0
    while len(picked) < k:
        picked.add(h)
        h += 1
    return sorted(picked)


def _validate(model: str, chips: int, steps: int, hosts: int | None, scenario: str):
    m = get_model(model)
    topo = topology_for(chips)
    scen = get_scenario(scenario)
    if steps < 1:
        raise TpuAnalyzeError(f"--steps must be at least 1 (got {steps})")
    if hosts is not None and not 1 <= hosts <= topo.hosts:
        raise TpuAnalyzeError(f"--hosts must be between 1 and {topo.hosts} for {chips} chips (got {hosts})")
    return m, topo, scen


class RunPlan(NamedTuple):
    """The modelled configuration of a run, before any per-core simulation."""

    model: Model
    config: Preset
    topology: Topology
    scenario: Scenario
    costs: StepCosts
    train: Program
    evalp: Program
    nominal_step_ms: float


def plan_run(model: str, chips: int, scenario: str = "baseline", steps: int = 10) -> RunPlan:
    """The configuration, costs and programs of a run without writing anything (calibration, tests)."""
    m, topo, scen = _validate(model, chips, steps, None, scenario)
    cfg = config_for(model, chips)
    if scen.at_scale:
        cfg = at_scale_config(model, chips, cfg)
    costs = step_costs(m, cfg, topo, scen)
    train = build_train_program(m, costs, topo, scen, _program_id(model, scenario, "train"))
    nominal = nominal_step_ms(train, topo.cores, costs.partition)
    # not distributed (catalog §3.10): the device waits while host-side metric code runs, 2.5 steps [est]
    host_metric_ms = 0.0 if scen.eval_distributed else 2.5 * nominal
    evalp = build_eval_program(m, costs, topo, scen, _program_id(model, scenario, "eval"), host_metric_ms)
    return RunPlan(m, cfg, topo, scen, costs, train, evalp, nominal)


def generate(
    model: str,
    chips: int,
    steps: int = 10,
    hosts: int | None = None,
    scenario: str = "baseline",
    seed: int = 0,
    out: Path | str = Path("."),
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> Path:
    """Model every host of the slice, write `hosts` of them (default all) as real XSpace files, and
    `ground_truth.json` computed from the written op intervals. Returns the run folder.

    workers: processes writing hosts in parallel (default: up to 4 CPUs when 16+ hosts are written);
    the output is the same bytes either way."""
    t_start = time.perf_counter()
    _validate(model, chips, steps, hosts, scenario)
    m, cfg, topo, scen, costs, train, evalp, nominal = plan_run(model, chips, scenario, steps)
    rng = np.random.default_rng(seed)

    straggler = (
        int(rng.integers(1, topo.hosts))
        if scen.straggler and topo.hosts > 1
        else (0 if scen.straggler else None)
    )
    periods = np.full(topo.hosts, costs.host_period_ms)
    if scen.host_input_ratio is not None:  # catalog §3.8: the host pipeline is slower than the step
        periods[:] = scen.host_input_ratio * nominal
    if straggler is not None:
        periods[straggler] = 1.5 * nominal
    host_gap = None if scen.device_loop else 2.0 + 0.06 * nominal  # catalog §3.7: per-step host launch
    eval_every = scen.eval_every if steps > scen.eval_every else 0

    n_write = topo.hosts if hosts is None else hosts
    written_hosts = _sample_hosts(topo.hosts, n_write, [0] + ([straggler] if straggler is not None else []))
    cph = topo.cores_per_host
    keep = np.concatenate([np.arange(h * cph, (h + 1) * cph) for h in written_hosts])
    sched = simulate(
        train,
        evalp,
        cores=topo.cores,
        cores_per_host=cph,
        steps=steps,
        keep=keep,
        partition=costs.partition,
        host_period_ms=periods,
        host_gap_ms=host_gap,
        eval_every=eval_every,
        straggler_host=straggler,
        rng=rng,
    )

    lead_ms = float(periods.max()) + 1.0  # room for the host's prefetch of step 0
    run_name = f"{model}_{topo.name}_{scenario}_seed{seed}"
    run_dir = Path(out) / "plugins" / "profile" / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in list(run_dir.glob("*.xplane.pb")) + list(run_dir.glob("*.op_stats*.pb")):
        old.unlink()  # earlier hosts and XProf's cached analysis of them

    meta = build_run_metadata(train, evalp, steps)
    step_starts = np.round((np.array(sched.step_starts) + lead_ms) * PS_PER_MS).astype(np.int64)
    step_ends = np.round((np.array(sched.step_ends) + lead_ms) * PS_PER_MS).astype(np.int64)
    step_bounds = np.stack([step_starts, step_ends], axis=1)
    truth = TruthAccumulator(step_bounds, int(step_ends[-1] - step_starts[0]))
    info = {
        "generator": "tpuanalyze.generator",
        "model": m.name,
        "scenario": scen.name,
        "num_chips": topo.chips,
        "num_cores": topo.cores,
        "num_hosts": topo.hosts,
        "global_batch_size": int(round(costs.per_core_batch * topo.cores)),
        "per_core_batch": float(costs.per_core_batch),
        "num_partitions": int(costs.partition),
        "seed": int(seed),
    }
    writer = HostWriter(
        run_dir=run_dir,
        slice_name=topo.name,
        cores_per_host=topo.cores_per_host,
        steps=steps,
        train=train,
        evalp=evalp,
        sched=sched,
        meta=meta,
        lead_ms=lead_ms,
        step_starts=step_starts,
        step_ends=step_ends,
        periods=periods,
        host_gap=host_gap,
        scen=scen,
        info=info,
    )
    categories = writer.categories
    cat_time_ps = np.zeros(len(categories))
    infeed_ps: list[float] = []
    bytes_written = 0
    for done, result in enumerate(write_hosts(writer, written_hosts, workers), start=1):
        truth.add_sweep(result.host, list(range(topo.cores_per_host)), result.sweep)
        cat_time_ps += result.category_time_ps
        infeed_ps.extend(result.infeed_ps)
        bytes_written += result.bytes_written
        if progress is not None:
            progress(done, len(written_hosts))

    res = truth.result()
    op_ms = {c: float(cat_time_ps[i]) / PS_PER_MS / truth.cores / steps for i, c in enumerate(categories)}
    visibility = check_visibility(
        res["exposed_by_kind"],
        scen,
        res["mean"],
        op_ms,
        infeed_ps,
        train,
        costs,
        host_processing=scen.host_processing_share,
    )
    step_ms = float(np.mean(step_ends - step_starts)) / PS_PER_MS
    gt = {
        "step_time_ms": step_ms,
        "breakdown": {k: res["mean"][k] for k in BREAKDOWN_KEYS},
        "collectives_overlapped": res["mean"]["collectives_overlapped"],
        # exposed collective time by hlo_category (sums to breakdown.collectives)
        "collectives_exposed_by_kind": res["exposed_by_kind"],
        "breakdown_min": {k: res["min"][k] for k in BREAKDOWN_KEYS},
        "breakdown_max": {k: res["max"][k] for k in BREAKDOWN_KEYS},
        "scenario": scen.name,
        "scenario_description": scen.description,
        # rules the scenario injects and that its effect makes visible by the catalog's thresholds
        # (a rule can be physically invisible, e.g. straggler max/avg infeed with < 3 hosts written)
        "scenario_rules": list(scen.injected_rules),
        "injected_rules": [r for r in scen.injected_rules if visibility[r]["visible"]],
        "expected_rules": [r for r in scen.injected_rules + scen.secondary_rules if visibility[r]["visible"]],
        "model": {
            "name": m.name,
            "title": m.title,
            "chips": topo.chips,
            "cores": topo.cores,
            "hosts": topo.hosts,
            "cores_per_host": cph,
            "slice": topo.name,
            "torus": [topo.x, topo.y],
            "wraparound": [topo.wrap_x, topo.wrap_y],
            "global_batch": info["global_batch_size"],
            "per_core_batch": costs.per_core_batch,
            "partition": costs.partition,
            "params": m.params,
            "train_flops_per_example": m.train_flops_per_example,
            "optimizer": m.optimizer,
            "preset": cfg.source,
            "mlperf_round": cfg.round,
            "published_step_ms": cfg.published_step_ms,
        },
        "techniques": {
            k: v for k, v in vars(scen).items() if k not in ("name", "description", "injected_rules")
        },
        "cost_model": {
            "efficiency": costs.efficiency,
            "compute_ms": costs.compute_ms,
            "weight_update_ms": costs.weight_update_ms,
            "gradient_bytes": costs.grad_bytes,
            "allreduce_ms_full": allreduce_ms(costs.grad_bytes, topo, "2d-concurrent"),
            "nominal_step_ms": nominal,
            "host_input_period_ms": float(np.median(periods)),
            "host_gap_ms": host_gap or 0.0,
            "eval_every": eval_every,
        },
        "steps": steps,
        "eval_runs": len(sched.eval_spans),
        "straggler_host": None if straggler is None else f"{topo.name}-w-{straggler}",
        "hosts_written": [f"{topo.name}-w-{h}" for h in written_hosts],
        "cores_written": truth.cores,
        "seed": seed,
        "per_step": res["per_step"],
        "op_time_ms_per_step": op_ms,
        "visibility": visibility,
        "per_core": truth.per_core if truth.cores <= 1024 else None,
        "bytes_written": bytes_written,
        "generate_seconds": time.perf_counter() - t_start,
    }
    (run_dir / "ground_truth.json").write_text(json.dumps(gt, indent=1))
    return run_dir
