"""The long fuzz run: a million (``--inputs``) mutated inputs through the three readers, in process.

    nice -n 19 python tests/fuzz/run_fuzz.py --inputs 1000000 --out benchmarks/results/fuzz_readers.md

Inputs are mutations of seeds cut from the real captures (../shared/traces, ../shared/mlperf_logs)
and the bundled samples (tests/fuzz/harness.py). Every input must be accepted with data equal to an
independent parse, or refused with one line; every ``--db-every``-th input is also ingested into a
database holding a run, and a refusal must leave that database as it was.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz import harness  # noqa: E402
from tpuanalyze.errors import TpuAnalyzeError  # noqa: E402
from tpuanalyze.pipeline import ingest_paths  # noqa: E402

CLASSES = [
    "xspace-structured",
    "xspace-bytes",
    "json-structured",
    "json-bytes",
    "json-gzip",
    "mlperf-structured",
    "mlperf-bytes",
]


def make_input(klass: str, seeds: dict, rng: random.Random) -> tuple[str, bytes, bool]:
    """(reader kind, bytes, gzip?) of one input of the class."""
    if klass == "xspace-structured":
        return "xspace", harness.mutate_xspace(rng.choice(seeds["xspace"]), rng), False
    if klass == "xspace-bytes":
        return "xspace", harness.mutate_bytes(rng.choice(seeds["xspace_bytes"]), rng), False
    if klass in ("json-structured", "json-gzip"):
        return "json", harness.mutate_json(rng.choice(seeds["json"]), rng), klass == "json-gzip"
    if klass == "json-bytes":
        return "json", harness.mutate_bytes(rng.choice(seeds["json_bytes"]), rng), False
    if klass == "mlperf-structured":
        return "mlperf", harness.mutate_mlperf(rng.choice(seeds["mlperf"]), rng), False
    return "mlperf", harness.mutate_bytes(rng.choice(seeds["mlperf_bytes"]), rng), False


def check_db(path: Path, db: Path) -> harness.Outcome:
    """Ingest the input into ``db``: a refusal must leave it exactly as it was."""
    before = harness.db_state(db)
    try:
        ingest_paths([path], db)
    except TpuAnalyzeError as exc:
        if "\n" in str(exc):
            return harness.Outcome("wrong", f"ingest error not one line: {exc!r}")
        after = harness.db_state(db)
        if after != before:
            return harness.Outcome("wrong", "database changed by a refused ingest")
        return harness.Outcome("refused")
    except Exception:
        import traceback

        return harness.Outcome("traceback", traceback.format_exc(limit=-3))
    return harness.Outcome("accepted")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--db-every", type=int, default=2000, help="ingest every N-th input into a database too"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures (markdown) here")
    parser.add_argument("--log-every", type=int, default=20_000)
    parser.add_argument("--classes", default=",".join(CLASSES), help="comma-separated input classes to run")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    json_seeds = harness.json_seeds()
    import json

    seeds = {
        "xspace": harness.xspace_seeds(),
        "json": json_seeds,
        "mlperf": harness.mlperf_seeds(),
    }
    seeds["xspace_bytes"] = seeds["xspace"]
    seeds["json_bytes"] = [json.dumps(s).encode() for s in json_seeds]
    seeds["mlperf_bytes"] = ["\n".join(s).encode() for s in seeds["mlperf"]]
    wanted = args.classes.split(",")
    classes = [c for c in CLASSES if c in wanted and seeds[c.split("-")[0]]]
    tally = harness.Tally()
    db_tally = harness.Tally()
    started = time.time()
    with tempfile.TemporaryDirectory(
        prefix="tpuanalyze-fuzz-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
    ) as tmp:
        root = Path(tmp)
        db = root / "fuzz.duckdb"
        ingest_paths([harness.SAMPLES / "jax_cpu" / "single_jit_train"], db)
        for n in range(1, args.inputs + 1):
            klass = classes[n % len(classes)]
            kind, data, gz = make_input(klass, seeds, rng)
            folder = root / f"in{n % 2}"
            folder.mkdir(exist_ok=True)
            path = harness.write_input(folder, kind, data, gz)
            if kind == "mlperf":  # the Arrow tables on every 10th log (they cost 2 ms)
                tally.add(klass, harness.check_mlperf(path, with_tables=n % 10 == 0))
            else:
                tally.add(klass, harness.CHECKS[kind](path))
            if args.db_every and n % args.db_every == 0:
                db_tally.add(klass, check_db(path, db))
            if n % args.log_every == 0:
                bad = sum(v for (c, k), v in tally.outcomes.items() if k in ("traceback", "wrong"))
                print(f"{n:,} inputs, {time.time() - started:,.0f} s, {bad} problems", flush=True)
                if args.out:  # the figures so far, should the run be stopped
                    args.out.write_text(render(tally, db_tally, time.time() - started, args))
    report = render(tally, db_tally, time.time() - started, args)
    print(report)
    if args.out:
        args.out.write_text(report)
    return 1 if tally.problems or db_tally.problems else 0


def render(tally: harness.Tally, db_tally: harness.Tally, seconds: float, args: argparse.Namespace) -> str:
    lines = [
        "# Reader fuzzing (tests/fuzz/run_fuzz.py)",
        "",
        f"`run_fuzz.py --inputs {args.inputs} --seed {args.seed} --db-every {args.db_every}`"
        f": {sum(tally.inputs.values()):,} inputs in {seconds:,.0f} s.",
        "",
        "| class | inputs | accepted (= oracle) | refused (one line) | tracebacks | silently wrong |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for klass in sorted(tally.inputs):
        o = tally.outcomes
        lines.append(
            f"| {klass} | {tally.inputs[klass]:,} | {o[(klass, 'accepted')]:,} | {o[(klass, 'refused')]:,} "
            f"| {o[(klass, 'traceback')]:,} | {o[(klass, 'wrong')]:,} |"
        )
    total = sum(tally.inputs.values())
    lines += [
        "",
        f"Database check (ingest of every {args.db_every}th input; a refusal must leave the "
        f"database unchanged): {sum(db_tally.inputs.values()):,} ingests, "
        f"{sum(v for (c, k), v in db_tally.outcomes.items() if k == 'refused'):,} refused, "
        f"{sum(v for (c, k), v in db_tally.outcomes.items() if k in ('traceback', 'wrong')):,} problems.",
        "",
        f"Total: {total:,} inputs, {len(tally.problems)} distinct problems.",
    ]
    for key, detail in list(tally.problems.items())[:30] + list(db_tally.problems.items())[:10]:
        lines += ["", f"- {key}", "", "```", detail.strip()[-1500:], "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
