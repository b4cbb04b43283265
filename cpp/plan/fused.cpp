// Fused pointwise groups of a plan (meta/lv1/plan/lowering/fused.py): a connected group of
// elementwise nodes runs as one step that evaluates a small register program over blocks of
// kBlock elements, so each value between the group's nodes lives in a block-sized register
// (in cache) instead of a tensor in memory, and each instruction is a simple loop over a
// block that the compiler vectorises. Blocks are independent: OpenMP splits them over threads.
//
// Inputs are read through their broadcast strides (0 along a broadcast axis) as float32 or
// bool (uint8: Where's condition, comparisons' results); outputs are written contiguous as
// float32 (optionally added to: a gradient's later contribution) or bool. The backward of a
// group is another program of the same instructions (fused.py derives it by the chain rule),
// so one interpreter runs both. exp, tanh and sigmoid are float32 polynomials of 1-2 ulp; the
// rarer log, erf, softplus and pow are computed in double and rounded once; so each node's
// result is within an ulp or two of numpy's float32 one (the reference path).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "meta/activations.hpp"
#include "plan.hpp"

namespace meta::plan {

namespace {

// Elements per block: each instruction is dispatched once a block, so a block must be long
// enough for its loop to outweigh the dispatch (at 256 the tanh-GELU's 55 instructions of
// forward and backward spent about as long dispatching as computing), and short enough
// that the registers stay in the first-level caches (4 KiB each).
constexpr std::int64_t kBlock = 1024;

// The opcodes; fused.py's OPCODES lists the same names in the same order.
enum Op : int {
  kLoad, kConst, kAdd, kSub, kMul, kDiv, kPow, kPowC, kMin, kMax, kSqrt, kRecip, kExp, kLog,
  kTanh, kErf, kSigmoid, kSoftplus, kNeg, kAbs, kWhere, kEq, kLt, kLe, kGt, kGe, kNot, kAnd,
  kOr, kNe0, kSign, kErfDeriv, kLogSafe,
  // with a constant operand (imm): a + c, a * c, c - a, a / c, c / a
  kAddC, kMulC, kRSubC, kDivC, kRDivC, kCount
};

struct Instr {
  int op, dst, a, b, c;
  float imm;
};

struct Operand {
  const char* data;
  int dtype;  // 0 float32, 1 bool / uint8
  Dims strides;  // elements, one per iteration dim (0 where broadcast)
  bool contiguous, scalar;
};

struct Output {
  char* data;
  int dtype;
  bool accumulate;
  int reg;
};

template <typename T>
inline void gather(const T* src, const Operand& in, const Dims& dims, std::int64_t i0,
                   std::int64_t len, float* dst) {
  const std::int64_t inner = dims.back(), s_in = in.strides.back();
  const int rank = static_cast<int>(dims.size());
  std::int64_t p = i0;
  float* out = dst;
  while (p < i0 + len) {
    std::int64_t row = p / inner, j = p % inner;
    const std::int64_t seg = std::min(inner - j, i0 + len - p);
    std::int64_t base = j * s_in;
    for (int d = rank - 2; d >= 0 && row; --d) {
      base += (row % dims[d]) * in.strides[d];
      row /= dims[d];
    }
    const T* s = src + base;
    if (s_in == 1) {
#pragma omp simd
      for (std::int64_t k = 0; k < seg; ++k) out[k] = static_cast<float>(s[k]);
    } else if (s_in == 0) {
      const float v = static_cast<float>(s[0]);
#pragma omp simd
      for (std::int64_t k = 0; k < seg; ++k) out[k] = v;
    } else {
      for (std::int64_t k = 0; k < seg; ++k) out[k] = static_cast<float>(s[k * s_in]);
    }
    out += seg;
    p += seg;
  }
}

void load(const Operand& in, const Dims& dims, std::int64_t i0, std::int64_t len, float* dst) {
  if (in.dtype == 0) {
    const float* src = reinterpret_cast<const float*>(in.data);
    if (in.contiguous) {
      std::memcpy(dst, src + i0, len * sizeof(float));
    } else if (in.scalar) {
      const float v = src[0];
#pragma omp simd
      for (std::int64_t k = 0; k < len; ++k) dst[k] = v;
    } else {
      gather(src, in, dims, i0, len, dst);
    }
  } else {
    const std::uint8_t* src = reinterpret_cast<const std::uint8_t*>(in.data);
    if (in.contiguous) {
#pragma omp simd
      for (std::int64_t k = 0; k < len; ++k) dst[k] = src[i0 + k] ? 1.f : 0.f;
    } else if (in.scalar) {
      const float v = src[0] ? 1.f : 0.f;
#pragma omp simd
      for (std::int64_t k = 0; k < len; ++k) dst[k] = v;
    } else {
      gather(src, in, dims, i0, len, dst);
#pragma omp simd
      for (std::int64_t k = 0; k < len; ++k) dst[k] = dst[k] != 0.f ? 1.f : 0.f;
    }
  }
}

// Cloned for AVX-512, AVX2 and the baseline (as eltwise.cpp's gelu): the double-precision
// exp and tanh then run 4-8 lanes wide (at the baseline's two, tanh took 10x numpy's time).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define META_FUSED_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define META_FUSED_CLONES
#endif

// The transcendental instructions, each a small function of its own so that exp_vec and
// tanh_vec inline into the loop and it vectorises (inside execute's switch they stayed calls).
// Float32 exp, tanh and sigmoid (about 1-2 ulp, numpy's own are 1 ulp): twice the lanes of
// double and a shorter polynomial; in double, the fused tanh-GELU ran at twice the time of
// oneDNN's nine separate steps.
META_FUSED_CLONES void exp_block(const float* a, float* d, std::int64_t n) {
#pragma omp simd
  for (std::int64_t k = 0; k < n; ++k) d[k] = exp_vec(a[k]);
}

// tanh: Cephes' tanhf, a polynomial below |x| = 0.625, 1 - 2 / (e^2|x| + 1) above.
inline float tanh_f(float x) {
  const float a = std::fabs(x), s = x * x;
  const float p = (((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                   1.33314422036e-1f) * s - 3.33332819422e-1f;
  const float small = x + x * s * p;
  const float large = 1.f - 2.f / (exp_vec(2.f * a) + 1.f);
  const float signed_large = __builtin_isless(x, 0.f) ? -large : large;
  return __builtin_isless(a, 0.625f) ? small : signed_large;
}

META_FUSED_CLONES void tanh_block(const float* a, float* d, std::int64_t n) {
#pragma omp simd
  for (std::int64_t k = 0; k < n; ++k) d[k] = tanh_f(a[k]);
}

META_FUSED_CLONES void sigmoid_block(const float* a, float* d, std::int64_t n) {
#pragma omp simd
  for (std::int64_t k = 0; k < n; ++k) {
    const float x = a[k], e = exp_vec(-std::fabs(x));
    d[k] = __builtin_isgreaterequal(x, 0.f) ? 1.f / (1.f + e) : e / (1.f + e);
  }
}

// 2/sqrt(pi) e^(-x^2): Erf's derivative
META_FUSED_CLONES void erf_deriv_block(const float* a, float* d, std::int64_t n) {
#pragma omp simd
  for (std::int64_t k = 0; k < n; ++k) {
    const double x = a[k];
    d[k] = static_cast<float>(1.1283791670955126 * exp_vec(-x * x));
  }
}

// x^c for a constant c: the exponents models use as products (numpy's float32 power squares
// exactly; a cube rounded once from double), any other through pow in double.
META_FUSED_CLONES void pow_const(const float* a, float c, float* d, std::int64_t n) {
  if (c == 2.f) {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) d[k] = a[k] * a[k];
  } else if (c == 3.f) {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) {
      const double v = a[k];
      d[k] = static_cast<float>(v * v * v);
    }
  } else if (c == 1.f) {
    std::memmove(d, a, n * sizeof(float));
  } else if (c == 0.5f) {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) d[k] = std::sqrt(a[k]);
  } else if (c == -1.f) {
#pragma omp simd
    for (std::int64_t k = 0; k < n; ++k) d[k] = 1.f / a[k];
  } else {
    for (std::int64_t k = 0; k < n; ++k)
      d[k] = static_cast<float>(std::pow(static_cast<double>(a[k]), static_cast<double>(c)));
  }
}

// Cloned too: at the baseline (SSE2, 4 lanes) each instruction over a block ran slower than
// oneDNN's AVX-512 pass over a whole tensor.
META_FUSED_CLONES void execute(const Instr& in, float* regs, const std::vector<Operand>& operands,
             const Dims& dims, std::int64_t i0, std::int64_t n) {
  float* d = regs + in.dst * kBlock;
  const float* a = in.a >= 0 ? regs + in.a * kBlock : nullptr;
  const float* b = in.b >= 0 ? regs + in.b * kBlock : nullptr;
  const float* c = in.c >= 0 ? regs + in.c * kBlock : nullptr;
#define META_LOOP(expr)                                      \
  _Pragma("omp simd") for (std::int64_t k = 0; k < n; ++k) { \
    d[k] = (expr);                                           \
  }                                                          \
  break;
  switch (in.op) {
    case kLoad:
      load(operands[in.a], dims, i0, n, d);
      break;
    case kConst: META_LOOP(in.imm)
    case kAdd: META_LOOP(a[k] + b[k])
    case kSub: META_LOOP(a[k] - b[k])
    case kMul: META_LOOP(a[k] * b[k])
    case kDiv: META_LOOP(a[k] / b[k])
    case kPow:
      for (std::int64_t k = 0; k < n; ++k)
        d[k] = b[k] == 2.f ? a[k] * a[k]
                           : static_cast<float>(std::pow(static_cast<double>(a[k]),
                                                         static_cast<double>(b[k])));
      break;
    case kPowC:
      pow_const(a, in.imm, d, n);
      break;
    // numpy's minimum and maximum: NaN in either operand gives NaN
    case kMin: META_LOOP(std::isnan(a[k]) ? a[k] : (__builtin_islessequal(a[k], b[k]) ? a[k] : b[k]))
    case kMax: META_LOOP(std::isnan(a[k]) ? a[k] : (__builtin_isgreaterequal(a[k], b[k]) ? a[k] : b[k]))
    case kSqrt: META_LOOP(std::sqrt(a[k]))
    case kRecip: META_LOOP(1.f / a[k])
    case kExp:
      exp_block(a, d, n);
      break;
    case kLog:
      for (std::int64_t k = 0; k < n; ++k) d[k] = static_cast<float>(std::log(double(a[k])));
      break;
    case kTanh:
      tanh_block(a, d, n);
      break;
    case kErf:
      for (std::int64_t k = 0; k < n; ++k) d[k] = static_cast<float>(std::erf(double(a[k])));
      break;
    case kSigmoid:
      sigmoid_block(a, d, n);
      break;
    case kSoftplus:
      for (std::int64_t k = 0; k < n; ++k) {
        const double x = a[k];
        d[k] = static_cast<float>(std::max(x, 0.0) + std::log1p(exp_vec(-std::fabs(x))));
      }
      break;
    case kAddC: META_LOOP(a[k] + in.imm)
    case kMulC: META_LOOP(a[k] * in.imm)
    case kRSubC: META_LOOP(in.imm - a[k])
    case kDivC: META_LOOP(a[k] / in.imm)
    case kRDivC: META_LOOP(in.imm / a[k])
    case kNeg: META_LOOP(-a[k])
    case kAbs: META_LOOP(std::fabs(a[k]))
    case kWhere: META_LOOP(a[k] != 0.f ? b[k] : c[k])
    case kEq: META_LOOP(a[k] == b[k] ? 1.f : 0.f)
    case kLt: META_LOOP(__builtin_isless(a[k], b[k]) ? 1.f : 0.f)
    case kLe: META_LOOP(__builtin_islessequal(a[k], b[k]) ? 1.f : 0.f)
    case kGt: META_LOOP(__builtin_isgreater(a[k], b[k]) ? 1.f : 0.f)
    case kGe: META_LOOP(__builtin_isgreaterequal(a[k], b[k]) ? 1.f : 0.f)
    case kNot: META_LOOP(a[k] != 0.f ? 0.f : 1.f)
    case kAnd: META_LOOP(a[k] != 0.f && b[k] != 0.f ? 1.f : 0.f)
    case kOr: META_LOOP(a[k] != 0.f || b[k] != 0.f ? 1.f : 0.f)
    case kNe0: META_LOOP(a[k] != 0.f ? 1.f : 0.f)  // NaN != 0: true, as numpy's astype(bool)
    case kSign:
      META_LOOP(__builtin_isgreater(a[k], 0.f) ? 1.f
                : __builtin_isless(a[k], 0.f) ? -1.f
                                              : a[k] * 0.f)  // 0 stays 0, NaN stays NaN
    case kErfDeriv:
      erf_deriv_block(a, d, n);
      break;
    case kLogSafe:  // log a, with log 0 taken as 0 (Pow's exponent gradient where a == 0)
      for (std::int64_t k = 0; k < n; ++k)
        d[k] = static_cast<float>(std::log(a[k] == 0.f ? 1.0 : double(a[k])));
      break;
    default:
      throw std::invalid_argument("meta._plan.pointwise: unknown opcode");
  }
#undef META_LOOP
}

using InputSpec = std::tuple<py::array, int, Dims>;  // array, dtype, strides
using OutputSpec = std::tuple<py::array, int, bool, int>;  // array, dtype, accumulate, register
using InstrSpec = std::tuple<int, int, int, int, int, float>;

// One step running `program` over `dims` (each output has dims' elements, contiguous).
StepPtr pointwise(const std::string& name, const Dims& dims, const std::vector<InputSpec>& inputs,
                  const std::vector<OutputSpec>& outputs, const std::vector<InstrSpec>& program,
                  int registers) {
  if (dims.empty()) throw std::invalid_argument("meta._plan.pointwise: no dims");
  std::int64_t total = 1;
  for (auto v : dims) total *= v;
  std::vector<Operand> operands;
  for (const auto& [array, dtype, strides] : inputs) {
    if (strides.size() != dims.size())
      throw std::invalid_argument("meta._plan.pointwise: an input's strides and dims differ");
    std::int64_t last = 0;
    bool contiguous = true, scalar = true;
    std::int64_t expect = 1;
    for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
      last += (dims[d] - 1) * strides[d];
      if (dims[d] != 1 && strides[d] != expect) contiguous = false;
      if (dims[d] != 1 && strides[d] != 0) scalar = false;
      expect *= dims[d];
    }
    const std::size_t item = dtype == 0 ? 4 : 1;
    const char* p = static_cast<const char*>(address(array, (last + 1) * item, "pointwise input"));
    operands.push_back({p, dtype, strides, contiguous, scalar && !contiguous});
  }
  std::vector<Output> outs;
  for (const auto& [array, dtype, accumulate, reg] : outputs) {
    if (reg < 0 || reg >= registers)
      throw std::invalid_argument("meta._plan.pointwise: an output's register is out of range");
    const std::size_t item = dtype == 0 ? 4 : 1;
    outs.push_back({static_cast<char*>(address(array, total * item, "pointwise output")), dtype,
                    accumulate, reg});
  }
  std::vector<Instr> code;
  for (const auto& [op, dst, a, b, c, imm] : program) {
    if (op < 0 || op >= kCount || dst < 0 || dst >= registers ||
        (op != kLoad && a >= registers) ||
        b >= registers || c >= registers || (op == kLoad && (a < 0 || a >= int(operands.size()))))
      throw std::invalid_argument("meta._plan.pointwise: a malformed instruction");
    code.push_back({op, dst, a, b, c, imm});  // a load's a: the operand's index
  }
  return std::make_shared<LambdaStep>(name, [=] {
    const std::int64_t blocks = (total + kBlock - 1) / kBlock;
#pragma omp parallel if (total > (1 << 15))
    {
      std::vector<float> regs(static_cast<std::size_t>(registers) * kBlock);
#pragma omp for schedule(static)
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t i0 = blk * kBlock, n = std::min(kBlock, total - i0);
        for (const auto& in : code) {
          if (in.op == kLoad) {
            load(operands[in.a], dims, i0, n, regs.data() + in.dst * kBlock);
          } else {
            execute(in, regs.data(), operands, dims, i0, n);
          }
        }
        for (const auto& o : outs) {
          const float* r = regs.data() + o.reg * kBlock;
          if (o.dtype == 1) {
            std::uint8_t* y = reinterpret_cast<std::uint8_t*>(o.data) + i0;
#pragma omp simd
            for (std::int64_t k = 0; k < n; ++k) y[k] = r[k] != 0.f ? 1 : 0;
          } else if (o.accumulate) {
            float* y = reinterpret_cast<float*>(o.data) + i0;
#pragma omp simd
            for (std::int64_t k = 0; k < n; ++k) y[k] += r[k];
          } else {
            std::memcpy(reinterpret_cast<float*>(o.data) + i0, r, n * sizeof(float));
          }
        }
      }
    }
  });
}

}  // namespace

void bind_fused(py::module_& m) {
  m.def("pointwise", &pointwise, py::arg("name"), py::arg("dims"), py::arg("inputs"),
        py::arg("outputs"), py::arg("program"), py::arg("registers"));
  m.attr("pointwise_block") = kBlock;
  m.attr("pointwise_opcodes") = int(kCount);
}

}  // namespace meta::plan
