// User C++ operators for meta, compiled at run time by meta.register_cpp_op.
//
// A custom op is two function templates on the element type T (float and double are
// instantiated) and one macro line that generates the pybind11 module:
//
//   #include <cmath>
//   #include "meta/custom_op.hpp"
//
//   template <typename T>
//   void forward(meta::Forward<T>& op) {                 // y = x * sigmoid(beta * x)
//     auto x = op.input(0);
//     auto y = op.output(0, x.shape);                    // allocated, zero-filled
//     const T beta = op.attr("beta");
//     meta::parallel_for(x.size, [&](std::int64_t i) {
//       y[i] = x[i] / (T(1) + std::exp(-beta * x[i]));
//     });
//   }
//
//   template <typename T>
//   void backward(meta::Backward<T>& op) {
//     auto x = op.input(0);                              // what forward saw
//     auto dy = op.grad_output(0);                       // d loss / d output 0
//     auto dx = op.grad_input(0);                        // shaped like input 0, zero-filled
//     ...
//   }
//
//   META_OP(forward, backward)                           // or META_OP_FORWARD_ONLY(forward)
//
// Conventions (the Python side enforces them before the kernels run):
// * every input is C-contiguous and all inputs share one dtype, float32 or float64;
// * a gradient of an output that nothing downstream needs arrives as zeros;
// * a grad_input that backward never asks for is returned as None (no gradient);
// * kernels run with the GIL released: they must not touch Python objects. Throwing
//   std::invalid_argument raises ValueError in Python, std::out_of_range IndexError, any
//   other std::exception RuntimeError.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meta/parallel.hpp"

// meta.register_cpp_op defines this as the module name the shared library is loaded under.
#ifndef META_OP_MODULE
#define META_OP_MODULE meta_custom_op
#endif

namespace meta {

using Shape = std::vector<std::int64_t>;

// A view of a C-contiguous tensor: no ownership, no bounds checks.
// T is `const float`/`const double` for inputs and `float`/`double` for what a kernel writes.
template <typename T>
struct Tensor {
  T* data = nullptr;
  Shape shape;           // extents
  Shape strides;         // in elements (not bytes), row-major
  std::int64_t size = 0; // number of elements

  std::int64_t ndim() const { return static_cast<std::int64_t>(shape.size()); }
  // Extent of axis d; negative d counts from the end, as in numpy.
  std::int64_t dim(std::int64_t d) const { return shape[d < 0 ? d + ndim() : d]; }
  // Flat (row-major) element i: the fast path for elementwise ops.
  T& operator[](std::int64_t i) const { return data[i]; }
  // Element at a multi-index: t(n, c) for a matrix, t(n, c, h, w) for an image batch.
  template <typename... Index>
  T& operator()(Index... index) const {
    std::int64_t offset = 0, d = 0;
    ((offset += static_cast<std::int64_t>(index) * strides[d++]), ...);
    return data[offset];
  }
};

// ---- OpenMP loops --------------------------------------------------------------------------

// body(i) for i in [0, n), split across OpenMP threads once n * cost (elements touched per
// iteration) is large enough to pay for waking the threads. Iterations must be independent.
template <typename Body>
void parallel_for(std::int64_t n, Body&& body, std::int64_t cost = 1) {
#pragma omp parallel for schedule(static) if (n * cost > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

// The sum of body(i) for i in [0, n), accumulated in double in parallel: reductions such as
// the gradient of a scalar parameter. The result depends on the thread count in the last bits.
template <typename Body>
double parallel_sum(std::int64_t n, Body&& body, std::int64_t cost = 1) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (n * cost > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(body(i));
  return total;
}

// ---- attributes ----------------------------------------------------------------------------

// The node's attributes, converted from Python before the GIL is released.
class Attributes {
 public:
  double number(const std::string& name) const { return find(numbers_, name, "a number"); }
  std::int64_t integer(const std::string& name) const { return find(ints_, name, "an int"); }
  const std::vector<double>& list(const std::string& name) const {
    return find(lists_, name, "a list");
  }
  const std::string& text(const std::string& name) const {
    return find(strings_, name, "a string");
  }

  // Filled by the glue (detail::parse_attributes); kernels use the accessors above.
  std::map<std::string, double> numbers_;
  std::map<std::string, std::int64_t> ints_;
  std::map<std::string, std::vector<double>> lists_;
  std::map<std::string, std::string> strings_;
  std::string declared_;  // "beta, gamma", for error messages

 private:
  template <typename Map>
  const typename Map::mapped_type& find(const Map& map, const std::string& name,
                                        const char* kind) const {
    auto it = map.find(name);
    if (it == map.end())
      throw std::invalid_argument("attribute '" + name + "' is not " + kind +
                                  " attribute of this op (declared: " + declared_ + ")");
    return it->second;
  }
};

// An output the kernel allocated; handed to numpy without a copy.
template <typename T>
struct Buffer {
  std::unique_ptr<T[]> data;
  Shape shape;
};

namespace detail {

inline Shape row_major_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

inline std::int64_t count(const Shape& shape) {
  std::int64_t n = 1;
  for (auto s : shape) {
    if (s < 0) throw std::invalid_argument("negative extent in an output shape");
    n *= s;
  }
  return n;
}

template <typename T>
Tensor<T> allocate(Buffer<T>& buffer, Shape shape) {
  const std::int64_t n = count(shape);
  buffer.data.reset(new T[n > 0 ? n : 1]());  // zero-filled: kernels may accumulate with +=
  buffer.shape = std::move(shape);
  return Tensor<T>{buffer.data.get(), buffer.shape, row_major_strides(buffer.shape), n};
}

template <typename T>
const T& at(const std::vector<T>& items, std::size_t i, const char* what) {
  if (i >= items.size())
    throw std::out_of_range(std::string(what) + " " + std::to_string(i) + " does not exist (" +
                            std::to_string(items.size()) + " given)");
  return items[i];
}

}  // namespace detail

// What both passes share: the inputs and the attributes.
template <typename T>
class OpBase {
 public:
  std::size_t num_inputs() const { return inputs_.size(); }
  // Input i of the forward pass (in backward too: what forward saw).
  const Tensor<const T>& input(std::size_t i) const { return detail::at(inputs_, i, "input"); }

  // Attributes, with the defaults given to register_cpp_op filled in.
  double attr(const std::string& name) const { return attrs_->number(name); }
  std::int64_t int_attr(const std::string& name) const { return attrs_->integer(name); }
  const std::vector<double>& list_attr(const std::string& name) const {
    return attrs_->list(name);
  }
  const std::string& string_attr(const std::string& name) const { return attrs_->text(name); }

  // Filled by the glue (detail::run_forward, run_backward); kernels use the accessors above.
  std::vector<Tensor<const T>> inputs_;
  const Attributes* attrs_ = nullptr;
};

template <typename T>
class Forward : public OpBase<T> {
 public:
  // Allocate output i (zero-filled) and return a writable view of it. Outputs are numbered
  // from 0 without gaps; each is allocated once.
  Tensor<T> output(std::size_t i, Shape shape) {
    if (i < given_.size() && given_[i].data) {  // a plan's buffer: the shape it traced
      if (shape != given_[i].shape)
        throw std::invalid_argument("output " + std::to_string(i) + " has another shape than "
                                    "the plan traced for it");
      if (i >= written_.size()) written_.resize(i + 1);
      if (written_[i])
        throw std::invalid_argument("output " + std::to_string(i) + " is allocated twice");
      written_[i] = true;
      std::fill(given_[i].data, given_[i].data + given_[i].size, T(0));
      return given_[i];
    }
    if (i >= outputs_.size()) outputs_.resize(i + 1);
    if (outputs_[i].data)
      throw std::invalid_argument("output " + std::to_string(i) + " is allocated twice");
    return detail::allocate(outputs_[i], std::move(shape));
  }

  std::vector<Buffer<T>> outputs_;
  // Set by a plan (detail::Bound): outputs written in place into its buffers.
  std::vector<Tensor<T>> given_;
  std::vector<bool> written_;
};

template <typename T>
class Backward : public OpBase<T> {
 public:
  std::size_t num_outputs() const { return outputs_.size(); }
  // Output i as forward computed it (saves recomputing, e.g. y for a sigmoid's gradient).
  const Tensor<const T>& output(std::size_t i) const { return detail::at(outputs_, i, "output"); }
  // d loss / d output i (zeros when nothing downstream needs output i).
  const Tensor<const T>& grad_output(std::size_t i) const {
    return detail::at(grad_outputs_, i, "grad_output");
  }
  // Whether the graph wants the gradient of input i at all (data inputs do not): skip the work.
  bool needs_grad(std::size_t i) const { return i < needs_.size() && needs_[i]; }
  // d loss / d input i, shaped like input i and zero-filled; asking twice gives the same buffer.
  Tensor<T> grad_input(std::size_t i) {
    const auto& x = this->input(i);
    if (i < given_.size() && given_[i].data) {  // a plan's buffer, zero-filled once
      if (i >= written_.size()) written_.resize(i + 1);
      if (!written_[i]) std::fill(given_[i].data, given_[i].data + given_[i].size, T(0));
      written_[i] = true;
      return given_[i];
    }
    if (grads_.size() < this->num_inputs()) grads_.resize(this->num_inputs());
    Buffer<T>& buffer = grads_[i];
    if (!buffer.data) return detail::allocate(buffer, x.shape);
    return Tensor<T>{buffer.data.get(), x.shape, x.strides, x.size};
  }

  std::vector<Tensor<const T>> outputs_, grad_outputs_;
  std::vector<bool> needs_;
  std::vector<Buffer<T>> grads_;
  // Set by a plan (detail::Bound): gradients written in place into its buffers.
  std::vector<Tensor<T>> given_;
  std::vector<bool> written_;
};

// ---- the pybind11 glue META_OP generates ----------------------------------------------------

namespace detail {

namespace py = pybind11;

template <typename T>
using ForwardFn = void (*)(Forward<T>&);
template <typename T>
using BackwardFn = void (*)(Backward<T>&);

inline Attributes parse_attributes(const py::dict& attrs) {
  Attributes out;
  for (auto item : attrs) {
    const auto name = py::cast<std::string>(item.first);
    const py::handle value = item.second;
    out.declared_ += (out.declared_.empty() ? "" : ", ") + name;
    if (py::isinstance<py::int_>(value)) {  // bools too
      out.ints_[name] = py::cast<std::int64_t>(value);
      out.numbers_[name] = py::cast<double>(value);
    } else if (py::isinstance<py::float_>(value)) {
      out.numbers_[name] = py::cast<double>(value);
    } else if (py::isinstance<py::str>(value)) {
      out.strings_[name] = py::cast<std::string>(value);
    } else if (py::isinstance<py::list>(value)) {
      auto& list = out.lists_[name];
      for (auto v : py::reinterpret_borrow<py::list>(value)) list.push_back(py::cast<double>(v));
    } else {
      throw py::type_error("attribute '" + name + "': expected int, float, str or list");
    }
  }
  if (out.declared_.empty()) out.declared_ = "none";
  return out;
}

template <typename T>
std::vector<Tensor<const T>> views(const py::list& arrays, const char* what) {
  std::vector<Tensor<const T>> out;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    if (!py::isinstance<py::array_t<T, py::array::c_style>>(arrays[i]))
      throw py::type_error(std::string(what) + " " + std::to_string(i) +
                           ": expected a C-contiguous array of the op's dtype");
    auto array = py::reinterpret_borrow<py::array>(arrays[i]);
    Shape shape(array.shape(), array.shape() + array.ndim());
    const auto size = static_cast<std::int64_t>(array.size());
    out.push_back(Tensor<const T>{static_cast<const T*>(array.data()), shape,
                                  row_major_strides(shape), size});
  }
  return out;
}

template <typename T>
py::object to_numpy(Buffer<T>& buffer) {
  if (!buffer.data) return py::none();
  T* data = buffer.data.release();
  py::capsule owner(data, [](void* p) { delete[] static_cast<T*>(p); });
  return py::array_t<T>(buffer.shape, data, owner);
}

template <typename T>
py::list run_forward(ForwardFn<T> kernel, const py::list& inputs, const py::dict& attrs) {
  const Attributes parsed = parse_attributes(attrs);
  Forward<T> op;
  op.inputs_ = views<T>(inputs, "input");
  op.attrs_ = &parsed;
  {
    py::gil_scoped_release release;
    kernel(op);
  }
  py::list outputs;
  for (std::size_t i = 0; i < op.outputs_.size(); ++i) {
    if (!op.outputs_[i].data)
      throw std::invalid_argument("forward allocated output " +
                                  std::to_string(op.outputs_.size() - 1) + " but not output " +
                                  std::to_string(i));
    outputs.append(to_numpy(op.outputs_[i]));
  }
  if (outputs.empty()) throw std::invalid_argument("forward allocated no output");
  return outputs;
}

template <typename T>
py::list run_backward(BackwardFn<T> kernel, const py::list& inputs, const py::list& outputs,
                      const py::list& grad_outputs, const py::list& needs,
                      const py::dict& attrs) {
  const Attributes parsed = parse_attributes(attrs);
  Backward<T> op;
  op.inputs_ = views<T>(inputs, "input");
  op.outputs_ = views<T>(outputs, "output");
  op.grad_outputs_ = views<T>(grad_outputs, "grad_output");
  for (auto need : needs) op.needs_.push_back(py::cast<bool>(need));
  op.attrs_ = &parsed;
  {
    py::gil_scoped_release release;
    kernel(op);
  }
  op.grads_.resize(op.num_inputs());
  py::list grads;
  for (auto& buffer : op.grads_) grads.append(to_numpy(buffer));
  return grads;
}

// Whether the first array holds T. Compared by value (numpy's ==), never by identity: a pickled
// array's dtype (one a worker process sent) is an equal but distinct object.
template <typename T>
bool is(const py::list& arrays) {
  return arrays.size() > 0 && py::isinstance<py::array>(arrays[0]) &&
         py::cast<py::array>(arrays[0]).dtype().equal(py::dtype::of<T>());
}

inline py::type_error dtype_error() {
  return py::type_error("C++ custom ops take float32 or float64 arrays (at least one input)");
}

// Writable views of arrays a plan owns (None: not given, the kernel's own buffer is used).
template <typename T>
std::vector<Tensor<T>> targets(const py::list& arrays, const char* what) {
  std::vector<Tensor<T>> out;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i].is_none()) {
      out.emplace_back();
      continue;
    }
    if (!py::isinstance<py::array_t<T, py::array::c_style>>(arrays[i]))
      throw py::type_error(std::string(what) + " " + std::to_string(i) +
                           ": expected a C-contiguous array of the op's dtype");
    auto array = py::reinterpret_borrow<py::array>(arrays[i]);
    if (!array.writeable())
      throw py::type_error(std::string(what) + " " + std::to_string(i) + " is read-only");
    Shape shape(array.shape(), array.shape() + array.ndim());
    out.push_back(Tensor<T>{static_cast<T*>(array.mutable_data()), shape,
                            row_major_strides(shape), static_cast<std::int64_t>(array.size())});
  }
  return out;
}

// A kernel bound once to a plan's buffers (meta.lv1.plan runs it as a step): the attributes
// parsed and the views made at binding, so each run() is the kernel alone, the GIL released.
// It holds the arrays, so they outlive it.
struct Bound {
  std::function<void()> kernel;
  py::list keep;
  std::string name;
  void run() {
    py::gil_scoped_release release;
    kernel();
  }
};

template <typename T>
Bound bind_forward(ForwardFn<T> kernel, const py::list& inputs, const py::list& outputs,
                   const py::dict& attrs) {
  auto parsed = std::make_shared<Attributes>(parse_attributes(attrs));
  auto op = std::make_shared<Forward<T>>();
  op->inputs_ = views<T>(inputs, "input");
  op->given_ = targets<T>(outputs, "output");
  const std::size_t n = outputs.size();
  Bound bound;
  bound.keep = py::list();
  bound.keep.append(inputs);
  bound.keep.append(outputs);
  bound.name = "forward";
  bound.kernel = [kernel, parsed, op, n] {
    op->attrs_ = parsed.get();
    op->written_.assign(n, false);
    op->outputs_.clear();
    kernel(*op);
    for (std::size_t i = 0; i < n; ++i)
      if (i >= op->written_.size() || !op->written_[i])
        throw std::invalid_argument("forward did not write output " + std::to_string(i));
  };
  return bound;
}

template <typename T>
Bound bind_backward(BackwardFn<T> kernel, const py::list& inputs, const py::list& outputs,
                    const py::list& grad_outputs, const py::list& needs,
                    const py::list& grad_inputs, const py::dict& attrs) {
  auto parsed = std::make_shared<Attributes>(parse_attributes(attrs));
  auto op = std::make_shared<Backward<T>>();
  op->inputs_ = views<T>(inputs, "input");
  op->outputs_ = views<T>(outputs, "output");
  op->grad_outputs_ = views<T>(grad_outputs, "grad_output");
  for (auto need : needs) op->needs_.push_back(py::cast<bool>(need));
  op->given_ = targets<T>(grad_inputs, "grad_input");
  Bound bound;
  bound.keep = py::list();
  for (const auto* list : {&inputs, &outputs, &grad_outputs, &grad_inputs})
    bound.keep.append(*list);
  bound.name = "backward";
  bound.kernel = [kernel, parsed, op] {
    op->attrs_ = parsed.get();
    op->written_.assign(op->given_.size(), false);
    op->grads_.clear();
    kernel(*op);
    // A gradient the plan wants but the kernel never asked for is zero.
    for (std::size_t i = 0; i < op->given_.size(); ++i)
      if (op->given_[i].data && (i >= op->written_.size() || !op->written_[i]))
        std::fill(op->given_[i].data, op->given_[i].data + op->given_[i].size, T(0));
  };
  return bound;
}

inline void bind(py::module_& m, ForwardFn<float> f32, ForwardFn<double> f64,
                 BackwardFn<float> b32, BackwardFn<double> b64) {
  m.doc() = "A meta custom operator compiled by meta.register_cpp_op.";
  m.attr("has_backward") = py::bool_(b32 != nullptr);
  // module_local: every user op's module has its own Bound type, no clash between them.
  py::class_<Bound>(m, "Bound", py::module_local(),
                    "A kernel bound to a plan's buffers; run() runs it (the GIL released).")
      .def("run", &Bound::run)
      .def_readonly("name", &Bound::name);
  m.def("bind_forward", [=](const py::list& inputs, const py::list& outputs,
                            const py::dict& attrs) {
    if (is<float>(inputs)) return bind_forward(f32, inputs, outputs, attrs);
    if (is<double>(inputs)) return bind_forward(f64, inputs, outputs, attrs);
    throw dtype_error();
  }, py::arg("inputs"), py::arg("outputs"), py::arg("attrs"),
     "The forward kernel bound to given output arrays (written in place by run()).");
  if (b32) {
    m.def("bind_backward", [=](const py::list& inputs, const py::list& outputs,
                               const py::list& grad_outputs, const py::list& needs,
                               const py::list& grad_inputs, const py::dict& attrs) {
      if (is<float>(inputs))
        return bind_backward(b32, inputs, outputs, grad_outputs, needs, grad_inputs, attrs);
      if (is<double>(inputs))
        return bind_backward(b64, inputs, outputs, grad_outputs, needs, grad_inputs, attrs);
      throw dtype_error();
    }, py::arg("inputs"), py::arg("outputs"), py::arg("grad_outputs"), py::arg("needs"),
       py::arg("grad_inputs"), py::arg("attrs"),
       "The backward kernel bound to given gradient arrays (None: not wanted).");
  }
  m.def("forward", [=](const py::list& inputs, const py::dict& attrs) {
    if (is<float>(inputs)) return run_forward(f32, inputs, attrs);
    if (is<double>(inputs)) return run_forward(f64, inputs, attrs);
    throw dtype_error();
  }, py::arg("inputs"), py::arg("attrs"), "Outputs (a list) of the forward kernel.");
  if (!b32) return;
  m.def("backward", [=](const py::list& inputs, const py::list& outputs,
                        const py::list& grad_outputs, const py::list& needs,
                        const py::dict& attrs) {
    if (is<float>(inputs)) return run_backward(b32, inputs, outputs, grad_outputs, needs, attrs);
    if (is<double>(inputs)) return run_backward(b64, inputs, outputs, grad_outputs, needs, attrs);
    throw dtype_error();
  }, py::arg("inputs"), py::arg("outputs"), py::arg("grad_outputs"), py::arg("needs"),
     py::arg("attrs"), "Input gradients (a list, None where not computed) of the backward kernel.");
}

}  // namespace detail
}  // namespace meta

// The module glue: forward and backward are function templates `void f(meta::Forward<T>&)`
// and `void b(meta::Backward<T>&)`, instantiated for float and double.
#define META_OP(forward, backward)                                                   \
  PYBIND11_MODULE(META_OP_MODULE, m) {                                               \
    ::meta::detail::bind(m, &forward<float>, &forward<double>, &backward<float>,     \
                         &backward<double>);                                         \
  }

// An op without a gradient (its backward raises NotImplementedError in Python).
#define META_OP_FORWARD_ONLY(forward)                                                \
  PYBIND11_MODULE(META_OP_MODULE, m) {                                               \
    ::meta::detail::bind(m, &forward<float>, &forward<double>, nullptr, nullptr);    \
  }
