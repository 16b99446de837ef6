"""`tpuanalyze generate`: write a modelled TPU-v3 pod run (XSpace per host + ground_truth.json)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from tpuanalyze.generator import MODELS, SCENARIOS, generate
from tpuanalyze.reports.progress import progress_bar

from tpuanalyze.errors import TpuAnalyzeError


@click.command(name="generate")
@click.option("--model", required=True, help=f"MLPerf model: {', '.join(MODELS)}.")
@click.option("--chips", required=True, type=int, help="TPU-v3 chips: 4 (v3-8) ... 4096 (the multipod).")
@click.option(
    "--steps", default=10, show_default=True, type=int, help="Training steps in the profile window."
)
@click.option(
    "--hosts",
    default=None,
    type=int,
    help="Hosts to write (sampled; host 0 and any straggler always kept). Default: all.",
)
@click.option(
    "--scenario",
    default="baseline",
    show_default=True,
    help=f"baseline (MLPerf as run) or the rule id of the bottleneck to inject: {', '.join(SCENARIOS)}.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Random seed (deterministic output).")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Log directory; the run goes to OUT/plugins/profile/<run>/.",
)
def command(
    model: str, chips: int, steps: int, hosts: int | None, scenario: str, seed: int, out: Path
) -> None:
    """Generate a TPU-v3 pod trace calibrated to the MLPerf runs, with exact ground truth.

    \b
    Examples:
      tpuanalyze generate --model resnet50 --chips 16 --out generated_resnet50
      tpuanalyze generate --model bert --chips 4096 --hosts 2 --scenario weight-update-unsharded --out generated_bert
    """  # noqa: E501 (example lines are shown as they are typed)
    with progress_bar(total=None, description="generate hosts") as bar:

        def report(done: int, total: int) -> None:
            bar.set_total(total)
            bar.advance(1)

        try:
            run_dir = generate(
                model, chips, steps=steps, hosts=hosts, scenario=scenario, seed=seed, out=out, progress=report
            )
        except OSError as exc:  # the output folder cannot be made or written (permissions, disk full)
            raise TpuAnalyzeError(f"cannot write the generated run: {exc.strerror or exc}",
                                  str(exc.filename or out)) from exc
    truth = json.loads((run_dir / "ground_truth.json").read_text())
    shares = ", ".join(f"{k} {v:.1%}" for k, v in truth["breakdown"].items() if v >= 0.005)
    click.echo(
        f"{run_dir}: {len(truth['hosts_written'])} host file(s), {truth['cores_written']} cores, "
        f"step {truth['step_time_ms']:.2f} ms ({shares})"
    )
