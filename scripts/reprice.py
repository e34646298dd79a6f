"""armperf's estimate with the dot-product and matrix instructions priced.

qemu's disassembler prints sdot / udot / usdot / smmla / ummla / bfmmla as ``.byte``
words, and llvm-mca reads a ``.byte`` as data: it costs nothing. Every dotprod and i8mm
GEMM, TFLite's and tvm_armq's alike, is then cheaper in armperf's figure than on the
core. ``reprice(side)`` takes one side of an armperf JSON result (``tflite`` or ``tvm``,
run with a large ``--top`` so the hot list covers nearly everything), decodes those words
back to mnemonics (``inner_loop_peak.decode_line``), prices each changed block again with
llvm-mca on the same core model and flags, and returns the corrected cycles per run:

    corrected = cycles_per_run - sum(hot blocks as armperf priced them)
                               + sum(hot blocks with the words decoded)

Blocks without such words keep armperf's price, and the part armperf did not list (the
cold tail) keeps its share unchanged.

Page splits. qemu ends a translation block where a guest page ends, so a loop whose body
straddles a 4 KiB boundary is counted as two blocks, and llvm-mca prices each on its own,
as if it were a loop of its own: every value the first half hands the second then looks
like a dependency carried from the previous iteration of the same half, and the
scheduler cannot overlap the two halves. On the depthwise loop of MobileNetV1's 14x14
layers (77 instructions, cut 40 + 37 at a page boundary) that is 21 + 46 = 67 cycles
against 42 for the loop priced whole. Where the code lands is chance (the same source
moved across a boundary between two builds), and it is chance for TFLite's kernels too;
the core runs the loop the same either way. So ``reprice`` also finds such pairs among
the hot blocks (``page_splits``: a block that ends exactly at a page boundary on an
instruction that is not a branch, and the hot block that starts there) and prices the
executions that run through both as one block:

    + executions of the first half x (cycles of both halves as one block
                                      - cycles of the first - cycles of the second)

The second half's other executions (entered at the boundary from elsewhere) keep its
own price.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inner_loop_peak import _BRANCH, decode_line, mca_cycles  # noqa: E402

# armperf's core model per ISA level (its README)
CORE = {"neon": "cortex-a72", "dotprod": "neoverse-n1", "i8mm": "neoverse-n2"}


# qemu prints adrp with an absolute page address, which llvm-mca cannot assemble; a mov of
# an immediate is the same single ALU operation for the scheduling model.
_ADRP = re.compile(r"^\s*adrp\s+(x\d+),\s*#?-?0x[0-9a-f]+\s*$", re.I)


def _priceable(line: str) -> str:
    m = _ADRP.match(line)
    return f"mov {m.group(1)}, #0" if m else line


PAGE = 4096  # bytes: qemu's translation blocks end where a guest page ends


def _start(block: dict) -> tuple[str, int]:
    """(library, offset) where a hot block starts (armperf's ``where``: "lib.so+0x1f60")."""
    lib, offset = block["where"].rsplit("+", 1)
    return lib, int(offset, 16)


def page_splits(hot: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs (first, second) of hot blocks that are one straight run of code cut by a page
    boundary: ``first`` ends exactly at a page boundary on an instruction that is not a
    branch (4 bytes per aarch64 instruction), and ``second`` starts there."""
    by_start = {_start(b): b for b in hot if "+" in b.get("where", "")}
    pairs = []
    for block in by_start.values():
        lib, start = _start(block)
        end = start + 4 * len(block["code"])
        last = block["code"][-1].strip() if block["code"] else ""
        if end % PAGE == 0 and not _BRANCH.match(last) and (lib, end) in by_start:
            pairs.append((block, by_start[(lib, end)]))
    return pairs


def reprice(side: dict, level: str) -> float:
    """Corrected estimated cycles per run of one side of an armperf result: the hot blocks'
    ``.byte`` words decoded and priced, and page-split blocks priced whole."""
    core = CORE[level]

    def code(block):
        return [_priceable(decode_line(line)) for line in block["code"]]

    before = after = 0.0
    for block in side["hot"]:  # cycles and execs are per run already
        cycles = block["cycles"]
        before += cycles
        if code(block) != block["code"]:
            cycles = mca_cycles(code(block), core) * block["execs"]
        after += cycles
    # several blocks may run into the same second half (a loop's back edge, its entry)
    left = {id(second): second["execs"] for _, second in page_splits(side["hot"])}
    for first, second in page_splits(side["hot"]):
        through = min(first["execs"], left[id(second)])
        left[id(second)] -= through
        whole = mca_cycles(code(first) + code(second), core)
        apart = mca_cycles(code(first), core) + mca_cycles(code(second), core)
        after += through * (whole - apart)
    return side["cycles_per_run"] - before + after
