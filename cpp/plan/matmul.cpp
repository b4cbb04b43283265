// Matrix products in a plan: oneDNN's matmul over row-major arrays, either operand read
// transposed through its strides (so Gemm's transA/transB and every backward product need no
// copy), batch dimensions broadcast where they are 1, an optional bias row and fused
// activation, and an optional accumulate into the output (y += a.b, for summed gradients).
// An operand or the output may be a strided numpy view (row blocks and key prefixes of
// attention's per-head arrays): its own strides then describe it, so no copy is made.
// With `bf16`, each float32 operand is converted to bf16 (as it lies, into a dense copy in the
// shared staging buffers) just before the product, which accumulates in float32: the plan's
// mixed precision. An operand or output array that is bf16 already (ml_dtypes.bfloat16: an
// activation the plan keeps in bf16, meta/lv1/plan/precision.py) is read or written as bf16
// where it lies, with no copy; a bias stays float32.
// PackedMatmul (inference plans, meta/lv1/plan/lowering/matmul.py packed_product): a product
// by a constant 2-D weight packed once by the plan's prepare program into the layout oneDNN
// chooses (format any; as onnxruntime pre-packs a constant B), with its bias, the activation
// after it and a residual added after that (a transformer's x + o(y)) applied as the output is
// written: a binary-add post-op, which saves the Add's own pass over the output (T5 at
// batch 1: 15 us for 128 x 256).
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

// The element type of a plan array: float32, or bf16 (numpy's ml_dtypes.bfloat16: 2-byte
// elements of kind 'V', what meta/lv1/plan/precision.py stores bf16 activations as).
dt element_type(const py::array& a, const char* what) {
  if (a.itemsize() == 4) return dt::f32;
  if (a.itemsize() == 2 && a.dtype().kind() == 'V') return dt::bf16;
  throw std::invalid_argument(std::string("meta._plan.matmul: ") + what +
                              " is neither float32 nor bf16");
}

// True when `a` is a view that is not dense row-major over `phys`: it must then have exactly
// those dims, and its own strides describe it.
bool strided(const py::array& a, const Dims& phys, const char* what) {
  if (a.flags() & py::array::c_style) return false;
  bool same = std::size_t(a.ndim()) == phys.size();
  for (std::size_t i = 0; same && i < phys.size(); ++i) same = a.shape(i) == phys[i];
  if (!same)
    throw std::invalid_argument(std::string("meta._plan.matmul: ") + what +
                                " is a strided view whose shape is not the operand's dims");
  for (std::size_t i = 0; i < phys.size(); ++i)
    if (a.strides(i) % a.itemsize() != 0 || a.strides(i) < 0)
      throw std::invalid_argument(std::string("meta._plan.matmul: ") + what +
                                  " has strides that are not whole elements");
  return true;
}

// The address of a dense array holding md's bytes, or of a strided view (numpy checked it).
void* view_address(const py::array& a, const memory::desc& md, const char* what) {
  if (a.flags() & py::array::c_style) return address(a, md.get_size(), what);
  return const_cast<void*>(a.data());
}

// Logical (..., rows, cols) view of an array of physical dims (row-major, or the strided view
// `a`), transposed or not; its element type is `type` (default: the array's own).
memory::desc operand(Dims phys, bool transposed, const py::array& a, const char* what,
                     bool dense = false, std::optional<dt> type = std::nullopt) {
  const std::size_t n = phys.size();
  Dims strides(n, 1);
  if (!dense && strided(a, phys, what))
    for (std::size_t i = 0; i < n; ++i) strides[i] = a.strides(i) / a.itemsize();
  else
    for (int i = int(n) - 2; i >= 0; --i) strides[i] = strides[i + 1] * phys[i + 1];
  if (transposed) {
    std::swap(phys[n - 1], phys[n - 2]);
    std::swap(strides[n - 1], strides[n - 2]);
  }
  return strided_md(phys, strides, type ? *type : element_type(a, what));
}

StepPtr matmul(const Dims& a_dims, const Dims& b_dims, bool trans_a, bool trans_b,
               const py::array& a, const py::array& b, std::optional<py::array> bias,
               const py::array& y, const std::string& post, float post_alpha, float post_beta,
               bool accumulate, bool bf16) {
  if (a_dims.size() != b_dims.size() || a_dims.size() < 2)
    throw std::invalid_argument("meta._plan.matmul: operands must have one rank >= 2");
  const memory::desc ma = operand(a_dims, trans_a, a, "matmul a"),
                     mb = operand(b_dims, trans_b, b, "matmul b");
  const auto da = ma.get_dims(), db = mb.get_dims();
  const std::size_t n = a_dims.size();
  if (da[n - 1] != db[n - 2])
    throw std::invalid_argument("meta._plan.matmul: inner dimensions differ");
  Dims out(n);
  for (std::size_t i = 0; i + 2 < n; ++i) out[i] = std::max<std::int64_t>(da[i], db[i]);
  out[n - 2] = da[n - 2];
  out[n - 1] = db[n - 1];
  const memory::desc my = operand(out, false, y, "matmul output");
  dnnl::primitive_attr attr = scratch_attr();
  dnnl::post_ops po;
  if (accumulate) po.append_sum(1.f);
  if (!post.empty()) po.append_eltwise(eltwise_algorithm(post, false), post_alpha, post_beta);
  attr.set_post_ops(po);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(ma, engine(), view_address(a, ma, "matmul a"))},
      {DNNL_ARG_WEIGHTS, memory(mb, engine(), view_address(b, mb, "matmul b"))},
      {DNNL_ARG_DST, memory(my, engine(), view_address(y, my, "matmul output"))}};
  // bf16: a float32 operand as it lies (physical dims, its strides) -> a dense bf16 copy,
  // read transposed through strides as the float32 operand is; a bf16 operand (an array the
  // plan already holds in bf16) is read where it is. One bf16 operand makes the product bf16.
  const bool a16 = ma.get_data_type() == dt::bf16, b16 = mb.get_data_type() == dt::bf16;
  bf16 = bf16 || a16 || b16;
  const bool convert_a = bf16 && !a16, convert_b = bf16 && !b16;
  const memory::desc src = convert_a ? operand(a_dims, trans_a, a, "matmul a", true, dt::bf16)
                                     : ma,
                     wei = convert_b ? operand(b_dims, trans_b, b, "matmul b", true, dt::bf16)
                                     : mb;
  dnnl::matmul::primitive_desc pd;
  if (bias) {
    Dims bd(n, 1);
    bd[n - 1] = out[n - 1];
    const memory::desc mbias = make_md(bd, "plain");
    pd = dnnl::matmul::primitive_desc(engine(), src, wei, mbias, my, attr);
    args[DNNL_ARG_BIAS] = bind(mbias, *bias, "matmul bias");
  } else {
    pd = dnnl::matmul::primitive_desc(engine(), src, wei, my, attr);
  }
  const std::string label = bf16 ? "matmul bf16 (" + impl(pd) + ")" : "matmul";
  if (!convert_a && !convert_b)
    return primitive_step(label, dnnl::matmul(pd), std::move(args), pd.scratchpad_desc());
  std::vector<Bf16Input> in;
  if (convert_a) {
    const memory::desc pa = operand(a_dims, false, a, "matmul a");
    in.push_back(bf16_input(DNNL_ARG_SRC, pa, make_md(a_dims, "plain", dt::bf16),
                            view_address(a, pa, "matmul a")));
    args.erase(DNNL_ARG_SRC);
  }
  if (convert_b) {
    const memory::desc pb_ = operand(b_dims, false, b, "matmul b");
    in.push_back(bf16_input(DNNL_ARG_WEIGHTS, pb_, make_md(b_dims, "plain", dt::bf16),
                            view_address(b, pb_, "matmul b")));
    args.erase(DNNL_ARG_WEIGHTS);
  }
  return std::make_shared<Bf16Step>(label, dnnl::matmul(pd), std::move(args),
                                    pd.scratchpad_desc(), std::move(in));
}

// y = residual + post(x . op(w) + bias) over m rows by a weight packed once into the layout
// oneDNN's matmul chooses (format any), as onnxruntime pre-packs a constant B: read plain or
// transposed, brgemm packs it again on every call (MobileNetV3's head at batch 32, 32 x 576 x
// 1024: 310 us, packed 220). `pack` is the plan's prepare step (w as the graph holds it: (K,
// N), or (N, K) read transposed), `forward` the product. Inference plans' MatMuls and Gemms.
struct PackedMatmul {
  PackedMatmul(std::int64_t m, std::int64_t k, std::int64_t n, bool trans_w, bool bias,
               bool residual, const std::string& post, float alpha, float beta)
      : m(m), k(k), n(n), trans_w(trans_w), residual(residual) {
    dnnl::primitive_attr attr = scratch_attr();
    dnnl::post_ops po;
    if (!post.empty()) po.append_eltwise(eltwise_algorithm(post, false), alpha, beta);
    if (residual) po.append_binary(dnnl::algorithm::binary_add, make_md({m, n}, "plain"));
    attr.set_post_ops(po);
    const memory::desc src = make_md({m, k}, "plain"), dst = make_md({m, n}, "plain"),
                       wei({k, n}, dt::f32, memory::format_tag::any);
    pd = bias ? dnnl::matmul::primitive_desc(engine(), src, wei, make_md({1, n}, "plain"), dst,
                                             attr)
              : dnnl::matmul::primitive_desc(engine(), src, wei, dst, attr);
  }
  std::size_t weights_bytes() const { return pd.weights_desc().get_size(); }
  StepPtr pack(const py::array& w, const py::array& packed) const {
    const memory::desc from = trans_w ? strided_md({k, n}, {1, k}) : make_md({k, n}, "plain"),
                       to = pd.weights_desc();
    auto rd = dnnl::reorder::primitive_desc(engine(), from, engine(), to, scratch_attr());
    return primitive_step("matmul weights -> packed", dnnl::reorder(rd),
                          {{DNNL_ARG_FROM, bind(from, w, "packed matmul weight")},
                           {DNNL_ARG_TO, bind(to, packed, "packed matmul buffer")}},
                          rd.scratchpad_desc());
  }
  StepPtr forward(const py::array& x, const py::array& packed, std::optional<py::array> bias,
                  std::optional<py::array> res, const py::array& y) const {
    if (bool(bias) != bool(pd.bias_desc().get_size()) || bool(res) != residual)
      throw std::invalid_argument("meta._plan.PackedMatmul: the bias or residual given is not "
                                  "the one it was made for");
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, bind(pd.src_desc(), x, "packed matmul x")},
        {DNNL_ARG_WEIGHTS, bind(pd.weights_desc(), packed, "packed matmul buffer")},
        {DNNL_ARG_DST, bind(pd.dst_desc(), y, "packed matmul output")}};
    if (bias) args[DNNL_ARG_BIAS] = bind(make_md({1, n}, "plain"), *bias, "packed matmul bias");
    if (res) {
      const int index = pd.get_primitive_attr().get_post_ops().len() - 1;
      args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1] =
          bind(make_md({m, n}, "plain"), *res, "packed matmul residual");
    }
    return primitive_step("matmul packed", dnnl::matmul(pd), std::move(args),
                          pd.scratchpad_desc());
  }
  std::int64_t m, k, n;
  bool trans_w, residual;
  dnnl::matmul::primitive_desc pd;
};

}  // namespace

void bind_matmul(py::module_& m) {
  m.def("matmul", &matmul, py::arg("a_dims"), py::arg("b_dims"), py::arg("trans_a"),
        py::arg("trans_b"), py::arg("a"), py::arg("b"), py::arg("bias"), py::arg("y"),
        py::arg("post") = "", py::arg("post_alpha") = 0.f, py::arg("post_beta") = 0.f,
        py::arg("accumulate") = false, py::arg("bf16") = false,
        "y (+)= op(a) . op(b) (+ bias), op a transpose of the last two dims where asked; with "
        "bf16 the operands are read as bf16 (float32 accumulation and output).");
  py::class_<PackedMatmul, std::shared_ptr<PackedMatmul>>(
      m, "PackedMatmul",
      "y = residual + post(x . w + bias) by a constant weight packed once (inference plans).")
      .def(py::init<std::int64_t, std::int64_t, std::int64_t, bool, bool, bool, std::string,
                    float, float>(),
           py::arg("m"), py::arg("k"), py::arg("n"), py::arg("trans_w"), py::arg("bias"),
           py::arg("residual"), py::arg("post") = "", py::arg("alpha") = 0.f,
           py::arg("beta") = 0.f)
      .def("weights_bytes", &PackedMatmul::weights_bytes)
      .def("pack", &PackedMatmul::pack, py::arg("w"), py::arg("packed"))
      .def("forward", &PackedMatmul::forward, py::arg("x"), py::arg("packed"), py::arg("bias"),
           py::arg("residual"), py::arg("y"));
}

}  // namespace meta::plan
