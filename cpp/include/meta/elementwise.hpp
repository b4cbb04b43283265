// Broadcasting binary operators (Add, Sub, Mul, Div) and the reduction that undoes broadcasting
// in their backward pass: the native twins of ops/add.py, sub.py, mul.py and div.py.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "meta/parallel.hpp"

namespace meta {

constexpr int kMaxDims = 16;
constexpr int kMaxOperands = 4;

// A loop nest over a broadcast output: dimensions of size 1 dropped, and neighbours merged where
// every operand walks them as one (as numpy's iterator does). Strides are in elements, 0 where
// an operand is broadcast; the last dimension is the innermost loop.
struct Nest {
  int ndim = 0;
  int nops = 0;
  std::int64_t shape[kMaxDims] = {};
  std::int64_t stride[kMaxOperands][kMaxDims] = {};

  std::int64_t size() const {
    std::int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  std::int64_t inner() const { return ndim ? shape[ndim - 1] : 1; }
  std::int64_t rows() const { return size() / inner(); }
};

// The nest of C-contiguous operands broadcast to ``out`` (each shape right-aligned, as numpy
// does). Returns false when there are more than kMaxDims dimensions.
inline bool make_nest(const std::vector<std::int64_t>& out,
                      const std::vector<std::vector<std::int64_t>>& operands, Nest& nest) {
  const int ndim = static_cast<int>(out.size());
  nest.nops = static_cast<int>(operands.size());
  std::int64_t shape[kMaxDims], stride[kMaxOperands][kMaxDims];
  if (ndim > kMaxDims || nest.nops > kMaxOperands) return false;
  for (int k = 0; k < nest.nops; ++k) {
    const auto& s = operands[k];
    const int lead = ndim - static_cast<int>(s.size());
    std::int64_t step = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      const std::int64_t n = d >= lead ? s[d - lead] : 1;
      stride[k][d] = n == 1 ? 0 : step;
      step *= n;
    }
  }
  int m = 0;  // dimensions kept so far, size-1 ones dropped
  for (int d = 0; d < ndim; ++d) {
    if (out[d] == 1) continue;
    if (m > 0) {
      bool merge = true;  // (previous, d) walk as one dimension for every operand
      for (int k = 0; k < nest.nops && merge; ++k)
        merge = nest.stride[k][m - 1] == stride[k][d] * out[d];
      if (merge) {
        nest.shape[m - 1] *= out[d];
        for (int k = 0; k < nest.nops; ++k) nest.stride[k][m - 1] = stride[k][d];
        continue;
      }
    }
    nest.shape[m] = out[d];
    for (int k = 0; k < nest.nops; ++k) nest.stride[k][m] = stride[k][d];
    ++m;
  }
  nest.ndim = m;
  return true;
}

// Calls row(offsets, n) for every innermost row of the nest, rows [begin, end) only; offsets
// are the operands' element offsets of the row's first element.
template <typename Row>
void for_rows(const Nest& nest, std::int64_t begin, std::int64_t end, Row&& row) {
  if (begin >= end) return;
  const int outer = nest.ndim - 1;
  std::int64_t index[kMaxDims] = {};
  std::int64_t offset[kMaxOperands] = {};
  std::int64_t r = begin;
  for (int d = outer - 1; d >= 0; --d) {
    index[d] = r % nest.shape[d];
    r /= nest.shape[d];
    for (int k = 0; k < nest.nops; ++k) offset[k] += index[d] * nest.stride[k][d];
  }
  const std::int64_t n = nest.inner();
  for (std::int64_t i = begin; i < end; ++i) {
    row(offset, n);
    for (int d = outer - 1; d >= 0; --d) {  // odometer step to the next row
      for (int k = 0; k < nest.nops; ++k) offset[k] += nest.stride[k][d];
      if (++index[d] < nest.shape[d]) break;
      for (int k = 0; k < nest.nops; ++k) offset[k] -= index[d] * nest.stride[k][d];
      index[d] = 0;
    }
  }
}

// The rows of a nest split evenly over the threads of a parallel region (one thread below
// kParallelThreshold elements: see parallel.hpp).
template <typename Row>
void for_rows_parallel(const Nest& nest, Row&& row) {
  const std::int64_t rows = nest.rows();
  if (nest.size() <= kParallelThreshold || rows < 2) {
    for_rows(nest, 0, rows, row);
    return;
  }
#pragma omp parallel
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    for_rows(nest, rows * t / nt, rows * (t + 1) / nt, row);
  }
}

struct AddOp {
  template <typename T>
  static T apply(T a, T b) { return a + b; }
};
struct SubOp {
  template <typename T>
  static T apply(T a, T b) { return a - b; }
};
struct MulOp {
  template <typename T>
  static T apply(T a, T b) { return a * b; }
};
struct DivOp {
  template <typename T>
  static T apply(T a, T b) { return a / b; }
};

// out = a (op) b over the nest of (out, a, b); out is contiguous.
template <typename Op, typename T>
void binary_forward(const Nest& nest, const T* a, const T* b, T* out) {
  for_rows_parallel(nest, [&](const std::int64_t* off, std::int64_t n) {
    T* o = out + off[0];
    const T* pa = a + off[1];
    const T* pb = b + off[2];
    const std::int64_t sa = nest.ndim ? nest.stride[1][nest.ndim - 1] : 0;
    const std::int64_t sb = nest.ndim ? nest.stride[2][nest.ndim - 1] : 0;
    if (sa == 1 && sb == 1) {
      for (std::int64_t i = 0; i < n; ++i) o[i] = Op::apply(pa[i], pb[i]);
    } else if (sa == 1 && sb == 0) {
      const T vb = *pb;
      for (std::int64_t i = 0; i < n; ++i) o[i] = Op::apply(pa[i], vb);
    } else if (sa == 0 && sb == 1) {
      const T va = *pa;
      for (std::int64_t i = 0; i < n; ++i) o[i] = Op::apply(va, pb[i]);
    } else {
      for (std::int64_t i = 0; i < n; ++i) o[i] = Op::apply(pa[i * sa], pb[i * sb]);
    }
  });
}

// What flows back to one operand of a binary op, before the broadcast is undone. Operands of
// the nest: 0 the target (the input's gradient), 1 dy, 2 p, 3 q (p, q unused by some).
struct GradSame {  // dy (Add, Sub)
  template <typename T>
  static T apply(T dy, T, T) { return dy; }
};
struct GradMul {  // dy * p (Mul: p is the other operand)
  template <typename T>
  static T apply(T dy, T p, T) { return dy * p; }
};
struct GradDiv {  // dy / p (Div's numerator: p is the denominator)
  template <typename T>
  static T apply(T dy, T p, T) { return dy / p; }
};
struct GradDivDenominator {  // -dy * q / p (Div's denominator: q is the quotient, p itself)
  template <typename T>
  static T apply(T dy, T p, T q) { return -dy * q / p; }
};

namespace detail {

// One value of the gradient at inner position i of a row.
template <typename G, typename T>
inline T grad_at(const T* dy, const T* p, const T* q, std::int64_t sp, std::int64_t sq,
                 std::int64_t i) {
  return G::apply(dy[i], p[i * sp], q[i * sq]);
}

}  // namespace detail

// target = the gradient G(dy, p, q) summed over the axes the target was broadcast along. The
// nest is over (target, dy, p, q); a gradient that reads no p or q is given dy for them. Sums
// run in double. ``reduces`` says whether any axis is
// summed; when none is, this is one elementwise pass.
template <typename G, typename T>
void unbroadcast(const Nest& nest, bool reduces, std::int64_t target_size, const T* dy,
                 const T* p, const T* q, T* target) {
  const int last = nest.ndim - 1;
  const std::int64_t sp = nest.ndim ? nest.stride[2][last] : 0;
  const std::int64_t sq = nest.ndim ? nest.stride[3][last] : 0;
  if (!reduces) {
    for_rows_parallel(nest, [&](const std::int64_t* off, std::int64_t n) {
      const T* pdy = dy + off[1];
      const T* pp = p + off[2];
      const T* pq = q + off[3];
      T* t = target + off[0];
      if (sp == 1 && sq == 1) {
        for (std::int64_t i = 0; i < n; ++i) t[i] = G::apply(pdy[i], pp[i], pq[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i)
          t[i] = detail::grad_at<G>(pdy, pp, pq, sp, sq, i);
      }
    });
    return;
  }
  const std::int64_t rows = nest.rows();
  const bool parallel = nest.size() > kParallelThreshold && rows > 1;
  const int threads = parallel ? omp_get_max_threads() : 1;
  std::vector<double> acc(static_cast<std::size_t>(threads) * target_size, 0.0);
  const std::int64_t st = nest.ndim ? nest.stride[0][last] : 0;
  auto body = [&](double* sum, std::int64_t begin, std::int64_t end) {
    for_rows(nest, begin, end, [&](const std::int64_t* off, std::int64_t n) {
      const T* pdy = dy + off[1];
      const T* pp = p + off[2];
      const T* pq = q + off[3];
      double* s = sum + off[0];
      if (st == 0) {  // the whole row sums into one element
        // simd reductions: partial sums in vector lanes, not one latency-bound chain.
        double total = 0.0;
        if (sp == 1 && sq == 1) {
#pragma omp simd reduction(+ : total)
          for (std::int64_t i = 0; i < n; ++i) total += G::apply(pdy[i], pp[i], pq[i]);
        } else {
#pragma omp simd reduction(+ : total)
          for (std::int64_t i = 0; i < n; ++i)
            total += detail::grad_at<G>(pdy, pp, pq, sp, sq, i);
        }
        *s += total;
      } else {
        for (std::int64_t i = 0; i < n; ++i)
          s[i * st] += detail::grad_at<G>(pdy, pp, pq, sp, sq, i);
      }
    });
  };
  if (!parallel) {
    body(acc.data(), 0, rows);
  } else {
#pragma omp parallel num_threads(threads)
    {
      const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      body(acc.data() + t * target_size, rows * t / nt, rows * (t + 1) / nt);
    }
  }
  for (std::int64_t i = 0; i < target_size; ++i) {
    double total = acc[i];
    for (int t = 1; t < threads; ++t) total += acc[t * target_size + i];
    target[i] = static_cast<T>(total);
  }
}

}  // namespace meta
