"""TFLite models: loading, checking, reference outputs, test inputs.

``TFLiteModel`` is a .tflite flatbuffer read once and checked once: the bytes,
the parsed ``tflite.Model`` that TVM's Relax frontend imports, and the
input/output signature. ``reference_outputs`` runs the model in TFLite itself
(ai-edge-litert on the host). By default it asks for TFLite's *reference*
kernels (``BUILTIN_REF``): they define what a quantized op means, whereas the
optimized and XNNPACK kernels may round a requantization differently. A model with an
operator version the reference resolver lacks (``reference_gap``) runs that op's own
kernel registered at a lower version where it is the same code (TILE), or else on TFLite's
builtin kernels without XNNPACK; ``reference_note`` says which.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import os
from pathlib import Path

import numpy as np


class ModelError(ValueError):
    """The file is missing or is not a TFLite model; the message says which."""


class TFLiteCannotRun(ModelError):
    """A well-formed model that TFLite itself cannot build an interpreter for (an op it
    does not know, a custom op): not corrupt, but nothing can check results against it."""


# reference_outputs' memo: (model digest, reference kernels, inputs' digests) -> outputs
_MEMO: "collections.OrderedDict[tuple, list[np.ndarray]]" = collections.OrderedDict()
_MEMO_SIZE = 256

# What TFLite's FlatBufferModel::VerifyAndBuildFromBuffer reports when VerifyModelBuffer fails.
VERIFIER_VERDICT = "The model is not a valid Flatbuffer buffer"


# Ops whose reference resolver entry is the builtin kernel itself, registered for fewer
# versions (TFLite's register_ref.cc): a newer version runs the same code as an older one.
REF_SHARES_KERNEL = frozenset({"TILE"})


def _with_op_version(data: bytes, op: str, version: int, new_version: int) -> bytes:
    """``data`` with the operator code (``op``, ``version``) rewritten to ``new_version``
    in place (the flatbuffer's int32 field; nothing moves)."""
    import struct

    import tflite

    buf = bytearray(data)
    model = tflite.Model.GetRootAsModel(buf, 0)
    code = getattr(tflite.BuiltinOperator, op)
    for i in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(i)
        if max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode()) == code and \
                oc.Version() == version:
            field = oc._tab.Offset(8)  # OperatorCode.version, present when not the default 1
            struct.pack_into("<i", buf, oc._tab.Pos + field, new_version)
    return bytes(buf)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: float = 0.0  # the tensor's quantization, as TFLite declares it (0: not quantized)
    zero_point: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class TFLiteModel:
    path: Path | None
    data: bytes

    @classmethod
    def load(cls, model: "str | os.PathLike | bytes | TFLiteModel") -> "TFLiteModel":
        """Read and check a .tflite file (or bytes). Raises ``ModelError`` otherwise."""
        if isinstance(model, TFLiteModel):
            return model
        if isinstance(model, (bytes, bytearray)):
            m = cls(None, bytes(model))
        else:
            path = Path(model)
            if path.is_dir():
                raise ModelError(f"{path}: is a directory, not a .tflite file")
            if not path.is_file():
                raise ModelError(f"{path}: no such file")
            try:
                m = cls(path, path.read_bytes())
            except OSError as e:
                raise ModelError(f"{path}: cannot read it ({e.strerror or e})") from None
        # A TFLite flatbuffer carries the file identifier "TFL3" at bytes 4..8.
        if len(m.data) < 8 or m.data[4:8] != b"TFL3":
            raise ModelError(f"{m.label}: not a TFLite model (no TFL3 flatbuffer identifier)")
        m.verify()
        return m

    def verify(self) -> None:
        """Check the flatbuffer with TFLite's own verifier before anything else parses it.

        The Python ``tflite`` package (what TVM's frontend reads) and ``flatbuffers`` have no
        verifier: a truncated or corrupted file makes them read past the buffer. The real
        one is TFLite's C++ ``VerifyModelBuffer``, which ``ai_edge_litert``'s Interpreter
        runs (``FlatBufferModel::VerifyAndBuildFromBuffer``) when it is given bytes; its
        verdict is "The model is not a valid Flatbuffer buffer". Building the interpreter
        also resolves every operator, so an op TFLite itself does not know is caught here.
        """
        from ai_edge_litert.interpreter import Interpreter

        try:
            Interpreter(model_content=self.data)
        except ValueError as e:
            lines = list(dict.fromkeys(ln.strip() for ln in str(e).splitlines() if ln.strip()))
            why = "; ".join(lines[:3]) or "rejected"
            if any(VERIFIER_VERDICT in ln for ln in lines):
                raise ModelError(f"{self.label}: TFLite's flatbuffer verifier rejects it "
                                 f"({why}): the file is truncated, corrupted or not a TFLite "
                                 "model; export or download it again") from None
            raise TFLiteCannotRun(f"{self.label}: TFLite cannot load it ({why}): an operator "
                                  "TFLite's builtin ops do not include (a custom op?)") from None

    @property
    def label(self) -> str:
        return str(self.path) if self.path else "<tflite bytes>"

    def flatbuffer(self):
        """The parsed ``tflite.Model`` that ``tvm.relax.frontend.tflite.from_tflite`` takes."""
        import tflite

        return tflite.Model.GetRootAsModel(self.data, 0)

    @functools.cached_property
    def reference_gap(self) -> tuple[str, int] | None:
        """(op code, version) of the operator TFLite's reference op resolver cannot load,
        or None when it loads the whole model. A current converter writes some operator
        versions that resolver does not list: TILE 3 (int8, Keras' UpSampling2D), which
        ``register_ref.cc`` registers up to version 2 with the same kernel as the builtin
        resolver's (``REF_SHARES_KERNEL``). Such a model is run with the version lowered
        (TFLite's own TILE kernel, on the reference resolver); any other gap runs on
        TFLite's builtin kernels, without XNNPACK. ``reference_note`` says which."""
        import re

        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        try:
            Interpreter(model_content=self.data,
                        experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        except ValueError as e:
            found = re.search(r"builtin opcode '(\w+)' version '(\d+)'", str(e))
            if found is None:
                raise
            return found.group(1), int(found.group(2))
        return None

    @functools.cached_property
    def _reference_setup(self) -> tuple[bytes, bool, str | None]:
        """(model bytes, reference resolver?, note) for ``reference_outputs``."""
        gap = self.reference_gap
        if gap is None:
            return self.data, True, None
        op, version = gap
        if op in REF_SHARES_KERNEL:
            from ai_edge_litert.interpreter import Interpreter, OpResolverType

            for lower in range(version - 1, 0, -1):
                data = _with_op_version(self.data, op, version, lower)
                try:
                    Interpreter(model_content=data,
                                experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
                except ValueError:
                    continue
                return data, True, (f"TFLite's reference resolver registers {op} up to "
                                    f"version {lower}: its {op} kernel (the builtin one) ran "
                                    f"as version {lower}, the other ops on reference kernels")
        return self.data, False, (f"TFLite's reference kernels cannot load {op} version "
                                  f"{version}: compared with TFLite's builtin kernels (no "
                                  "XNNPACK) instead")

    @property
    def reference_note(self) -> str | None:
        """What ``reference_outputs`` runs instead of the reference kernels, if anything."""
        return self._reference_setup[2]

    def _interpreter(self, reference_kernels: bool, keep_all_tensors: bool = False):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        data = self.data
        kind = OpResolverType.BUILTIN_REF if reference_kernels else OpResolverType.AUTO
        if reference_kernels and self.reference_gap is not None:
            data, on_reference, _ = self._reference_setup
            if not on_reference:
                kind = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        it = Interpreter(model_content=data, experimental_op_resolver_type=kind,
                         num_threads=1,
                         experimental_preserve_all_tensors=keep_all_tensors)
        it.allocate_tensors()
        return it

    def signature(self) -> tuple[list[TensorInfo], list[TensorInfo]]:
        it = self._interpreter(reference_kernels=True)

        def info(details):
            out = []
            for d in details:
                scale, zero_point = d["quantization"]
                out.append(TensorInfo(d["name"], tuple(int(s) for s in d["shape"]),
                                      np.dtype(d["dtype"]).name, float(scale), int(zero_point)))
            return out

        return info(it.get_input_details()), info(it.get_output_details())

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs covering the whole range of each input's dtype, reproducible by ``seed``."""
        rng = np.random.default_rng(seed)
        out = []
        for t in self.signature()[0]:
            dt = np.dtype(t.dtype)
            if np.issubdtype(dt, np.integer):
                info = np.iinfo(dt)
                out.append(rng.integers(info.min, info.max, size=t.shape, endpoint=True,
                                        dtype=dt))
            else:
                out.append(rng.uniform(-1.0, 1.0, size=t.shape).astype(dt))
        return out

    @functools.cached_property
    def digest(self) -> bytes:
        """SHA-1 of the flatbuffer: the model's identity in ``reference_outputs``' memo."""
        return hashlib.sha1(self.data).digest()

    def reference_outputs(self, inputs: list[np.ndarray], *,
                          reference_kernels: bool = True) -> list[np.ndarray]:
        """Run the model in TFLite on the host and return its outputs in order.

        TFLite's outputs depend on the model and the inputs alone, so the process keeps
        the last ``_MEMO_SIZE`` answers: a model checked at three ISA levels, or by several
        tests, runs TFLite's reference kernels (slow: scalar loops) once per input. Each
        call gets arrays of its own."""
        key = (self.digest, reference_kernels,
               tuple((x.dtype.str, x.shape, hashlib.sha1(np.ascontiguousarray(x)).digest())
                     for x in map(np.asarray, inputs)))
        if key not in _MEMO:
            it = self.reference_run(inputs, reference_kernels=reference_kernels)
            _MEMO[key] = [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]
            while len(_MEMO) > _MEMO_SIZE:
                _MEMO.popitem(last=False)
        _MEMO.move_to_end(key)
        return [o.copy() for o in _MEMO[key]]

    def reference_run(self, inputs: list[np.ndarray], *, reference_kernels: bool = True,
                      keep_all_tensors: bool = False):
        """The TFLite interpreter after running ``inputs``; ``keep_all_tensors``: every
        intermediate tensor stays readable (``get_tensor`` by tensor index), not only the
        outputs."""
        it = self._interpreter(reference_kernels, keep_all_tensors)
        ins = it.get_input_details()
        if len(inputs) != len(ins):
            raise ValueError(f"{self.label} takes {len(ins)} inputs, got {len(inputs)}")
        for d, x in zip(ins, inputs):
            it.set_tensor(d["index"], np.asarray(x, dtype=d["dtype"]))
        it.invoke()
        return it
