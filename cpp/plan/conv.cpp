// Convolution in a plan: oneDNN's direct convolution, forward with fused post-ops (bias, an
// activation, an eval-mode BatchNormalization as a per-channel scale and shift), backward by
// data and by weights. The kernel picks the activation layouts it runs fastest in (blocked
// "nChw16c" for most); the planner reorders into them once and keeps tensors there between
// kernels that take them. Weights stay the graph's plain (OC, IC/group, KH, KW) arrays; a
// prepare step reorders them into the kernel's layouts (each training step, or once for an
// eval-mode plan).
//
// With `bf16` (the plan's mixed precision) the kernels read bf16: the forward reads the input
// and the weights in bf16, backward-data the output gradient and the weights, backward-weights
// the input and the output gradient. An activation the plan holds in bf16 already (its one bf16
// copy, or a bf16 output of the op before: an array of 2-byte elements) is read where it lies;
// a float32 one is converted just before the kernel (Bf16Step's shared staging buffers), the
// weights by the reorder into the kernel's layout that the plan runs anyway. The output is
// float32, or bf16 with `bf16_output` (when every reader of it reads bf16: a BatchNorm); data
// and weight gradients and the bias stay float32 (float32 accumulation).
//
// A bf16 weight gradient over a small output (ResNet's last stage: 4x4 positions, 256
// channels) is one matrix product instead of oneDNN's direct backward-weights kernel, which
// blocks over output rows and so runs such shapes 3-6x slower than the same product
// (brgconv_bwd_w on AMX: 3.9 ms against 0.7 ms for 32x256x4x4, 3x3; PyTorch's autocast runs
// the same slow kernel): the input is unfolded into bf16 columns (im2col, a row per output
// position, its (input channel, kernel row, kernel column) in the plain weights' order) and
// dW = dY^T x columns, float32 accumulation, written straight into the plain float32
// gradient (no reorder after). `gemm_dw` says which a kernel uses (`GEMM_DW_MAX_POSITIONS`).
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

using PostOp = std::tuple<std::string, std::string, float, float>;  // kind, name, alpha, beta

// Output positions per image up to which a bf16 weight gradient is im2col + one matrix
// product (see the top), for a stride of 1 and for a larger one (oneDNN's direct kernel is
// slower still over strided windows); measured on AMX in ResNet-18's step (direct kernel and
// its reorder / unfolding and product, 1 thread): 4x4 outputs 4.2 / 0.83 ms, 8x8 1.6 / 1.6,
// 16x16 and up the direct kernel is faster; stride 2, 8x8 outputs 1.1 / 0.74 ms. Without
// AMX (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, as on a Zen 4: jit_bf16 kernels) the product is
// as fast or faster on the same shapes (4x4: 6.6 / 6.4 ms, stride 2 to 4x4: 4.5 / 3.1) and
// slower from 8x8 at stride 1 (5.8 / 6.7), so the same bounds hold there.
// META_CONV_GEMM_DW=N[,M] moves the bounds (M: strided, N when not given), 0 keeps the
// direct kernel everywhere (to compare the two).
constexpr std::int64_t GEMM_DW_MAX_POSITIONS = 16, GEMM_DW_MAX_POSITIONS_STRIDED = 64;

std::int64_t gemm_dw_max_positions(bool strided) {
  const char* v = std::getenv("META_CONV_GEMM_DW");
  if (!v || !*v) return strided ? GEMM_DW_MAX_POSITIONS_STRIDED : GEMM_DW_MAX_POSITIONS;
  const char* comma = std::strchr(v, ',');
  return std::atoll(strided && comma ? comma + 1 : v);
}

struct ConvKernel {
  Dims src_dims, w_dims, dst_dims, strides, dilations, pads_begin, pads_end;
  std::int64_t group;
  bool has_bias, training, need_dx, need_dw, bf16, bf16_out;
  bool gemm_dw = false;  // the weight gradient as im2col + a matrix product (see the top)
  std::int64_t cols_rows = 0, cols_width = 0;  // the columns: N*OH*OW rows of IC*KH*KW
  dnnl::matmul::primitive_desc dw_product;
  std::vector<PostOp> post;
  memory::desc src_md, dst_md, w_plain, b_md, channel_md;
  memory::desc y_md;  // the output as the forward writes it: dst_md, or bf16 with bf16_out
  memory::desc src_lp, dst_lp;  // bf16: the input and the output gradient as the kernels read them
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
  std::string info;

  ConvKernel(Dims src, Dims w, bool bias, Dims s, Dims pb, Dims pe, Dims d, std::int64_t g,
             std::vector<PostOp> post_ops, bool train, bool dx, bool dw,
             const std::string& layout = "any", bool low = false, bool low_out = false)
      : src_dims(std::move(src)), w_dims(std::move(w)), strides(std::move(s)),
        dilations(std::move(d)), pads_begin(std::move(pb)), pads_end(std::move(pe)), group(g),
        has_bias(bias), training(train), need_dx(dx), need_dw(dw), bf16(low),
        bf16_out(low && low_out), post(std::move(post_ops)) {
    const std::size_t sp = src_dims.size() - 2;
    if (sp != 2) throw std::invalid_argument("meta._plan.Conv: 2-D convolutions only");
    dst_dims = {src_dims[0], w_dims[0]};
    for (std::size_t i = 0; i < sp; ++i) {
      const std::int64_t k = (w_dims[2 + i] - 1) * dilations[i] + 1;
      dst_dims.push_back((src_dims[2 + i] + pads_begin[i] + pads_end[i] - k) / strides[i] + 1);
    }
    Dims wd = w_dims;  // oihw, or goihw for groups
    if (group > 1) {
      wd = {group, w_dims[0] / group, w_dims[1], w_dims[2], w_dims[3]};
      w_plain = make_md(wd, "plain");
    } else {
      w_plain = make_md(wd, "plain");
    }
    b_md = make_md({w_dims[0]}, "plain");
    channel_md = make_md({1, w_dims[0], 1, 1}, "plain");
    memory::dims dil;
    for (auto v : dilations) dil.push_back(v - 1);
    const memory::dims st(strides.begin(), strides.end()), pl(pads_begin.begin(), pads_begin.end()),
        pr(pads_end.begin(), pads_end.end());
    const dt in_type = bf16 ? dt::bf16 : dt::f32;
    const memory::desc w_any = memory::desc(w_plain.get_dims(), in_type, tag::any);
    dnnl::primitive_attr attr = scratch_attr();
    dnnl::post_ops po;
    for (const auto& [kind, name, alpha, beta] : post) {
      if (kind == "eltwise") {
        po.append_eltwise(eltwise_algorithm(name, false), alpha, beta);
      } else if (kind == "scale_shift") {
        po.append_binary(dnnl::algorithm::binary_mul, channel_md);
        po.append_binary(dnnl::algorithm::binary_add, channel_md);
      } else if (kind == "sum") {
        po.append_sum(1.f);
      } else {
        throw std::invalid_argument("meta._plan.Conv: unknown post-op " + kind);
      }
    }
    attr.set_post_ops(po);
    const auto prop = training ? dnnl::prop_kind::forward_training
                               : dnnl::prop_kind::forward_inference;
    auto make_fwd = [&](const std::string& layout) {
      const memory::desc s = make_md(src_dims, layout, in_type),
                         o = make_md(dst_dims, layout, bf16_out ? dt::bf16 : dt::f32);
      return has_bias ? dnnl::convolution_forward::primitive_desc(
                            engine(), prop, dnnl::algorithm::convolution_direct, s, w_any, b_md,
                            o, st, dil, pl, pr, attr)
                      : dnnl::convolution_forward::primitive_desc(
                            engine(), prop, dnnl::algorithm::convolution_direct, s, w_any, o, st,
                            dil, pl, pr, attr);
    };
    fwd = make_fwd(layout);
    if (layout_of(fwd.src_desc()).empty() || layout_of(fwd.dst_desc()).empty())
      fwd = make_fwd("plain");  // a layout the planner cannot name: keep tensors plain
    src_lp = fwd.src_desc();
    y_md = fwd.dst_desc();
    dst_md = bf16_out ? make_md(dst_dims, layout_of(y_md)) : y_md;  // the float32 gradient's
    src_md = bf16 ? make_md(src_dims, layout_of(src_lp)) : src_lp;  // the plan's float32 input
    dst_lp = bf16 ? make_md(dst_dims, layout_of(dst_md), dt::bf16) : dst_md;
    info = std::string(bf16 ? (bf16_out ? "bf16 (bf16 output) " : "bf16 ") : "") + "fwd " +
           impl(fwd);
    if (!training) return;
    if (need_dx) {
      bwd_data = dnnl::convolution_backward_data::primitive_desc(
          engine(), dnnl::algorithm::convolution_direct, src_md, w_any, dst_lp, st, dil, pl, pr,
          fwd, scratch_attr());
      info += ", bwd_data " + impl(bwd_data);
    }
    if (need_dw) {
      const memory::desc dw_any = memory::desc(w_plain.get_dims(), dt::f32, tag::any);
      bwd_weights = has_bias ? dnnl::convolution_backward_weights::primitive_desc(
                                   engine(), dnnl::algorithm::convolution_direct, src_lp, dw_any,
                                   b_md, dst_lp, st, dil, pl, pr, fwd, scratch_attr())
                             : dnnl::convolution_backward_weights::primitive_desc(
                                   engine(), dnnl::algorithm::convolution_direct, src_lp, dw_any,
                                   dst_lp, st, dil, pl, pr, fwd, scratch_attr());
      info += ", bwd_weights " + impl(bwd_weights);
      plan_gemm_dw();
    }
  }

  // Whether this kernel's weight gradient is im2col + a matrix product: bf16, channels-last
  // input and output gradient, no bias, no groups or dilation, a small output; the product's
  // implementation must be a real one (never oneDNN's reference loops).
  void plan_gemm_dw() {
    const std::int64_t positions = dst_dims[2] * dst_dims[3];
    const bool strided = strides[0] > 1 || strides[1] > 1;
    if (!bf16 || has_bias || group != 1 || positions > gemm_dw_max_positions(strided) ||
        dilations[0] != 1 || dilations[1] != 1 || layout_of(src_lp) != "nhwc" ||
        layout_of(dst_lp) != "nhwc")
      return;
    const std::int64_t oc = w_dims[0];
    cols_rows = src_dims[0] * positions;
    cols_width = w_dims[1] * w_dims[2] * w_dims[3];
    // dY^T: the channels-last gradient (rows of OC) read transposed through its strides
    const memory::desc a = strided_md({oc, cols_rows}, {1, oc}, dt::bf16),
                       b = make_md({cols_rows, cols_width}, "plain", dt::bf16),
                       c = make_md({oc, cols_width}, "plain");
    dnnl::matmul::primitive_desc pd(engine(), a, b, c, scratch_attr());
    const std::string name = impl(pd);
    if (name.find("ref") != std::string::npos) return;
    dw_product = pd;
    gemm_dw = true;
    info += " (small outputs: im2col + matmul " + name + ")";
  }

  memory::desc weights_md(const std::string& which) const {
    if (which == "forward") return fwd.weights_desc();
    if (which == "backward_data" && training && need_dx) return bwd_data.weights_desc();
    if (which == "diff_weights" && training && need_dw) return bwd_weights.diff_weights_desc();
    throw std::invalid_argument("meta._plan.Conv: no weights '" + which + "' (not built)");
  }

  // Bytes of a buffer holding the weights in `which` kernel's layout; 0 when the plain array
  // is already that layout (no buffer, no reorder).
  std::int64_t weights_bytes(const std::string& which) const {
    const memory::desc md = weights_md(which);
    return md == w_plain ? 0 : std::int64_t(md.get_size());
  }

  // Bytes of the buffer the weight gradient's steps work in: the direct kernel's gradient in
  // its layout, or (gemm_dw) the bf16 columns; either fits (a step falls back to the direct
  // kernel when an operand is float32).
  std::int64_t dw_workspace_bytes() const {
    const std::int64_t direct = weights_bytes("diff_weights");
    return gemm_dw ? std::max(direct, cols_rows * cols_width * 2) : direct;
  }

  // The weights `which` kernel reads or writes: the plain array, or `buf` in its layout.
  memory weights(const std::string& which, const py::array& plain,
                 const std::optional<py::array>& buf) const {
    const memory::desc md = weights_md(which);
    if (md == w_plain) return bind(w_plain, plain, "conv weights");
    if (!buf) throw std::invalid_argument("meta._plan.Conv: " + which + " needs a weight buffer");
    return bind(md, *buf, "conv weight buffer");
  }
};

using ConvPtr = std::shared_ptr<ConvKernel>;

// Whether a plan array holds bf16 (2-byte) elements: a bf16 kernel reads it where it lies.
bool holds_bf16(const py::array& a) { return a.itemsize() == 2; }

// Argument `arg` of a kernel reading `a`: float32 as `f32` describes it (a float32 kernel), or
// in bf16 (`lp`) for a bf16 one: `a` itself when it holds bf16, else a conversion into the
// staging buffer before the kernel runs (added to `convert`).
void operand(const ConvKernel& k, std::unordered_map<int, memory>& args,
             std::vector<Bf16Input>& convert, int arg, const memory::desc& f32,
             const memory::desc& lp, const py::array& a, const char* what) {
  if (!k.bf16) {
    args[arg] = bind(f32, a, what);
  } else if (holds_bf16(a)) {
    args[arg] = bind(lp, a, what);
  } else {
    convert.push_back(bf16_input(arg, f32, lp, address(a, f32.get_size(), what)));
  }
}

// The step running `p`: a Bf16Step when some operand is converted first, else the primitive.
StepPtr conv_step(const std::string& name, const ConvKernel& k, dnnl::primitive p,
                  std::unordered_map<int, memory> args, const memory::desc& scratch,
                  std::vector<Bf16Input> convert) {
  const std::string full = name + (k.bf16 ? " bf16" : "");
  if (convert.empty()) return primitive_step(full, std::move(p), std::move(args), scratch);
  return std::make_shared<Bf16Step>(full, std::move(p), std::move(args), scratch,
                                    std::move(convert));
}

StepPtr reorder(const memory& from, const memory& to, const std::string& name) {
  auto pd = dnnl::reorder::primitive_desc(from, to, scratch_attr());
  return primitive_step(name, dnnl::reorder(pd), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}},
                        pd.scratchpad_desc());
}

// The plain weights into `buf` in the forward's or backward-data's layout.
StepPtr reorder_weights(const ConvPtr& k, const std::string& which, const py::array& w,
                        const py::array& buf) {
  return reorder(bind(k->w_plain, w, "conv weights"), k->weights(which, w, buf),
                 "conv weights -> " + which + " layout");
}

// The weights in `source`'s layout (its buffer `from`) into `buf` in `which` layout: a bf16
// plan's backward-data weights from the forward's bf16 copy, the same bits (a permutation)
// for half the bytes read (256x256x3x3 on AMX: 0.27 -> 0.11 ms).
StepPtr reorder_weights_from(const ConvPtr& k, const std::string& source, const py::array& from,
                             const std::string& which, const py::array& buf) {
  const memory::desc in = k->weights_md(source), out = k->weights_md(which);
  if (in == k->w_plain || out == k->w_plain)
    throw std::invalid_argument("meta._plan.Conv: " + source + " or " + which +
                                " weights are the plain array (no buffer)");
  return reorder(bind(in, from, "conv weight buffer"), bind(out, buf, "conv weight buffer"),
                 "conv weights " + source + " -> " + which + " layout");
}

StepPtr forward(const ConvPtr& k, const py::array& x, const py::array& w,
                std::optional<py::array> b, const py::array& y,
                const std::vector<py::array>& post_args, std::optional<py::array> wbuf) {
  std::unordered_map<int, memory> args{{DNNL_ARG_WEIGHTS, k->weights("forward", w, wbuf)},
                                       {DNNL_ARG_DST, bind(k->y_md, y, "conv output")}};
  std::vector<Bf16Input> convert;
  operand(*k, args, convert, DNNL_ARG_SRC, k->src_md, k->src_lp, x, "conv input");
  if (k->has_bias) {
    if (!b) throw std::invalid_argument("meta._plan.Conv: bias missing");
    args[DNNL_ARG_BIAS] = bind(k->b_md, *b, "conv bias");
  }
  std::size_t next = 0;
  for (std::size_t i = 0, idx = 0; i < k->post.size(); ++i, ++idx) {
    if (std::get<0>(k->post[i]) != "scale_shift") continue;
    if (next + 2 > post_args.size())
      throw std::invalid_argument("meta._plan.Conv: scale_shift needs two arrays");
    args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(int(idx)) | DNNL_ARG_SRC_1] =
        bind(k->channel_md, post_args[next++], "conv post-op scale");
    ++idx;  // scale_shift is two post-ops
    args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(int(idx)) | DNNL_ARG_SRC_1] =
        bind(k->channel_md, post_args[next++], "conv post-op shift");
  }
  return conv_step("conv forward", *k, dnnl::convolution_forward(k->fwd), std::move(args),
                   k->fwd.scratchpad_desc(), std::move(convert));
}

StepPtr backward_data(const ConvPtr& k, const py::array& dy, const py::array& w,
                      const py::array& dx, std::optional<py::array> wbuf) {
  if (!k->training || !k->need_dx)
    throw std::invalid_argument("meta._plan.Conv: built without a data gradient");
  std::unordered_map<int, memory> args{
      {DNNL_ARG_WEIGHTS, k->weights("backward_data", w, wbuf)},
      {DNNL_ARG_DIFF_SRC, bind(k->src_md, dx, "conv dx")}};
  std::vector<Bf16Input> convert;
  operand(*k, args, convert, DNNL_ARG_DIFF_DST, k->dst_md, k->dst_lp, dy, "conv dy");
  return conv_step("conv backward data", *k, dnnl::convolution_backward_data(k->bwd_data),
                   std::move(args), k->bwd_data.scratchpad_desc(), std::move(convert));
}

// im2col of a channels-last bf16 input: row (n, oh, ow) holds, for each input channel, the
// kernel window's KH*KW elements (zero where the window covers padding), the plain weights'
// (IC, KH, KW) order, so that dY^T x columns is the plain gradient.
void unfold(const ConvKernel& k, const Half* x, Half* cols) {
  const std::int64_t ic = k.src_dims[1], ih = k.src_dims[2], iw = k.src_dims[3],
                     kw = k.w_dims[3], oh = k.dst_dims[2], ow = k.dst_dims[3],
                     taps = k.w_dims[2] * kw, rows = k.cols_rows, width = k.cols_width;
  const std::vector<Half> zeros(std::size_t(ic), Half(0));  // a window over padding reads these
#pragma omp parallel for schedule(static) if (rows * width > (1 << 18))
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t n = r / (oh * ow), y = r / ow % oh, xo = r % ow;
    std::vector<const Half*> from(static_cast<std::size_t>(taps));  // the taps' input pixels
    for (std::int64_t t = 0; t < taps; ++t) {
      const std::int64_t iy = y * k.strides[0] - k.pads_begin[0] + t / kw,
                         ix = xo * k.strides[1] - k.pads_begin[1] + t % kw;
      const bool pad = iy < 0 || iy >= ih || ix < 0 || ix >= iw;
      from[std::size_t(t)] = pad ? zeros.data() : x + ((n * ih + iy) * iw + ix) * ic;
    }
    Half* d = cols + r * width;  // (channel, tap) order
    if (taps == 1) {
      std::memcpy(d, from[0], std::size_t(ic) * sizeof(Half));
    } else if (taps == 9) {  // 3x3, ResNet's: the taps' loop unrolled
      const Half *f0 = from[0], *f1 = from[1], *f2 = from[2], *f3 = from[3], *f4 = from[4],
                 *f5 = from[5], *f6 = from[6], *f7 = from[7], *f8 = from[8];
      for (std::int64_t c = 0; c < ic; ++c, d += 9) {
        d[0] = f0[c], d[1] = f1[c], d[2] = f2[c], d[3] = f3[c], d[4] = f4[c];
        d[5] = f5[c], d[6] = f6[c], d[7] = f7[c], d[8] = f8[c];
      }
    } else {
      for (std::int64_t c = 0; c < ic; ++c)
        for (std::int64_t t = 0; t < taps; ++t) *d++ = from[std::size_t(t)][c];
    }
  }
}

// dW = dY^T x im2col(x) into the plain float32 `dw` (gemm_dw, both operands held in bf16).
StepPtr gemm_backward_weights(const ConvPtr& k, const py::array& x, const py::array& dy,
                              const py::array& dw, const py::array& cols) {
  const auto* xs = static_cast<const Half*>(
      address(x, std::size_t(k->src_lp.get_size()), "conv input"));
  const std::size_t cols_bytes = std::size_t(k->cols_rows * k->cols_width) * 2;
  auto* c = static_cast<Half*>(address(cols, cols_bytes, "conv columns"));
  const memory a(k->dw_product.src_desc(), engine(),
                 address(dy, std::size_t(k->dst_lp.get_size()), "conv dy")),
      b(k->dw_product.weights_desc(), engine(), c),
      out = bind(k->w_plain, dw, "conv dw");
  dnnl::matmul product(k->dw_product);
  const memory::desc scratch_md = k->dw_product.scratchpad_desc();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, out}};
  return std::make_shared<LambdaStep>(
      "conv backward weights bf16 (im2col + matmul)",
      [k, xs, c, product, args, scratch_md]() mutable {
        unfold(*k, xs, c);
        if (scratch_md.get_size()) args[DNNL_ARG_SCRATCHPAD] = scratch(scratch_md);
        product.execute(stream(), args);
      });
}

// dW (through `dwbuf` in the kernel's layout, then reordered to the plain array) and dB; or
// (gemm_dw) dW as im2col + a matrix product, `dwbuf` holding the columns.
std::vector<StepPtr> backward_weights(const ConvPtr& k, const py::array& x, const py::array& dy,
                                      const py::array& dw, std::optional<py::array> db,
                                      std::optional<py::array> dwbuf) {
  if (!k->training || !k->need_dw)
    throw std::invalid_argument("meta._plan.Conv: built without a weight gradient");
  if (k->gemm_dw && holds_bf16(x) && holds_bf16(dy)) {
    if (!dwbuf) throw std::invalid_argument("meta._plan.Conv: the columns need a buffer");
    return {gemm_backward_weights(k, x, dy, dw, *dwbuf)};
  }
  std::vector<StepPtr> steps;
  const memory dwk = k->weights("diff_weights", dw, dwbuf);
  std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_WEIGHTS, dwk}};
  std::vector<Bf16Input> convert;
  operand(*k, args, convert, DNNL_ARG_SRC, k->src_md, k->src_lp, x, "conv input");
  operand(*k, args, convert, DNNL_ARG_DIFF_DST, k->dst_md, k->dst_lp, dy, "conv dy");
  if (k->has_bias) {
    if (!db) throw std::invalid_argument("meta._plan.Conv: bias gradient missing");
    args[DNNL_ARG_DIFF_BIAS] = bind(k->b_md, *db, "conv db");
  }
  steps.push_back(conv_step("conv backward weights", *k,
                            dnnl::convolution_backward_weights(k->bwd_weights), std::move(args),
                            k->bwd_weights.scratchpad_desc(), std::move(convert)));
  if (k->weights_bytes("diff_weights"))
    steps.push_back(reorder(dwk, bind(k->w_plain, dw, "conv dw"), "conv dw -> plain"));
  return steps;
}

}  // namespace

void bind_conv(py::module_& m) {
  py::class_<ConvKernel, ConvPtr>(m, "Conv", "A 2-D convolution's primitives for one shape.")
      .def(py::init<Dims, Dims, bool, Dims, Dims, Dims, Dims, std::int64_t, std::vector<PostOp>,
                    bool, bool, bool, std::string, bool, bool>(),
           py::arg("src_dims"), py::arg("w_dims"), py::arg("has_bias"), py::arg("strides"),
           py::arg("pads_begin"), py::arg("pads_end"), py::arg("dilations"), py::arg("group"),
           py::arg("post_ops"), py::arg("training"), py::arg("need_dx"), py::arg("need_dw"),
           py::arg("layout") = "any", py::arg("bf16") = false, py::arg("bf16_output") = false,
           "bf16: the products read bf16 (arrays holding bf16 where they lie, float32 ones "
           "converted); bf16_output: the forward writes its output in bf16")
      .def_property_readonly("src_layout", [](const ConvKernel& k) { return layout_of(k.src_md); })
      .def_property_readonly("dst_layout", [](const ConvKernel& k) { return layout_of(k.dst_md); })
      .def_readonly("dst_dims", &ConvKernel::dst_dims)
      .def_readonly("info", &ConvKernel::info)
      .def_readonly("bf16", &ConvKernel::bf16)
      .def_readonly("bf16_output", &ConvKernel::bf16_out)
      .def_readonly("gemm_dw", &ConvKernel::gemm_dw)
      .def("dw_workspace_bytes", &ConvKernel::dw_workspace_bytes)
      .def("weights_bytes", &ConvKernel::weights_bytes, py::arg("which"))
      .def("reorder_weights", &reorder_weights, py::arg("which"), py::arg("w"), py::arg("buf"))
      .def("reorder_weights_from", &reorder_weights_from, py::arg("source"), py::arg("src"),
           py::arg("which"), py::arg("buf"))
      .def("forward", &forward, py::arg("x"), py::arg("w"), py::arg("b"), py::arg("y"),
           py::arg("post_args") = std::vector<py::array>{}, py::arg("wbuf") = py::none())
      .def("backward_data", &backward_data, py::arg("dy"), py::arg("w"), py::arg("dx"),
           py::arg("wbuf") = py::none())
      .def("backward_weights", &backward_weights, py::arg("x"), py::arg("dy"), py::arg("dw"),
           py::arg("db"), py::arg("dwbuf") = py::none());
}

}  // namespace meta::plan
