"""Properties of the MLPerf parsing and scoring on generated logs (hypothesis)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.analyzer.mlperf_summary import olympic_score
from tpuanalyze.parsers.mlperf import _length, _union, load_mlperf

durations = st.lists(st.floats(min_value=1.0, max_value=1e4, allow_nan=False), min_size=3, max_size=12)


@given(durations, st.randoms())
def test_olympic_score_ignores_order_and_drops_best_and_worst(values, rnd):
    shuffled = values[:]
    rnd.shuffle(shuffled)
    score = olympic_score(shuffled, ["success"] * len(values), "v0.7")
    kept = sorted(values)[1:-1]
    tolerance = 1e-9 * max(values)  # a float mean of equal values can land an ulp outside them
    assert abs(score.seconds - sum(kept) / len(kept)) <= tolerance
    assert min(values) - tolerance <= score.seconds <= max(values) + tolerance
    assert score.counted == len(values) - 2


@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e5)), max_size=20))
def test_eval_union_is_bounded(spans):
    intervals = [(a, a + d) for a, d in spans]
    merged = _union(intervals, 0.0, 2e6)
    total = _length(merged)
    assert total <= sum(d for _, d in spans) + 1e-6
    assert total >= max((min(b, 2e6) - a for a, b in intervals), default=0.0) - 1e-6
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(merged, merged[1:], strict=False))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1000, max_value=500_000), min_size=1, max_size=6),
       st.sampled_from(["v0.6", "v0.7"]), st.integers(1, 4))
def test_written_logs_parse_back(tmp_path_factory, run_ms, version, evals):
    folder = tmp_path_factory.mktemp(version) / "tpu-v3-64" / "resnet"
    folder.mkdir(parents=True)
    for index, length in enumerate(run_ms):
        start = 1_600_000_000_000 + index * 10_000_000
        events = [(start, "run_start", None, {})]
        for e in range(evals):
            t = start + length * (e + 1) // (evals + 1)
            events += [(t, "eval_start", None, {"epoch_num": e}),
                       (t + 5, "eval_stop", None, {"epoch_num": e}),
                       (t + 6, "eval_accuracy", 0.5 + e / 100, {"epoch_num": e})]
        events += [(start + 1, "global_batch_size", 512, {}),
                   (start + length, "run_stop", None, {"status": "success"})]
        lines = []
        for t, key, value, meta in events:
            if version == "v0.7":
                lines.append(":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "key": key,
                                                       "value": value, "metadata": meta}))
            else:
                payload = json.dumps({"value": value, "metadata": meta})
                lines.append(f":::MLL {t / 1000:.3f} {key}: {payload}")
        (folder / f"result_{index}.txt").write_text("\n".join(["noise line"] + lines) + "\n")
    results = load_mlperf([folder]).results.to_pandas().sort_values("result_file")
    assert list((results.run_stop_ms - results.run_start_ms).round()) == [float(x) for x in run_ms]
    assert (results.chips == 32).all() and (results.global_batch_size == 512).all()
    assert (results.eval_count == evals).all()
    assert (results.eval_ms.round() == 5 * evals).all()
