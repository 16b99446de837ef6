"""Per-workload constants the time-to-train model needs when a log does not state them.

Every value names its source. Examples per epoch come from the logs themselves where they are logged
(``train_samples`` / ``num_train_examples``); the fallbacks here are the same benchmark's logged value
in the MLPerf v0.7 result logs (same datasets as v0.6). Parameter counts are [est] from the models'
papers; they only set the all-reduce / weight-update split of the fitted non-shrinking step time
(catalog §2 cost models), never the fitted total. Partitioning (cores per model replica) is not logged
in v0.6/v0.7: the table below is catalog §1 (the submissions' configurations).
"""

from __future__ import annotations

from dataclasses import dataclass

# Trace workload names (the generator's / a trace's model stat) -> MLPerf benchmark names.
ALIASES = {"resnet50": "resnet", "resnet-50": "resnet", "maskrcnn": "mask", "mask_rcnn": "mask",
           "mask-rcnn": "mask", "gnmt": "gnmt", "transformer": "transformer", "ssd": "ssd",
           "bert": "bert", "resnet": "resnet", "mask": "mask"}


@dataclass(frozen=True)
class WorkloadFacts:
    """Constants of one MLPerf benchmark, each with its source."""

    examples_per_epoch: int
    examples_source: str
    parameters: float
    parameters_source: str
    update_bytes_per_param: float   # bytes the optimizer reads and writes per parameter per step [est]


_FACTS = {
    "resnet": WorkloadFacts(1_281_167, "ImageNet train images (num_train_examples in the logs)",
                            25.6e6, "ResNet-50, He et al. 2016 [est]", 16.0),   # LARS: w, g, momentum
    "ssd": WorkloadFacts(118_287, "COCO 2017 train images (train_samples, MLPerf v0.7 SSD log)",
                         20.0e6, "SSD300 with a ResNet-34 backbone [est]", 16.0),
    "mask": WorkloadFacts(118_287, "COCO 2017 train images (train_samples, MLPerf v0.7 Mask R-CNN log)",
                          44.0e6, "Mask R-CNN ResNet-50-FPN [est]", 16.0),
    "maskrcnn": WorkloadFacts(118_287, "COCO 2017 train images (train_samples, MLPerf v0.7 log)",
                              44.0e6, "Mask R-CNN ResNet-50-FPN [est]", 16.0),
    "transformer": WorkloadFacts(566_340, "train_samples of the MLPerf v0.7 Transformer logs (WMT17 en-de)",
                                 213e6, "Transformer big, Vaswani et al. 2017 [est]", 24.0),  # Adam: m, v
    "gnmt": WorkloadFacts(3_442_299, "train_samples of the MLPerf v0.7 GNMT log (WMT16 en-de)",
                          160e6, "MLPerf GNMT, 4+4 LSTM layers of 1024 [est]", 24.0),
    "bert": WorkloadFacts(1, "an 'epoch' is a step in BERT logs (catalog §5)",
                          340e6, "BERT large [est]", 24.0),                              # LAMB: m, v
}

# Cores per model replica (spatial / model partitioning), catalog §1; 1 elsewhere.
_PARTITIONING = {
    ("v0.6", "ssd"): {512: 4, 1024: 4},
    ("v0.6", "mask"): {64: 4, 128: 4},
    ("v0.7", "ssd"): {4096: 8, 2048: 4},
    ("v0.7", "maskrcnn"): {512: 8},
    ("v0.7", "transformer"): {4096: 4},
}


# Model names inside a trace's workload label (program · model scope · input), most specific first: a
# ResNet is the backbone of SSD and Mask R-CNN, so "resnet" is looked for last.
_IN_LABEL = (("mask", "mask"), ("ssd", "ssd"), ("bert", "bert"), ("gnmt", "gnmt"),
             ("transformer", "transformer"), ("resnet", "resnet"))


def canonical(workload: str | None) -> str:
    """The MLPerf benchmark name of a workload: ``resnet50`` -> ``resnet``, and a trace's workload label
    (``jit_train_step · resnet_model · bf16[...]``) by the model name in it."""
    name = (workload or "").strip().lower()
    if name in ALIASES:
        return ALIASES[name]
    return next((benchmark for needle, benchmark in _IN_LABEL if needle in name), name)


def facts_for(workload: str | None) -> WorkloadFacts | None:
    return _FACTS.get(canonical(workload))


def partition_for(version: str | None, benchmark: str | None, chips: int | None) -> int:
    """Cores per replica of a logged configuration (catalog §1), 1 when data-parallel or unknown."""
    table = _PARTITIONING.get(((version or "").lower(), (benchmark or "").lower()), {})
    return int(table.get(int(chips or 0), 1))
