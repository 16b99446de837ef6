"""The compiled programs as op lists: the train step (infeed, forward, backward with gradient
collectives, weight update, outfeed) and the eval step, each op with its HLO text and XProf stats.

How an analyzer recognises each kind is fixed here and documented in docs/generator.md:
weight update = `tf_op` contains "/optimizer/"; infeed/outfeed = hlo_category "infeed"/"outfeed";
collectives = hlo_category in COLLECTIVE_CATEGORIES; eval = ops of the `jit_eval_step` program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpuanalyze.generator.cost_model import (
    StepCosts,
    all_gather_ms,
    allreduce_ms,
    reduce_scatter_ms,
)
from tpuanalyze.generator.scenarios import Scenario
from tpuanalyze.generator.topology import Topology
from tpuanalyze.generator.workloads import Model, OpRecipe

COLLECTIVE_CATEGORIES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
AG_BUCKET_BASE = 1000  # bucket ids of the weight all-gathers (they finish in the next step)
KINDS = ("weight_update", "compute", "collectives", "input", "output")  # attribution priority order


@dataclass
class Op:
    """One HLO op of a program as the timeline schedules it and the writer names it."""

    short: str  # display name, e.g. "fusion.12"
    hlo: str  # HLO text (event metadata name)
    category: str  # XProf hlo_category
    kind: str  # attribution kind (KINDS)
    tf_op: str
    shape: str
    flops: int
    bytes_accessed: int
    base_ms: float
    role: str  # compute | fixed | infeed | async_start | async_done | sync_global | sync_group
    comm_ms: float = 0.0
    bucket: int = -1


@dataclass
class Program:
    name: str  # jit_train_step / jit_eval_step
    program_id: int
    ops: list[Op] = field(default_factory=list)


class _Namer:
    """Numbers ops per stem the way XLA does (fusion, fusion.1, ...)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, stem: str) -> str:
        n = self.counts.get(stem, 0)
        self.counts[stem] = n + 1
        return stem if n == 0 else f"{stem}.{n}"


def _layout(shape: str) -> str:
    dims = shape[shape.index("[") + 1 : shape.index("]")]
    rank = len(dims.split(",")) if dims else 0
    return f"{shape}{{{','.join(str(i) for i in reversed(range(rank)))}}}"


def _activation_shape(model: Model, layer: int, batch: int) -> str:
    if model.units_per_example == 1.0:  # CNN: spatial size halves per stage
        stage = min(3, layer * 4 // max(model.layers, 1))
        return f"bf16[{batch},{56 >> stage},{56 >> stage},{256 << stage}]"
    return f"bf16[{batch},{int(model.units_per_example)},1024]"


def _hlo(short: str, shape: str, opcode: str, operands: str, extra: str = "") -> str:
    text = f"%{short} = {_layout(shape)} {opcode}({operands})"
    return f"{text}, {extra}" if extra else text


def _op_from_recipe(
    namer: _Namer,
    r: OpRecipe,
    model: Model,
    layer: int,
    batch: int,
    time_ms: float,
    flops: float,
    tf_op: str,
    suffix: str = "",
) -> Op:
    short = namer(r.stem)
    shape = _activation_shape(model, layer, batch)
    opcode = "fusion" if r.stem == "fusion" else r.stem
    kind_attr = "kind=kOutput" if r.category == "convolution fusion" else "kind=kLoop"
    extra = f"{kind_attr}, calls=%fused_computation.{short.split('.')[-1]}" if opcode == "fusion" else ""
    if opcode == "convolution":
        extra = "window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f"
    operands = (
        f"{_layout(shape)} %param.{layer}" if opcode != "while" else f"(s32[], {_layout(shape)}) %tuple"
    )
    # conv/matmul fusions: ~60 FLOP per HBM byte; elementwise: streaming at ~85% of 450 GB/s [est]
    mem = flops / 60 if flops > 1e6 else time_ms * 1e-3 * 380e9
    return Op(
        short,
        _hlo(short, shape, opcode, operands, extra),
        r.category,
        "compute",
        tf_op + suffix,
        _layout(shape),
        int(flops),
        int(max(mem, 1024)),
        time_ms,
        "compute",
    )


def _layers(model: Model) -> list[tuple[int, OpRecipe, str]]:
    """(layer index, recipe, tf_op) for every forward op in order: stem, layers, head."""
    out: list[tuple[int, OpRecipe, str]] = [(0, r, r.tf_op) for r in model.stem_ops]
    for i in range(model.layers):
        layer = model.layer_name.format(i=i)
        out += [(i, r, r.tf_op.format(layer=layer)) for r in model.recipe]
    out += [(model.layers - 1, r, r.tf_op) for r in model.head_ops]
    return out


def _bucket_shares(buckets: int) -> list[tuple[float, float]]:
    """(issue position in backward, share of gradient bytes) per combined bucket.

    Gradients become ready in reverse layer order and the late layers hold most parameters, so the
    ready share grows like sqrt(position) [est]."""
    return [
        ((g + 1) / buckets, math.sqrt((g + 1) / buckets) - math.sqrt(g / buckets)) for g in range(buckets)
    ]


def _forward_bucket_shares(buckets: int) -> list[tuple[float, float]]:
    """(position in forward where the bucket is first needed, share of weights), mirror of the above."""
    return [
        (g / buckets, math.sqrt(1 - g / buckets) - math.sqrt(1 - (g + 1) / buckets)) for g in range(buckets)
    ]


def _tensor_shares(n: int) -> list[tuple[float, float]]:
    """Per-tensor gradients (no combining): one weight matrix/kernel for every two bias or norm vectors
    (ResNet-50: 54 kernels, 107 batch-norm vectors; BERT: 6 matrices per 10 vectors per layer)."""
    big_idx = [i for i in range(n) if i % 3 == 0]
    big = {i: 1.0 + 0.8 * math.sin(i * 1.7) ** 2 for i in big_idx}
    tiny = 1e-4 / max(n - len(big_idx), 1)
    total = sum(big.values()) / (1 - 1e-4)
    return [((i + 1) / n, big[i] / total if i in big else tiny) for i in range(n)]


def build_train_program(
    model: Model, costs: StepCosts, topo: Topology, scen: Scenario, program_id: int
) -> Program:
    """The train step as ops in execution order on one TensorCore."""
    prog = Program("jit_train_step", program_id)
    name = _Namer()
    batch = max(1, math.ceil(costs.padded_batch))
    layers = _layers(model)
    tw = sum(r.time_weight for _, r, _ in layers)
    fw = sum(r.flop_weight for _, r, _ in layers)
    fwd_ms = costs.compute_ms / 3
    conv0_boost = 6.0 if not scen.space_to_depth and model.units_per_example == 1.0 else 1.0
    p = costs.partition

    # halo exchange after each partitioned conv/matmul: a latency plus a surface-to-volume share of the
    # op's own time that grows with the number of partitions (catalog §3.1) [est]
    def halo_ms(op_ms: float) -> float:
        return scen.halo_scale * (0.0025 + 0.005 * (p - 1) * op_ms)

    # catalog §3.9: layout transposes around each layer's first op, forward and backward
    format_at = set()
    if scen.formatting_share > 0:
        seen: set[int] = set()
        for idx, (layer, _r, _t) in enumerate(_layers(model)):
            if layer not in seen:
                seen.add(layer)
                format_at.add(idx)
    n_format = 2 * len(format_at)
    fmt_ms = scen.formatting_share * costs.compute_ms / max(n_format, 1)

    infeed_shape = model.input_shape.format(b=batch)
    short = name("infeed")
    prog.ops.append(
        Op(
            short,
            _hlo(short, f"({infeed_shape}, token[])", "infeed", "token[] %after-all"),
            "infeed",
            "input",
            "input_pipeline/InfeedDequeueTuple",
            _layout(infeed_shape),
            0,
            int(costs.padded_batch * model.input_bytes_per_example),
            costs.infeed_ms,
            "infeed",
        )
    )

    def permute(tf_op: str, layer: int, op_ms: float) -> None:
        if p <= 1:
            return
        s = name("collective-permute")
        shape = _activation_shape(model, layer, batch)
        pairs = ",".join(f"{{{i},{(i + 1) % p}}}" for i in range(min(p, 4)))
        prog.ops.append(
            Op(
                s,
                _hlo(
                    s,
                    shape,
                    "collective-permute",
                    f"{_layout(shape)} %fusion",
                    f"source_target_pairs={{{pairs}}}",
                ),
                "collective-permute",
                "collectives",
                tf_op + "/halo_exchange",
                _layout(shape),
                0,
                int(halo_ms(op_ms) * 1e-3 * 50e9),
                0.0,
                "sync_group",
                comm_ms=halo_ms(op_ms),
            )
        )

    def formatting(tf_op: str, layer: int) -> None:
        s = name("copy" if layer % 2 else "transpose")
        shape = _activation_shape(model, layer, batch)
        prog.ops.append(
            Op(
                s,
                _hlo(
                    s,
                    shape,
                    s.split(".")[0],
                    f"{_layout(shape)} %fusion",
                    "dimensions={0,3,1,2}" if s.startswith("transpose") else "",
                ),
                "data formatting",
                "compute",
                tf_op + "/transpose",
                _layout(shape),
                0,
                int(fmt_ms * 1e-3 * 380e9),
                fmt_ms,
                "compute",
            )
        )

    algo = scen.allreduce_algo
    dtype = "f32" if scen.grad_dtype == "f32" else "bf16"
    # the gradient all-reduce runs over the replicas: one group per partition, written in XLA's iota form
    # over every device of the job (G groups of S devices), as a real capture's HLO text states it
    replicas = topo.cores // p
    groups = (f"replica_groups=[{p},{replicas}]<=[{replicas},{p}]T(1,0)" if p > 1
              else f"replica_groups=[1,{replicas}]<=[{replicas}]") + ", use_global_device_ids=true"

    def collective(
        opcode: str, category: str, nbytes: float, comm: float, role: str, bucket: int, tf_op: str
    ) -> Op:
        elems = max(1, int(nbytes / (4 if dtype == "f32" else 2)))
        shape = f"{dtype}[{elems}]"
        s = name(opcode)
        extra = f"channel_id={bucket + 1}, {groups}" + (", to_apply=%add" if "gather" not in opcode else "")
        return Op(
            s,
            _hlo(s, shape, opcode, f"{_layout(shape)} %fusion", extra),
            category,
            "collectives",
            tf_op,
            _layout(shape),
            elems if "gather" not in opcode else 0,
            int(nbytes),
            0.002 if role == "async_start" else 0.0,
            role,
            comm_ms=comm,
            bucket=bucket,
        )

    def done(start: Op) -> Op:
        opcode = start.hlo.split(" ")[3].split("(")[0].replace("-start", "-done")
        s = name(opcode)
        return Op(
            s,
            _hlo(s, start.shape.split("{")[0], opcode, f"{start.shape} %{start.short}"),
            start.category,
            "collectives",
            start.tf_op,
            start.shape,
            0,
            0,
            0.0,
            "async_done",
            bucket=start.bucket,
        )

    # catalog §3.2: with sharding, the updated weights are all-gathered in buckets after the update;
    # overlapped, each bucket's -done waits just before the next step's forward needs those layers
    # crossing into the next step needs one program around the steps: the on-device loop (catalog §3.7)
    sharded_async = scen.wu_sharded and scen.overlap and scen.device_loop
    ag_plan = _forward_bucket_shares(max(scen.grad_buckets, 1)) if sharded_async else []
    ag_done_at = {round(pos * len(layers)): g for g, (pos, _share) in enumerate(ag_plan)}
    ag_starts = [
        collective(
            "all-gather-start",
            "all-gather",
            costs.grad_bytes * share,
            all_gather_ms(costs.grad_bytes * share, topo, algo),
            "async_start",
            AG_BUCKET_BASE + g,
            f"train_step/all-gather_weights/bucket_{g}",
        )
        for g, (_pos, share) in enumerate(ag_plan)
    ]

    # forward
    for idx, (layer, r, tf_op) in enumerate(layers):
        if idx in ag_done_at:
            prog.ops.append(done(ag_starts[ag_done_at[idx]]))
        boost = conv0_boost if idx == 0 else 1.0
        t = fwd_ms * r.time_weight / tw * boost
        prog.ops.append(
            _op_from_recipe(
                name, r, model, layer, batch, t, costs.fwd_flops_per_core * r.flop_weight / fw, tf_op
            )
        )
        if r.backward_ops == 2:
            permute(tf_op, layer, t)
        if idx in format_at:
            formatting(tf_op, layer)

    # backward: reverse order, conv/matmul -> input-grad + weight-grad
    start = len(prog.ops)
    for idx, (layer, r, tf_op) in reversed(list(enumerate(layers))):
        boost = conv0_boost if idx == 0 else 1.0
        t = fwd_ms * r.time_weight / tw * boost
        fl = costs.fwd_flops_per_core * r.flop_weight / fw
        grad = "gradients/" + tf_op
        if r.backward_ops == 2:
            prog.ops.append(_op_from_recipe(name, r, model, layer, batch, t, fl, grad, "_grad_input"))
            permute(grad, layer, t)
            prog.ops.append(_op_from_recipe(name, r, model, layer, batch, t, fl, grad, "_grad_filter"))
        else:
            prog.ops.append(_op_from_recipe(name, r, model, layer, batch, 2 * t, fl, grad))
        if idx in format_at:
            formatting(grad, layer)
    bwd = prog.ops[start:]
    del prog.ops[start:]

    # gradient reduction (catalog §3.2-§3.5): reduce-scatter when sharded, else all-reduce
    kind = "reduce-scatter" if scen.wu_sharded else "all-reduce"
    cost = reduce_scatter_ms if scen.wu_sharded else allreduce_ms
    plan = (
        _tensor_shares(model.param_tensors) if scen.grad_buckets == 0 else _bucket_shares(scen.grad_buckets)
    )
    issue_at = [min(len(bwd), max(1, round(pos * len(bwd)))) for pos, _ in plan]
    label = "bucket" if scen.grad_buckets else "tensor"
    reductions = [
        collective(
            f"{kind}-start" if scen.overlap else kind,
            kind,
            costs.grad_bytes * share,
            cost(costs.grad_bytes * share, topo, algo),
            "async_start" if scen.overlap else "sync_global",
            g,
            f"gradients/{kind}/{label}_{g}",
        )
        for g, (_pos, share) in enumerate(plan)
    ]
    if scen.overlap:
        for i, op in enumerate(bwd):
            prog.ops.append(op)
            prog.ops += [c for c, at in zip(reductions, issue_at, strict=True) if at == i + 1]
        prog.ops += [done(c) for c in reductions]
    else:
        prog.ops += bwd + reductions

    # weight update (catalog §3.2): six fused optimizer passes over the (sharded) parameters
    passes = ("norm_weights", "norm_grads", "trust_ratio", "moments", "apply", "cast")
    wu_elems = max(1, int(costs.wu_params_per_core))
    for what in passes:
        s = name("fusion")
        shape = f"f32[{wu_elems}]"
        prog.ops.append(
            Op(
                s,
                _hlo(
                    s,
                    shape,
                    "fusion",
                    f"{_layout(shape)} %param, {_layout(shape)} %gradient",
                    f"kind=kLoop, calls=%fused_computation.{s.split('.')[-1]}",
                ),
                "loop fusion",
                "weight_update",
                f"train_step/optimizer/{model.optimizer}/{what}",
                _layout(shape),
                wu_elems * 4,
                int(costs.wu_params_per_core * model.wu_bytes_per_param / len(passes)),
                costs.weight_update_ms / len(passes),
                "compute",
            )
        )
    if sharded_async:
        prog.ops += ag_starts
    elif scen.wu_sharded:  # not overlapped: one all-gather of the updated weights, waited for here
        prog.ops.append(
            collective(
                "all-gather",
                "all-gather",
                costs.grad_bytes,
                all_gather_ms(costs.grad_bytes, topo, algo),
                "sync_global",
                AG_BUCKET_BASE,
                "train_step/all-gather_weights",
            )
        )
    out_ms = costs.outfeed_ms + scen.outfeed_share * nominal_compute_ms(costs)
    s = name("outfeed")
    prog.ops.append(
        Op(
            s,
            _hlo(s, "token[]", "outfeed", "(f32[], f32[]) %tuple, token[] %after-all"),
            "outfeed",
            "output",
            "host_call/OutfeedEnqueueTuple",
            "f32[]",
            0,
            int(out_ms * 1e-3 * 5e9),
            out_ms,
            "fixed",
        )
    )
    return prog


def nominal_compute_ms(costs: StepCosts) -> float:
    return costs.compute_ms + costs.weight_update_ms


def build_eval_program(
    model: Model, costs: StepCosts, topo: Topology, scen: Scenario, program_id: int, host_metric_ms: float
) -> Program:
    """Distributed eval (catalog §3.10): forward on all cores, metrics summed on device; when not
    distributed, predictions are outfed and the device waits while the host computes the metric."""
    prog = Program("jit_eval_step", program_id)
    name = _Namer()
    batch = max(1, int(costs.eval_examples_per_core))
    layers = _layers(model)
    tw = sum(r.time_weight for _, r, _ in layers)
    fw = sum(r.flop_weight for _, r, _ in layers)
    infeed_shape = model.input_shape.format(b=batch)
    s = name("infeed")
    prog.ops.append(
        Op(
            s,
            _hlo(s, f"({infeed_shape}, token[])", "infeed", "token[] %after-all"),
            "infeed",
            "input",
            "eval/InfeedDequeueTuple",
            _layout(infeed_shape),
            0,
            int(batch * model.input_bytes_per_example),
            costs.infeed_ms,
            "infeed",
        )
    )
    fl = model.train_flops_per_example / 3 * costs.eval_examples_per_core
    for layer, r, tf_op in layers:
        prog.ops.append(
            _op_from_recipe(
                name,
                r,
                model,
                layer,
                batch,
                costs.eval_ms * r.time_weight / tw,
                fl * r.flop_weight / fw,
                "eval/" + tf_op,
            )
        )
    s = name("all-reduce")
    prog.ops.append(
        Op(
            s,
            _hlo(s, "f32[4]", "all-reduce", "f32[4] %metrics", "channel_id=7, to_apply=%add"),
            "all-reduce",
            "collectives",
            "eval/metrics/all-reduce",
            "f32[4]{0}",
            4,
            16,
            0.0,
            "sync_global",
            comm_ms=allreduce_ms(16, topo, scen.allreduce_algo),
        )
    )
    out_ms = costs.outfeed_ms if scen.eval_distributed else host_metric_ms
    s = name("outfeed")
    prog.ops.append(
        Op(
            s,
            _hlo(s, "token[]", "outfeed", "(f32[4]) %tuple, token[] %after-all"),
            "outfeed",
            "output",
            "eval/host_call/OutfeedEnqueueTuple",
            "f32[4]{0}",
            0,
            int(out_ms * 1e-3 * 5e9),
            out_ms,
            "fixed",
        )
    )
    return prog
