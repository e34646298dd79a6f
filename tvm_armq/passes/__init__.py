"""The Relax passes tvm_armq puts in front of ``tvm.compile``'s pipeline.

``integer.py`` (``quantized_to_integer``): every quantized layer of a TFLite model, which
TVM's frontend imports as float compute between a ``dequantize`` and a ``quantize``,
becomes one call of a tvm_armq integer kernel that computes what TFLite's reference
kernel computes. The pass is a driver over the op families of ``families.py``: each family
is one module here (``gemm``, ``batch_matmul``, ``transpose_conv``, ``tables``,
``elementwise``, ``reduce``, ``requantize``, ``concat``, ``resize``, ``avg_pool``) with
its matcher and its lowering (``records.OpFamily``); the kernels themselves live in
``tvm_armq.schedules``. ``bf16.py``: the opt-in bf16 precision for float models. Both read
and rewrite the Relax graph through ``graph.py``. ``call_sequence.py`` runs after them: a
model's kernel calls become one library function.
"""
