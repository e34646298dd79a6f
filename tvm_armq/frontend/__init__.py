"""The first stage: a .tflite file read, checked and imported into Relax with TVM's TFLite
frontend, and .tflite files written. In pipeline order: ``model.py`` (``TFLiteModel``: the
file loaded and checked once, TFLite's reference outputs, test inputs), ``importer.py``
(``import_tflite``: the Relax module, QDQ, that TVM 0.27's frontend makes of it, refused
with a plain error where it cannot), ``converters.py`` (what tvm_armq adds to that frontend:
exact quantized data movement, static reshapes, variables named after their operator;
installed by ``hooks``), ``layers.py`` (a convolution or dense layer's quantization
parameters read from the file, and TFLite's fused-activation clamp) and ``writer.py``
(.tflite files written directly, for what TensorFlow's converter cannot make).
"""
