// 2-D grouped convolution (NCHW) as im2col + GEMM, the native twin of ops/conv.py.
//
// Forward, backward-data and backward-weights all walk the batch in chunks of a few images: the
// chunk's im2col columns (C*KH*KW rows, images*OH*OW columns) stay in cache and feed one GEMM
// per group through meta::blas (numpy's OpenBLAS). Backward recomputes the columns from x
// instead of keeping them from forward, as PyTorch does; no buffer outlives a call.
//
// Threads: with several OpenMP threads and a batch worth it, each thread takes a contiguous
// range of images (its own column buffer, its own single-threaded GEMMs, its own partial dW,
// added up in thread order at the end), so the copies run in parallel too; otherwise one range
// holds every image and meta::blas::gemm splits each large product over the threads. Either
// way the BLAS's own thread pool stays idle (blas.hpp says why).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "meta/blas.hpp"
#include "meta/window.hpp"

namespace meta::conv {

// Where each output reads its input; pads are the begin pads (end pads follow from out_h/out_w).
struct Geometry {
  std::int64_t n, c, h, w;             // input (N, C, H, W)
  std::int64_t m, group;               // output channels, groups
  std::int64_t kh, kw;                 // kernel
  std::int64_t sh, sw, dh, dw, ph, pw; // strides, dilations, begin pads
  std::int64_t oh, ow;                 // output spatial shape

  std::int64_t cg() const { return c / group; }
  std::int64_t mg() const { return m / group; }
  std::int64_t kg() const { return cg() * kh * kw; }  // GEMM inner size per group
  std::int64_t rows() const { return c * kh * kw; }   // im2col rows, all groups
  std::int64_t p() const { return oh * ow; }
  // A 1x1 convolution reading every pixel once: the input image is its own column matrix.
  bool pointwise() const {
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && oh == h && ow == w;
  }
};

template <typename T>
std::unique_ptr<T[]> scratch(std::int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<std::size_t>(std::max<std::int64_t>(n, 1))]);
}

// Columns of one image: row (c, i, j) of `cols` (leading dimension ld) holds, for every output
// position, the input the kernel tap (i, j) of channel c reads (0 in the padding).
template <typename T>
void im2col(const Geometry& g, const T* x, T* cols, std::int64_t ld) {
  const std::int64_t ow = g.ow;
  for (std::int64_t c = 0; c < g.c; ++c) {
    const T* xc = x + c * g.h * g.w;
    for (std::int64_t i = 0; i < g.kh; ++i) {
      for (std::int64_t j = 0; j < g.kw; ++j) {
        T* row = cols + ((c * g.kh + i) * g.kw + j) * ld;
        const std::int64_t off = j * g.dw - g.pw;
        std::int64_t lo, hi;
        valid_range(off, g.sw, g.w, ow, lo, hi);
        for (std::int64_t oy = 0; oy < g.oh; ++oy) {
          T* out = row + oy * ow;
          const std::int64_t iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) {
            std::fill(out, out + ow, T(0));
            continue;
          }
          const T* src = xc + iy * g.w + off;
          std::fill(out, out + lo, T(0));
          if (g.sw == 1) {
            for (std::int64_t o = lo; o < hi; ++o) out[o] = src[o];
          } else {
            for (std::int64_t o = lo; o < hi; ++o) out[o] = src[o * g.sw];
          }
          std::fill(out + hi, out + ow, T(0));
        }
      }
    }
  }
}

// The adjoint of im2col: adds every column entry onto the input element it was read from
// (padding dropped). Per element, the taps add in (i, j) order, as ops/_window.col2im does.
template <typename T>
void col2im(const Geometry& g, const T* cols, std::int64_t ld, T* dx) {
  const std::int64_t ow = g.ow;
  std::fill(dx, dx + g.c * g.h * g.w, T(0));
  for (std::int64_t c = 0; c < g.c; ++c) {
    T* dxc = dx + c * g.h * g.w;
    for (std::int64_t i = 0; i < g.kh; ++i) {
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const T* row = cols + ((c * g.kh + i) * g.kw + j) * ld;
        const std::int64_t off = j * g.dw - g.pw;
        std::int64_t lo, hi;
        valid_range(off, g.sw, g.w, ow, lo, hi);
        for (std::int64_t oy = 0; oy < g.oh; ++oy) {
          const std::int64_t iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          const T* in = row + oy * ow;
          T* dst = dxc + iy * g.w + off;
          if (g.sw == 1) {
            for (std::int64_t o = lo; o < hi; ++o) dst[o] += in[o];
          } else {
            for (std::int64_t o = lo; o < hi; ++o) dst[o * g.sw] += in[o];
          }
        }
      }
    }
  }
}

// Images per chunk: as many as keep the chunk's columns within kColumnBytes (half of a 2 MB
// L2 cache), so a layer with small feature maps or few channels still makes a few large GEMMs
// instead of many small ones, and a wide layer one image at a time (its GEMM is large anyway).
// LeNet-5, 1 thread: 8 images per GEMM made conv1's backward 2x faster than 1 image.
constexpr std::int64_t kColumnBytes = 1 << 20;

inline std::int64_t chunk_images(const Geometry& g, std::int64_t requested, std::size_t elem) {
  const std::int64_t n = std::max<std::int64_t>(g.n, 1);
  if (requested > 0) return std::min(requested, n);
  const std::int64_t per_image = std::max<std::int64_t>(g.rows() * g.p() * std::int64_t(elem), 1);
  return std::max<std::int64_t>(1, std::min(kColumnBytes / per_image, n));
}

// Below this many multiply-adds per image a batch is not split over threads.
constexpr std::int64_t kImageWork = 1 << 15;

// Runs body(thread, first image, end image) over the batch: one range per OpenMP thread when
// there are threads and work enough, else one range on the calling thread. Returns the ranges.
template <typename Body>
int over_images(const Geometry& g, Body&& body) {
  const std::int64_t work = g.m * g.kg() * g.p();
  const int threads = static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), g.n));
  if (threads < 2 || work < kImageWork || omp_in_parallel()) {
    body(0, std::int64_t{0}, g.n);
    return 1;
  }
  blas::SingleThreadedBlas single;  // the GEMMs inside run on their own thread each
  int used = threads;  // the team OpenMP gives may be smaller than asked
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    if (t == 0) used = static_cast<int>(nt);
    body(static_cast<int>(t), g.n * t / nt, g.n * (t + 1) / nt);
  }
  return used;
}

// forward() for images [first, end).
template <typename T>
void forward_images(const Geometry& g, const T* x, const T* w, const T* b, T* y,
                    std::int64_t first, std::int64_t end, std::int64_t images_per_gemm) {
  const std::int64_t p = g.p(), mg = g.mg(), kg = g.kg(), image = g.c * g.h * g.w;
  const auto add_bias = [&](T* yn) {
    if (b == nullptr) return;
    for (std::int64_t m = 0; m < g.m; ++m) {
      const T bm = b[m];
      T* row = yn + m * p;
      for (std::int64_t q = 0; q < p; ++q) row[q] += bm;
    }
  };
  if (g.pointwise()) {
    for (std::int64_t n = first; n < end; ++n) {
      for (std::int64_t gi = 0; gi < g.group; ++gi)
        blas::gemm<T>(false, false, mg, p, kg, T(1), w + gi * mg * kg, kg,
                      x + n * image + gi * kg * p, p, T(0), y + (n * g.m + gi * mg) * p, p);
      add_bias(y + n * g.m * p);
    }
    return;
  }
  const std::int64_t chunk = chunk_images(g, images_per_gemm, sizeof(T));
  auto cols = scratch<T>(g.rows() * chunk * p);
  auto out = scratch<T>(chunk > 1 ? g.m * chunk * p : 0);
  for (std::int64_t n0 = first; n0 < end; n0 += chunk) {
    const std::int64_t nb = std::min(chunk, end - n0), ld = nb * p;
    for (std::int64_t k = 0; k < nb; ++k) im2col(g, x + (n0 + k) * image, cols.get() + k * p, ld);
    if (nb == 1) {
      T* yn = y + n0 * g.m * p;
      for (std::int64_t gi = 0; gi < g.group; ++gi)
        blas::gemm<T>(false, false, mg, p, kg, T(1), w + gi * mg * kg, kg,
                      cols.get() + gi * kg * ld, ld, T(0), yn + gi * mg * p, p);
      add_bias(yn);
      continue;
    }
    for (std::int64_t gi = 0; gi < g.group; ++gi)
      blas::gemm<T>(false, false, mg, ld, kg, T(1), w + gi * mg * kg, kg,
                    cols.get() + gi * kg * ld, ld, T(0), out.get() + gi * mg * ld, ld);
    // (M, images * P) -> (images, M, P), adding the bias on the way.
    for (std::int64_t k = 0; k < nb; ++k) {
      for (std::int64_t m = 0; m < g.m; ++m) {
        const T* src = out.get() + m * ld + k * p;
        T* dst = y + ((n0 + k) * g.m + m) * p;
        const T bm = b ? b[m] : T(0);
        if (b) {
          for (std::int64_t q = 0; q < p; ++q) dst[q] = src[q] + bm;
        } else {
          std::memcpy(dst, src, sizeof(T) * std::size_t(p));
        }
      }
    }
  }
}

// y (N, M, OH, OW) = conv(x (N, C, H, W), w (M, C/group, KH, KW)) + b (M, or null).
template <typename T>
void forward(const Geometry& g, const T* x, const T* w, const T* b, T* y,
             std::int64_t images_per_gemm = 0) {
  over_images(g, [&](int, std::int64_t first, std::int64_t end) {
    forward_images(g, x, w, b, y, first, end, images_per_gemm);
  });
}

// db (M) = dy summed over images and positions: each row in 16 interleaved partial sums (one
// running sum is a chain of dependent adds the compiler may not reorder, 8x slower), rows
// into a double total.
template <typename T>
void bias_backward(const Geometry& g, const T* dy, T* db) {
  constexpr std::int64_t kLanes = 16;
  const std::int64_t p = g.p(), body = p - p % kLanes;
  for (std::int64_t m = 0; m < g.m; ++m) {
    double s = 0;
    for (std::int64_t n = 0; n < g.n; ++n) {
      const T* row = dy + (n * g.m + m) * p;
      T lane[kLanes] = {};
      for (std::int64_t q = 0; q < body; q += kLanes)
        for (std::int64_t l = 0; l < kLanes; ++l) lane[l] += row[q + l];
      T part = 0;
      for (std::int64_t q = body; q < p; ++q) part += row[q];
      for (std::int64_t l = 0; l < kLanes; ++l) part += lane[l];
      s += double(part);
    }
    db[m] = T(s);
  }
}

// backward() for images [first, end); dw (if asked) is overwritten with their share.
template <typename T>
void backward_images(const Geometry& g, const T* x, const T* w, const T* dy, T* dx, T* dw,
                     std::int64_t first, std::int64_t end, std::int64_t images_per_gemm) {
  const std::int64_t p = g.p(), mg = g.mg(), kg = g.kg(), image = g.c * g.h * g.w;
  if (g.pointwise()) {
    for (std::int64_t n = first; n < end; ++n) {
      const T* dyn = dy + n * g.m * p;
      for (std::int64_t gi = 0; gi < g.group; ++gi) {
        const T* dyg = dyn + gi * mg * p;
        if (dw)
          blas::gemm<T>(false, true, mg, kg, p, T(1), dyg, p, x + n * image + gi * kg * p, p,
                        n > first ? T(1) : T(0), dw + gi * mg * kg, kg);
        if (dx)
          blas::gemm<T>(true, false, kg, p, mg, T(1), w + gi * mg * kg, kg, dyg, p, T(0),
                        dx + n * image + gi * kg * p, p);
      }
    }
    if (dw && first == end) std::fill(dw, dw + g.m * kg, T(0));
    return;
  }
  const std::int64_t chunk = chunk_images(g, images_per_gemm, sizeof(T));
  auto cols = scratch<T>(g.rows() * chunk * p);
  auto dyb = scratch<T>(chunk > 1 ? g.m * chunk * p : 0);
  if (dw && first == end) std::fill(dw, dw + g.m * kg, T(0));
  for (std::int64_t n0 = first; n0 < end; n0 += chunk) {
    const std::int64_t nb = std::min(chunk, end - n0), ld = nb * p;
    // dy of the chunk as one (M, images * P) matrix
    const T* dym = dy + n0 * g.m * p;
    if (nb > 1) {
      for (std::int64_t k = 0; k < nb; ++k)
        for (std::int64_t m = 0; m < g.m; ++m)
          std::memcpy(dyb.get() + m * ld + k * p, dy + ((n0 + k) * g.m + m) * p,
                      sizeof(T) * std::size_t(p));
      dym = dyb.get();
    }
    if (dw) {
      for (std::int64_t k = 0; k < nb; ++k)
        im2col(g, x + (n0 + k) * image, cols.get() + k * p, ld);
      for (std::int64_t gi = 0; gi < g.group; ++gi)
        blas::gemm<T>(false, true, mg, kg, ld, T(1), dym + gi * mg * ld, ld,
                      cols.get() + gi * kg * ld, ld, n0 > first ? T(1) : T(0), dw + gi * mg * kg,
                      kg);
    }
    if (dx) {
      for (std::int64_t gi = 0; gi < g.group; ++gi)
        blas::gemm<T>(true, false, kg, ld, mg, T(1), w + gi * mg * kg, kg, dym + gi * mg * ld, ld,
                      T(0), cols.get() + gi * kg * ld, ld);
      for (std::int64_t k = 0; k < nb; ++k)
        col2im(g, cols.get() + k * p, ld, dx + (n0 + k) * image);
    }
  }
}

// dx (N, C, H, W) and/or dw (M, C/group, KH, KW) from dy (N, M, OH, OW); either may be null.
// The columns are recomputed from x for dw; dw's GEMM runs before dx's so that dx's column
// gradients can reuse the same buffer.
template <typename T>
void backward(const Geometry& g, const T* x, const T* w, const T* dy, T* dx, T* dw,
              std::int64_t images_per_gemm = 0) {
  if (dx == nullptr && dw == nullptr) return;
  const std::int64_t size_w = g.m * g.kg();
  // Thread t > 0 adds its images' dW into partial[t - 1]; thread 0 writes dw itself.
  std::vector<std::unique_ptr<T[]>> partial(static_cast<std::size_t>(
      dw ? std::max(0, std::min<int>(omp_get_max_threads(), int(g.n)) - 1) : 0));
  for (auto& part : partial) part = scratch<T>(size_w);
  const int ranges = over_images(g, [&](int t, std::int64_t first, std::int64_t end) {
    T* dw_range = dw == nullptr ? nullptr : t == 0 ? dw : partial[std::size_t(t - 1)].get();
    if (dw_range && first == end) std::fill(dw_range, dw_range + size_w, T(0));
    backward_images(g, x, w, dy, dx, dw_range, first, end, images_per_gemm);
  });
  for (int t = 1; t < ranges; ++t) {  // in thread order: the same sums for the same threads
    const T* part = partial[std::size_t(t - 1)].get();
    for (std::int64_t i = 0; i < size_w; ++i) dw[i] += part[i];
  }
}

}  // namespace meta::conv
