-- tpuanalyze trace database: the public relations (contract; documented in docs/schema.md).
-- Times are picoseconds relative to the run's time zero (runs.t0_ns, ns since the epoch), since
-- absolute picoseconds overflow int64.

CREATE SEQUENCE IF NOT EXISTS run_id_seq START 1;

CREATE TABLE IF NOT EXISTS runs (
    run_id          INTEGER PRIMARY KEY,
    name            VARCHAR NOT NULL,     -- <logdir or parent>/<run>, unique in the database (store/names.py)
    source_path     VARCHAR NOT NULL,     -- absolute path of the run folder or file; re-ingest key (keeps run_id)
    source_format   VARCHAR NOT NULL,     -- 'xspace' | 'chrome_json' | 'mlperf'
    device_type     VARCHAR,              -- e.g. 'TPU v3', 'TPU v6 Lite', 'GPU', 'CPU'
    num_hosts       INTEGER NOT NULL,
    num_devices     INTEGER NOT NULL,     -- accelerator planes (TPU cores / GPUs) across hosts
    t0_ns           BIGINT,               -- time zero of the run, ns since the epoch
    capture_start_ps BIGINT,              -- first event start (relative to t0)
    capture_end_ps  BIGINT,               -- last event end (relative to t0)
    num_events      BIGINT NOT NULL,
    ingested_at     TIMESTAMP NOT NULL,
    metadata        JSON                  -- anything else (e.g. generator scenario name from file stats)
);

CREATE TABLE IF NOT EXISTS hosts (
    run_id          INTEGER NOT NULL,
    host            VARCHAR NOT NULL,     -- from the file name: <host>.xplane.pb
    file_path       VARCHAR NOT NULL,
    file_bytes      BIGINT,
    hostnames       VARCHAR[],            -- XSpace.hostnames
    errors          VARCHAR[],            -- XSpace.errors
    warnings        VARCHAR[]
);

CREATE TABLE IF NOT EXISTS planes (
    run_id          INTEGER NOT NULL,
    host            VARCHAR NOT NULL,
    plane_index     INTEGER NOT NULL,     -- position in the file (names can repeat)
    plane_id        BIGINT,               -- XPlane.id
    name            VARCHAR NOT NULL,     -- '/device:TPU:0', '/host:CPU', ...
    kind            VARCHAR NOT NULL,     -- 'tpu' | 'gpu' | 'cpu_host' | 'metadata' | 'other'
    device_ordinal  INTEGER,              -- N of /device:XXX:N, else NULL
    device_type     VARCHAR,              -- plane stat device_type_string
    peak_tflops     DOUBLE,               -- plane stat peak_teraflops_per_second
    peak_hbm_bw_gbps DOUBLE,              -- plane stat peak_hbm_bw_gigabytes_per_second
    num_lines       INTEGER NOT NULL,
    num_events      BIGINT NOT NULL,
    stats           JSON                  -- every plane stat, name -> value
);

CREATE TABLE IF NOT EXISTS lines (
    run_id          INTEGER NOT NULL,
    host            VARCHAR NOT NULL,
    plane_index     INTEGER NOT NULL,
    line_index      INTEGER NOT NULL,     -- position in the plane (names can repeat)
    line_id         BIGINT,               -- XLine.id
    display_id      BIGINT,
    name            VARCHAR NOT NULL,     -- 'Steps', 'XLA Modules', 'XLA Ops', thread names, ...
    display_name    VARCHAR,
    timestamp_ns    BIGINT,               -- XLine.timestamp_ns (absolute)
    duration_ps     BIGINT,
    num_events      BIGINT NOT NULL
);

-- One row per event metadata (XEventMetadata) of a plane: the op/name table events point at.
CREATE TABLE IF NOT EXISTS event_metadata (
    run_id          INTEGER NOT NULL,
    host            VARCHAR NOT NULL,
    plane_index     INTEGER NOT NULL,
    metadata_id     BIGINT NOT NULL,
    name            VARCHAR NOT NULL,
    display_name    VARCHAR,
    hlo_category    VARCHAR,
    hlo_module      VARCHAR,
    program_id      UBIGINT,
    flops           DOUBLE,
    bytes_accessed  DOUBLE,
    tf_op           VARCHAR,
    shape           VARCHAR,
    source          VARCHAR,
    step_num        BIGINT,
    group_id        BIGINT,
    correlation_id  BIGINT,
    stats           JSON                  -- the metadata's other stats, name -> value
);

-- Storage of the events: one narrow numeric row per trace event. Names and op properties live
-- once per event metadata (event_metadata); the few values an event carries itself beyond
-- step_num/group_id live in event_details. Query the `events` view, not these tables.
-- Narrow on purpose: DuckDB builds a row group uncompressed in memory before writing it, so every
-- mostly-NULL column here cost ~1 MB of ingest memory per 122,880 events (docs/schema.md).
CREATE TABLE IF NOT EXISTS event_rows (
    run_id          INTEGER NOT NULL,
    host            VARCHAR NOT NULL,
    plane_index     INTEGER NOT NULL,
    line_index      INTEGER NOT NULL,
    event_index     BIGINT NOT NULL,      -- position of the event in its plane (key of event_details)
    metadata_id     BIGINT,
    start_ps        BIGINT NOT NULL,
    duration_ps     BIGINT NOT NULL,
    num_occurrences BIGINT,
    step_num        BIGINT,               -- the event's own step_num / iter_num stat
    group_id        BIGINT                -- the event's own group_id stat
);

-- The event's own typed stats other than step_num/group_id, and its other stats as JSON: one row
-- per event that has any (host threads' annotations, GPU kernels' correlation ids), none for the
-- millions of device ops whose properties are their metadata's.
CREATE TABLE IF NOT EXISTS event_details (
    run_id          INTEGER NOT NULL,
    host            VARCHAR NOT NULL,
    plane_index     INTEGER NOT NULL,
    event_index     BIGINT NOT NULL,
    hlo_category    VARCHAR,
    hlo_module      VARCHAR,
    program_id      UBIGINT,
    flops           DOUBLE,
    bytes_accessed  DOUBLE,
    tf_op           VARCHAR,
    shape           VARCHAR,
    source          VARCHAR,
    correlation_id  BIGINT,
    stats           JSON
);

-- The events relation users query (contract): one row per trace event, names and typed stats
-- resolved (event value wins over its metadata's).
CREATE VIEW IF NOT EXISTS events AS
SELECT r.run_id, r.host, r.plane_index, r.line_index,
       p.name AS plane,                   -- plane name
       l.name AS line,                    -- line name
       p.device_ordinal,                  -- of the plane, NULL on host planes
       COALESCE(m.name, '') AS name,      -- event metadata name (HLO text on TPU 'XLA Ops')
       COALESCE(NULLIF(m.display_name, ''), m.name, '') AS display_name,
       r.start_ps,                        -- relative to runs.t0_ns
       r.duration_ps,
       r.num_occurrences,                 -- aggregated events (XEvent.num_occurrences), else NULL
       COALESCE(d.hlo_category, m.hlo_category) AS hlo_category,
       COALESCE(d.hlo_module, m.hlo_module) AS hlo_module,
       COALESCE(d.program_id, m.program_id) AS program_id,
       COALESCE(d.flops, m.flops) AS flops,
       COALESCE(d.bytes_accessed, m.bytes_accessed) AS bytes_accessed,
       COALESCE(d.tf_op, m.tf_op) AS tf_op,
       COALESCE(d.shape, m.shape) AS shape,
       COALESCE(d.source, m.source) AS source,
       COALESCE(r.step_num, m.step_num) AS step_num,
       COALESCE(r.group_id, m.group_id) AS group_id,
       COALESCE(d.correlation_id, m.correlation_id) AS correlation_id,
       d.stats,                           -- the event's own other stats (metadata's: event_metadata)
       r.metadata_id                      -- XEvent.metadata_id (key into event_metadata)
FROM event_rows r
JOIN planes p ON p.run_id = r.run_id AND p.host = r.host AND p.plane_index = r.plane_index
JOIN lines l ON l.run_id = r.run_id AND l.host = r.host AND l.plane_index = r.plane_index
            AND l.line_index = r.line_index
LEFT JOIN event_metadata m ON m.run_id = r.run_id AND m.host = r.host AND m.plane_index = r.plane_index
                          AND m.metadata_id = r.metadata_id
LEFT JOIN event_details d ON d.run_id = r.run_id AND d.host = r.host AND d.plane_index = r.plane_index
                         AND d.event_index = r.event_index;

-- Every stat of an event, merged: metadata stats overridden by the event's own (typed ones excluded).
CREATE VIEW IF NOT EXISTS event_stats AS
SELECT e.*, CASE WHEN m.stats IS NULL THEN e.stats
                 WHEN e.stats IS NULL THEN m.stats
                 ELSE json_merge_patch(m.stats, e.stats) END AS all_stats
FROM events e
LEFT JOIN event_metadata m
  ON m.run_id = e.run_id AND m.host = e.host AND m.plane_index = e.plane_index AND m.metadata_id = e.metadata_id;

-- MLPerf result logs (tpuanalyze.parsers.mlperf).
CREATE TABLE IF NOT EXISTS mlperf_results (
    run_id          INTEGER NOT NULL,     -- the folder's row in runs (source_format 'mlperf')
    result_file     VARCHAR NOT NULL,
    benchmark       VARCHAR,              -- resnet, bert, transformer, ssd, maskrcnn, gnmt, ...
    submitter_path  VARCHAR,              -- e.g. v0.7/tpu-v3-8192/resnet
    version         VARCHAR,              -- 'v0.6' | 'v0.7'
    cores           INTEGER,
    chips           INTEGER,
    framework       VARCHAR,
    run_start_ms    DOUBLE,
    run_stop_ms     DOUBLE,
    status          VARCHAR,
    global_batch_size BIGINT,
    opt_name        VARCHAR,
    epochs          DOUBLE,
    eval_count      INTEGER,
    eval_ms         DOUBLE,
    hyperparameters JSON
);

CREATE TABLE IF NOT EXISTS mlperf_intervals (
    run_id          INTEGER NOT NULL,
    result_file     VARCHAR NOT NULL,
    kind            VARCHAR NOT NULL,     -- 'init' | 'run' | 'block' | 'eval' | 'epoch'
    start_ms        DOUBLE,
    stop_ms         DOUBLE,
    epoch           DOUBLE,               -- first_epoch_num / epoch_num
    epoch_count     DOUBLE,
    value           DOUBLE                -- e.g. eval_accuracy
);
