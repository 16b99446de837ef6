"""Generator of realistic TPU-v3 pod traces (XSpace, laid out like a real capture) with exact ground truth.

    from tpuanalyze.generator import generate
    run_dir = generate("resnet50", chips=32, steps=10, scenario="input-bound", out=Path("logdir"))

See docs/generator.md for the trace layout, the recognition rules and the cost model.
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import numpy as np
from tpuanalyze.generator.cost_model import allreduce_ms, step_costs
from tpuanalyze.generator.ground_truth import BREAKDOWN_KEYS, CATEGORIES, TruthAccumulator
from tpuanalyze.generator.program import build_eval_program, build_train_program
from tpuanalyze.generator.scenarios import SCENARIOS, get_scenario
from tpuanalyze.generator.timeline import nominal_step_ms, simulate
from tpuanalyze.generator.topology import topology_for
from tpuanalyze.generator.visibility import check_visibility
from tpuanalyze.generator.workloads import MODELS, at_scale_config, config_for, get_model
from tpuanalyze.generator.xspace_writer import (
    LINE_ASYNC,
    LINE_MODULES,
    LINE_OPS,
    LINE_STEPS,
    SID,
    build_run_metadata,
    device_line_events,
    device_plane_header,
    host_cpu_plane,
    line_bytes,
    metadata_plane,
    write_space,
)

from tpuanalyze.errors import TpuAnalyzeError

__all__ = ["generate", "MODELS", "SCENARIOS", "plan_run"]

T0_NS = (
    1_000_000_000  # line timestamp: ns since the profiler session start (ps since the epoch overflow int64)
)
PS_PER_MS = 1_000_000_000
KIND_INDEX = {name: i for i, name in enumerate(CATEGORIES)}


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


def plan_run(model: str, chips: int, scenario: str = "baseline", steps: int = 10):
    """The modelled configuration without writing anything: (model, config, topology, scenario, costs,
    train program, eval program, nominal device step ms). Used by calibration and tests."""
    m, topo, scen = _validate(model, chips, steps, None, scenario)
    cfg = config_for(model, chips)
    if scen.at_scale:
        cfg = at_scale_config(model, chips, cfg)
    costs = step_costs(m, cfg, topo, scen)
    train = build_train_program(m, costs, topo, scen, _program_id(model, scenario, "train"))
    evalp0 = build_eval_program(m, costs, topo, scen, _program_id(model, scenario, "eval"), 0.0)
    nominal = nominal_step_ms(train, topo.cores, costs.partition)
    evalp = (
        evalp0
        if scen.eval_distributed
        else build_eval_program(m, costs, topo, scen, _program_id(model, scenario, "eval"), 2.5 * nominal)
    )  # host-side metric code
    return m, cfg, topo, scen, costs, train, evalp, nominal


def generate(
    model: str,
    chips: int,
    steps: int = 10,
    hosts: int | None = None,
    scenario: str = "baseline",
    seed: int = 0,
    out: Path | str = Path("."),
    progress=None,
) -> Path:
    """Model every host of the slice, write `hosts` of them (default all) as real XSpace files, and
    `ground_truth.json` computed from the written op intervals. Returns the run folder."""
    t_start = time.perf_counter()
    m, topo, scen = _validate(model, chips, steps, hosts, scenario)
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
    wall_ps = int(step_ends[-1] - step_starts[0])
    truth = TruthAccumulator(step_bounds, wall_ps)

    n_train, n_eval = len(train.ops), len(evalp.ops)
    train_kinds = np.array([KIND_INDEX[o.kind] for o in train.ops])
    eval_kinds = np.array([KIND_INDEX[o.kind] for o in evalp.ops])
    bytes_written = 0
    categories = sorted({o.category for o in train.ops})
    train_cat_index = np.array([categories.index(o.category) for o in train.ops])
    cat_time_ps = np.zeros(len(categories))
    infeed_ps: list[float] = []
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
    for i, host in enumerate(written_hosts):
        cols = slice(i * cph, (i + 1) * cph)
        hostname = f"{topo.name}-w-{host}"
        ops_md, ops_s, ops_e, ops_grp, ops_pres, gt_cat = [], [], [], [], [], []
        as_md, as_s, as_e, as_grp, as_pres = [], [], [], [], []
        mod_md, mod_s, mod_e, mod_grp, mod_pres = [], [], [], [], []
        for seg in sched.segments:
            is_train = seg.program == 0
            base = meta.train_base if is_train else meta.eval_base
            n = n_train if is_train else n_eval
            s = np.round((seg.starts[:, cols] + lead_ms) * PS_PER_MS).astype(np.int64)
            e = np.round((seg.starts[:, cols] + seg.durs[:, cols] + lead_ms) * PS_PER_MS).astype(np.int64)
            ops_md.append(base + np.arange(n))
            ops_s.append(s)
            ops_e.append(e)
            ops_grp.append(np.full(n, seg.step))
            ops_pres.append(np.full(n, is_train))
            gt_cat.append(train_kinds if is_train else eval_kinds)
            if len(seg.async_ops):
                a_s = np.round((seg.async_starts[:, cols] + lead_ms) * PS_PER_MS).astype(np.int64)
                a_e = np.round((seg.async_ends[:, cols] + lead_ms) * PS_PER_MS).astype(np.int64)
                a_e = np.minimum(a_e, step_ends[-1])  # the capture stops at the last step's end
                as_md.append(base + np.array(seg.async_ops))
                as_s.append(a_s)
                as_e.append(a_e)
                as_grp.append(np.full(len(seg.async_ops), seg.step))
                as_pres.append(np.full(len(seg.async_ops), is_train))
            mod_md.append(np.array([meta.module_train if is_train else meta.module_eval]))
            mod_s.append(s[:1])
            mod_e.append(e[-1:])
            mod_grp.append(np.array([seg.step]))
            mod_pres.append(np.array([is_train]))
        o_s, o_e = np.concatenate(ops_s), np.concatenate(ops_e)
        o_md, o_grp, o_pres = np.concatenate(ops_md), np.concatenate(ops_grp), np.concatenate(ops_pres)
        a_s = np.concatenate(as_s) if as_s else np.empty((0, cph), np.int64)
        a_e = np.concatenate(as_e) if as_e else np.empty((0, cph), np.int64)
        m_s, m_e = np.concatenate(mod_s), np.concatenate(mod_e)
        m_md, m_pres = np.concatenate(mod_md), np.concatenate(mod_pres)

        # ground truth from exactly these intervals (+ eval program spans)
        eval_rows = ~m_pres
        gt_s = np.concatenate([o_s, a_s, m_s[eval_rows]])
        gt_e = np.concatenate([o_e, a_e, m_e[eval_rows]])
        gt_c = np.concatenate(
            gt_cat
            + [
                np.full(a_s.shape[0], KIND_INDEX["collectives"]),
                np.full(int(eval_rows.sum()), KIND_INDEX["eval"]),
            ]
        )
        truth.add(host, list(range(cph)), gt_s, gt_e, gt_c)
        # op time per hlo_category in train steps (XLA Ops line), for the visibility checks
        train_rows = o_pres & (o_md < meta.train_base + n_train)
        cat_idx = train_cat_index[o_md[train_rows] - meta.train_base]
        np.add.at(cat_time_ps, cat_idx, (o_e - o_s)[train_rows].sum(axis=1))
        infeed_rows = train_rows & (o_md == meta.train_base)
        infeed_ps.extend((o_e - o_s)[infeed_rows].sum(axis=0).tolist())

        ops_lines = device_line_events(o_md, o_s, o_e - o_s, o_grp, o_pres)
        async_lines = device_line_events(
            np.concatenate(as_md) if as_md else np.empty(0, np.int64),
            a_s,
            a_e - a_s,
            np.concatenate(as_grp) if as_grp else np.empty(0, np.int64),
            np.concatenate(as_pres) if as_pres else None,
        )
        run_ids = np.arange(len(m_md)) + 1
        mod_lines = device_line_events(
            m_md, m_s, m_e - m_s, np.concatenate(mod_grp), m_pres, [(SID["run_id"], run_ids, None)]
        )
        st_md = meta.step_base + np.arange(steps)
        st_s = np.repeat(step_starts[:, None], cph, axis=1)
        st_d = np.repeat((step_ends - step_starts)[:, None], cph, axis=1)
        step_lines = device_line_events(
            st_md, st_s, st_d, np.arange(steps), None, [(SID["step_num"], np.arange(steps), None)]
        )
        planes = []
        for c in range(cph):
            global_core = host * cph + c
            body = (
                line_bytes(LINE_STEPS, "Steps", T0_NS, step_lines[c])
                + line_bytes(LINE_MODULES, "XLA Modules", T0_NS, mod_lines[c])
                + line_bytes(LINE_OPS, "XLA Ops", T0_NS, ops_lines[c])
                + line_bytes(LINE_ASYNC, "Async XLA Ops", T0_NS, async_lines[c])
            )
            planes.append(device_plane_header(c, hostname, global_core) + meta.bytes_ + body)
        cpu = host_cpu_plane(
            list(np.array(sched.step_starts) + lead_ms),
            list(np.array(sched.step_ends) + lead_ms),
            float(periods[host]),
            scen.host_processing_share,
            cph,
            host_gap,
            T0_NS,
            [(k, s + lead_ms, e + lead_ms) for k, s, e in sched.eval_spans],
            scen.eval_distributed,
        )
        planes.append(cpu.SerializeToString())
        planes.append(metadata_plane({**info, "host_index": int(host)}).SerializeToString())
        bytes_written += write_space(run_dir / f"{hostname}.xplane.pb", hostname, planes)
        if progress is not None:
            progress(i + 1, len(written_hosts))

    res = truth.result()
    op_ms = {c: float(cat_time_ps[i]) / PS_PER_MS / truth.cores / steps for i, c in enumerate(categories)}
    visibility = check_visibility(
        scen, res["mean"], op_ms, infeed_ps, train, costs, host_processing=scen.host_processing_share
    )
    step_ms = float(np.mean(step_ends - step_starts)) / PS_PER_MS
    gt = {
        "step_time_ms": step_ms,
        "breakdown": {k: res["mean"][k] for k in BREAKDOWN_KEYS},
        "collectives_overlapped": res["mean"]["collectives_overlapped"],
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
