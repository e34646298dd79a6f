"""The inner-loop benchmark's reading of a loop (scripts/inner_loop_peak.py), on made-up
assembly: which instructions count as multiply-accumulates, and which are a tile's K run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import inner_loop_peak as ilp  # noqa: E402

# A tile whose short K loop was unrolled: zeroing, loads and sdots, then requantization.
TILE = [
    "movi v0.2d, #0000000000000000",
    "ldr q4, [x1]",
    "sdot v0.4s, v4.16b, v5.4b[0]",
    "ldr q6, [x1, #16]",
    "sdot v0.4s, v6.16b, v5.4b[1]",
    "sqrdmulh v0.4s, v0.4s, v7.4s",
    "srshl v0.4s, v0.4s, v8.4s",
    "subs x2, x2, #1",
    "b.ne .LBB0_1",
]


def test_k_run_is_first_to_last_multiply_accumulate():
    run = ilp.k_run(TILE)
    assert run == TILE[2:5]
    assert ilp.macs(run) == ilp.macs(TILE) == 2 * ilp.MACS["sdot"]


def test_k_run_of_a_k_loop_is_the_loop_without_its_branch():
    loop = ["ldr q4, [x1], #16", "smull v2.8h, v4.8b, v5.8b", "sadalp v0.4s, v2.8h",
            "smull2 v3.8h, v4.16b, v5.16b", "subs x2, x2, #1", "b.ne .LBB0_1"]
    assert ilp.k_run(loop) == loop[1:4]
