"""The TensorIntrins tvm_armq registers with TVM, one per kernel form, and ``tensorize``.

A kernel's block form is registered under the kernel's name; its K-loop and direct forms
under names that carry their parameters (``forms.k_loop_name``, ``forms.direct_name``), on
demand, when a schedule first uses them, so ``register_named`` can rebuild any of them from
a name found in a tuning record. Each TensorIntrin is the form's scalar desc
(``forms.py``) and the impl the kernel's instruction module builds (its ``IMPLEMENTS``).

Registration is explicit and idempotent: ``register(kernel)`` / ``register_all()``, or
``tensorize(...)``, which checks the target can run the kernel, registers what it uses
and calls ``Schedule.tensorize``.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from typing import Callable

from . import dot, mmla, neon
from .forms import (DirectWindow, Implementation, desc, desc_direct, desc_k_loop,
                    direct_name, k_loop_name)
from .kernels import BLOCK, DIRECT, K_LOOP, NAME_RE, TABLE, Kernel, get, require

# Kernel.module -> what that instruction module implements
IMPLEMENTATIONS: dict[str, Implementation] = {
    "dot": dot.IMPLEMENTS, "mmla": mmla.IMPLEMENTS, "neon": neon.IMPLEMENTS}


def implementation(kernel: Kernel) -> Implementation:
    """The ``IMPLEMENTS`` object of ``kernel``'s instruction module."""
    if kernel.module is None:
        raise ValueError(f"{kernel.name} is the scalar reference: it has no instruction "
                         "sequence and is never tensorized (leave its loops as they are)")
    return IMPLEMENTATIONS[kernel.module]


def _builder(kernel: Kernel, form: str) -> Callable:
    if form not in kernel.forms:
        raise ValueError(f"{kernel.name} has no {form} form (its forms: "
                         f"{', '.join(kernel.forms) or 'none'})")
    return getattr(implementation(kernel), form)


def impl(kernel: Kernel):
    """The impl PrimFunc of ``kernel``'s block form (from its instruction module)."""
    return _builder(kernel, BLOCK)(kernel)


def register(kernel: Kernel) -> str:
    """Register ``kernel``'s TensorIntrin (once) and return its name."""
    from tvm.s_tir import TensorIntrin

    if kernel.intrin is None:
        raise ValueError(f"{kernel.name} is the scalar reference: there is no TensorIntrin")
    if TensorIntrin.get(kernel.intrin, allow_missing=True) is None:
        TensorIntrin.register(kernel.intrin, desc(kernel), impl(kernel))
    return kernel.intrin


def register_k_loop(kernel: Kernel, k_blocks: int) -> str:
    """Register ``kernel``'s whole-K TensorIntrin for ``k_blocks`` blocks (once); its name."""
    from tvm.s_tir import TensorIntrin

    build = _builder(kernel, K_LOOP)
    name = k_loop_name(kernel, k_blocks)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc_k_loop(kernel, k_blocks), build(kernel, k_blocks))
    return name


def register_direct(kernel: Kernel, window: DirectWindow, n_tiles: int) -> str:
    """Register ``kernel``'s direct-read TensorIntrin for ``window`` and n_tiles (once);
    its name."""
    from tvm.s_tir import TensorIntrin

    build = _builder(kernel, DIRECT)
    if window.segment % kernel.kr:
        raise ValueError(f"{kernel.name}: the direct-read form needs each run of A "
                         f"({window.segment} elements) to be a multiple of kr "
                         f"({kernel.kr}): A is not padded")
    name = direct_name(kernel, window, n_tiles)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc_direct(kernel, window, n_tiles),
                              build(kernel, window, n_tiles))
    return name


_K_LOOP_RE = re.compile(r"^(?P<kernel>gemm_[a-z0-9_]+?)__k(?P<blocks>\d+)$")
_DIRECT_RE = re.compile(r"^(?P<kernel>gemm_[a-z0-9_]+?)__direct_k(?P<segment>\d+)"
                        r"(?:x(?P<segments>\d+)_s(?P<stride>\d+)_(?:r(?P<row>\d+)|(?P<pixel>p)))?"
                        r"_n(?P<n_tiles>\d+)$")


def parse_direct_name(name: str) -> tuple[Kernel, DirectWindow, int]:
    """(kernel, window, n_tiles) of a direct-read form's name (``forms.direct_name``; a
    by-pixel window's is the INDIRECT form's, ``indirect.MARK``)."""
    m = _DIRECT_RE.match(name)
    if not m:
        raise ValueError(f"{name!r} is not the name of a tvm_armq direct-read form")
    if m["segments"] is None:
        window = DirectWindow.pointwise(int(m["segment"]))
    elif m["pixel"]:
        window = DirectWindow.of_pixels(int(m["segment"]), int(m["segments"]), int(m["stride"]))
    else:
        window = DirectWindow(int(m["segment"]), int(m["segments"]), int(m["stride"]),
                              int(m["row"]))
    return get(m["kernel"]), window, int(m["n_tiles"])


def register_named(name: str) -> str:
    """Register the TensorIntrin called ``name`` (a kernel's, its whole-K form's or its
    direct-read form's: the names carry their parameters), for replaying a schedule
    trace that refers to it by name in a process that has not built it yet."""
    from tvm.s_tir import TensorIntrin

    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    if NAME_RE.match(name):
        return register(get(name))
    m = _K_LOOP_RE.match(name)
    if m:
        return register_k_loop(get(m["kernel"]), int(m["blocks"]))
    if _DIRECT_RE.match(name):
        kernel, window, n_tiles = parse_direct_name(name)
        if window.by_pixel:
            raise ValueError(f"{name!r} is an INDIRECT form: it is lowered by "
                             "intrinsics.indirect, never registered as a TensorIntrin")
        return register_direct(kernel, window, n_tiles)
    raise ValueError(f"{name!r} is not the name of a tvm_armq TensorIntrin")


def register_all() -> list[str]:
    """Register the TensorIntrin of every tensorizable kernel in ``TABLE``."""
    return [register(k) for k in TABLE if k.intrin is not None]


# --------------------------------------------------------------- tensorize
class TensorizeUnavailable(RuntimeError):
    """``Schedule.tensorize`` would crash the process in this Python environment."""


@functools.lru_cache(maxsize=None)
def _ir_serialization_works() -> bool:
    # Schedule.tensorize deep-copies the intrinsic through TVM's JSON serializer. With
    # apache-tvm-ffi 0.1.15.x under apache-tvm 0.27.0.post1 that serializer segfaults on
    # any IR node, which would kill the calling process; probe it in a child process.
    code = "import tvm; tvm.ir.save_json(tvm.ir.PrimType('int32'))"
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def tensorize(sch, loop, kernel: Kernel, target, *, k_blocks: int | None = None,
              direct: tuple[DirectWindow, int] | None = None) -> None:
    """Tensorize the block loop nest under ``loop`` with ``kernel`` for ``target``.

    ``loop`` is the outermost of the (mr, nr, kr) loops of a block computing
    ``C[.., ..] += acc(A_packed[.., .., i, k]) * acc(B_packed[.., .., j, k])`` without an
    init (``decompose_reduction`` first). With ``k_blocks``, ``loop`` is instead the K-block
    loop of extent ``k_blocks`` right above them (kb, i, j, k) and the K_LOOP form's
    intrinsic is used. With ``direct`` = (window, n_tiles), ``loop`` is the
    micro-tile column loop of extent n_tiles above ([s,] kb, i, j, kk) of a GEMM that reads
    A from the input (``window``: ``DirectWindow``), and the DIRECT form's intrinsic is
    used. Raises
    ``MissingTargetFeature`` when the target cannot run the kernel, before anything reaches LLVM.
    """
    require(kernel, target)
    if kernel.intrin is None:
        raise ValueError(f"{kernel.name} is the scalar reference: nothing to tensorize")
    if not _ir_serialization_works():
        try:
            from importlib.metadata import version

            ffi = version("apache-tvm-ffi")
        except Exception:  # noqa: BLE001
            ffi = "?"
        raise TensorizeUnavailable(
            f"Schedule.tensorize would crash this process: TVM's IR serialization "
            f"(tvm.ir.save_json, which tensorize uses to copy the intrinsic) segfaults with "
            f"apache-tvm-ffi {ffi} under apache-tvm 0.27.0.post1. Install a matching FFI: "
            f"pip install 'apache-tvm-ffi<0.1.15' (0.1.14.post1 works)")
    if direct is not None:
        sch.tensorize(loop, register_direct(kernel, *direct))
    else:
        sch.tensorize(loop, register(kernel) if k_blocks is None
                      else register_k_loop(kernel, k_blocks))
