// Index arithmetic shared by the sliding-window kernels (convolution, pooling).
#pragma once
#include <algorithm>
#include <cstdint>

namespace meta {

// The outputs [lo, hi) of a row (out long) whose input position o * stride + off lies inside
// [0, in): the part of the row that reads real input rather than padding.
inline void valid_range(std::int64_t off, std::int64_t stride, std::int64_t in, std::int64_t out,
                        std::int64_t& lo, std::int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  hi = in - off <= 0 ? 0 : (in - 1 - off) / stride + 1;
  lo = std::min(lo, out);
  hi = std::max(lo, std::min(hi, out));
}

}  // namespace meta
