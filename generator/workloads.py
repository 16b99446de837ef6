"""The six MLPerf models: size, FLOPs, per-step op structure, and the MLPerf configurations as presets.

Parameter counts and FLOPs are the usual published figures for these networks [est where noted];
the efficiency constants (`e_max`, `u_sat`, `k_eff`) are fitted so that the baseline presets reproduce
the step times of catalog §1 (see benchmarks/calibration.py and docs/calibration.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpuanalyze.errors import TpuAnalyzeError


@dataclass(frozen=True)
class OpRecipe:
    """One forward op kind of a layer: its HLO op, XProf category and share of the layer's time."""

    stem: str  # short op name stem, e.g. "fusion" / "convolution"
    category: str  # XProf hlo_category
    time_weight: float  # share of the model's forward compute time (normalised over the recipe)
    flop_weight: float  # share of forward FLOPs (matmul/conv ops carry the FLOPs)
    tf_op: str  # framework op path (layer name substituted)
    backward_ops: int = 2  # conv/matmul: input-grad + weight-grad; elementwise: 1


@dataclass(frozen=True)
class Model:
    """A network as the generator needs it: sizes, FLOPs, op structure, efficiency and input costs."""

    name: str
    title: str
    params: float
    param_tensors: int  # gradient tensors (before all-reduce combining)
    train_flops_per_example: float  # forward + backward (3 x forward)
    units_per_example: float  # work units the MXU efficiency depends on (images or tokens)
    input_bytes_per_example: float  # infeed bytes per example after host preprocessing
    input_shape: str  # HLO shape of the per-core infeed batch, "{b}" = per-core batch
    optimizer: str  # LARS, LAMB, Adam, Momentum
    wu_bytes_per_param: float  # optimizer HBM traffic per parameter (f32 state) [est]
    layers: int
    layer_name: str
    recipe: tuple[OpRecipe, ...]
    stem_ops: tuple[OpRecipe, ...]
    head_ops: tuple[OpRecipe, ...]
    e_max: float  # MXU efficiency at a large per-core batch (fitted)
    u_sat: float  # work units per core above which efficiency is e_max (fitted)
    k_eff: float  # efficiency loss per halving of per-core work below u_sat (fitted)
    host_examples_per_s: float  # baseline host input pipeline throughput per host [est]
    eval_examples: int  # examples in one full evaluation
    partition_kind: str  # "spatial" (halo collective-permutes) or "model" (in-layer all-reduce)
    batch_limit: int  # largest global batch that still converges (catalog §1, §3.1)

    def efficiency(self, units_per_core: float) -> float:
        """MXU efficiency falls by `k_eff` per halving of per-core work below `u_sat` (fitted)."""
        if units_per_core >= self.u_sat:
            return self.e_max
        return self.e_max / (1.0 + self.k_eff * math.log2(self.u_sat / max(units_per_core, 1e-9)))


@dataclass(frozen=True)
class Preset:
    """An MLPerf configuration (catalog §1): chips, global batch, partitioning; step time if published."""

    model: str
    chips: int
    global_batch: int
    partition: int = 1
    round: str = "v0.7"
    published_step_ms: float | None = None
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def per_core_batch(self) -> float:
        return self.global_batch / (self.chips * 2)


def _conv(stem: str, tw: float, fw: float, tf_op: str) -> OpRecipe:
    return OpRecipe(stem, "convolution fusion", tw, fw, tf_op)


def _elem(stem: str, cat: str, tw: float, tf_op: str) -> OpRecipe:
    return OpRecipe(stem, cat, tw, 0.002, tf_op, backward_ops=1)


_RESNET_BLOCK = (
    _conv("fusion", 1.0, 1.0, "{layer}/conv1/Conv2D"),
    _conv("fusion", 2.2, 2.25, "{layer}/conv2/Conv2D"),
    _conv("fusion", 1.0, 1.0, "{layer}/conv3/Conv2D"),
    _elem("fusion", "loop fusion", 0.45, "{layer}/batch_normalization/FusedBatchNormV3"),
)
_TRANSFORMER_LAYER = (
    _conv("fusion", 3.0, 3.0, "{layer}/attention/qkv/MatMul"),
    _conv("convolution", 1.0, 1.0, "{layer}/attention/scores/einsum"),
    _elem("fusion", "loop fusion", 0.5, "{layer}/attention/softmax"),
    _conv("convolution", 1.0, 1.0, "{layer}/attention/context/einsum"),
    _conv("fusion", 1.0, 1.0, "{layer}/attention/output/MatMul"),
    _elem("fusion", "loop fusion", 0.3, "{layer}/attention/LayerNorm"),
    _conv("fusion", 4.0, 4.0, "{layer}/ffn/dense_1/MatMul"),
    _conv("fusion", 4.0, 4.0, "{layer}/ffn/dense_2/MatMul"),
    _elem("fusion", "loop fusion", 0.3, "{layer}/output/LayerNorm"),
)
_LSTM_LAYER = (
    _conv("fusion", 4.0, 4.0, "{layer}/lstm_cell/MatMul"),
    _elem("fusion", "loop fusion", 1.2, "{layer}/lstm_cell/gates"),
    _elem("while", "while", 0.4, "{layer}/rnn/while"),
)

MODELS: dict[str, Model] = {
    "resnet50": Model(
        name="resnet50",
        title="ResNet-50 v1.5 (ImageNet)",
        params=25.6e6,
        param_tensors=161,
        train_flops_per_example=3 * 8.2e9,
        units_per_example=1.0,
        input_bytes_per_example=224 * 224 * 3 * 2,
        input_shape="bf16[{b},112,112,12]",
        optimizer="LARS",
        wu_bytes_per_param=28.0,
        layers=16,
        layer_name="resnet_model/block{i}",
        recipe=_RESNET_BLOCK,
        stem_ops=(
            OpRecipe("convolution", "convolution", 0.9, 0.9, "resnet_model/conv2d/Conv2D"),
            _elem("fusion", "loop fusion", 0.4, "resnet_model/max_pooling2d/MaxPool"),
        ),
        head_ops=(
            _elem("fusion", "loop fusion", 0.2, "resnet_model/average_pooling2d/Mean"),
            _conv("fusion", 0.15, 0.1, "resnet_model/dense/MatMul"),
            _elem("fusion", "loop fusion", 0.15, "loss/softmax_cross_entropy"),
        ),
        e_max=0.4,
        u_sat=128.0,
        k_eff=0.15,
        host_examples_per_s=12000.0,
        eval_examples=50000,
        partition_kind="spatial",
        batch_limit=65536,
    ),
    "bert": Model(
        name="bert",
        title="BERT-large (Wikipedia, seq 512)",
        params=334e6,
        param_tensors=398,
        train_flops_per_example=6 * 334e6 * 512 * 1.12,
        units_per_example=512.0,
        input_bytes_per_example=512 * 4 * 4,
        input_shape="s32[{b},512]",
        optimizer="LAMB",
        wu_bytes_per_param=36.0,
        layers=24,
        layer_name="bert/encoder/layer_{i}",
        recipe=_TRANSFORMER_LAYER,
        stem_ops=(_elem("fusion", "loop fusion", 0.5, "bert/embeddings/embedding_lookup"),),
        head_ops=(
            _conv("fusion", 1.0, 1.0, "cls/predictions/transform/dense/MatMul"),
            _elem("fusion", "loop fusion", 0.3, "cls/predictions/loss"),
        ),
        e_max=0.49,
        u_sat=2048.0,
        k_eff=0.06,
        host_examples_per_s=20000.0,
        eval_examples=10000,
        partition_kind="model",
        batch_limit=65536,
    ),
    "transformer": Model(
        name="transformer",
        title="Transformer big (WMT En-De)",
        params=210e6,
        param_tensors=186,
        train_flops_per_example=6 * 176e6 * 256 * 1.1,
        units_per_example=256.0,
        input_bytes_per_example=256 * 4 * 2,
        input_shape="s32[{b},256]",
        optimizer="Adam",
        wu_bytes_per_param=32.0,
        layers=12,
        layer_name="transformer/layer_{i}",
        recipe=_TRANSFORMER_LAYER,
        stem_ops=(_elem("fusion", "loop fusion", 0.6, "transformer/embedding/embedding_lookup"),),
        head_ops=(
            _conv("fusion", 2.0, 2.0, "transformer/softmax/MatMul"),
            _elem("fusion", "loop fusion", 0.4, "transformer/loss/cross_entropy"),
        ),
        e_max=0.3,
        u_sat=4096.0,
        k_eff=0.25,
        host_examples_per_s=60000.0,
        eval_examples=3003,
        partition_kind="model",
        batch_limit=2048,
    ),
    "ssd": Model(
        name="ssd",
        title="SSD-ResNet34 (COCO, 300x300)",
        params=20.0e6,
        param_tensors=108,
        train_flops_per_example=3 * 2 * 14e9,
        units_per_example=1.0,
        input_bytes_per_example=300 * 300 * 3 * 2,
        input_shape="bf16[{b},300,300,3]",
        optimizer="Momentum",
        wu_bytes_per_param=20.0,
        layers=12,
        layer_name="ssd/resnet34/block{i}",
        recipe=_RESNET_BLOCK[:2] + _RESNET_BLOCK[3:],
        stem_ops=(OpRecipe("convolution", "convolution", 0.9, 0.9, "ssd/resnet34/conv1/Conv2D"),),
        head_ops=(
            _conv("fusion", 1.2, 1.2, "ssd/multibox_head/Conv2D"),
            _elem("fusion", "loop fusion", 0.6, "ssd/loss/box_matching"),
        ),
        e_max=0.4,
        u_sat=64.0,
        k_eff=0.44,
        host_examples_per_s=6000.0,
        eval_examples=5000,
        partition_kind="spatial",
        batch_limit=4096,
    ),
    "maskrcnn": Model(
        name="maskrcnn",
        title="Mask R-CNN ResNet-50 FPN (COCO)",
        params=44.0e6,
        param_tensors=230,
        train_flops_per_example=3 * 2 * 140e9,
        units_per_example=1.0,
        input_bytes_per_example=1024 * 1024 * 3 * 2,
        input_shape="bf16[{b},1024,1024,3]",
        optimizer="Momentum",
        wu_bytes_per_param=20.0,
        layers=16,
        layer_name="mask_rcnn/resnet50/block{i}",
        recipe=_RESNET_BLOCK,
        stem_ops=(OpRecipe("convolution", "convolution", 0.9, 0.9, "mask_rcnn/resnet50/conv1/Conv2D"),),
        head_ops=(
            _conv("fusion", 2.0, 2.0, "mask_rcnn/fpn/Conv2D"),
            _elem("fusion", "loop fusion", 1.0, "mask_rcnn/rpn/proposals"),
            _elem("fusion", "loop fusion", 1.0, "mask_rcnn/roi_align/crop_and_resize"),
            _conv("fusion", 2.0, 2.0, "mask_rcnn/mask_head/Conv2D"),
            _elem("fusion", "loop fusion", 0.6, "mask_rcnn/loss"),
        ),
        e_max=0.25,
        u_sat=8.0,
        k_eff=0.55,
        host_examples_per_s=400.0,
        eval_examples=5000,
        partition_kind="spatial",
        batch_limit=256,
    ),
    "gnmt": Model(
        name="gnmt",
        title="GNMT (WMT En-De, 4+4 LSTM layers)",
        params=160e6,
        param_tensors=56,
        train_flops_per_example=6 * 90e6 * 50,
        units_per_example=50.0,
        input_bytes_per_example=100 * 4 * 2,
        input_shape="s32[{b},100]",
        optimizer="Adam",
        wu_bytes_per_param=32.0,
        layers=8,
        layer_name="gnmt/lstm_layer_{i}",
        recipe=_LSTM_LAYER,
        stem_ops=(_elem("fusion", "loop fusion", 0.5, "gnmt/embedding_lookup"),),
        head_ops=(
            _conv("fusion", 2.0, 2.0, "gnmt/attention/MatMul"),
            _conv("fusion", 2.0, 2.0, "gnmt/softmax/MatMul"),
            _elem("fusion", "loop fusion", 0.5, "gnmt/loss/cross_entropy"),
        ),
        e_max=0.15,
        u_sat=4096.0,
        k_eff=0.17,
        host_examples_per_s=60000.0,
        eval_examples=3003,
        partition_kind="model",
        batch_limit=8192,
    ),
}

# catalog §1: the v0.7 headline runs (published step from block stamps) and the v0.6 scaling points.
PRESETS: tuple[Preset, ...] = (
    Preset("resnet50", 4096, 65536, 1, "v0.7", 14.3, "catalog §1 ResNet-50 (TF) 4096 chips"),
    Preset("resnet50", 16, 4096, 1, "v0.6", None, "v0.6 tpu-v3-32"),
    Preset("resnet50", 64, 16384, 1, "v0.6", None, "v0.6 tpu-v3-128"),
    Preset("resnet50", 128, 32768, 1, "v0.6", None, "v0.6 tpu-v3-256"),
    Preset("resnet50", 256, 32768, 1, "v0.6", None, "v0.6 tpu-v3-512"),
    Preset("resnet50", 512, 32768, 1, "v0.6", None, "v0.6 tpu-v3-1024"),
    Preset("resnet50", 1024, 32768, 1, "v0.6", 25.0, "catalog §1 v0.6 ResNet-50 1024 chips ~25 ms [est]"),
    Preset("bert", 4096, 8192, 1, "v0.7", 46.0, "catalog §1 BERT (TF) 4096 chips"),
    Preset(
        "transformer",
        4096,
        2048,
        4,
        "v0.7",
        11.6,
        "catalog §1 Transformer (TF/Lingvo) 4096 chips, 4-way model",
    ),
    Preset("transformer", 16, 512, 1, "v0.6", None, "v0.6 tpu-v3-32"),
    Preset("transformer", 64, 512, 1, "v0.6", None, "v0.6 tpu-v3-128"),
    Preset("transformer", 128, 512, 1, "v0.6", None, "v0.6 tpu-v3-256"),
    Preset("transformer", 256, 2048, 1, "v0.6", None, "v0.6 tpu-v3-512"),
    Preset("transformer", 512, 2048, 1, "v0.6", None, "v0.6 tpu-v3-1024"),
    Preset("transformer", 1024, 2048, 1, "v0.6", None, "v0.6 tpu-v3-2048"),
    Preset("ssd", 4096, 4096, 8, "v0.7", 8.4, "catalog §1 SSD (TF) 4096 chips, 8-way spatial"),
    Preset("ssd", 16, 1024, 1, "v0.6", None, "v0.6 tpu-v3-32"),
    Preset("ssd", 64, 1024, 1, "v0.6", None, "v0.6 tpu-v3-128"),
    Preset("ssd", 128, 1024, 1, "v0.6", None, "v0.6 tpu-v3-256"),
    Preset("ssd", 256, 2048, 1, "v0.6", None, "v0.6 tpu-v3-512"),
    Preset("ssd", 512, 2048, 4, "v0.6", None, "v0.6 tpu-v3-1024, 4-way spatial"),
    Preset("ssd", 1024, 2048, 4, "v0.6", None, "v0.6 tpu-v3-2048, 4-way spatial"),
    Preset("maskrcnn", 512, 256, 8, "v0.7", 53.0, "catalog §1 Mask R-CNN (TF) 512 chips, 8-way spatial"),
    Preset("maskrcnn", 16, 128, 1, "v0.6", None, "v0.6 tpu-v3-32"),
    Preset("maskrcnn", 64, 128, 4, "v0.6", None, "v0.6 tpu-v3-128, 4-way spatial"),
    Preset("maskrcnn", 128, 128, 4, "v0.6", None, "v0.6 tpu-v3-256, 4-way spatial"),
    Preset("gnmt", 512, 8192, 1, "v0.7", 36.0, "catalog §1 GNMT (TF) 512 chips"),
    Preset("gnmt", 16, 4096, 1, "v0.6", None, "v0.6 tpu-v3-32"),
    Preset("gnmt", 64, 8192, 1, "v0.6", None, "v0.6 tpu-v3-128"),
    Preset("gnmt", 128, 8192, 1, "v0.6", None, "v0.6 tpu-v3-256"),
    Preset("gnmt", 256, 8192, 1, "v0.6", None, "v0.6 tpu-v3-512"),
)


def get_model(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise TpuAnalyzeError(f"unknown model {name!r} (choose from {', '.join(MODELS)})") from None


def nearest_preset(model: str, chips: int) -> Preset:
    """The model's MLPerf preset nearest in log2(chips); ties go to the larger slice."""
    get_model(model)
    candidates = [p for p in PRESETS if p.model == model]
    return min(candidates, key=lambda p: (abs(math.log2(p.chips) - math.log2(chips)), -p.chips))


def config_for(model: str, chips: int) -> Preset:
    """The run configuration at `chips`: the nearest preset, scaled keeping its per-core batch."""
    preset = nearest_preset(model, chips)
    if preset.chips == chips:
        return preset
    global_batch = max(1, round(preset.per_core_batch * chips * 2))
    partition = min(preset.partition, chips * 2)
    return Preset(
        model,
        chips,
        global_batch,
        partition,
        preset.round,
        None,
        f"scaled from {preset.source} keeping {preset.per_core_batch:g} examples per core",
    )


def at_scale_config(model: str, chips: int, cfg: Preset) -> Preset:
    """The model's largest-scale MLPerf per-core batch and partitioning, applied at `chips`.

    Collective, weight-update and partitioning costs only matter once the per-core batch is small
    (catalog §3.2-§3.5, §3.13); scenarios about them run in that regime on any slice size."""
    largest = max((p for p in PRESETS if p.model == model), key=lambda p: p.chips)
    if largest.per_core_batch >= cfg.per_core_batch:
        return cfg
    global_batch = max(1, round(largest.per_core_batch * chips * 2))
    partition = min(largest.partition, chips * 2)
    return Preset(
        model,
        chips,
        global_batch,
        partition,
        largest.round,
        None,
        f"{largest.source}: its {largest.per_core_batch:g} examples per core at {chips} chips",
    )
