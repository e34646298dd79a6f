"""The benchmark's correction of armperf's block pricing (scripts/reprice.py), on made-up
hot-block lists: which blocks it takes for one straight run of code that qemu cut up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import reprice  # noqa: E402


def _block(offset: int, n: int, last: str = "add v0.4s, v0.4s, v1.4s", execs: float = 10.0,
           lib: str = "k.so") -> dict:
    code = ["smull v2.8h, v3.8b, v4.8b"] * (n - 1) + [last]
    return {"where": f"{lib}+{offset:#x}", "code": code, "execs": execs, "cycles": execs * n}


def _offsets(chains):
    return sorted([[reprice._start(b)[1] for b in chain] for chain in chains])


def test_a_loop_cut_at_a_page_boundary_is_one_chain_per_way_in():
    # A loop body from 0x1f60 to past 0x2000: qemu's block from the loop head stops at the
    # page end, and so does the block that enters it from the preamble at 0x1ef0.
    head = _block(0x1f60, 40, execs=4224)
    entry = _block(0x1ef0, 68, execs=384)
    tail = _block(0x2000, 37, last="b.ne #0x1f60", execs=4608)
    assert _offsets(reprice.split_chains([head, entry, tail])) == [[0x1ef0, 0x2000],
                                                                   [0x1f60, 0x2000]]


def test_a_long_unrolled_tile_cut_where_blocks_were_full_is_one_chain():
    pieces = [_block(0x1c00, 116), _block(0x1dd0, 108), _block(0x1f80, 32),
              _block(0x2000, 107), _block(0x21ac, 106, last="b.ne #0x1c00")]
    assert _offsets(reprice.split_chains(pieces[::-1])) == [[0x1c00, 0x1dd0, 0x1f80,
                                                             0x2000, 0x21ac]]


def test_blocks_that_end_on_a_branch_or_leave_a_gap_are_not_joined():
    branch = _block(0x1000, 10, last="b.ne #0x1000")
    after_branch = _block(0x1028, 10)
    gap = _block(0x2000, 10)  # ends at 0x2028: nothing starts there
    other_lib = _block(0x2028, 10, lib="other.so")
    for last in ("cbz x1, #0x40", "tbnz w2, #3, #0x80", "b #0x10", "bl #0x10"):
        ends = _block(0x3000, 4, last=last)
        assert reprice.split_chains([ends, _block(0x3010, 4)]) == []
    assert reprice.split_chains([branch, after_branch, gap, other_lib]) == []
