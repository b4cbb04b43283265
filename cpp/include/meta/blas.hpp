// Matrix products for meta's kernels through the BLAS that numpy already loaded.
//
// meta.lv0.native looks up numpy's OpenBLAS (through threadpoolctl) when the extension is first
// used and hands its cblas_?gemm entry points to set_provider(): one BLAS and one BLAS thread
// pool serve numpy and the C++ kernels, so thread settings (meta._threads) govern both and no
// second pool spins against the first. Without a usable BLAS the portable loops below run
// (correct, several times slower); blas_name() says which is in use.
//
// Call gemm() from outside OpenMP parallel regions: BLAS runs its own threads.
#pragma once
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

struct Provider {
  void* sgemm = nullptr;  // cblas_sgemm of the loaded BLAS, or null for the built-in loops
  void* dgemm = nullptr;
  bool ilp64 = false;     // 64-bit integer interface (numpy's scipy-openblas64)
  std::string name = "built-in loops (no BLAS connected)";
};

inline Provider& provider() {
  static Provider p;
  return p;
}

inline void set_provider(std::uintptr_t sgemm, std::uintptr_t dgemm, bool ilp64,
                         const std::string& name) {
  Provider& p = provider();
  p.sgemm = reinterpret_cast<void*>(sgemm);
  p.dgemm = reinterpret_cast<void*>(dgemm);
  p.ilp64 = ilp64;
  p.name = (sgemm && dgemm) ? name : "built-in loops (no BLAS connected)";
}

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

template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
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

}  // namespace meta::blas
