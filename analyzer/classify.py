"""Op -> attribution category and collective kind, as SQL expressions over an op row.

Works on real XProf traces (hlo_category values, HLO op names such as ``all-reduce-start``), GPU kernel
names (NCCL/RCCL) and XLA CPU op names; the optimizer is recognised from configurable name patterns
(analyzer/thresholds.toml ``[patterns]``), never from generator-specific markers.

XLA's async pairs (docs/attribution.md, "XLA's async ops") are classified by what they move: collective
halves (``all-reduce-start``/``-done``, ...) by their collective, ``copy-start``/``copy-done`` and host
transfers (``send``/``recv`` with ``is_host_transfer=true``, copies to/from host memory space ``S(5)``)
as ``memory_transfer``, and ``async-start``/``async-update``/``async-done`` by the computation they wrap
(``calls=%...`` in the HLO text, column ``wrapped``).
"""

from __future__ import annotations

from typing import Any

COLLECTIVE_KINDS = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "send/recv",
)

# HLO short names (display_name) of collectives, incl. async -start/-done halves. catalog §4.
_HLO_KIND_REGEX = {
    # psum/pmean: JAX names of its all-reduce computations on CPU traces
    "all-reduce": r"^%?(all-reduce|allreduce|all_reduce|cross-replica-sum|psum|pmean|pmax|pmin)([.\-_]|$)",
    "all-gather": r"^%?(all-gather|allgather|all_gather)([.\-_]|$)",
    "reduce-scatter": r"^%?(reduce-scatter|reducescatter|reduce_scatter)([.\-_]|$)",
    "all-to-all": r"^%?(all-to-all|alltoall|all_to_all|ragged-all-to-all)([.\-_]|$)",
    "collective-permute": r"^%?(collective-permute|collectivepermute|collective_permute)([.\-_]|$)",
    "send/recv": r"^%?(send|recv|send-done|recv-done)([.\-_]|$)",
}
# NCCL / RCCL kernel names on GPU streams.
_GPU_KIND_REGEX = {
    "all-reduce": r"(nccl|rccl).*all_?reduce",
    "all-gather": r"(nccl|rccl).*all_?gather",
    "reduce-scatter": r"(nccl|rccl).*reduce_?scatter",
    "all-to-all": r"(nccl|rccl).*(all_?to_?all|sendrecv)",
    "send/recv": r"(nccl|rccl).*(send|recv)",
}


def sql_literal(text: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


# Async wrappers: the generic async-start/-update/-done ops of XLA, classified by the wrapped computation.
_ASYNC_WRAPPER_REGEX = r"^%?async-(start|update|done)([.\-_]|$)"
# Device memory transfers: async copies (HBM <-> VMEM/host), the async dynamic-(update-)slice halves XLA
# uses for host offloading (XProf's host_offload_utils lists the same op names), GPU device-to-device
# and peer memcpys (ROCm runs hipMemcpyDtoD as its `__amd_rocclr_copyBuffer` kernel).
_MEMORY_TRANSFER_REGEX = (r"^%?(copy-start|copy-done|dynamic-slice-start|dynamic-slice-done"
                          r"|dynamic-update-slice-start|dynamic-update-slice-done)([.\-_]|$)"
                          r"|(memcpyd2d|memcpy dtod|memcpyp2p|memcpy ptop|copydevicetodevice|memcpyother"
                          r"|rocclr_copybuffer)")
# hlo_category values XProf writes for these ops ("host send"/"host recv" prefix the host/DCN transfers)
_MEMORY_TRANSFER_CATEGORIES = ("copy-start", "copy-done", "host transfer")


def wrapped_sql(name: str = "name", short_name: str = "short_name") -> str:
    """The computation an async-start/-update/-done op wraps (``calls=%all-gather.3`` in its HLO text),
    NULL for other ops. Its name tells what the async op does (docs/attribution.md)."""
    return (f"CASE WHEN regexp_matches(lower({short_name}), {sql_literal(_ASYNC_WRAPPER_REGEX)}) "
            f"THEN nullif(regexp_extract({name}, 'calls=%?([A-Za-z0-9_.-]+)', 1), '') END")


def host_transfer_sql(name: str = "name") -> str:
    """TRUE where the HLO text says the op moves data between device and host: send/recv with
    ``is_host_transfer=true``, or an async copy / dynamic-(update-)slice whose operand or result lives in
    host memory space ``S(5)`` (the host memory label XProf's host-offload view keys on)."""
    return (f"(coalesce(contains({name}, 'is_host_transfer=true'), FALSE) "
            f"OR coalesce(regexp_matches({name}, '(copy|dynamic-slice|dynamic-update-slice)-(start|done)') "
            f"AND contains({name}, 'S(5)'), FALSE))")


def collective_kind_sql() -> str:
    """CASE expression: the collective kind of an op row (NULL for non-collectives). Needs columns
    short_name, hlo_category, wrapped (see wrapped_sql) and host_transfer (see host_transfer_sql):
    host send/recv are memory transfers, not collectives."""
    hlo_cat = "lower(coalesce(hlo_category, ''))"
    sname = "lower(short_name)"
    wrapped = "lower(coalesce(wrapped, ''))"
    arms = [f"WHEN coalesce(host_transfer, FALSE) OR {hlo_cat} LIKE 'host send%' "
            f"OR {hlo_cat} LIKE 'host recv%' THEN NULL"]
    for kind, regex in _HLO_KIND_REGEX.items():
        cat_name = kind if kind != "send/recv" else "send"
        if kind == "send/recv":
            cat_test = f"{hlo_cat} IN ('send', 'recv')"
        else:
            cat_test = f"{hlo_cat} = {sql_literal(cat_name)}"
        name_test = (f"regexp_matches({sname}, {sql_literal(regex)}) "
                     f"OR regexp_matches({wrapped}, {sql_literal(regex)})")
        arms.append(f"WHEN {cat_test} OR {name_test} THEN {sql_literal(kind)}")
    for kind, regex in _GPU_KIND_REGEX.items():
        arms.append(f"WHEN regexp_matches({sname}, {sql_literal(regex)}) THEN {sql_literal(kind)}")
    return "CASE " + " ".join(arms) + " ELSE NULL END"


def op_category_sql(config: dict[str, Any]) -> str:
    """CASE expression: the attribution category of an op row (needs column collective_kind).

    Order: collectives, memory_transfer (async copies, host transfers, async ops wrapping a copy),
    input (infeed / host-to-device copy), output (outfeed / device-to-host), weight_update (optimizer name
    patterns on tf_op, op name or module), else compute (an async op wrapping a fusion is compute).
    """
    wu = sql_literal(config["patterns"]["weight_update"])
    hlo_cat = "lower(coalesce(hlo_category, ''))"
    sname = "lower(short_name)"
    mem = sql_literal(_MEMORY_TRANSFER_REGEX)
    mem_cats = "(" + ", ".join(sql_literal(c) for c in _MEMORY_TRANSFER_CATEGORIES) + ")"
    return (
        "CASE WHEN collective_kind IS NOT NULL THEN 'collectives' "
        f"WHEN coalesce(host_transfer, FALSE) OR {hlo_cat} IN {mem_cats} OR {hlo_cat} LIKE 'host send%' "
        f"OR {hlo_cat} LIKE 'host recv%' OR regexp_matches({sname}, {mem}) "
        f"OR regexp_matches(lower(coalesce(wrapped, '')), '^%?(copy|copy-start)([._-]|$)') "
        "THEN 'memory_transfer' "
        f"WHEN {hlo_cat} LIKE 'infeed%' OR regexp_matches({sname}, '^%?infeed([.\\-_]|$)') "
        f"OR regexp_matches({sname}, '(memcpyh2d|memcpy htod|copyhosttodevice)') THEN 'input' "
        f"WHEN {hlo_cat} LIKE 'outfeed%' OR regexp_matches({sname}, '^%?outfeed([.\\-_]|$)') "
        f"OR regexp_matches({sname}, '(memcpyd2h|memcpy dtoh|copydevicetohost)') THEN 'output' "
        f"WHEN regexp_matches(lower(coalesce(tf_op, '')), {wu}) OR regexp_matches({sname}, {wu}) "
        f"OR regexp_matches(lower(coalesce(hlo_module, '')), {wu}) THEN 'weight_update' "
        "ELSE 'compute' END"
    )


# Control-flow containers (while/conditional/call) enclose their body ops (docs/attribution.md, att_intervals)
_CONTAINER_REGEX = r"^(while|conditional|call)([.]|$)"


def container_sql(short_name: str = "short_name") -> str:
    """TRUE where the op is a control-flow container (while/conditional/call): it counts as compute only
    where none of its body ops runs."""
    return f"regexp_matches(lower({short_name}), {sql_literal(_CONTAINER_REGEX)})"


def classified_sql(source: str, op_category: str) -> str:
    """``source``'s rows (columns name, short_name, hlo_category, tf_op, hlo_module) with their class:
    wrapped, host_transfer, collective_kind, category (``op_category``: ``op_category_sql``'s text) and
    is_container, each expression over the ones before it. The one classification of stage att_ops and
    of the per-host narrow op kinds (analyzer/op_kinds.py)."""
    return (f"SELECT *, {op_category} AS category, {container_sql()} AS is_container\n"
            f"    FROM (SELECT *, {collective_kind_sql()} AS collective_kind\n"
            f"          FROM (SELECT *, {wrapped_sql()} AS wrapped, {host_transfer_sql()} AS host_transfer\n"
            f"                FROM {source}))")


def dtype_sql(column: str = "coalesce(shape, name)") -> str:
    """The element type of an op from its shape text (e.g. ``f32[25557032]`` -> ``f32``)."""
    return (
        f"nullif(regexp_extract({column}, "
        "'(bf16|f16|f32|f64|f8e4m3fn|f8e5m2|s8|s16|s32|s64|u8|u16|u32|u64|pred|c64|c128)\\[', 1), '')"
    )
