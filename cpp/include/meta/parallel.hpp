// Shared helpers for meta's OpenMP kernels.
#pragma once
#include <cstdint>

namespace meta {

// Below this many elements a parallel region costs more than it saves (measured on 2 cores:
// thread wake-up is a few microseconds, an elementwise pass over 32k floats about as long).
constexpr std::int64_t kParallelThreshold = 1 << 15;

}  // namespace meta
