"""Each rule's catalog technique (catalog.md §3), where it applies and how it is worded per platform.

A rule's technique applies to some platforms (TPU / GPU / CPU) and workloads (training / inference).
The text is looked up as ``<family>/<mode>``, then ``<family>``; a platform without text means the
technique does not apply there and the rule stays silent. TPU texts may name the generation's torus
(``{torus}``: 2-D on v2/v3/v5e/v6e, 3-D on v4/v5p), the GPU collective library (``{ccl}``: NCCL on
NVIDIA, RCCL on AMD) and the vendor's graph capture and stream (``{graphs}``, ``{stream}``: CUDA on
NVIDIA, HIP on AMD) and its matrix units (``{mma}``: Tensor Cores, Matrix Cores).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpuanalyze.analyzer.platform import TORUS_3D

TRAINING = ("training",)
BOTH = ("training", "inference")


@dataclass(frozen=True)
class Advice:
    catalog: str  # catalog §3 section(s) the technique comes from
    modes: tuple[str, ...]
    text: dict[str, str] = field(default_factory=dict)


ADVICE: dict[str, Advice] = {
    "input-bound": Advice("3.8", BOTH, {  # catalog §3.8
        "TPU": "Scale the host input pipeline: per-host sharding, parallel interleave, cache decoded "
               "records, "
               "fused decode-and-crop, host-side space-to-depth, prefetch and background infeed threads so "
               "the next batch is on the device before the step needs it.",
        "GPU": "Scale the input pipeline: more dataloader workers (or tf.data parallel map/interleave), "
               "cache decoded records, fused decode-and-crop, pinned host memory and prefetch to the GPU "
               "(non-blocking copies on their own {stream}) so the next batch is there before the step.",
        "CPU": "The host both feeds and computes: give the input pipeline its own threads (tf.data / "
               "loader worker threads, prefetch), cache decoded records and fuse decode-and-crop, so the "
               "batch is ready before the step starts.",
    }),
    "host-input-processing": Advice("3.8", BOTH, {  # catalog §3.8
        "TPU": "Host decode/augmentation bounds the step: cache decoded records, fuse decode-and-crop, "
               "parallelize map/interleave across host cores, move space-to-depth to the host, or add "
               "input hosts.",
        "GPU": "Host decode/augmentation bounds the step: more dataloader workers, cache decoded records, "
               "fuse decode-and-crop, or decode and augment on the GPU (e.g. DALI / nvJPEG).",
        "CPU": "Host decode/augmentation bounds the step: cache decoded records, fuse decode-and-crop and "
               "run map/interleave on more host threads than the compute uses.",
    }),
    "outfeed-bound": Advice("3.10", BOTH, {  # catalog §3.10
        "TPU/training": "Reduce per-step outfeed: keep metrics on the device (sum on device, outfeed once "
                        "per loop), drop per-example predictions/summaries from the training step, run eval "
                        "metrics asynchronously.",
        "TPU/inference": "Reduce per-call outfeed: return only what the caller needs, keep intermediate "
                         "results on the device and batch the transfers.",
        "GPU/training": "Reduce per-step device-to-host copies: keep metrics on the GPU and copy them once "
                        "every N steps (no .item() or blocking copy per step), asynchronously on a side "
                        "stream.",
        "GPU/inference": "Reduce per-call device-to-host copies: return only what the caller needs, copy "
                         "asynchronously (pinned memory, side stream) and batch the transfers.",
    }),
    "collective-bound": Advice("3.3", BOTH, {  # catalog §2, §3.3
        # most of the exposed time in all-to-all: an embedding or expert exchange, not a gradient sum
        "TPU/all-to-all": "The exposed collective is an all-to-all (an embedding or expert exchange, not a "
                          "gradient sum): overlap it with dense compute (pipeline the next batch's "
                          "exchange), cut its volume (deduplicate ids, lower-precision payloads, a smaller "
                          "expert capacity factor) and keep the exchanging mesh axis on ICI, not the DCN.",
        "GPU/all-to-all": "The exposed collective is an all-to-all (an embedding or expert exchange, not a "
                          "gradient sum): overlap the {ccl} all-to-all with dense compute on its own stream "
                          "(pipeline the next batch's exchange), cut its volume (deduplicate ids, "
                          "lower-precision payloads, a smaller expert capacity factor) and keep the "
                          "exchanging groups inside one NVLink/xGMI node.",
        "TPU/training": "Make the gradient all-reduce cheaper and hidden: a {torus} schedule (reduce-scatter "
                        "along one axis, all-reduce along the next, all-gather back) with two concurrent "
                        "schedules over ICI, overlapped with backward, instead of a ring or the DCN.",
        "TPU/inference": "Make the collectives cheaper and hidden: overlap them with compute (async "
                         "collectives, collective matmul) and map the mesh axis that communicates most onto "
                         "the {torus} ICI links rather than the DCN.",
        "GPU/training": "Make the gradient all-reduce cheaper and hidden: bucket gradients and overlap the "
                        "{ccl} all-reduce with backward on its own stream, keep the heaviest groups "
                        "inside one "
                        "NVLink/xGMI node and use a hierarchical (intra-node, then inter-node) all-reduce.",
        "GPU/inference": "Make the collectives cheaper and hidden: overlap {ccl} collectives with compute on "
                         "a separate stream and keep tensor-parallel groups inside one NVLink/xGMI node.",
        "CPU": "The devices are one host's cores and memory, so collectives are memory copies competing "
               "with compute: use fewer XLA CPU devices with more threads each, or a larger batch per "
               "device so the collective is amortized.",
    }),
    "f32-gradient-allreduce": Advice("3.4", TRAINING, {  # catalog §3.4
        "TPU": "Sum gradients in bf16: halves the all-reduce bytes (2 x params instead of 4), about 2x on "
               "the bandwidth term.",
        "GPU": "Communicate gradients in bf16 (or fp16 with scaling), e.g. a bf16 compression hook on the "
               "{ccl} all-reduce: half the bytes, about 2x on the bandwidth term.",
    }),
    "latency-bound-collectives": Advice("3.5, 3.6", BOTH, {  # catalog §3.5, §3.6
        "TPU/training": "Combine small all-reduces into a few large buckets and overlap them with backward "
                        "(async start/done), so the per-op latency term stops dominating; check the "
                        "batch-norm group mapping onto the torus (§3.6).",
        "TPU/inference": "Combine small collectives into a few large ones (XLA's combiner thresholds) and "
                         "overlap them with compute (async start/done), so the per-op latency term stops "
                         "dominating.",
        "GPU/training": "Combine small all-reduces into larger {ccl} calls (gradient buckets, XLA's combiner "
                        "thresholds) overlapped with backward on their own stream, and capture the step in "
                        "{graphs} so per-launch latency disappears.",
        "GPU/inference": "Combine small collectives into larger {ccl} calls and capture the forward pass in "
                         "{graphs} so per-launch latency disappears.",
        "CPU": "Combine small all-reduces into a few large ones (XLA's all-reduce combiner thresholds): on "
               "one host each collective costs a synchronisation of all device threads.",
    }),
    "distributed-batch-norm": Advice("3.6", TRAINING, {  # catalog §3.6
        "TPU": "Many tiny all-reduces inside forward/backward (distributed batch norm): use small replica "
               "groups that map onto neighbouring cores of the torus, or fewer normalisation groups.",
        "GPU": "Many tiny all-reduces inside forward/backward (synchronised batch norm): keep the "
               "normalisation groups inside one node (NVLink) and as small as convergence allows.",
    }),
    "weight-update-unsharded": Advice("3.2", TRAINING, {  # catalog §3.2
        "TPU": "Shard the weight update: reduce-scatter the gradients, update 1/N of the weights on each "
               "replica, all-gather the weights (replaces one all-reduce).",
        "GPU": "Shard the optimizer state and update (ZeRO-1 / FSDP): {ccl} reduce-scatter of the "
               "gradients, update 1/N on each GPU, all-gather of the weights.",
        "CPU": "Shard the weight update across the devices: reduce-scatter the gradients, update 1/N of "
               "the weights on each, all-gather the weights.",
    }),
    "eval-overhead": Advice("3.10", TRAINING, {  # catalog §3.10
        "TPU": "Distribute evaluation over all cores (padded even per-host batches, metrics summed on "
               "device) and overlap or run it asynchronously (e.g. COCO eval off the critical path).",
        "GPU": "Distribute evaluation over all GPUs (padded, evenly sharded eval data, metrics reduced on "
               "the devices) and run host-side metric code asynchronously.",
        "CPU": "Evaluate less often or in a separate process, and keep metric code off the training "
               "thread.",
    }),
    "host-overhead": Advice("3.7", BOTH, {  # catalog §3.7
        "TPU/training": "Run the training loop on the device: iterations_per_loop (TF) or a device "
                        "while-loop with per-step infeed (JAX), so the host does not launch every step.",
        "TPU/inference": "Keep the device fed: dispatch calls asynchronously (no host sync between them), "
                         "batch requests, and compile larger programs so the host launches less often.",
        "GPU/training": "The GPU waits for the host to launch work: capture the step in {graphs} (XLA "
                        "command buffers under JAX/TF), jit the whole step or fuse small kernels "
                        "(torch.compile), avoid host synchronisations (.item(), blocking copies, "
                        "block_until_ready per step) and add input workers (DataLoader num_workers, tf.data "
                        "parallel calls), so the host runs ahead of the GPU.",
        "GPU/inference": "The GPU waits for the host to launch work: capture the forward pass in {graphs} "
                         "(XLA command buffers under JAX/TF), fuse small kernels, dispatch asynchronously "
                         "and batch requests.",
        "CPU": "The XLA CPU devices wait for the host thread that launches them: dispatch asynchronously "
               "(no block_until_ready per step), jit the whole step, and leave host threads free for the "
               "launches (fewer devices or intra-op threads per host).",
    }),
    "data-parallel-limit": Advice("3.1, 3.13", TRAINING, {  # catalog §3.1, §3.13
        "TPU": "Global batch is capped below the core count: use model parallelism / spatial partitioning "
               "(SPMD) so each core gets a larger slice, instead of more data-parallel replicas.",
        "GPU": "Global batch is capped below the GPU count: use tensor / pipeline parallelism (or FSDP) so "
               "each GPU gets a larger slice, instead of more data-parallel ranks.",
    }),
    "partition-overhead": Advice("3.1", BOTH, {  # catalog §3.1
        "TPU": "Halo exchanges (collective-permute) dominate: use fewer partitions per replica, partition "
               "along the dimension with the smallest halo, or overlap the exchange with compute.",
        "GPU": "Halo / pipeline exchanges ({ccl} send/recv, collective-permute) dominate: use fewer "
               "partitions, partition along the dimension with the smallest halo, or overlap the exchange "
               "with compute on a separate stream.",
    }),
    "data-formatting": Advice("3.9", BOTH, {  # catalog §3.9
        "TPU/conv": "Use space-to-depth for the first convolution and MXU-friendly layouts (NHWC / "
                    "batch-minor) so device-side copies and transposes disappear.",
        "TPU": "Device-side copies and transposes are layout changes: choose MXU-friendly layouts for the "
               "operands (batch-minor, feature dimensions multiples of 128) so XLA stops inserting them.",
        "GPU": "Device-side copies and transposes are layout changes: keep tensors channels-last (NHWC / "
               "NDHWC) for the {mma} and let the compiler fuse the transposes (XLA / torch.compile) "
               "instead of explicit copies.",
    }),
    "straggler": Advice("3.3, 3.8", BOTH, {  # catalog §3.3, §3.8
        "TPU": "A slow host or core holds every other core in the collectives: find the worst host (infeed "
               "max vs average, all-reduce sync time) and fix its input pipeline or hardware; balance "
               "per-host input sharding.",
        "GPU": "A slow rank holds every other GPU in the {ccl} collectives: find the worst rank (its input "
               "wait, its collective wait) and fix its dataloader, its host or its GPU; balance the "
               "per-rank input sharding.",
        "CPU": "One device (host thread) is slower and the others wait for it in the collectives: check "
               "for oversubscribed host cores and uneven per-device input.",
    }),
}


def recommendation(rule: str, platform: dict[str, Any], variant: str = "") -> str | None:
    """The technique worded for the run's platform, or None when it does not apply (wrong platform or
    a training technique on an inference trace)."""
    advice = ADVICE[rule]
    family, mode = platform.get("family"), platform.get("mode")
    if mode not in advice.modes or family is None:
        return None
    keys = [f"{family}/{variant}", f"{family}/{mode}", family] if variant else [f"{family}/{mode}", family]
    text = next((advice.text[k] for k in keys if k in advice.text), None)
    if text is None:
        return None
    torus = "3-D torus" if platform.get("generation") in TORUS_3D else "2-D torus"
    amd = str(platform.get("vendor") or "").upper() == "AMD"
    vendor = "HIP" if amd else "CUDA"
    return text.format(torus=torus, ccl="RCCL" if amd else "NCCL", graphs=f"{vendor} graphs",
                       stream=f"{vendor} stream", mma="Matrix Cores" if amd else "Tensor Cores")
