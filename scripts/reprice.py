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

Split blocks. qemu ends a translation block where a guest page ends, and when the block
has grown to as many guest instructions as its code buffer takes (about a hundred NEON
instructions), so straight-line code is counted as several blocks: a loop whose body
straddles a 4 KiB boundary, a fully unrolled GEMM tile of several hundred instructions.
llvm-mca prices each piece on its own, as if it were a loop of its own: every value one
piece hands the next then looks like a dependency carried from the previous iteration of
the same piece, and the scheduler cannot overlap the pieces. On the depthwise loop of
MobileNetV1's 14x14 layers (77 instructions, cut 40 + 37 at a page boundary) that is
21 + 46 = 67 cycles against 42 for the loop priced whole. Where code lands and how long
its straight runs are is the same on the core whichever way qemu cuts it, and it happens
to TFLite's kernels too. So ``reprice`` also finds such chains among the hot blocks
(``split_chains``: a block that ends on an instruction that is not a branch, where another
hot block starts) and prices the executions that run through a whole chain as one block:

    + executions through the chain x (cycles of the chain as one block
                                      - the sum of its pieces' cycles)

The other executions of a piece (entered in the middle of a chain from elsewhere) keep
its own price.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inner_loop_peak import _BRANCH, decode_line, mca_cycles  # noqa: E402

# armperf's core model per ISA level (its README)
CORE = {"neon": "cortex-a72", "dotprod": "neoverse-n1", "i8mm": "neoverse-n2"}


# qemu prints adr / adrp with an absolute address, which llvm-mca cannot assemble; a mov
# of an immediate is the same single ALU operation for the scheduling model.
_ADRP = re.compile(r"^\s*adrp?\s+(x\d+),\s*#?-?0x[0-9a-f]+\s*$", re.I)


def _priceable(line: str) -> str:
    m = _ADRP.match(line)
    return f"mov {m.group(1)}, #0" if m else line


def _start(block: dict) -> tuple[str, int]:
    """(library, offset) where a hot block starts (armperf's ``where``: "lib.so+0x1f60")."""
    lib, offset = block["where"].rsplit("+", 1)
    return lib, int(offset, 16)


def split_chains(hot: list[dict]) -> list[list[dict]]:
    """Runs of hot blocks that are one straight run of code cut by qemu: each block but
    the last ends on an instruction that is not a branch (4 bytes per aarch64
    instruction), exactly where the next one starts. A block two others run into (a
    loop's back edge and its entry) is in both chains."""
    by_start = {_start(b): b for b in hot if "+" in b.get("where", "")}

    def successor(block):
        lib, start = _start(block)
        last = block["code"][-1].strip() if block["code"] else ""
        if _BRANCH.match(last):
            return None
        return by_start.get((lib, start + 4 * len(block["code"])))

    followed = {id(s) for s in map(successor, by_start.values()) if s is not None}
    chains = []
    for block in by_start.values():
        if id(block) in followed:
            continue  # chains start at a piece nothing falls into
        chain = [block]
        while (nxt := successor(chain[-1])) is not None and nxt not in chain:
            chain.append(nxt)
        if len(chain) > 1:
            chains.append(chain)
    return chains


def reprice(side: dict, level: str) -> float:
    """Corrected estimated cycles per run of one side of an armperf result: the hot blocks'
    ``.byte`` words decoded and priced, and blocks qemu split priced whole."""
    core = CORE[level]

    def code(block):
        return [_priceable(decode_line(line)) for line in block["code"]]

    before = after = 0.0
    for block in side["hot"]:  # cycles and execs are per run already
        cycles = block["cycles"]
        before += cycles
        if any(decode_line(line) != line for line in block["code"]):
            cycles = mca_cycles(code(block), core) * block["execs"]
        after += cycles
    # a piece several chains run through (a loop's entry and back edge) is shared out
    chains = split_chains(side["hot"])
    left = {id(b): b["execs"] for chain in chains for b in chain}
    for chain in chains:
        through = min(left[id(b)] for b in chain)
        for b in chain:
            left[id(b)] -= through
        try:
            whole = mca_cycles([line for b in chain for line in code(b)], core)
            apart = sum(mca_cycles(code(b), core) for b in chain)
        except RuntimeError:  # a line llvm-mca cannot assemble: the pieces keep their prices
            continue
        after += through * (whole - apart)
    return side["cycles_per_run"] - before + after
