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
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inner_loop_peak import decode_line, mca_cycles  # noqa: E402

# armperf's core model per ISA level (its README)
CORE = {"neon": "cortex-a72", "dotprod": "neoverse-n1", "i8mm": "neoverse-n2"}


# qemu prints adrp with an absolute page address, which llvm-mca cannot assemble; a mov of
# an immediate is the same single ALU operation for the scheduling model.
_ADRP = re.compile(r"^\s*adrp\s+(x\d+),\s*#?-?0x[0-9a-f]+\s*$", re.I)


def _priceable(line: str) -> str:
    m = _ADRP.match(line)
    return f"mov {m.group(1)}, #0" if m else line


def reprice(side: dict, level: str) -> float:
    """Corrected estimated cycles per run of one side of an armperf result."""
    before = after = 0.0
    for block in side["hot"]:  # cycles and execs are per run already
        decoded = [decode_line(line) for line in block["code"]]
        cycles = block["cycles"]
        before += cycles
        if decoded != block["code"]:
            cycles = mca_cycles([_priceable(line) for line in decoded],
                                CORE[level]) * block["execs"]
        after += cycles
    return side["cycles_per_run"] - before + after
