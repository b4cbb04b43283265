"""meta's operator library: one ONNX operator per file, registered on import."""

from ops import flatten, gemm, relu, reshape, softmax_cross_entropy_loss  # noqa: F401
