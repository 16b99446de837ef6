"""Capture small REAL profiler traces with JAX on the CPU backend (8 host-platform devices).

Why: the project's tests need real captures (the real XSpace and Chrome-trace JSON that JAX's
profiler writes), small enough to commit, with a known structure: train steps marked with
``StepTraceAnnotation("train", step_num=i)``, eval inside ``TraceAnnotation("eval")``, a real
all-reduce (``jax.lax.pmean``/``psum`` under ``pmap``), and optionally a slow host input pipeline.

Each capture goes to ``<out>/<name>/plugins/profile/<run>/<host>.xplane.pb`` plus
``<host>.trace.json.gz`` (both written by ``jax.profiler.start_trace``/``stop_trace``; ``<run>`` is
JAX's timestamp folder name, ``<host>`` the machine's host name). ``<out>/<name>`` is wiped first,
so each capture folder holds exactly one run.

Usage (from the project root; jax must be installed: ``pip install -e .[capture]``)::

    python sample_traces/capture_jax_cpu.py                      # all variants -> sample_traces/jax_cpu/
    python sample_traces/capture_jax_cpu.py --variant pmap8_train_eval --out /tmp/caps
    python sample_traces/capture_jax_cpu.py --python-tracer      # also record every Python call (big)

then refresh the independent expected counts (xprof's ProfileData, see tests/test_own_captures.py)::

    /opt/xprofvenv/bin/python ../shared/tools/xspace_counts_xprof.py sample_traces/jax_cpu \\
        > sample_traces/jax_cpu/expected_counts.json

Variants (structure is fixed; only the timings differ between captures):

- ``pmap8_train_eval``: 8 devices, ``--steps`` train steps (pmap'ed SGD on a tiny MLP, gradients
  all-reduced with ``pmean``, loss with ``psum``), an eval step (a separate pmap'ed function with a
  ``psum``) inside ``TraceAnnotation("eval")`` after every ``--eval-every`` train steps.
- ``pmap8_input_bound``: the same with a host input pipeline that sleeps ``--input-delay-ms`` per
  batch (inside ``TraceAnnotation("host_input")``), so the devices wait on input.
- ``single_jit_train``: one device, a ``jax.jit`` train step on a tiny conv net, no collectives.
- ``single_jit_cold``: the same, but nothing is compiled before the trace starts: the first step
  compiles the train step inside the capture (a warm-up step, as in most real captures).

Except in ``single_jit_cold``, everything is compiled before the trace starts, so the capture holds
steady-state steps only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

NUM_DEVICES = 8
# Must be set before jax is imported: it decides how many CPU devices the host platform exposes.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={NUM_DEVICES}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

VARIANTS = ("pmap8_train_eval", "pmap8_input_bound", "single_jit_train", "single_jit_cold")
FEATURES, HIDDEN, CLASSES, PER_DEVICE_BATCH = 32, 64, 10, 16
LEARNING_RATE = 0.05


def init_mlp(seed: int = 0) -> dict[str, jnp.ndarray]:
    """A two-layer MLP; small so that the trace, not the math, dominates the capture size."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * 0.1,
        "b1": jnp.zeros((HIDDEN,)),
        "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) * 0.1,
        "b2": jnp.zeros((CLASSES,)),
    }


def mlp_loss(params: dict, x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, CLASSES), axis=-1))


def pmap_train_step(params: dict, x: jnp.ndarray, y: jnp.ndarray) -> tuple[dict, jnp.ndarray]:
    """Data-parallel SGD: per-device gradients, then a real all-reduce (pmean) across devices."""
    loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
    grads = jax.lax.pmean(grads, axis_name="batch")
    total_loss = jax.lax.psum(loss, axis_name="batch")
    params = jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return params, total_loss


def pmap_eval_step(params: dict, x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
    """Eval is its own program (a different XLA module than the train step), as in real training."""
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    correct = jnp.sum(jnp.argmax(hidden @ params["w2"] + params["b2"], axis=-1) == y)
    return jax.lax.psum(correct, axis_name="batch")


def host_batches(rng: np.random.Generator, devices: int, delay_s: float):
    """The host input pipeline: numpy batches, optionally slow (a sleep stands in for decoding)."""
    while True:
        with jax.profiler.TraceAnnotation("host_input"):
            if delay_s:
                time.sleep(delay_s)
            x = rng.standard_normal((devices, PER_DEVICE_BATCH, FEATURES), dtype=np.float32)
            y = rng.integers(0, CLASSES, size=(devices, PER_DEVICE_BATCH), dtype=np.int32)
        yield x, y


def profile_options(python_tracer: bool) -> jax.profiler.ProfileOptions:
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 2
    options.python_tracer_level = 1 if python_tracer else 0
    return options


def capture_pmap(run_dir: Path, steps: int, eval_every: int, delay_s: float, python_tracer: bool) -> None:
    devices = jax.local_devices()[:NUM_DEVICES]
    if len(devices) < NUM_DEVICES:
        sys.exit(f"need {NUM_DEVICES} CPU devices, got {len(devices)}: was jax imported before XLA_FLAGS?")
    train = jax.pmap(pmap_train_step, axis_name="batch", devices=devices)
    evaluate = jax.pmap(pmap_eval_step, axis_name="batch", devices=devices)
    # One replica of the parameters per device (leading axis), as pmap expects.
    params = jax.tree_util.tree_map(lambda a: jnp.stack([a] * NUM_DEVICES), init_mlp())
    batches = host_batches(np.random.default_rng(0), NUM_DEVICES, delay_s)
    # Compile outside the trace: the capture should hold steady-state steps only.
    # Twice, because the first call's outputs are sharded differently from its stacked inputs.
    for _ in range(2):
        x, y = next(batches)
        params, loss = train(params, x, y)
        jax.block_until_ready(evaluate(params, x, y))

    jax.profiler.start_trace(str(run_dir), profiler_options=profile_options(python_tracer))
    try:
        for step in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                x, y = next(batches)
                params, loss = train(params, x, y)
                jax.block_until_ready(loss)
            if eval_every and (step + 1) % eval_every == 0:
                with jax.profiler.TraceAnnotation("eval"):
                    x, y = next(batches)
                    jax.block_until_ready(evaluate(params, x, y))
    finally:
        jax.profiler.stop_trace()


def capture_single_jit(run_dir: Path, steps: int, python_tracer: bool, warm_up: bool = True) -> None:
    """One device, one jitted train step on a tiny conv net: the simplest real capture. Without
    warm_up the first traced step compiles the program."""
    rng = np.random.default_rng(0)
    kernel = jnp.asarray(rng.standard_normal((8, 3, 3, 3), dtype=np.float32) * 0.1)  # OIHW
    dense = jnp.asarray(rng.standard_normal((8 * 16 * 16, CLASSES), dtype=np.float32) * 0.01)
    params = {"kernel": kernel, "dense": dense}

    def loss_fn(p: dict, images: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
        feats = jax.lax.conv_general_dilated(images, p["kernel"], (1, 1), "SAME")
        logits = jax.nn.relu(feats).reshape(images.shape[0], -1) @ p["dense"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, CLASSES), axis=-1))

    @jax.jit
    def train_step(p: dict, images: jnp.ndarray, labels: jnp.ndarray) -> tuple[dict, jnp.ndarray]:
        loss, grads = jax.value_and_grad(loss_fn)(p, images, labels)
        return jax.tree_util.tree_map(lambda a, g: a - LEARNING_RATE * g, p, grads), loss

    def batch() -> tuple[np.ndarray, np.ndarray]:
        images = rng.standard_normal((PER_DEVICE_BATCH, 3, 16, 16), dtype=np.float32)
        return images, rng.integers(0, CLASSES, size=(PER_DEVICE_BATCH,), dtype=np.int32)

    if warm_up:
        for _ in range(2):
            params, loss = train_step(params, *batch())
        jax.block_until_ready(loss)
    jax.profiler.start_trace(str(run_dir), profiler_options=profile_options(python_tracer))
    try:
        for step in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                params, loss = train_step(params, *batch())
                jax.block_until_ready(loss)
    finally:
        jax.profiler.stop_trace()


def capture(variant: str, out: Path, args: argparse.Namespace) -> Path:
    """Capture one variant into ``out/variant`` (wiped first); returns that folder."""
    target = out / variant
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if variant.startswith("single_jit"):
        capture_single_jit(target, args.steps, args.python_tracer, warm_up=variant == "single_jit_train")
    else:
        delay = args.input_delay_ms / 1000.0 if variant == "pmap8_input_bound" else 0.0
        capture_pmap(target, args.steps, args.eval_every, delay, args.python_tracer)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "jax_cpu")
    parser.add_argument("--variant", choices=(*VARIANTS, "all"), default="all")
    parser.add_argument("--steps", type=int, default=6, help="train steps per capture")
    parser.add_argument("--eval-every", type=int, default=3, help="an eval step after every N train steps")
    parser.add_argument("--input-delay-ms", type=float, default=20.0, help="host input sleep (input_bound)")
    parser.add_argument("--python-tracer", action="store_true", help="record Python calls too (large)")
    args = parser.parse_args(argv)
    for variant in VARIANTS if args.variant == "all" else (args.variant,):
        target = capture(variant, args.out, args)
        files = sorted(p for p in target.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in files)
        print(f"{variant}: {len(files)} files, {size / 1e6:.2f} MB under {target}")


if __name__ == "__main__":
    main()
