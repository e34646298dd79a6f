"""Write a compiled module as an aarch64 shared library a board (or the emulated device)
loads, and recognise such a library.

The library is cross-linked with Debian's aarch64 g++ (``CROSS_CXX``); the Relax VM
executable of ``build.compile_tflite``, a TIR module, or a tuning candidate are all
written the same way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from . import portable, threads

CROSS_CXX = "aarch64-linux-gnu-g++"


class OutputError(OSError):
    """The compiled library cannot be written where asked; the message says why."""


def export_aarch64(executable, path: str | os.PathLike) -> Path:
    """Write ``executable`` as an aarch64 shared library, cross-linked, loadable on a board.

    The library is linked beside ``path`` under a temporary name and renamed over it only
    when complete: a failed link never leaves half a file, nor destroys the one there.
    Raises ``OutputError`` when ``path`` cannot be written."""
    from tvm.support import cc

    if not shutil.which(CROSS_CXX):
        raise RuntimeError(f"{CROSS_CXX} not found: install Debian's g++-aarch64-linux-gnu "
                           "(or run `python -m tvm_armq device provision`)")
    path = Path(path)
    existing = next(p for p in path.parents if p.exists())
    if not existing.is_dir():  # mkdir would say "File exists", which misleads
        raise OutputError(f"cannot write {path}: {existing} is a file, not a directory "
                          "(choose another -o)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e} (choose another -o)") from None
    try:
        with tempfile.TemporaryDirectory(prefix="tvm_armq_export_") as work:
            # every library carries tvm_armq_level(), which a portable build's layers call
            # (portable.py); a few hundred bytes in the others
            select = Path(work) / "tvm_armq_select.cc"
            select.write_text(portable.SELECT_SOURCE)
            # and tvm_armq_pool_unconfigured(), which a library compiled with threads=N
            # calls (threads.py)
            guard = Path(work) / "tvm_armq_pool.cc"
            guard.write_text(threads.GUARD_SOURCE)
            executable.export_library(tmp, fcompile=cc.cross_compiler(CROSS_CXX),
                                      addons=[str(select), str(guard)])
        os.chmod(tmp, LIBRARY_MODE & ~_umask())  # mkstemp's file is private; a library is not
        os.replace(tmp, path)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e} (choose another -o)") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


LIBRARY_MODE = 0o755  # what the linker gives a new shared library, before the umask


def _umask() -> int:
    """The process's umask, read without changing it (os.umask can only set it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022  # the usual default


ELF_MAGIC = b"\x7fELF"
ELF_HEADER = slice(0, 20)  # magic and ident (16 bytes), e_type, e_machine (2 bytes each)
ET_DYN, EM_AARCH64 = 3, 0xB7  # a shared object, for aarch64


def is_compiled_module(path: str | os.PathLike) -> bool:
    """True when ``path`` is an aarch64 shared library (what ``export_aarch64`` writes), so
    replacing it with a new build loses nothing that cannot be rebuilt; any other file,
    an x86 program or another ELF included, is not."""
    try:
        with open(path, "rb") as f:
            head = f.read(ELF_HEADER.stop)
    except OSError:
        return False
    if len(head) < ELF_HEADER.stop or head[:len(ELF_MAGIC)] != ELF_MAGIC:
        return False
    little = head[5] == 1  # EI_DATA: 1 little-endian, 2 big-endian
    order = "little" if little else "big"
    return (int.from_bytes(head[16:18], order) == ET_DYN
            and int.from_bytes(head[18:20], order) == EM_AARCH64)
