"""Scenarios: which catalog techniques are on. `baseline` is the MLPerf run; each other scenario switches
one technique off (or injects one fault) and is named by the rule id it should trigger (catalog §3)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpuanalyze.errors import TpuAnalyzeError


@dataclass(frozen=True)
class Scenario:
    """Technique switches the cost model and timeline read; defaults are the MLPerf baseline."""

    name: str = "baseline"
    description: str = "as run in MLPerf: every catalog technique on"
    injected_rules: tuple[str, ...] = ()
    # rules the injected bottleneck may also trip as a consequence (listed in ground truth when visible)
    secondary_rules: tuple[str, ...] = ()
    grad_dtype: str = "bf16"  # catalog §3.4
    grad_buckets: int = 4  # combined gradient collectives (catalog §3.5); 0 = one per tensor
    overlap: bool = True  # async gradient collectives overlapped with backward (catalog §3.5)
    wu_sharded: bool = True  # reduce-scatter + sharded update + all-gather (catalog §3.2)
    allreduce_algo: str = "2d-concurrent"  # catalog §2: 2-D torus, two concurrent schedules; or "2d", "dcn"
    host_input_ratio: float | None = None  # host input period / device step; None = the model's pipeline
    host_processing_share: float = 0.45  # host input time in Iterator:: processing (rest is enqueue)
    eval_every: int = 5  # steps between evaluations in the profiled window
    eval_distributed: bool = True  # catalog §3.10
    device_loop: bool = True  # catalog §3.7
    straggler: bool = False
    outfeed_share: float = 0.0  # extra per-step outfeed, as a share of the nominal device step
    partition_factor: int = 1  # multiplies the preset's partitioning (catalog §3.1)
    halo_scale: float = 1.0  # halo-exchange cost multiplier
    data_parallel_limit: bool = False  # global batch capped below the core count, no partitioning
    space_to_depth: bool = True  # catalog §3.9
    formatting_share: float = 0.0  # device-side copy/transpose time as a share of compute
    at_scale: bool = False  # run at the model's largest-scale per-core batch (see workloads.at_scale_config)


_BASE = Scenario()

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _BASE,
        replace(
            _BASE,
            name="input-bound",
            injected_rules=("input-bound",),
            description="host input pipeline delivers 1/1.6 of what the TPU consumes; enqueue-heavy "
            "(no background infeed threads), catalog §3.8 off",
            host_input_ratio=1.6,
            host_processing_share=0.4,
        ),
        replace(
            _BASE,
            name="host-input-processing",
            injected_rules=("host-input-processing",),
            secondary_rules=("input-bound",),
            description="decode and augmentation on the host bound the step (no cached decoded records, "
            "no fused decode-and-crop), catalog §3.8",
            host_input_ratio=1.25,
            host_processing_share=0.85,
        ),
        replace(
            _BASE,
            name="outfeed-bound",
            injected_rules=("outfeed-bound",),
            description="per-example predictions and summaries outfed every step (catalog §3.10)",
            outfeed_share=0.45,
        ),
        replace(
            _BASE,
            name="f32-gradient-allreduce",
            injected_rules=("f32-gradient-allreduce",),
            secondary_rules=("collective-bound",),
            description="gradients summed in f32 in one collective after backward (catalog §3.4 off)",
            grad_dtype="f32",
            grad_buckets=1,
            overlap=False,
            at_scale=True,
        ),
        replace(
            _BASE,
            name="latency-bound-collectives",
            injected_rules=("latency-bound-collectives",),
            secondary_rules=("weight-update-unsharded", "collective-bound"),
            description="one small all-reduce per gradient tensor, no combining (catalog §3.5 off); "
            "the replicated update follows",
            grad_buckets=0,
            wu_sharded=False,
            at_scale=True,
        ),
        replace(
            _BASE,
            name="collective-bound",
            injected_rules=("collective-bound",),
            description="gradient all-reduce over the data-center network instead of the ICI torus, "
            "not overlapped (catalog §3.3)",
            allreduce_algo="dcn",
            overlap=False,
            grad_buckets=1,
            at_scale=True,
        ),
        replace(
            _BASE,
            name="weight-update-unsharded",
            injected_rules=("weight-update-unsharded",),
            description="one all-reduce and the optimizer update repeated on every replica "
            "(catalog §3.2 off)",
            wu_sharded=False,
            at_scale=True,
        ),
        replace(
            _BASE,
            name="eval-overhead",
            injected_rules=("eval-overhead",),
            description="evaluation not distributed: predictions outfed and metrics computed on the host "
            "while the TPUs wait (catalog §3.10 off)",
            eval_distributed=False,
        ),
        replace(
            _BASE,
            name="host-overhead",
            injected_rules=("host-overhead",),
            description="no on-device training loop: every step is launched from the host (catalog §3.7 off)",
            device_loop=False,
        ),
        replace(
            _BASE,
            name="straggler",
            injected_rules=("straggler",),
            secondary_rules=("input-bound", "collective-bound"),
            description="one host's input pipeline is 1.5x slower than the step; every other core waits "
            "in the gradient collective (catalog §3.3, §3.8)",
            straggler=True,
        ),
        replace(
            _BASE,
            name="data-parallel-limit",
            injected_rules=("data-parallel-limit",),
            secondary_rules=("collective-bound",),
            description="global batch capped at a quarter of the cores, data parallel only: "
            "0.25 examples per core padded to 1 (catalog §3.1, §3.13)",
            data_parallel_limit=True,
        ),
        replace(
            _BASE,
            name="partition-overhead",
            injected_rules=("partition-overhead",),
            secondary_rules=("collective-bound",),
            description="over-partitioned (twice the preset's ways, at least 4): halo exchanges "
            "(collective-permute) dominate (catalog §3.1)",
            partition_factor=2,
            halo_scale=6.0,
            at_scale=True,
        ),
        replace(
            _BASE,
            name="data-formatting",
            injected_rules=("data-formatting",),
            description="no space-to-depth and NCHW layouts: device-side transposes/copies and a "
            "wasteful first convolution (catalog §3.9 off)",
            space_to_depth=False,
            formatting_share=0.5,
        ),
    )
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise TpuAnalyzeError(f"unknown scenario {name!r} (choose from {', '.join(SCENARIOS)})") from None
