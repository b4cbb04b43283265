// 2-D max and average pooling (NCHW), the native twins of ops/max_pool.py and
// ops/average_pool.py. The Python side resolves the window (auto_pad, ceil_mode, output shape);
// here every (image, channel) plane is pooled row by row: for one output row, each kernel tap
// is a strided run over an input row, so the inner loops vectorise.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "meta/parallel.hpp"
#include "meta/window.hpp"

namespace meta::pool {

struct Geometry {
  std::int64_t planes, h, w;            // N * C planes of H x W
  std::int64_t kh, kw, sh, sw, dh, dw;  // kernel, strides, dilations
  std::int64_t ph, pw, eh, ew;          // begin pads, end pads (ceil_mode's room excluded)
  std::int64_t oh, ow;                  // output

  std::int64_t in_plane() const { return h * w; }
  std::int64_t out_plane() const { return oh * ow; }
};

// Pools run over whole planes; below this much work (kernel taps times outputs) one thread.
inline bool parallel(const Geometry& g) {
  return g.planes > 1 && g.planes * g.out_plane() * g.kh * g.kw > kParallelThreshold;
}

// y = window max, index = flat index in x of the first max in window order (plane * H * W +
// row-major position; plane * H * W - 1 where the window lies wholly in padding). Padding
// reads as -inf and never wins after the first tap, exactly as in the numpy op, NaNs included.
// One output at a time with the running max in registers and a branch-free update: on random
// data "if (v > best)" mispredicts half the time (the wide CNN's pool ran 10x slower).
template <typename T>
void max_forward(const Geometry& g, const T* x, T* y, std::int64_t* index) {
  const T pad = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static) if (parallel(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane) {
    const T* xp = x + plane * g.in_plane();
    const std::int64_t base = plane * g.in_plane();
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      const std::int64_t iy0 = oy * g.sh - g.ph;
      std::int64_t ilo, ihi;  // kernel rows inside the input
      valid_range(iy0, g.dh, g.h, g.kh, ilo, ihi);
      T* yr = y + plane * g.out_plane() + oy * g.ow;
      std::int64_t* ir = index + plane * g.out_plane() + oy * g.ow;
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        const std::int64_t ix0 = ox * g.sw - g.pw;
        const bool first = ilo == 0 && ix0 >= 0 && ix0 < g.w;
        T best = first ? xp[iy0 * g.w + ix0] : pad;
        std::int64_t at = first ? iy0 * g.w + ix0 : -1;
        for (std::int64_t i = ilo; i < ihi; ++i) {
          const std::int64_t row = (iy0 + i * g.dh) * g.w;
          for (std::int64_t j = i == 0 ? 1 : 0; j < g.kw; ++j) {
            const std::int64_t ix = ix0 + j * g.dw;
            if (ix < 0 || ix >= g.w) continue;
            const T v = xp[row + ix];
            const bool better = v > best;
            best = better ? v : best;
            at = better ? row + ix : at;
          }
        }
        yr[ox] = best;
        ir[ox] = base + at;
      }
    }
  }
}

// The same indices with the spatial position counted column-major (storage_order=1).
inline void column_major(const Geometry& g, const std::int64_t* index, std::int64_t* out) {
  const std::int64_t total = g.planes * g.out_plane(), hw = g.in_plane();
#pragma omp parallel for schedule(static) if (total > kParallelThreshold)
  for (std::int64_t k = 0; k < total; ++k) {
    const std::int64_t base = (k / g.out_plane()) * hw, s = index[k] - base;
    out[k] = s < 0 ? index[k] : base + (s % g.w) * g.h + s / g.w;
  }
}

// dx = dy sent to each output's max (row-major index from max_forward), added per plane in
// output order; windows wholly in padding pass nothing back.
template <typename T>
void max_backward(const Geometry& g, const std::int64_t* index, const T* dy, T* dx) {
#pragma omp parallel for schedule(static) if (parallel(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane) {
    T* dxp = dx + plane * g.in_plane();
    std::fill(dxp, dxp + g.in_plane(), T(0));
    const std::int64_t base = plane * g.in_plane();
    const std::int64_t* ip = index + plane * g.out_plane();
    const T* dyp = dy + plane * g.out_plane();
    for (std::int64_t o = 0; o < g.out_plane(); ++o) {
      const std::int64_t s = ip[o] - base;
      if (s >= 0) dxp[s] += dyp[o];
    }
  }
}

// For each output position of one axis, how many taps the divisor counts: those inside the
// input or, with count_include_pad, inside the input and its explicit pads.
inline std::vector<std::int64_t> counts(std::int64_t out, std::int64_t k, std::int64_t s,
                                        std::int64_t d, std::int64_t pad, std::int64_t in,
                                        std::int64_t end, bool include_pad) {
  const std::int64_t lo = include_pad ? -pad : 0, hi = include_pad ? in + end : in;
  std::vector<std::int64_t> c(static_cast<std::size_t>(out), 0);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t t = 0; t < k; ++t) {
      const std::int64_t p = o * s - pad + t * d;
      c[o] += p >= lo && p < hi;
    }
  return c;
}

template <typename T>
std::vector<T> divisors(const Geometry& g, bool include_pad) {
  const auto rows = counts(g.oh, g.kh, g.sh, g.dh, g.ph, g.h, g.eh, include_pad);
  const auto cols = counts(g.ow, g.kw, g.sw, g.dw, g.pw, g.w, g.ew, include_pad);
  std::vector<T> div(static_cast<std::size_t>(g.out_plane()));
  for (std::int64_t oy = 0; oy < g.oh; ++oy)
    for (std::int64_t ox = 0; ox < g.ow; ++ox) div[oy * g.ow + ox] = T(rows[oy] * cols[ox]);
  return div;
}

// y = window sum / divisor; taps add in row-major order onto 0 (padding adds nothing).
template <typename T>
void average_forward(const Geometry& g, const T* x, T* y, bool include_pad) {
  const std::vector<T> div = divisors<T>(g, include_pad);
#pragma omp parallel for schedule(static) if (parallel(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane) {
    const T* xp = x + plane * g.in_plane();
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      T* yr = y + plane * g.out_plane() + oy * g.ow;
      std::fill(yr, yr + g.ow, T(0));
      for (std::int64_t i = 0; i < g.kh; ++i) {
        const std::int64_t iy = oy * g.sh - g.ph + i * g.dh;
        if (iy < 0 || iy >= g.h) continue;
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const std::int64_t off = j * g.dw - g.pw;
          std::int64_t lo, hi;
          valid_range(off, g.sw, g.w, g.ow, lo, hi);
          const T* src = xp + iy * g.w + off;
          for (std::int64_t o = lo; o < hi; ++o) yr[o] += src[o * g.sw];
        }
      }
      const T* dr = div.data() + oy * g.ow;
      for (std::int64_t o = 0; o < g.ow; ++o) yr[o] /= dr[o];
    }
  }
}

// dx: each output's dy / divisor added onto its window's input elements, tap by tap in
// row-major order (as ops/_window.col2im adds them).
template <typename T>
void average_backward(const Geometry& g, const T* dy, T* dx, bool include_pad) {
  const std::vector<T> div = divisors<T>(g, include_pad);
#pragma omp parallel if (parallel(g))
  {
    std::vector<T> share(static_cast<std::size_t>(g.out_plane()));
#pragma omp for schedule(static)
    for (std::int64_t plane = 0; plane < g.planes; ++plane) {
      const T* dyp = dy + plane * g.out_plane();
      for (std::int64_t o = 0; o < g.out_plane(); ++o) share[o] = dyp[o] / div[o];
      T* dxp = dx + plane * g.in_plane();
      std::fill(dxp, dxp + g.in_plane(), T(0));
      for (std::int64_t i = 0; i < g.kh; ++i) {
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const std::int64_t off = j * g.dw - g.pw;
          std::int64_t lo, hi;
          valid_range(off, g.sw, g.w, g.ow, lo, hi);
          for (std::int64_t oy = 0; oy < g.oh; ++oy) {
            const std::int64_t iy = oy * g.sh - g.ph + i * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            const T* sr = share.data() + oy * g.ow;
            T* dst = dxp + iy * g.w + off;
            for (std::int64_t o = lo; o < hi; ++o) dst[o * g.sw] += sr[o];
          }
        }
      }
    }
  }
}

}  // namespace meta::pool
