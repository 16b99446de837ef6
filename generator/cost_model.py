"""Cost model [est]: compute from FLOPs and efficiency, collectives from an alpha-beta model of the
2-D torus (catalog §2), the optimizer from HBM traffic, input from host throughput. Times in ms."""

from __future__ import annotations

from dataclasses import dataclass

from tpuanalyze.generator.scenarios import Scenario
from tpuanalyze.generator.topology import (
    DCN_GBPS_PER_HOST,
    HBM_GBPS_PER_CORE,
    ICI_GBPS_PER_LINK,
    PEAK_TFLOPS_PER_CORE,
    Topology,
)
from tpuanalyze.generator.workloads import Model, Preset

ALPHA_US = 1.0  # catalog §2: alpha ~1-5 us per hop; the MLPerf runs used the low end
OP_OVERHEAD_US = 1.5  # fixed cost per HLO op (pipeline fill, DMA issue) [est]
HBM_EFFICIENCY = 0.7  # fraction of HBM peak the optimizer fusions reach over many tensors [est]


def _ring_phase_ms(nbytes: float, n: int, wrap: bool, concurrent: bool, reduce_scatter: bool = True) -> float:
    """One reduce-scatter (or all-gather) over a ring of n chips: (n-1)/n * M/B + (n-1)*alpha (catalog §2).

    A bidirectional ring moves data both ways (2 links); a non-wrapped axis costs ~2x (catalog §2);
    two concurrent schedules halve the bandwidth term (catalog §2).
    """
    if n <= 1:
        return 0.0
    bw = 2 * ICI_GBPS_PER_LINK * 1e9 * (2.0 if concurrent else 1.0)
    # a line (no wraparound) carries the ring's traffic twice over its links: ~2x on the bandwidth term
    # (catalog §2); pipelined both ways it still takes n-1 hops, so the latency term is unchanged [est]
    axis = 1.0 if wrap else 2.0
    return (axis * (n - 1) / n * nbytes / bw + (n - 1) * ALPHA_US * 1e-6) * 1e3


def reduce_scatter_ms(nbytes: float, topo: Topology, algo: str) -> float:
    """2-D reduce-scatter: along X on M bytes, then along Y on M/X."""
    if algo == "dcn":
        return dcn_allreduce_ms(nbytes, topo) / 2
    conc = algo == "2d-concurrent"
    return _ring_phase_ms(nbytes, topo.x, topo.wrap_x, conc) + _ring_phase_ms(
        nbytes / topo.x, topo.y, topo.wrap_y, conc
    )


def all_gather_ms(nbytes: float, topo: Topology, algo: str) -> float:
    """All-gather is the reduce-scatter run backwards: same cost."""
    return reduce_scatter_ms(nbytes, topo, algo)


def allreduce_ms(nbytes: float, topo: Topology, algo: str) -> float:
    """2-D torus all-reduce = reduce-scatter on X, all-reduce on Y, all-gather on X (catalog §2)."""
    if algo == "dcn":
        return dcn_allreduce_ms(nbytes, topo)
    return 2 * reduce_scatter_ms(nbytes, topo, algo)


def dcn_allreduce_ms(nbytes: float, topo: Topology) -> float:
    """Ring all-reduce between hosts over the data-center network, ~25 GB/s per host (catalog §2)."""
    hosts = max(topo.hosts, 2)
    per_host = nbytes * topo.chips_per_host  # every chip's gradients leave the host
    return (2 * (hosts - 1) / hosts * per_host / (DCN_GBPS_PER_HOST * 1e9) + 2 * (hosts - 1) * 10e-6) * 1e3


def latency_allreduce_ms(topo: Topology) -> float:
    """The latency floor of one 2-D all-reduce: 2(n-1) alpha per axis (catalog §2)."""
    return allreduce_ms(0.0, topo, "2d")


@dataclass(frozen=True)
class StepCosts:
    """Per-core costs of one training step, before per-core jitter (ms unless named otherwise)."""

    per_core_batch: float  # examples per core (fraction when partitioned or capped)
    padded_batch: float  # examples a core actually computes on (>= 1 when capped without partitioning)
    partition: int
    units_per_core: float
    efficiency: float
    compute_ms: float  # forward + backward op time, excluding the fixed per-op overhead
    fwd_flops_per_core: float
    grad_bytes: float  # gradient bytes per replica in the reduction dtype
    weight_update_ms: float
    wu_params_per_core: float
    infeed_ms: float
    outfeed_ms: float
    examples_per_host: float
    host_period_ms: float  # host input pipeline time per step (model's throughput)
    eval_ms: float
    eval_examples_per_core: float


def step_costs(model: Model, cfg: Preset, topo: Topology, scen: Scenario) -> StepCosts:
    """Per-core costs of one step for a configuration and scenario."""
    cores = topo.cores
    partition = cfg.partition
    global_batch = cfg.global_batch
    if scen.data_parallel_limit:  # catalog §3.1: batch capped below the core count, no partitioning
        global_batch = max(1, cores // 4)
        partition = 1
    elif scen.partition_factor > 1:
        partition = min(cores, max(4, partition * scen.partition_factor))
    per_core = global_batch / cores
    replicas = cores // partition
    per_replica = global_batch / replicas
    padded = max(per_replica, 1.0) / partition if partition > 1 else max(per_core, 1.0)
    units = padded * model.units_per_example
    eff = model.efficiency(units)
    fwd_flops = model.train_flops_per_example / 3 * padded
    compute_ms = model.train_flops_per_example * padded / (PEAK_TFLOPS_PER_CORE * 1e12 * eff) * 1e3

    dtype_bytes = 4 if scen.grad_dtype == "f32" else 2
    grad_bytes = model.params * dtype_bytes / partition
    # catalog §3.2: the sharded update touches params / replicas on each core
    wu_params = model.params / partition / (replicas if scen.wu_sharded else 1)
    wu_ms = wu_params * model.wu_bytes_per_param / (HBM_GBPS_PER_CORE * 1e9 * HBM_EFFICIENCY) * 1e3

    infeed_bytes = padded * model.input_bytes_per_example  # a partitioned core gets its slice
    infeed_ms = 0.015 + infeed_bytes / 50e9 * 1e3  # dequeue of prefetched data [est]
    outfeed_ms = 0.008
    examples_per_host = global_batch / topo.hosts
    host_period_ms = examples_per_host / model.host_examples_per_s * 1e3

    # one execution of the distributed eval step (catalog §3.10): the forward pass of a per-core batch;
    # the eval loop runs eval_examples / global batch of them, the profile window catches one
    eval_per_core = padded
    eval_ms = compute_ms / 3
    return StepCosts(
        per_core_batch=per_core,
        padded_batch=padded,
        partition=partition,
        units_per_core=units,
        efficiency=eff,
        compute_ms=compute_ms,
        fwd_flops_per_core=fwd_flops,
        grad_bytes=grad_bytes,
        weight_update_ms=wu_ms,
        wu_params_per_core=wu_params,
        infeed_ms=infeed_ms,
        outfeed_ms=outfeed_ms,
        examples_per_host=examples_per_host,
        host_period_ms=host_period_ms,
        eval_ms=eval_ms,
        eval_examples_per_core=eval_per_core,
    )
