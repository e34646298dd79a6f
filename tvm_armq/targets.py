"""ISA levels and aarch64 target presets.

tvm_armq thinks of Arm CPUs in three *ISA levels*, ordered from the most
portable to the fastest int8 instruction they offer:

    level     int8 instruction it adds        emulated CPU (qemu-user)   example cores
    -------   -----------------------------   ------------------------   -------------------
    neon      umull/smull + uadalp (Armv8.0)  cortex-a72                 Cortex-A53/A72
    dotprod   sdot/udot (Armv8.2 +dotprod)    neoverse-n1                Cortex-A76, Neoverse-N1
    i8mm      smmla/ummla (Armv8.6 +i8mm)     max,sve=off,sme=off        Neoverse-N2/V2, Cortex-X2

Each level is one ``IsaLevel`` record: the TVM target that compiles code for it
and the qemu CPU model that runs that code (and only that code: an instruction
the level lacks dies with SIGILL under that CPU, as it would on silicon).

``target(name)`` returns a JSON target dict for a level or for a named core, and
``resolve(target)`` makes a ``tvm.target.Target`` of any target tvm_armq is given (a level
or core name, a JSON dict or string, a Target): targets are resolved here and nowhere else.
The i8mm level deliberately has no ``mcpu``: an ``mcpu`` such as neoverse-n2
turns SVE on, and the emulated i8mm CPU has SVE off.
"""

from __future__ import annotations

import dataclasses

AARCH64_TRIPLE = "aarch64-linux-gnu"


@dataclasses.dataclass(frozen=True)
class IsaLevel:
    """One rung of the ISA ladder: how to compile for it and how to emulate it."""

    name: str
    qemu_cpu: str  # value for qemu-aarch64 -cpu / QEMU_CPU
    mcpu: str | None  # LLVM -mcpu, only where it cannot switch on features the level lacks
    mattr: tuple[str, ...]  # LLVM -mattr
    summary: str

    def target(self) -> dict:
        """The TVM target (JSON dict form) that compiles code for this level."""
        t = {"kind": "llvm", "mtriple": AARCH64_TRIPLE}
        if self.mcpu:
            t["mcpu"] = self.mcpu
        if self.mattr:
            t["mattr"] = list(self.mattr)
        return t


# Ordered from the portable baseline to the richest level.
LEVELS: dict[str, IsaLevel] = {
    lvl.name: lvl
    for lvl in (
        IsaLevel("neon", "cortex-a72", "cortex-a72", ("+neon",), "Armv8.0 Advanced SIMD"),
        IsaLevel("dotprod", "neoverse-n1", "neoverse-n1", ("+neon", "+dotprod"),
                 "Armv8.2 with the dot-product extension"),
        IsaLevel("i8mm", "max,sve=off,sme=off", None,
                 ("+v8.6a", "+neon", "+dotprod", "+i8mm", "+bf16"),
                 "Armv8.6 with int8 and bf16 matrix multiply"),
    )
}

# Named cores map onto a level, with the core's own mcpu where that is safe.
_CORES: dict[str, tuple[str, dict]] = {
    "cortex-a53": ("neon", {"mcpu": "cortex-a53"}),
    "cortex-a72": ("neon", {"mcpu": "cortex-a72"}),
    "cortex-a76": ("dotprod", {"mcpu": "cortex-a76"}),
    "neoverse-n1": ("dotprod", {"mcpu": "neoverse-n1"}),
}


class UnknownIsaError(ValueError):
    """Raised for an ISA level or core name tvm_armq does not know."""


def level(name: str) -> IsaLevel:
    """The ``IsaLevel`` called ``name``; a clear error naming the valid levels otherwise."""
    try:
        return LEVELS[name]
    except KeyError:
        raise UnknownIsaError(
            f"unknown ISA level {name!r}: expected one of {', '.join(LEVELS)}") from None


def target(name: str, levels=None) -> dict:
    """JSON target dict for an ISA level (``neon``, ``dotprod``, ``i8mm``), a named core,
    or ``portable`` (``levels``: the levels it carries, default all)."""
    if name == PORTABLE:
        return portable(levels or tuple(LEVELS))
    if levels is not None:
        raise ValueError(f"levels= applies to the {PORTABLE!r} target only, not {name!r}")
    return preset(name)


PORTABLE = "portable"
PORTABLE_KEY = "armq_portable"  # target key of a portable build; armq_level_<L> per level


def portable(levels=tuple(LEVELS)) -> dict:
    """The target of one library for every Arm CPU (``tvm_armq/portable.py``): the lowest
    of ``levels`` compiles everything, and each GEMM layer carries a kernel per level,
    chosen when it runs. The levels travel as target keys."""
    unknown = [lvl for lvl in levels if lvl not in LEVELS]
    if unknown or not levels:
        raise UnknownIsaError(f"portable levels {list(levels)}: expected some of "
                              f"{', '.join(LEVELS)}")
    ordered = [name for name in LEVELS if name in levels]
    return {**LEVELS[ordered[0]].target(),
            "keys": ["arm_cpu", "cpu", PORTABLE_KEY, *(f"armq_level_{n}" for n in ordered)]}


def portable_levels(target) -> tuple[str, ...] | None:
    """The levels of a portable target (lowest first), or None for any other target."""
    keys = [str(k) for k in target.keys]
    if PORTABLE_KEY not in keys:
        return None
    return tuple(n for n in LEVELS if f"armq_level_{n}" in keys)


def preset(name: str) -> dict:
    """``target``: the JSON target dict of an ISA level or a named core."""
    if name in LEVELS:
        return LEVELS[name].target()
    if name == PORTABLE:
        return portable()
    if name in _CORES:
        lvl, extra = _CORES[name]
        return {**LEVELS[lvl].target(), **extra}
    raise UnknownIsaError(
        f"unknown target preset {name!r}: expected an ISA level ({', '.join(LEVELS)}) "
        f"or a core ({', '.join(_CORES)})")


def resolve(target):
    """A ``tvm.target.Target`` from an ISA level or core name (``neon``, ``cortex-a76``,
    ...), a JSON target dict or string, or a Target (returned as it is). Every target
    tvm_armq is given goes through here."""
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and not target.lstrip().startswith("{"):
        try:
            return tvm.target.Target(preset(target))
        except UnknownIsaError:
            if " " not in target and target not in ("llvm", "c"):
                raise
    return tvm.target.Target(target)


def describe(target) -> str:
    """A short label of a target for messages: kind, triple, cpu and features."""
    attrs = target.attrs
    parts = [target.kind.name] + [str(attrs[k]) for k in ("mtriple", "mcpu") if k in attrs]
    if "mattr" in attrs and len(attrs["mattr"]):
        parts.append(",".join(str(m) for m in attrs["mattr"]))
    return " ".join(parts)
