// The plan runtime: engine, stream, the shared scratchpad, layouts, programs and reorders.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <optional>

#include <immintrin.h>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

namespace {

struct Scratch {
  void* data = nullptr;
  std::size_t bytes = 0;
  ~Scratch() { std::free(data); }
};

Scratch& scratch_buffer() {
  static Scratch s;
  return s;
}

}  // namespace

namespace {

// The shared scratchpad's bytes, grown to at least `need`.
void* scratch_data(std::size_t need) {
  Scratch& s = scratch_buffer();
  if (need > s.bytes) {
    std::free(s.data);
    s.bytes = (need + 4095) / 4096 * 4096;
    s.data = std::aligned_alloc(64, s.bytes);
    if (!s.data) throw std::bad_alloc();
  }
  return s.data;
}

}  // namespace

memory scratch(const memory::desc& md) {
  return memory(md, engine(), scratch_data(md.get_size()));
}

dnnl::primitive_attr scratch_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

memory::desc make_md(const Dims& dims, const std::string& layout, dt type) {
  const memory::dims d(dims.begin(), dims.end());
  if (layout == "any") return memory::desc(d, type, tag::any);
  if (layout == "plain" || layout.empty()) {
    static const tag plain[] = {tag::undef, tag::a,     tag::ab,     tag::abc,
                                tag::abcd,  tag::abcde, tag::abcdef};
    if (dims.size() >= 1 && dims.size() <= 6) return memory::desc(d, type, plain[dims.size()]);
    // higher ranks: row-major strides
    Dims strides(dims.size(), 1);
    for (int i = int(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
    return strided_md(dims, strides, type);
  }
  if (dims.size() == 4) {
    if (layout == "nChw16c") return memory::desc(d, type, tag::aBcd16b);
    if (layout == "nChw8c") return memory::desc(d, type, tag::aBcd8b);
    if (layout == "nhwc") return memory::desc(d, type, tag::acdb);
  }
  throw std::invalid_argument("meta._plan: no layout '" + layout + "' for a " +
                              std::to_string(dims.size()) + "-D tensor");
}

std::string layout_of(const memory::desc& md) {
  const memory::dims d = md.get_dims();
  const Dims dims(d.begin(), d.end());
  for (const char* name : {"plain", "nChw16c", "nChw8c", "nhwc"}) {
    if (std::strcmp(name, "plain") != 0 && dims.size() != 4) continue;
    if (make_md(dims, name, md.get_data_type()) == md) return name;
  }
  return "";
}

memory::desc strided_md(const Dims& dims, const Dims& strides, dt type) {
  return memory::desc(memory::dims(dims.begin(), dims.end()), type,
                      memory::dims(strides.begin(), strides.end()));
}

void* address(const py::array& a, std::size_t bytes, const char* what) {
  if (!(a.flags() & py::array::c_style) && a.ndim() > 1)
    throw std::invalid_argument(std::string("meta._plan: ") + what + " is not C-contiguous");
  if (static_cast<std::size_t>(a.nbytes()) < bytes)
    throw std::invalid_argument(std::string("meta._plan: ") + what + " holds " +
                                std::to_string(a.nbytes()) + " bytes, the kernel needs " +
                                std::to_string(bytes));
  return const_cast<void*>(a.data());
}

memory bind(const memory::desc& md, const py::array& a, const char* what) {
  return memory(md, engine(), address(a, md.get_size(), what));
}

std::string impl(const dnnl::primitive_desc_base& pd) { return pd.impl_info_str(); }

void PrimitiveStep::run() {
  // the scratchpad's memory object made once and kept in args while the shared buffer stays
  // where it is: making one per call cost ~0.5 us a step (MobileNetV3 at batch 1 runs 30
  // convolutions with a scratchpad in 0.2 ms)
  if (const std::size_t need = scratch_md.get_size()) {
    void* data = scratch_data(need);
    const auto it = args.find(DNNL_ARG_SCRATCHPAD);
    if (it == args.end() || it->second.get_data_handle() != data)
      args[DNNL_ARG_SCRATCHPAD] = memory(scratch_md, engine(), data);
  }
  prim.execute(stream(), args);
}

namespace {

// One staging buffer per operand position of a bf16 step (a step converts at most a few).
constexpr int kStagingSlots = 4;
Scratch& staging_buffer(int slot) {
  static Scratch s[kStagingSlots];
  return s[slot];
}

void* staging(int slot, std::size_t need) {
  Scratch& s = staging_buffer(slot);
  if (need > s.bytes) {
    std::free(s.data);
    s.bytes = (need + 4095) / 4096 * 4096;
    s.data = std::aligned_alloc(64, s.bytes);
    if (!s.data) throw std::bad_alloc();
  }
  return s.data;
}

}  // namespace

std::size_t staging_bytes() {
  std::size_t n = 0;
  for (int i = 0; i < kStagingSlots; ++i) n += staging_buffer(i).bytes;
  return n;
}

Bf16Input bf16_input(int arg, const memory::desc& from, const memory::desc& to, void* data) {
  if (to.get_data_type() != dt::bf16)
    throw std::invalid_argument("meta._plan: a bf16 operand's target is not bf16");
  auto pd = dnnl::reorder::primitive_desc(engine(), from, engine(), to);
  return Bf16Input{arg, from, to, data, dnnl::reorder(pd)};
}

void Bf16Step::run() {
  if (inputs.size() > std::size_t(kStagingSlots))
    throw std::runtime_error("meta._plan: a bf16 step converts more operands than it has slots");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Bf16Input& in = inputs[i];
    memory src(in.from, engine(), in.data);
    memory dst(in.to, engine(), staging(int(i), in.to.get_size()));
    in.convert.execute(stream(), {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
    args[in.arg] = dst;
  }
  if (scratch_md.get_size()) args[DNNL_ARG_SCRATCHPAD] = scratch(scratch_md);
  prim.execute(stream(), args);
}

StepPtr primitive_step(const std::string& name, const dnnl::primitive& p,
                       std::unordered_map<int, memory> args, const memory::desc& scratch_md) {
  return std::make_shared<PrimitiveStep>(name, p, std::move(args), scratch_md);
}

void Program::run() {
  if (profile && ns.size() != steps.size()) ns.assign(steps.size(), 0);
  py::gil_scoped_release release;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (profile) {
      const auto t0 = std::chrono::steady_clock::now();
      steps[i]->run();
      ns[i] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - t0)
                   .count();
    } else {
      steps[i]->run();
    }
  }
  stream().wait();
  ++runs;
}

namespace {

// x (layout a) -> y (layout b), same dims; or a permutation (Transpose) when `perm` is given:
// y[i0..] = x[perm...] as ONNX's Transpose, through a reorder between strided views.
StepPtr reorder_step(const Dims& dims, const std::string& from, const std::string& to,
                     const py::array& x, const py::array& y) {
  const memory::desc src = make_md(dims, from), dst = make_md(dims, to);
  auto pd = dnnl::reorder::primitive_desc(engine(), src, engine(), dst, scratch_attr());
  return primitive_step("reorder " + from + "->" + to, dnnl::reorder(pd),
                        {{DNNL_ARG_FROM, bind(src, x, "reorder source")},
                         {DNNL_ARG_TO, bind(dst, y, "reorder destination")}},
                        pd.scratchpad_desc());
}

// Elements a copy loop runs on one thread: below this a fork/join of the plan's two threads
// costs more than the half of the copy it saves (~1 us against 16 KiB).
constexpr std::int64_t kParallelFloats = 1 << 14;

// A Transpose as the plan's own loop where it moves runs of at least 16 contiguous elements
// (the attention's head splits and merges, (T, B, E) <-> (B, T, E)): one memcpy per output
// row, the rows in a static split on the plan's threads, each thread stepping its source
// offset along (no division per row). oneDNN's reorder between strided views ran these on
// one thread whatever the plan's count (the transformer's Transposes: 1.0 ms a step at 1
// thread, 0.76 at 2). Pure copies: the same bytes at any thread count.
// n floats (n a multiple of 16) from x to y, sixteen lanes at a time: glibc's memcpy of a
// 128- or 512-byte row cost twice oneDNN's reorder per byte here.
__attribute__((target("avx512f"))) inline void copy_floats_avx512(const float* x, float* y,
                                                                 std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, _mm512_loadu_ps(x + i));
}

bool cpu_has_avx512f() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
const bool kRowsAvx512 = cpu_has_avx512f();

struct TransposeRows {
  static constexpr std::size_t kMaxDims = 8;
  Dims dims;     // output dims but the last, merged where the source runs on
  Dims strides;  // the source stride (elements) of each
  std::int64_t run = 0;  // elements a row (the last output dim, contiguous in the source)
  const float* x = nullptr;
  float* y = nullptr;

  void copy(std::int64_t r0, std::int64_t r1) const {  // output rows [r0, r1)
    const std::size_t n = dims.size();
    std::int64_t index[kMaxDims], off = 0, r = r0;
    for (int d = int(n) - 1; d >= 0; --d) {
      index[d] = r % dims[d];
      off += index[d] * strides[d];
      r /= dims[d];
    }
    const std::size_t bytes = std::size_t(run) * 4;
    const bool lanes = kRowsAvx512 && run % 16 == 0;
    for (std::int64_t row = r0; row < r1; ++row) {
      if (lanes)
        copy_floats_avx512(x + off, y + row * run, run);
      else
        std::memcpy(y + row * run, x + off, bytes);
      for (int d = int(n) - 1; d >= 0; --d) {  // the next row's source offset
        off += strides[d];
        if (++index[d] < dims[d]) break;
        off -= dims[d] * strides[d];
        index[d] = 0;
      }
    }
  }

  void operator()() const {
    std::int64_t count = 1;
    for (const auto d : dims) count *= d;
    if (count * run <= kParallelFloats) return copy(0, count);
#pragma omp parallel
    {
      const std::int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
      copy(count * t / threads, count * (t + 1) / threads);
    }
  }
};

// The rows loop for this transpose (output dims, source strides), or none where oneDNN's
// reorder takes it: the last output dim strided in the source (K^T: oneDNN's vector
// transposes beat a scalar loop), runs under 16 elements, a plain copy.
std::optional<TransposeRows> transpose_rows(const Dims& out_dims, const Dims& src_strides) {
  Dims dims, strides;
  for (std::size_t i = 0; i < out_dims.size(); ++i) {
    if (out_dims[i] == 1) continue;
    if (!dims.empty() && strides.back() == src_strides[i] * out_dims[i]) {
      dims.back() *= out_dims[i];  // the source runs on: one dim
      strides.back() = src_strides[i];
    } else {
      dims.push_back(out_dims[i]);
      strides.push_back(src_strides[i]);
    }
  }
  if (dims.size() < 2 || dims.size() > TransposeRows::kMaxDims + 1 || strides.back() != 1 ||
      dims.back() < 16)
    return std::nullopt;
  TransposeRows t;
  t.run = dims.back();
  t.dims.assign(dims.begin(), dims.end() - 1);
  t.strides.assign(strides.begin(), strides.end() - 1);
  return t;
}

StepPtr transpose_step(const Dims& in_dims, const Dims& perm, const py::array& x,
                       const py::array& y) {
  const std::size_t n = in_dims.size();
  if (perm.size() != n) throw std::invalid_argument("transpose: perm has the wrong length");
  Dims in_strides(n, 1);
  for (int i = int(n) - 2; i >= 0; --i) in_strides[i] = in_strides[i + 1] * in_dims[i + 1];
  // The source viewed in the output's index order.
  Dims out_dims(n), src_strides(n);
  for (std::size_t i = 0; i < n; ++i) {
    out_dims[i] = in_dims[perm[i]];
    src_strides[i] = in_strides[perm[i]];
  }
  const memory::desc src = strided_md(out_dims, src_strides), dst = make_md(out_dims, "plain");
  void* px = address(x, dst.get_size(), "transpose source");
  void* py_ = address(y, dst.get_size(), "transpose output");
  // at one thread oneDNN's reorder is as fast (a plan is built for its thread count)
  if (auto rows = transpose_rows(out_dims, src_strides); rows && omp_get_max_threads() > 1) {
    rows->x = static_cast<const float*>(px);
    rows->y = static_cast<float*>(py_);
    return std::make_shared<LambdaStep>("transpose rows", *rows);
  }
  auto pd = dnnl::reorder::primitive_desc(engine(), src, engine(), dst, scratch_attr());
  return primitive_step("transpose", dnnl::reorder(pd),
                        {{DNNL_ARG_FROM, memory(src, engine(), px)},
                         {DNNL_ARG_TO, memory(dst, engine(), py_)}},
                        pd.scratchpad_desc());
}

// y = x (same bytes): copies or accumulates (y += x) plain buffers of n floats.
StepPtr copy_step(const py::array& x, const py::array& y, std::int64_t n, bool accumulate) {
  const float* px = static_cast<const float*>(address(x, n * 4, "copy source"));
  float* py_ = static_cast<float*>(address(y, n * 4, "copy destination"));
  if (accumulate)
    return std::make_shared<LambdaStep>("accumulate", [=] {
      // chunks with an inner simd loop: GCC 12 left a combined "parallel for simd" in a
      // lambda scalar (1.05 ms on 2^20 floats at 1 thread; numpy's += 0.16)
      constexpr std::int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > kParallelFloats)
      for (std::int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
        const std::int64_t i1 = std::min(n, (c + 1) * kChunk);
#pragma omp simd
        for (std::int64_t i = c * kChunk; i < i1; ++i) py_[i] += px[i];
      }
    });
  // in chunks on the plan's threads: a backward's copy reads what the other thread wrote
  // (a residual Add's gradient: 11 us at 1 thread, 25 at 2 as one memcpy)
  return std::make_shared<LambdaStep>("copy", [=] {
    constexpr std::int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > kParallelFloats)
    for (std::int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
      const std::int64_t i0 = c * kChunk;
      std::memcpy(py_ + i0, px + i0, std::size_t(std::min(kChunk, n - i0)) * 4);
    }
  });
}

StepPtr fill_step(const py::array& y, std::int64_t n, float value) {
  float* py_ = static_cast<float*>(address(y, n * 4, "fill destination"));
  return std::make_shared<LambdaStep>("fill", [=] {
    constexpr std::int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > kParallelFloats)
    for (std::int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c)
      std::fill(py_ + c * kChunk, py_ + std::min(n, (c + 1) * kChunk), value);
  });
}

}  // namespace

void bind_runtime(py::module_& m) {
  py::class_<Step, StepPtr>(m, "Step", "One bound kernel call of a plan.")
      .def("run", [](Step& s) {
            py::gil_scoped_release release;
            s.run();
            stream().wait();
          })
      .def_readwrite("name", &Step::name)
      .def("__repr__", [](const Step& s) { return "<Step " + s.name + ">"; });
  py::class_<PyStep, Step, std::shared_ptr<PyStep>>(m, "PyStep",
                                                    "A step Python runs (takes the GIL).")
      .def(py::init<py::function, std::string>(), py::arg("fn"), py::arg("name"));
  py::class_<Program>(m, "Program", "Steps run in order in one call, the GIL released.")
      .def(py::init([](std::vector<StepPtr> steps) {
             Program p;
             p.steps = std::move(steps);
             return p;
           }),
           py::arg("steps"))
      .def("run", &Program::run)
      .def_readwrite("profile", &Program::profile)
      .def_readonly("runs", &Program::runs)
      .def_property_readonly("step_ns", [](const Program& p) { return p.ns; })
      .def_property_readonly("steps", [](const Program& p) { return p.steps; })
      .def_property_readonly("names", [](const Program& p) {
            std::vector<std::string> n;
            for (const auto& s : p.steps) n.push_back(s->name);
            return n;
          })
      .def("__len__", [](const Program& p) { return p.steps.size(); });
  m.def("layout_bytes", [](const Dims& dims, const std::string& layout) {
        return make_md(dims, layout).get_size();
      }, py::arg("dims"), py::arg("layout"), "Bytes a float32 tensor takes in this layout.");
  m.def("reorder", &reorder_step, py::arg("dims"), py::arg("source_layout"),
        py::arg("target_layout"), py::arg("x"), py::arg("y"));
  m.def("transpose", &transpose_step, py::arg("dims"), py::arg("perm"), py::arg("x"),
        py::arg("y"));
  m.def("copy", &copy_step, py::arg("x"), py::arg("y"), py::arg("n"),
        py::arg("accumulate") = false);
  m.def("fill", &fill_step, py::arg("y"), py::arg("n"), py::arg("value"));
  m.def("scratch_bytes", [] { return scratch_buffer().bytes; });
  m.def("staging_bytes", &staging_bytes, "Bytes of the bf16 steps' shared operand copies.");
  m.def("max_threads", &omp_get_max_threads);
}

}  // namespace meta::plan
