// meta._plan: the runtime of the planned executor (meta/lv1/plan). A plan is a list of steps,
// each a oneDNN primitive (or one of our loops) bound once to fixed buffers, so a whole forward
// or backward runs in one call from Python, with the GIL released. Steps that only Python can
// run (an operator without a kernel here) are PyStep objects calling back into Python.
//
// Buffers are numpy arrays the Python planner owns (views into one arena, the graph's
// parameters, plan constants); a step keeps raw pointers into them and the Plan object on the
// Python side keeps the arrays alive. Layouts: a 4-D activation may live in one of oneDNN's
// blocked layouts ("nChw16c", "nChw8c") between kernels that take it; every other tensor is
// plain row-major ("plain").
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace meta::plan {

namespace py = pybind11;
using dnnl::memory;
using Dims = std::vector<std::int64_t>;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& engine();
dnnl::stream& stream();

// One scratchpad shared by every primitive (their "user" scratchpad mode): steps run one at a
// time, so the largest need is all the memory scratch takes.
memory scratch(const memory::desc& md);
dnnl::primitive_attr scratch_attr();

// A layout name -> descriptor for these dims ("plain", "nChw16c", "nChw8c", "nhwc", "any"),
// and back ("" when a descriptor is none of the named ones).
memory::desc make_md(const Dims& dims, const std::string& layout, dt type = dt::f32);
std::string layout_of(const memory::desc& md);
// A plain descriptor with explicit strides (transposed views, slices).
memory::desc strided_md(const Dims& dims, const Dims& strides, dt type = dt::f32);

// The address of a numpy array that must hold at least `bytes`; `what` names it in errors.
void* address(const py::array& a, std::size_t bytes, const char* what);
memory bind(const memory::desc& md, const py::array& a, const char* what);

struct Step {
  virtual ~Step() = default;
  virtual void run() = 0;
  std::string name;
};
using StepPtr = std::shared_ptr<Step>;

// A oneDNN primitive with its arguments bound once.
struct PrimitiveStep : Step {
  PrimitiveStep(std::string n, dnnl::primitive p, std::unordered_map<int, memory> a,
                memory::desc scratch_md)
      : prim(std::move(p)), args(std::move(a)), scratch_md(std::move(scratch_md)) {
    name = std::move(n);
  }
  void run() override;
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  memory::desc scratch_md;
};

// A primitive that reads some float32 operands as bf16 (mixed precision, meta/lv1/plan
// precision="bf16"): each listed operand is converted (a oneDNN reorder) into a shared bf16
// staging buffer just before the primitive runs, which reads it there; outputs stay float32
// (float32 accumulation). The staging buffers are shared by every such step, as the
// scratchpad is, since steps run one at a time: the bf16 copies cost the largest step's
// operands, not the sum over the plan.
struct Bf16Input {
  int arg;                    // the primitive's argument (DNNL_ARG_SRC, ...)
  memory::desc from, to;      // float32 as the plan holds it, bf16 as the primitive reads it
  void* data;                 // the float32 operand
  dnnl::reorder convert;
};
struct Bf16Step : Step {
  Bf16Step(std::string n, dnnl::primitive p, std::unordered_map<int, memory> a,
           memory::desc scratch_md, std::vector<Bf16Input> in)
      : prim(std::move(p)), args(std::move(a)), scratch_md(std::move(scratch_md)),
        inputs(std::move(in)) {
    name = std::move(n);
  }
  void run() override;
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  memory::desc scratch_md;
  std::vector<Bf16Input> inputs;
};
// Operand `from` (float32 at `data`) converted to `to` (bf16) for argument `arg`.
Bf16Input bf16_input(int arg, const memory::desc& from, const memory::desc& to, void* data);
// Bytes the bf16 staging buffers hold now (they grow to the largest step's need).
std::size_t staging_bytes();

// A step that runs any C++ callable (our own loops).
struct LambdaStep : Step {
  LambdaStep(std::string n, std::function<void()> f) : fn(std::move(f)) { name = std::move(n); }
  void run() override { fn(); }
  std::function<void()> fn;
};

// A step Python runs (an operator with no kernel here): takes the GIL for the call.
struct PyStep : Step {
  PyStep(py::function f, std::string n) : fn(std::move(f)) { name = std::move(n); }
  void run() override {
    py::gil_scoped_acquire gil;
    fn();
  }
  py::function fn;
};

// Steps run in order; with profiling on, each step's wall time is kept (ns, summed over runs).
struct Program {
  std::vector<StepPtr> steps;
  std::vector<std::int64_t> ns;
  std::int64_t runs = 0;
  bool profile = false;
  void run();
};

// Builders of each kernel family bind themselves here (one file each).
void bind_runtime(py::module_& m);
void bind_conv(py::module_& m);
void bind_matmul(py::module_& m);
void bind_pool(py::module_& m);
void bind_norm(py::module_& m);
void bind_eltwise(py::module_& m);
void bind_tensor(py::module_& m);
void bind_loss(py::module_& m);
void bind_rnn(py::module_& m);
void bind_attention(py::module_& m);
void bind_embedding(py::module_& m);
void bind_fused(py::module_& m);

// Shared by the builders.
dnnl::algorithm eltwise_algorithm(const std::string& name, bool use_dst);
bool eltwise_has_dst_form(const std::string& name, float alpha);
std::string impl(const dnnl::primitive_desc_base& pd);
StepPtr primitive_step(const std::string& name, const dnnl::primitive& p,
                       std::unordered_map<int, memory> args, const memory::desc& scratch_md);

// bf16 elements (mixed precision), one definition for every kernel file: float32 -> bf16
// rounds to nearest even (a NaN stays a quiet NaN), bf16 -> float32 is exact. Bit casts and a
// select, not a branch: loops calling them vectorise. widen and put read and write a float32
// or a bf16 element as float32, so one template loop serves both element types.
using Half = std::uint16_t;
inline Half to_bf16(float f) {
  const std::uint32_t v = __builtin_bit_cast(std::uint32_t, f);
  const std::uint32_t rounded = (v + 0x7fffu + ((v >> 16) & 1u)) >> 16;
  return Half((v & 0x7fffffffu) > 0x7f800000u ? (v >> 16) | 0x40u : rounded);
}
inline float from_bf16(Half h) { return __builtin_bit_cast(float, std::uint32_t(h) << 16); }
inline float widen(float v) { return v; }
inline float widen(Half h) { return from_bf16(h); }
inline void put(float& d, float v) { d = v; }
inline void put(Half& d, float v) { d = to_bf16(v); }

}  // namespace meta::plan
