// Matrix products for meta's kernels through the BLAS that numpy already loaded.
//
// meta.lv0.native looks up numpy's OpenBLAS (through threadpoolctl) when the extension is first
// used and hands its cblas_?gemm entry points to set_provider(): the kernels use numpy's BLAS
// code, no second copy. Threads: the kernels' elementwise and pooling loops run on OpenMP's
// pool, and OpenBLAS (pthreads) has a pool of its own. Alternating the two on a small machine
// was ruinous: each pool's idle threads spin for a while after its work, on the cores the other
// pool needs next (LeNet-5 ran 3x slower with 2 threads than with 1). So gemm() keeps OpenBLAS
// at one thread for the duration of the call and splits a large product over OpenMP's threads
// itself, each part one single-threaded BLAS call: the kernels use one pool, as PyTorch does.
// Without a usable BLAS the portable loops below run (correct, several times slower);
// blas_name() says which is in use.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace meta::blas {

// CBLAS constants (cblas.h): row-major order, no transpose, transpose.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

template <typename Int, typename T>
using CblasGemm = void (*)(int, int, int, Int, Int, Int, T, const T*, Int, const T*, Int, T, T*,
                           Int);

using SetThreads = void (*)(int);
using GetThreads = int (*)();

struct Provider {
  void* sgemm = nullptr;  // cblas_sgemm of the loaded BLAS, or null for the built-in loops
  void* dgemm = nullptr;
  bool ilp64 = false;     // 64-bit integer interface (numpy's scipy-openblas64)
  SetThreads set_threads = nullptr;  // openblas_set_num_threads, when the BLAS has one
  GetThreads get_threads = nullptr;
  std::string name = "built-in loops (no BLAS connected)";
};

inline Provider& provider() {
  static Provider p;
  return p;
}

inline void set_provider(std::uintptr_t sgemm, std::uintptr_t dgemm, bool ilp64,
                         std::uintptr_t set_threads, std::uintptr_t get_threads,
                         const std::string& name) {
  Provider& p = provider();
  p.sgemm = reinterpret_cast<void*>(sgemm);
  p.dgemm = reinterpret_cast<void*>(dgemm);
  p.ilp64 = ilp64;
  p.set_threads = set_threads && get_threads ? reinterpret_cast<SetThreads>(set_threads) : nullptr;
  p.get_threads = set_threads && get_threads ? reinterpret_cast<GetThreads>(get_threads) : nullptr;
  p.name = (sgemm && dgemm) ? name : "built-in loops (no BLAS connected)";
}

// Keeps the BLAS at one thread while alive (outside OpenMP regions; nothing to do without a
// thread setter or when it already runs one).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() {
    const Provider& p = provider();
    if (p.set_threads && !omp_in_parallel()) {
      previous_ = p.get_threads();
      if (previous_ != 1) p.set_threads(1);
    }
  }
  ~SingleThreadedBlas() {
    if (previous_ > 1) provider().set_threads(previous_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_ = 0;
};

// C = alpha * op(A) op(B) + beta * C, row-major; op(A) is M x K, op(B) is K x N.
template <typename T>
void builtin_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                  T* c, std::int64_t ldc) {
  // B is read row by row (k, then j) so the inner loop is contiguous; a transposed B is copied
  // once into that layout.
  std::vector<T> bt;
  if (trans_b) {
    bt.resize(static_cast<std::size_t>(k * n));
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) bt[p * n + j] = b[j * ldb + p];
    b = bt.data();
    ldb = n;
  }
#pragma omp parallel for schedule(static) if (m * n * k > (1 << 20))
  for (std::int64_t i = 0; i < m; ++i) {
    T* ci = c + i * ldc;
    for (std::int64_t j = 0; j < n; ++j) ci[j] = beta == T(0) ? T(0) : beta * ci[j];
    for (std::int64_t p = 0; p < k; ++p) {
      const T aip = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
      if (aip == T(0)) continue;
      const T* bp = b + p * ldb;
      for (std::int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

template <typename T, typename Int>
void call_cblas(void* fn, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                std::int64_t k, T alpha, const T* a, std::int64_t lda, const T* b,
                std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  reinterpret_cast<CblasGemm<Int, T>>(fn)(kRowMajor, trans_a ? kTrans : kNoTrans,
                                          trans_b ? kTrans : kNoTrans, Int(m), Int(n), Int(k),
                                          alpha, a, Int(lda), b, Int(ldb), beta, c, Int(ldc));
}

// One BLAS call on the calling thread.
template <typename T>
void serial_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                 std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  const Provider& p = provider();
  void* fn = sizeof(T) == sizeof(float) ? p.sgemm : p.dgemm;
  if (fn == nullptr || k == 0) {
    builtin_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else if (p.ilp64) {
    call_cblas<T, std::int64_t>(fn, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                ldc);
  } else {
    call_cblas<T, int>(fn, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Below this many multiply-adds a product stays on one thread (a fork-join costs a few us).
constexpr std::int64_t kParallelGemmWork = 1 << 16;
// Parts are cut at multiples of this many rows or columns (whole vector registers).
constexpr std::int64_t kGemmGrain = 16;

// C = alpha * op(A) op(B) + beta * C, row-major; op(A) is M x K, op(B) is K x N. Large products
// are cut into one block of C's columns (or rows, when C is taller than wide) per OpenMP thread,
// each a single-threaded BLAS call; see the top of this file for why.
template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  SingleThreadedBlas single;
  const bool by_columns = n >= m;
  const std::int64_t extent = by_columns ? n : m;
  const std::int64_t threads = std::min<std::int64_t>(omp_get_max_threads(), extent / kGemmGrain);
  if (threads < 2 || m * n * k < kParallelGemmWork || omp_in_parallel()) {
    serial_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const std::int64_t blocks = (extent + kGemmGrain - 1) / kGemmGrain;
    const std::int64_t lo = std::min(extent, blocks * t / nt * kGemmGrain);
    const std::int64_t hi = std::min(extent, blocks * (t + 1) / nt * kGemmGrain);
    if (hi > lo) {
      if (by_columns)  // C[:, lo:hi] = op(A) op(B)[:, lo:hi]
        serial_gemm(trans_a, trans_b, m, hi - lo, k, alpha, a, lda,
                    trans_b ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
      else  // C[lo:hi, :] = op(A)[lo:hi, :] op(B)
        serial_gemm(trans_a, trans_b, hi - lo, n, k, alpha, trans_a ? a + lo : a + lo * lda,
                    lda, b, ldb, beta, c + lo * ldc, ldc);
    }
  }
}

}  // namespace meta::blas
