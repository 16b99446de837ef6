-- tpuanalyze step-time attribution: a pipeline of named SQL stages over the trace database.
--
-- Each stage "-- stage: NAME" is one SELECT. tpuanalyze.analyzer.attribution runs them in order, either
-- as TEMP tables for one run (analyze_run) or as persistent VIEWs over all runs (install_views), so
-- users can query the same relations with `tpuanalyze sql`. Placeholders: $run_filter (a predicate on
-- run_id), $<stage> (the relation name of an earlier stage), $classified_combos (att_ops' classes of
-- its distinct ops: SQL from analyzer/classify.py), $pat_* (regex literals from analyzer/thresholds.toml),
-- $e_host / $l_host (TRUE, or a predicate on a batch of hosts' events e / l when the stages run batch by batch)
-- $att_programs_run (the run's program executions, all hosts: the dominant program is the run's),
-- $events (the events the stages after att_ops read: the `events` view, or a batch's events off the
-- device op lines, which no stage after att_ops reads: docs/attribution.md, "The batch engine"),
-- $maybe_chrome_json (FALSE when the stages run for one run known not to come from Chrome-trace JSON, else
-- TRUE) and $has_device_planes ... $is_kineto (att_runs' flags: the column r.<flag> of the joined att_runs row, or
-- the literal TRUE/FALSE when the stages run for one run whose flags are known, so that DuckDB's
-- optimizer drops the branches that cannot apply before they scan any event).
-- Documented in docs/attribution.md.

-- stage: att_runs
-- One row per run: does it have accelerator (TPU/GPU) op events? If not, the run is "host-only" and
-- XLA CPU ops (host thread events carrying an hlo_op stat) stand in for device ops.
-- The flags are facts about which lines hold events: read from the small planes/lines tables and the
-- narrow event_rows (an event of the `events` view is an event_rows row of a stored line and plane),
-- never through the view's metadata and detail joins over every event of the run.
WITH flag_lines AS (
    SELECT l.run_id, l.host, l.plane_index, l.line_index,
           l.name = 'Steps' AND p.name LIKE '/device:%' AS steps_line,
           l.name = 'XLA Modules' AND p.name LIKE '/device:%' AS modules_line,
           (p.name LIKE '/device:TPU:%' OR p.name LIKE '/device:GPU:%')
             AND (l.name = 'XLA Ops' OR l.name LIKE 'Stream #%') AS op_line
    FROM lines l JOIN planes p USING (run_id, host, plane_index)
    WHERE $run_filter AND $l_host AND p.name LIKE '/device:%'
), flagged AS (
    SELECT * FROM flag_lines WHERE steps_line OR modules_line OR op_line
), line_events AS (
    -- the flagged lines that hold at least one event, with whether one of their events has a group_id
    -- of its own (with a duration)
    SELECT f.run_id, f.host, f.plane_index, f.line_index, any_value(f.steps_line) AS steps_line,
           any_value(f.modules_line) AS modules_line, any_value(f.op_line) AS op_line,
           bool_or(e.group_id IS NOT NULL AND e.duration_ps > 0) AS own_group
    FROM event_rows e JOIN flagged f USING (run_id, host, plane_index, line_index)
    WHERE $e_host
    GROUP BY ALL
), metadata_groups AS (
    -- device op events whose group_id comes from their metadata (event_metadata.group_id)
    SELECT DISTINCT e.run_id
    FROM (SELECT * FROM event_metadata m WHERE $run_filter AND m.group_id IS NOT NULL) m
    JOIN event_rows e USING (run_id, host, plane_index, metadata_id)
    JOIN flagged f USING (run_id, host, plane_index, line_index)
    WHERE $e_host AND f.op_line AND e.duration_ps > 0
), kineto AS (
    -- Chrome-trace JSON from PyTorch/Kineto: GPU kernels and memcpys are events with a device
    -- (the JSON stats are read only for chrome_json runs)
    SELECT DISTINCT e.run_id
    FROM events e JOIN (SELECT run_id FROM runs WHERE $run_filter AND source_format = 'chrome_json') k
      USING (run_id)
    WHERE $maybe_chrome_json AND $e_host AND json_extract_string(e.stats, '$.cat') IN $kineto_device_cats
)
SELECT r.run_id,
       EXISTS (SELECT 1 FROM planes p
               WHERE p.run_id = r.run_id AND p.kind IN ('tpu', 'gpu') AND p.num_events > 0) AS has_device_planes,
       coalesce((SELECT bool_or(steps_line) FROM line_events x WHERE x.run_id = r.run_id), FALSE)
           AS has_steps_line,
       coalesce((SELECT bool_or(modules_line) FROM line_events x WHERE x.run_id = r.run_id), FALSE)
           AS has_modules_line,
       -- device ops grouped into steps by the profiler (group_id stat, e.g. TF GPU traces)
       coalesce((SELECT bool_or(op_line AND own_group) FROM line_events x WHERE x.run_id = r.run_id), FALSE)
           OR r.run_id IN (SELECT run_id FROM metadata_groups) AS has_group_ids,
       r.run_id IN (SELECT run_id FROM kineto) AS is_kineto
FROM runs r
WHERE $run_filter;

-- stage: att_ops
-- One row per device op: the attribution device (host, device), its category and collective kind.
-- Accelerators: TPU 'XLA Ops' lines, GPU 'Stream #...' lines, plus collective spans of 'Async XLA Ops'.
-- Host-only runs: XLA CPU op events (stat hlo_op) on host threads, device = their device_ordinal stat.
WITH raw AS MATERIALIZED (
    SELECT e.run_id, e.host, e.device_ordinal AS device, e.plane, e.line, e.name,
           coalesce(nullif(e.display_name, ''), e.name) AS short_name,
           e.hlo_category, e.hlo_module, e.program_id, e.tf_op, e.shape, e.flops, e.bytes_accessed,
           e.start_ps, e.duration_ps, e.group_id, e.step_num, FALSE AS on_host, e.correlation_id
    FROM events e
    JOIN $att_runs r USING (run_id)
    WHERE $run_filter AND $e_host AND $has_device_planes
      AND (e.plane LIKE '/device:TPU:%' OR e.plane LIKE '/device:GPU:%')
      AND (e.line IN ('XLA Ops', 'Async XLA Ops') OR e.line LIKE 'Stream #%')
      AND e.duration_ps > 0
    UNION ALL
    SELECT e.run_id, e.host,
           coalesce(e.device_ordinal, TRY_CAST(json_extract_string(e.stats, '$.device_ordinal') AS INTEGER), 0),
           e.plane, e.line, e.name,
           coalesce(json_extract_string(e.stats, '$.hlo_op'), nullif(e.display_name, ''), e.name),
           e.hlo_category,
           coalesce(e.hlo_module, json_extract_string(e.stats, '$.hlo_module')),
           coalesce(e.program_id, TRY_CAST(json_extract_string(e.stats, '$.program_id') AS UBIGINT)),
           e.tf_op, e.shape, e.flops, e.bytes_accessed,
           e.start_ps, e.duration_ps, e.group_id, e.step_num, TRUE, e.correlation_id
    FROM events e
    JOIN $att_runs r USING (run_id)
    WHERE $run_filter AND $e_host AND NOT $has_device_planes
      AND e.plane LIKE '/host:%'
      AND json_extract_string(e.stats, '$.hlo_op') IS NOT NULL
      AND e.duration_ps > 0
    UNION ALL
    SELECT e.run_id, e.host, coalesce(TRY_CAST(json_extract_string(e.stats, '$.device') AS INTEGER), 0),
           e.plane, e.line, e.name, e.name, e.hlo_category, e.hlo_module, e.program_id, e.tf_op, e.shape,
           e.flops, e.bytes_accessed, e.start_ps, e.duration_ps, e.group_id, e.step_num, FALSE, e.correlation_id
    FROM events e
    JOIN $att_runs r USING (run_id)
    WHERE $run_filter AND $e_host AND $is_kineto
      AND json_extract_string(e.stats, '$.cat') IN $kineto_device_cats
      AND e.duration_ps > 0
), combos AS (
    -- classify each distinct (op, category, tf_op, module) once, not every event (regexes are costly);
    -- the HLO text says what an async wrapper calls and whether a transfer touches host memory
    SELECT DISTINCT short_name, hlo_category, tf_op, hlo_module, name FROM raw
), classified AS (
    -- wrapped computation, host transfer, collective kind, category and control-flow container
    -- (while/conditional/call: they enclose their body ops, see att_intervals): analyzer/classify.py
    $classified_combos
)
SELECT r.run_id, r.host, r.device, r.line,
       -- the HLO text only where shapes are read (collective payloads, infeed batch): it is long
       CASE WHEN c.category IN ('collectives', 'input') THEN r.name END AS name,
       r.short_name, r.hlo_category, r.hlo_module, r.tf_op, r.shape, r.flops, r.bytes_accessed,
       r.start_ps, r.duration_ps, c.collective_kind, c.category, c.is_container, c.wrapped, c.host_transfer,
       r.group_id, r.correlation_id
FROM raw r
JOIN classified c
  ON r.short_name IS NOT DISTINCT FROM c.short_name AND r.hlo_category IS NOT DISTINCT FROM c.hlo_category
 AND r.tf_op IS NOT DISTINCT FROM c.tf_op AND r.hlo_module IS NOT DISTINCT FROM c.hlo_module
 AND r.name IS NOT DISTINCT FROM c.name
-- the async line only contributes collective spans (async copies there are not core-busy time)
WHERE r.line <> 'Async XLA Ops' OR c.collective_kind IS NOT NULL;

-- stage: att_programs
-- One row per program execution on a device: the `XLA Modules` line (program = the XLA module name
-- with its fingerprint, e.g. `jit_f(1219...)`). A trace may run several programs (init, a psum, the
-- train step, eval); only one of them forms the step series (att_steps). Without an XLA Modules line
-- (GPU traces of JAX), an execution is the device ops of one module launched inside one host execute
-- call: device op -> the host launch event with its correlation_id -> the outermost host dispatch
-- event ($pat_dispatch or GpuExecutable::ExecuteThunks) whose span holds that launch: the user's call.
-- (JAX 0.8 on ROCm launches from a thread of its own while one per-device ExecuteHelper per GPU
-- overlaps the others: the innermost span holding a launch changed mid-execution, 100 "executions"
-- of 5 calls.)
WITH modules AS (
    SELECT e.run_id, e.host, e.device_ordinal AS device,
           coalesce(nullif(e.hlo_module, ''), e.name) AS program, e.program_id,
           e.start_ps, e.start_ps + e.duration_ps AS end_ps, 'xla_modules' AS source
    FROM $events e JOIN $att_runs r USING (run_id)
    WHERE $run_filter AND $e_host AND $has_device_planes AND e.line = 'XLA Modules' AND e.plane LIKE '/device:%'
      AND e.duration_ps > 0
), launched AS (
    SELECT o.run_id, o.host, o.device, o.hlo_module AS program, o.start_ps, o.duration_ps, l.start_ps AS launch_ps
    FROM $att_ops o JOIN $att_runs r USING (run_id)
    JOIN $events l ON l.run_id = o.run_id AND l.host = o.host AND l.correlation_id = o.correlation_id
    WHERE $has_device_planes AND NOT $has_modules_line AND NOT $has_steps_line AND NOT $has_group_ids
      AND $l_host AND o.hlo_module IS NOT NULL AND o.correlation_id IS NOT NULL AND l.plane LIKE '/host:%'
), dispatch AS (
    SELECT e.run_id, e.host, e.start_ps, e.start_ps + e.duration_ps AS end_ps
    FROM $events e
    WHERE $run_filter AND $e_host AND e.plane LIKE '/host:%' AND e.duration_ps > 0
      AND e.run_id IN (SELECT run_id FROM launched)
      AND (regexp_matches(e.name, $pat_dispatch) OR e.name = 'GpuExecutable::ExecuteThunks')
), keyed AS (
    SELECT l.run_id, l.host, l.device, l.program, l.start_ps, l.duration_ps, min(d.start_ps) AS exec_key
    FROM launched l JOIN dispatch d
      ON d.run_id = l.run_id AND d.host = l.host AND d.start_ps <= l.launch_ps AND d.end_ps >= l.launch_ps
    GROUP BY ALL
), launches AS (
    SELECT run_id, host, device, program, CAST(NULL AS UBIGINT), min(start_ps), max(start_ps + duration_ps),
           'program_launches'
    FROM keyed GROUP BY run_id, host, device, program, exec_key
)
SELECT *, regexp_matches(lower(program), $pat_eval_program) AS named_eval
FROM (SELECT * FROM modules UNION ALL SELECT * FROM launches);

-- stage: att_steps
-- One row per device step, found as XProf finds them: the Steps line on device planes; else device ops
-- grouped by their group_id stat (one step per group); else the executions of the dominant program
-- (the non-eval XLA module with the most execution time: never two programs in one series); else
-- (host-only runs) StepTraceAnnotation events (stat step_num) on host threads, applied to every device
-- of that host; else one step spanning the device's ops. Eval steps by name (eval pattern).
-- Warm-up: a leading train step (among the first $warmup_max_steps of its device) that runs more than
-- $warmup_slow_factor x the device's median step, or that host compile activity (pattern
-- `patterns.compile`) overlaps for at least $warmup_compile_overlap of its time; only an unbroken run of
-- such steps from the start counts, and at least one step always remains.
WITH device_list AS (
    SELECT DISTINCT run_id, host, device FROM $att_ops
), steps_line AS (
    SELECT e.run_id, e.host, e.device_ordinal AS device,
           coalesce(e.step_num, TRY_CAST(e.name AS BIGINT), e.group_id) AS step_num,
           e.start_ps, e.start_ps + e.duration_ps AS end_ps,
           regexp_matches(lower(e.name), $pat_eval_program) AS named_eval, 'steps_line' AS step_source,
           CAST(NULL AS INTEGER) AS line_index, CAST(NULL AS VARCHAR) AS program
    FROM $events e JOIN $att_runs r USING (run_id)
    WHERE $run_filter AND $e_host AND $has_device_planes AND e.line = 'Steps' AND e.plane LIKE '/device:%'
      AND e.duration_ps > 0
), group_steps AS (
    SELECT o.run_id, o.host, o.device, o.group_id, min(o.start_ps), max(o.start_ps + o.duration_ps),
           FALSE, 'group_id', CAST(NULL AS INTEGER), CAST(NULL AS VARCHAR)
    FROM $att_ops o JOIN $att_runs r USING (run_id)
    WHERE $has_device_planes AND NOT $has_steps_line AND $has_group_ids AND o.group_id IS NOT NULL
      AND o.line <> 'Async XLA Ops'
    GROUP BY o.run_id, o.host, o.device, o.group_id
), dominant AS (
    SELECT run_id, arg_max(program, total_ps) AS program
    FROM (SELECT run_id, program, sum(end_ps - start_ps) AS total_ps FROM $att_programs_run
          WHERE NOT named_eval GROUP BY ALL)
    GROUP BY run_id
), module_steps AS (
    SELECT p.run_id, p.host, p.device,
           row_number() OVER (PARTITION BY p.run_id, p.host, p.device ORDER BY p.start_ps) - 1,
           p.start_ps, p.end_ps, FALSE, p.source, CAST(NULL AS INTEGER), p.program
    FROM $att_programs p JOIN $att_runs r USING (run_id) JOIN dominant d USING (run_id, program)
    WHERE NOT $has_steps_line AND NOT $has_group_ids
), host_steps AS (
    -- StepTraceAnnotation (step_num stat); Kineto's "ProfilerStep#N" annotations
    SELECT e.run_id, e.host, d.device,
           coalesce(e.step_num, TRY_CAST(regexp_extract(e.name, '^ProfilerStep#(\d+)$', 1) AS BIGINT)),
           e.start_ps, e.start_ps + e.duration_ps,
           regexp_matches(lower(e.name), $pat_eval_program), 'step_annotation', e.line_index,
           CAST(NULL AS VARCHAR)
    FROM $events e JOIN $att_runs r USING (run_id)
    JOIN device_list d ON d.run_id = e.run_id AND d.host = e.host
    WHERE $run_filter AND $e_host AND NOT $has_device_planes AND (e.plane LIKE '/host:%' OR $is_kineto)
      AND (e.step_num IS NOT NULL OR ($is_kineto AND regexp_matches(e.name, '^ProfilerStep#\d+$')))
      AND e.duration_ps > 0
      AND json_extract_string(e.stats, '$.hlo_op') IS NULL
      AND coalesce(json_extract_string(e.stats, '$.cat'), '') NOT IN $kineto_device_cats
), found AS (
    SELECT * FROM steps_line
    UNION ALL SELECT * FROM group_steps
    UNION ALL SELECT * FROM module_steps
    UNION ALL SELECT * FROM host_steps
), op_span AS (
    -- last resort: a device with ops but no step markers at all gets one step spanning its ops
    SELECT o.run_id, o.host, o.device, CAST(0 AS BIGINT), min(o.start_ps), max(o.start_ps + o.duration_ps),
           FALSE, 'op_span', CAST(NULL AS INTEGER), CAST(NULL AS VARCHAR)
    FROM $att_ops o
    WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.run_id = o.run_id AND f.host = o.host)
    GROUP BY o.run_id, o.host, o.device
), all_steps AS (
    SELECT * FROM found
    UNION ALL SELECT * FROM op_span
), compile_spans AS (
    SELECT e.run_id, e.host, e.start_ps, e.start_ps + e.duration_ps AS end_ps
    FROM $events e
    WHERE $run_filter AND $e_host AND e.plane LIKE '/host:%' AND e.duration_ps > 0
      AND e.name ILIKE '%compil%'  -- cheap prefilter: every compile event name has it
      AND regexp_matches(lower(e.name), $pat_compile)
), compile_overlap AS (
    -- the longest single compile event inside the step (compile events nest: never summed)
    SELECT s.run_id, s.host, s.device, s.start_ps,
           max(least(c.end_ps, s.end_ps) - greatest(c.start_ps, s.start_ps)) AS overlap_ps
    FROM all_steps s JOIN compile_spans c
      ON c.run_id = s.run_id AND c.host = s.host AND c.start_ps < s.end_ps AND c.end_ps > s.start_ps
    WHERE NOT s.named_eval
    GROUP BY ALL
), ranked AS (
    SELECT s.*, coalesce(o.overlap_ps, 0) AS compile_overlap_ps,
           row_number() OVER dev - 1 AS train_rank,
           count(*) OVER (PARTITION BY s.run_id, s.host, s.device, s.named_eval) AS train_count,
           median(s.end_ps - s.start_ps) OVER (PARTITION BY s.run_id, s.host, s.device, s.named_eval)
               AS median_ps
    FROM all_steps s
    LEFT JOIN compile_overlap o USING (run_id, host, device, start_ps)
    WINDOW dev AS (PARTITION BY s.run_id, s.host, s.device, s.named_eval ORDER BY s.start_ps)
), candidates AS (
    SELECT *, NOT named_eval AND train_rank < least($warmup_max_steps, train_count - 1)
              AND ((end_ps - start_ps) > $warmup_slow_factor * median_ps
                   OR compile_overlap_ps >= $warmup_compile_overlap * (end_ps - start_ps)) AS candidate
    FROM ranked
)
SELECT run_id, host, device, step_num, start_ps, end_ps, named_eval, step_source, line_index, program,
       candidate AND bool_and(candidate) OVER (PARTITION BY run_id, host, device, named_eval ORDER BY start_ps
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS is_warmup,
       compile_overlap_ps
FROM candidates;

-- stage: att_eval_spans
-- Eval time decided by program: eval steps, XLA module executions of eval programs, and (host-only
-- runs) host TraceAnnotation("eval") spans applied to every device of the host.
WITH device_list AS (
    SELECT DISTINCT run_id, host, device FROM $att_ops
)
SELECT run_id, host, device, start_ps, end_ps FROM $att_steps WHERE named_eval
UNION ALL
SELECT e.run_id, e.host, e.device_ordinal, e.start_ps, e.start_ps + e.duration_ps
FROM $events e JOIN $att_runs r USING (run_id)
WHERE $run_filter AND $e_host AND $has_device_planes AND e.line = 'XLA Modules' AND e.plane LIKE '/device:%'
  AND regexp_matches(lower(e.name), $pat_eval_program) AND e.duration_ps > 0
UNION ALL
SELECT e.run_id, e.host, d.device, e.start_ps, e.start_ps + e.duration_ps
FROM $events e JOIN $att_runs r USING (run_id)
JOIN device_list d ON d.run_id = e.run_id AND d.host = e.host
WHERE $run_filter AND $e_host AND NOT $has_device_planes AND e.plane LIKE '/host:%'
  AND regexp_matches(lower(e.name), $pat_eval_annotation) AND e.duration_ps > 0;

-- stage: att_input_spans
-- Host-only runs: inside a step annotation, the time before the step's first program dispatch
-- (PjitFunction / Execute on the annotating thread) is the host producing the batch = input wait.
-- PyTorch profiles (Kineto JSON): the DataLoader's __next__ on the annotating thread inside a
-- ProfilerStep is the loop waiting for its batch: the GPU's idle under it is input, not launch overhead.
SELECT s.run_id, s.host, s.device, s.start_ps, least(s.end_ps, min(e.start_ps)) AS end_ps
FROM $att_steps s
JOIN $att_runs r ON r.run_id = s.run_id
JOIN $events e ON e.run_id = s.run_id AND e.host = s.host AND e.line_index = s.line_index
             AND e.start_ps >= s.start_ps AND e.start_ps < s.end_ps
             AND regexp_matches(e.name, $pat_dispatch)
-- (step annotations are steps of host-only runs only: att_steps' host_steps)
WHERE s.step_source = 'step_annotation' AND NOT s.named_eval AND $e_host AND NOT $has_device_planes
  AND NOT $is_kineto
GROUP BY s.run_id, s.host, s.device, s.start_ps, s.end_ps
UNION ALL
SELECT s.run_id, s.host, s.device, greatest(s.start_ps, e.start_ps),
       least(s.end_ps, e.start_ps + e.duration_ps)
FROM $att_steps s
JOIN $att_runs r ON r.run_id = s.run_id
JOIN $events e ON e.run_id = s.run_id AND e.host = s.host AND e.line_index = s.line_index
             AND e.start_ps < s.end_ps AND e.start_ps + e.duration_ps > s.start_ps
             AND regexp_matches(lower(e.name), $pat_dataloader)
WHERE s.step_source = 'step_annotation' AND NOT s.named_eval AND $e_host AND $is_kineto;

-- stage: att_intervals
-- Everything the sweep needs, one row per (device, category, span). Categories get priorities:
-- eval > weight_update > compute > collectives > memory_transfer > input > output > container
-- (idle = none active).
-- A control-flow container (while/conditional/call) counts as compute only where none of its body ops
-- (nor anything else) runs: a childless loop op is compute, a loop's children keep their own category.
-- Collective spans
-- carry their kind so exposed/overlapped time can be split per kind in the same sweep.
SELECT run_id, host, device, CASE WHEN is_container THEN 'container' ELSE category END AS category,
       collective_kind AS kind, start_ps, start_ps + duration_ps AS end_ps
FROM $att_ops
UNION ALL SELECT run_id, host, device, 'eval', NULL, start_ps, end_ps FROM $att_eval_spans
UNION ALL SELECT run_id, host, device, 'input', NULL, start_ps, end_ps FROM $att_input_spans WHERE end_ps > start_ps
UNION ALL SELECT run_id, host, device, 'step', NULL, start_ps, end_ps FROM $att_steps;

-- stage: att_elementary
-- Boundary sweep: +1/-1 per category at every start/end, running sums in time order per device, and
-- for each elementary interval [ts, next_ts) the highest-priority active category, the active
-- collective kinds, and the step it lies in (ASOF join on the step start; step bounds are boundaries).
-- The counters are packed into two HUGEINTs (9 categories 14 bits each; 6 collective kinds 15 bits each)
-- so the window computes two running sums instead of fifteen; a counter is the number of ops of that
-- category active at once on one device, far below 2^14.
WITH codes AS (
    SELECT *, hash(run_id, host, device) AS dev_key,  -- one integer key: cheaper to sort and group
           CASE category WHEN 'eval' THEN 0 WHEN 'weight_update' THEN 1 WHEN 'compute' THEN 2
                         WHEN 'collectives' THEN 3 WHEN 'input' THEN 4 WHEN 'output' THEN 5
                         WHEN 'step' THEN 6 WHEN 'container' THEN 7 WHEN 'memory_transfer' THEN 8
                         END AS cat_bit,
           CASE kind WHEN 'all-reduce' THEN 0 WHEN 'all-gather' THEN 1 WHEN 'reduce-scatter' THEN 2
                     WHEN 'all-to-all' THEN 3 WHEN 'collective-permute' THEN 4 WHEN 'send/recv' THEN 5
                     END AS kind_bit
    FROM $att_intervals
), devices AS (
    SELECT DISTINCT dev_key, run_id, host, device FROM codes
), points AS (
    SELECT dev_key, start_ps AS ts,
           (1::HUGEINT << (14 * cat_bit)) AS dc,
           CASE WHEN kind_bit IS NULL THEN 0::HUGEINT ELSE (1::HUGEINT << (15 * kind_bit)) END AS dk
    FROM codes
    UNION ALL
    SELECT dev_key, end_ps,
           -(1::HUGEINT << (14 * cat_bit)),
           CASE WHEN kind_bit IS NULL THEN 0::HUGEINT ELSE -(1::HUGEINT << (15 * kind_bit)) END
    FROM codes
), net AS (
    SELECT dev_key, ts, sum(dc) AS dc, sum(dk) AS dk
    FROM points GROUP BY dev_key, ts
), running AS (
    SELECT dev_key, ts,
           lead(ts) OVER w AS next_ts,
           sum(dc) OVER w AS c,
           sum(dk) OVER w AS k
    FROM net
    WINDOW w AS (PARTITION BY dev_key ORDER BY ts ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
), counts AS (
    SELECT dev_key, ts, next_ts,
           (c >> 0) & 16383 AS n_eval, (c >> 14) & 16383 AS n_wu, (c >> 28) & 16383 AS n_compute,
           (c >> 42) & 16383 AS n_coll, (c >> 56) & 16383 AS n_input, (c >> 70) & 16383 AS n_output,
           (c >> 84) & 16383 AS n_step, (c >> 98) & 16383 AS n_cont, (c >> 112) & 16383 AS n_mem,
           (k >> 0) & 32767 AS n_ar, (k >> 15) & 32767 AS n_ag, (k >> 30) & 32767 AS n_rs,
           (k >> 45) & 32767 AS n_a2a, (k >> 60) & 32767 AS n_cp, (k >> 75) & 32767 AS n_sr
    FROM running
    WHERE next_ts IS NOT NULL AND next_ts > ts
), elementary AS (
    SELECT d.run_id, d.host, d.device, ts, next_ts - ts AS len_ps,
           CASE WHEN n_eval > 0 THEN 'eval'
                WHEN n_wu > 0 THEN 'weight_update'
                WHEN n_compute > 0 THEN 'compute'
                WHEN n_coll > 0 THEN 'collectives'
                WHEN n_mem > 0 THEN 'memory_transfer'
                WHEN n_input > 0 THEN 'input'
                WHEN n_output > 0 THEN 'output'
                WHEN n_cont > 0 THEN 'compute'
                ELSE 'idle' END AS category,
           n_coll > 0 AND (n_wu > 0 OR n_compute > 0) AND n_eval = 0 AS collective_overlapped,
           n_step > 0 AS in_step,
           n_ar > 0 AS ar, n_ag > 0 AS ag, n_rs > 0 AS rs, n_a2a > 0 AS a2a, n_cp > 0 AS cp, n_sr > 0 AS sr
    FROM counts JOIN devices d USING (dev_key)
), steps AS (
    SELECT run_id, host, device, start_ps, end_ps FROM $att_steps
)
SELECT x.*, CASE WHEN x.in_step AND x.ts < s.end_ps THEN s.start_ps END AS step_start
FROM elementary x
ASOF LEFT JOIN steps s ON s.run_id = x.run_id AND s.host = x.host AND s.device = x.device AND x.ts >= s.start_ps;

-- stage: step_breakdown
-- One row per device step with picoseconds per category (the `steps` DataFrame).
WITH steps AS (
    SELECT run_id, host, device, step_num, start_ps, end_ps, named_eval, step_source, program, is_warmup
    FROM $att_steps
), assigned AS (
    SELECT run_id, host, device, step_start, category, len_ps, collective_overlapped
    FROM $att_elementary WHERE step_start IS NOT NULL
), sums AS (
    SELECT run_id, host, device, step_start,
           coalesce(sum(len_ps) FILTER (WHERE category = 'compute'), 0) AS compute_ps,
           coalesce(sum(len_ps) FILTER (WHERE category = 'weight_update'), 0) AS weight_update_ps,
           coalesce(sum(len_ps) FILTER (WHERE category = 'collectives'), 0) AS collectives_ps,
           coalesce(sum(len_ps) FILTER (WHERE category = 'memory_transfer'), 0) AS memory_transfer_ps,
           coalesce(sum(len_ps) FILTER (WHERE category = 'input'), 0) AS input_ps,
           coalesce(sum(len_ps) FILTER (WHERE category = 'output'), 0) AS output_ps,
           coalesce(sum(len_ps) FILTER (WHERE category = 'eval'), 0) AS eval_ps,
           coalesce(sum(len_ps) FILTER (WHERE category = 'idle'), 0) AS idle_ps,
           coalesce(sum(len_ps) FILTER (WHERE collective_overlapped), 0) AS collectives_overlapped_ps
    FROM assigned GROUP BY ALL
)
SELECT s.run_id, s.host, s.device AS device_ordinal, s.step_num,
       s.named_eval OR coalesce(m.eval_ps, 0) * 2 > (s.end_ps - s.start_ps) AS is_eval,
       s.start_ps, s.end_ps - s.start_ps AS duration_ps,
       coalesce(m.compute_ps, 0) AS compute_ps, coalesce(m.weight_update_ps, 0) AS weight_update_ps,
       coalesce(m.collectives_ps, 0) AS collectives_ps, coalesce(m.input_ps, 0) AS input_ps,
       coalesce(m.output_ps, 0) AS output_ps, coalesce(m.eval_ps, 0) AS eval_ps,
       -- instants not covered by any elementary interval (no op at all) are idle too
       (s.end_ps - s.start_ps) - coalesce(m.compute_ps + m.weight_update_ps + m.collectives_ps
            + m.memory_transfer_ps + m.input_ps + m.output_ps + m.eval_ps, 0) AS idle_ps,
       coalesce(m.collectives_overlapped_ps, 0) AS collectives_overlapped_ps,
       s.step_source, coalesce(m.memory_transfer_ps, 0) AS memory_transfer_ps, s.is_warmup, s.program
FROM steps s
LEFT JOIN sums m ON m.run_id = s.run_id AND m.host = s.host AND m.device = s.device AND m.step_start = s.start_ps;

-- stage: device_breakdown
-- Per device: wall time (first step, program execution or eval start to the last end) split into the
-- contract's categories. Train steps contribute their categories; eval steps and eval spans outside
-- steps are eval; instants outside steps where an op runs (e.g. executions of programs other than the
-- step program) go to that op's category; the rest of the wall (gaps between steps) is idle (host
-- overhead). Warm-up steps (att_steps.is_warmup) are left out unless $keep_warmup: the wall then starts
-- where the last warm-up step ends. The wall is the capture's, as XProf's duty cycle is; the step cycle
-- (cycle_ps: the first step or eval span's start to the last one's end) leaves out program executions
-- before or after it (set-up, a capture started early), and idle_in_cycle_ps is the idle inside it: the
-- gaps host overhead can cause, without the one-off set-up gaps.
WITH spans AS (
    SELECT run_id, host, device, start_ps, end_ps, false AS program_only FROM $att_steps
    UNION ALL SELECT run_id, host, device, start_ps, end_ps, false FROM $att_eval_spans
    UNION ALL SELECT run_id, host, device, start_ps, end_ps, true FROM $att_programs
), warm AS (
    SELECT run_id, host, device, max(end_ps) AS warm_end FROM $att_steps
    WHERE is_warmup AND NOT $keep_warmup GROUP BY ALL
), bounds AS (
    SELECT s.run_id, s.host, s.device,
           greatest(min(s.start_ps), coalesce(any_value(w.warm_end), min(s.start_ps))) AS wall_start,
           max(s.end_ps) AS wall_end,
           greatest(min(s.start_ps) FILTER (WHERE NOT s.program_only), any_value(w.warm_end)) AS cycle_start,
           max(s.end_ps) FILTER (WHERE NOT s.program_only) AS cycle_end
    FROM spans s LEFT JOIN warm w USING (run_id, host, device)
    GROUP BY ALL
), outside AS (
    SELECT x.run_id, x.host, x.device,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category = 'eval'), 0) AS eval_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category = 'compute'), 0) AS compute_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category = 'weight_update'), 0) AS weight_update_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category = 'collectives'), 0) AS collectives_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category = 'memory_transfer'), 0) AS memory_transfer_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category = 'input'), 0) AS input_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category = 'output'), 0) AS output_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.collective_overlapped), 0) AS collectives_overlapped_ps,
           coalesce(sum(x.len_ps) FILTER (WHERE x.category <> 'idle' AND x.ts >= b.cycle_start
                                            AND x.ts < b.cycle_end), 0) AS busy_in_cycle_ps
    FROM $att_elementary x JOIN bounds b USING (run_id, host, device)
    WHERE NOT x.in_step AND x.ts >= b.wall_start AND x.ts < b.wall_end
    GROUP BY ALL
), per_step AS (
    SELECT s.run_id, s.host, s.device_ordinal AS device,
           count(*) FILTER (WHERE NOT is_eval) AS train_steps,
           count(*) FILTER (WHERE is_eval) AS eval_steps,
           avg(duration_ps) FILTER (WHERE NOT is_eval) AS mean_step_ps,
           sum(duration_ps) FILTER (WHERE NOT is_eval) AS train_step_ps,
           sum(duration_ps) FILTER (WHERE is_eval) AS eval_step_ps,
           sum(compute_ps) FILTER (WHERE NOT is_eval) AS compute_ps,
           sum(weight_update_ps) FILTER (WHERE NOT is_eval) AS weight_update_ps,
           sum(collectives_ps) FILTER (WHERE NOT is_eval) AS collectives_ps,
           sum(memory_transfer_ps) FILTER (WHERE NOT is_eval) AS memory_transfer_ps,
           sum(input_ps) FILTER (WHERE NOT is_eval) AS input_ps,
           sum(output_ps) FILTER (WHERE NOT is_eval) AS output_ps,
           sum(eval_ps) FILTER (WHERE NOT is_eval) AS eval_in_train_ps,
           sum(idle_ps) FILTER (WHERE NOT is_eval) AS idle_in_steps_ps,
           sum(collectives_overlapped_ps) FILTER (WHERE NOT is_eval) AS collectives_overlapped_ps
    FROM $step_breakdown s
    JOIN bounds b ON b.run_id = s.run_id AND b.host = s.host AND b.device = s.device_ordinal
    WHERE s.start_ps >= b.wall_start
    GROUP BY ALL
), sums AS (
    SELECT b.run_id, b.host, b.device, b.wall_end - b.wall_start AS wall_ps, p.train_steps, p.eval_steps,
           p.mean_step_ps,
           coalesce(p.compute_ps, 0) + coalesce(o.compute_ps, 0) AS compute_ps,
           coalesce(p.weight_update_ps, 0) + coalesce(o.weight_update_ps, 0) AS weight_update_ps,
           coalesce(p.collectives_ps, 0) + coalesce(o.collectives_ps, 0) AS collectives_ps,
           coalesce(p.memory_transfer_ps, 0) + coalesce(o.memory_transfer_ps, 0) AS memory_transfer_ps,
           coalesce(p.input_ps, 0) + coalesce(o.input_ps, 0) AS input_ps,
           coalesce(p.output_ps, 0) + coalesce(o.output_ps, 0) AS output_ps,
           coalesce(p.eval_step_ps, 0) + coalesce(p.eval_in_train_ps, 0) + coalesce(o.eval_ps, 0) AS eval_ps,
           coalesce(p.idle_in_steps_ps, 0) AS idle_in_steps_ps,
           coalesce(p.collectives_overlapped_ps, 0) + coalesce(o.collectives_overlapped_ps, 0)
               AS collectives_overlapped_ps,
           b.cycle_end - b.cycle_start AS cycle_ps,
           -- the cycle less its busy instants: train steps' busy time, eval steps, ops outside steps
           b.cycle_end - b.cycle_start - coalesce(p.train_step_ps, 0) + coalesce(p.idle_in_steps_ps, 0)
             - coalesce(p.eval_step_ps, 0) - coalesce(o.busy_in_cycle_ps, 0) AS idle_in_cycle_ps
    FROM bounds b
    LEFT JOIN per_step p USING (run_id, host, device)
    LEFT JOIN outside o USING (run_id, host, device)
)
SELECT run_id, host, device AS device_ordinal,
       coalesce(train_steps, 0) AS train_steps, coalesce(eval_steps, 0) AS eval_steps,
       wall_ps, mean_step_ps, compute_ps, weight_update_ps, collectives_ps, input_ps, output_ps, eval_ps,
       wall_ps - compute_ps - weight_update_ps - collectives_ps - memory_transfer_ps - input_ps - output_ps
         - eval_ps AS idle_ps,
       idle_in_steps_ps, collectives_overlapped_ps, memory_transfer_ps, cycle_ps, idle_in_cycle_ps
FROM sums;

-- stage: collective_time
-- Per device step and collective kind: exposed time (category collectives: no compute, update or eval
-- runs) and overlapped time (hidden under compute/update). An instant where k kinds are active is
-- split evenly between them, so the kinds sum to the step's collectives / collectives_overlapped.
WITH flagged AS (
    SELECT run_id, host, device, step_start, category, collective_overlapped,
           len_ps / (ar::INTEGER + ag::INTEGER + rs::INTEGER + a2a::INTEGER + cp::INTEGER + sr::INTEGER) AS share,
           ar, ag, rs, a2a, cp, sr
    FROM $att_elementary
    WHERE step_start IS NOT NULL AND (ar OR ag OR rs OR a2a OR cp OR sr)
), per_kind AS (
    SELECT run_id, host, device, step_start, category, collective_overlapped, share,
           unnest([CASE WHEN ar THEN 'all-reduce' END, CASE WHEN ag THEN 'all-gather' END,
                   CASE WHEN rs THEN 'reduce-scatter' END, CASE WHEN a2a THEN 'all-to-all' END,
                   CASE WHEN cp THEN 'collective-permute' END, CASE WHEN sr THEN 'send/recv' END]) AS kind
    FROM flagged
)
SELECT run_id, host, device AS device_ordinal, step_start, kind,
       coalesce(sum(share) FILTER (WHERE category = 'collectives'), 0) AS exposed_ps,
       coalesce(sum(share) FILTER (WHERE collective_overlapped), 0) AS overlapped_ps
FROM per_kind WHERE kind IS NOT NULL
GROUP BY ALL;

-- stage: op_steps
-- Every attributed device op with the step it starts in (NULL outside steps) and that step's eval flag:
-- the step with the latest start at or before the op's start, if the op starts before that step ends
-- (what an ASOF join on the step start finds). Found by one window over the steps and the distinct op
-- starts of each device, keyed by one integer per device (as att_elementary's sweep), then given to the
-- ops by an equality join: an ASOF join would sort every op row with its payload and string keys.
WITH ops AS (
    SELECT *, hash(run_id::BIGINT, host, device::BIGINT) AS dev_key FROM $att_ops
), steps AS (
    SELECT row_number() OVER () AS step_index, hash(run_id::BIGINT, host, device_ordinal::BIGINT) AS dev_key,
           start_ps, duration_ps, step_num, is_eval
    FROM $step_breakdown WHERE device_ordinal IS NOT NULL
), points AS (
    -- a step's start sorts before an op starting at the same instant (the op is in that step)
    SELECT dev_key, start_ps AS ts, 0 AS is_op, step_index FROM steps
    UNION ALL
    SELECT DISTINCT dev_key, start_ps, 1, CAST(NULL AS BIGINT) FROM ops
), latest AS (
    SELECT dev_key, ts,
           last_value(step_index IGNORE NULLS) OVER (PARTITION BY dev_key ORDER BY ts, is_op
                                                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS step_index
    FROM points
    QUALIFY is_op = 1
), step_of AS (
    SELECT k.dev_key, k.ts,
           CASE WHEN k.ts < s.start_ps + s.duration_ps THEN s.step_num END AS step_num,
           CASE WHEN k.ts < s.start_ps + s.duration_ps THEN s.start_ps END AS step_start,
           CASE WHEN k.ts < s.start_ps + s.duration_ps THEN s.is_eval END AS step_is_eval
    FROM latest k JOIN steps s USING (step_index)
)
SELECT o.run_id, o.host, o.device AS device_ordinal, o.short_name,
       o.name, o.category, o.collective_kind,
       o.hlo_category, o.hlo_module, o.tf_op, o.shape, o.flops, o.bytes_accessed, o.start_ps, o.duration_ps,
       o.line, o.is_container, k.step_num, k.step_start, k.step_is_eval
FROM ops o
LEFT JOIN step_of k ON k.dev_key = o.dev_key AND k.ts = o.start_ps;
