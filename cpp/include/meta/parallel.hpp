// Shared helpers for meta's OpenMP kernels.
#pragma once
#include <cstdint>

namespace meta {

// Below this many elements an elementwise kernel runs on one thread. A memory-bound pass over
// 256k floats takes ~50 us on one core, so a parallel region saves little below it; worse,
// OpenMP workers keep spinning after a region while OpenBLAS's threads need the same cores:
// with 2 threads, a parallel ReLU on the MLP's 128x512 activations made the next GEMM 7x
// slower (benchmarks/mlp_step.py).
constexpr std::int64_t kParallelThreshold = 1 << 18;

}  // namespace meta
