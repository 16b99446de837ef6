"""TPU-v3 slice topology: chips, cores, hosts and the 2-D torus/mesh the collectives run on.

Facts from catalog §2: 2 TensorCores per chip, 123 TFLOP/s bf16 per chip (61.5 per core), ~900 GB/s
HBM per chip; pods are 2-D tori up to 32x32 (1024 chips) with 4 chips per host; the v0.7 multipod is
a 128x32 mesh (wraparound only on the 32 axis) with 8 chips per host.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuanalyze.errors import TpuAnalyzeError

CORES_PER_CHIP = 2
PEAK_TFLOPS_PER_CORE = 61.5  # catalog §2: 123 TFLOP/s bf16 per chip
HBM_GBPS_PER_CHIP = 900.0  # catalog §2
# Two cores share a chip's HBM; each core sees half of it when both stream (documented in docs/generator.md).
HBM_GBPS_PER_CORE = HBM_GBPS_PER_CHIP / CORES_PER_CHIP
ICI_GBPS_PER_LINK = 100.0  # catalog §2 [est], one way
DCN_GBPS_PER_HOST = 25.0  # catalog §2 [est]
PCIE_GBPS_PER_CHIP = 15.0  # catalog §2 [est]
MAX_POD_CHIPS = 1024
MAX_CHIPS = 4096
VALID_CHIPS = tuple(4 * 2**k for k in range(11))  # v3-8 (4 chips) ... 4096-chip multipod


@dataclass(frozen=True)
class Topology:
    """A TPU-v3 slice: how many chips, how they are wired and how they are grouped into hosts."""

    chips: int
    x: int  # torus/mesh extent on the long axis
    y: int  # extent on the short axis
    wrap_x: bool
    wrap_y: bool
    chips_per_host: int

    @property
    def cores(self) -> int:
        return self.chips * CORES_PER_CHIP

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def cores_per_host(self) -> int:
        return self.chips_per_host * CORES_PER_CHIP

    @property
    def name(self) -> str:
        """Cloud slice name: counts cores (v3-8 = 4 chips), as the MLPerf folder names do."""
        return f"v3-{self.cores}"

    def host_of_core(self, core: int) -> int:
        return core // self.cores_per_host


def topology_for(chips: int) -> Topology:
    """The slice shape for a chip count; anything but 4 * 2^k up to 4096 is not a TPU-v3 slice."""
    if chips not in VALID_CHIPS:
        raise TpuAnalyzeError(
            f"--chips {chips} is not a TPU-v3 slice size (valid: {', '.join(map(str, VALID_CHIPS))})"
        )
    if chips > MAX_POD_CHIPS:  # multipod: 128x32 mesh, wraparound only on the 32 axis (catalog §2)
        return Topology(chips, chips // 32, 32, wrap_x=False, wrap_y=True, chips_per_host=8)
    # square-ish sub-slices of a 32x32 pod; only a full pod axis of 32 has wraparound links
    side = 1
    while side * side * 2 <= chips:
        side *= 2
    x, y = max(side, chips // side), min(side, chips // side)
    return Topology(chips, x, y, wrap_x=(x == 32), wrap_y=(y == 32), chips_per_host=4)
