"""tvm_armq: quantized TFLite models compiled by Apache TVM into integer aarch64 code."""
__version__ = "0.1.0"
