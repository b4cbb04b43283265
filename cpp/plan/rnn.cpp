// Recurrent layers in a plan: ONNX LSTM and GRU (linear_before_reset 0 and 1) on oneDNN's RNN
// primitives, one layer, forward, reverse or bidirectional, for inference or training (the
// forward keeps oneDNN's workspace; the backward gives dX, dW, dR, dB, d initial_h and
// d initial_c). ONNX and oneDNN differ in four things our loops bridge:
// - gate order: ONNX LSTM i, o, f, c against oneDNN i, f, c~, o (ONNX GRU's z, r, h is
//   oneDNN's u, r, o);
// - weight layout: ONNX W [D, G*H, I] and R [D, G*H, H] against oneDNN's ldigo
//   [1, D, I, G, H] (the kernels then reorder into the layouts they run fastest in);
// - biases: ONNX keeps Wb and Rb per gate, oneDNN one bias per gate (their sum), four for
//   the linear-before-reset GRU (u, r, and the input and hidden halves of o);
// - a bidirectional output: ONNX Y [T, D, N, H], oneDNN [T, N, D*H].
// The kernel owns what only it reads (weights in its layouts, workspace, gradients in
// oneDNN's layout, zeros for absent states); the plan's arrays hold what the graph sees.
#include <omp.h>

#include <cstring>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

struct RnnKernel {
  std::string cell;  // "lstm", "gru" or "lbr_gru"
  std::int64_t T, N, C, H, D, G, GB;
  bool training;
  std::vector<int> perm;  // oneDNN gate g is ONNX gate perm[g]
  memory::desc x_md, state_md, y_md, bias_md, wl_plain, wi_plain;
  dnnl::rnn_primitive_desc_base fwd, bwd;
  dnnl::primitive fwd_prim, bwd_prim;
  // owned by the kernel
  memory wl_p, wi_p, bias, wl_f, wi_f, wl_b, wi_b, ws, y_own, dy_own, h_zero, c_zero, h_last,
      c_last, dwl, dwi, dbias, dwl_p, dwi_p, dx_own, dh_own, dc_own;
  std::int64_t internal_bytes = 0;
  std::string info;

  memory own(const memory::desc& md) {
    memory m(md, engine());
    std::memset(m.get_data_handle(), 0, md.get_size());
    internal_bytes += std::int64_t(md.get_size());
    return m;
  }

  bool lstm() const { return cell == "lstm"; }

  RnnKernel(std::string cell_, std::int64_t t, std::int64_t n, std::int64_t c, std::int64_t h,
            const std::string& direction, bool train)
      : cell(std::move(cell_)), T(t), N(n), C(c), H(h), training(train) {
    dnnl::rnn_direction dir;
    if (direction == "forward") {
      dir = dnnl::rnn_direction::unidirectional_left2right;
    } else if (direction == "reverse") {
      dir = dnnl::rnn_direction::unidirectional_right2left;
    } else if (direction == "bidirectional") {
      dir = dnnl::rnn_direction::bidirectional_concat;
    } else {
      throw std::invalid_argument("meta._plan.RNN: unknown direction '" + direction + "'");
    }
    D = direction == "bidirectional" ? 2 : 1;
    if (cell == "lstm") {
      G = GB = 4;
      perm = {0, 2, 3, 1};
    } else if (cell == "gru" || cell == "lbr_gru") {
      G = 3;
      GB = cell == "gru" ? 3 : 4;
      perm = {0, 1, 2};
    } else {
      throw std::invalid_argument("meta._plan.RNN: unknown cell '" + cell + "'");
    }
    x_md = memory::desc({T, N, C}, dt::f32, tag::tnc);
    state_md = memory::desc({1, D, N, H}, dt::f32, tag::ldnc);
    y_md = memory::desc({T, N, D * H}, dt::f32, tag::tnc);
    bias_md = memory::desc({1, D, GB, H}, dt::f32, tag::ldgo);
    wl_plain = memory::desc({1, D, C, G, H}, dt::f32, tag::ldigo);
    wi_plain = memory::desc({1, D, H, G, H}, dt::f32, tag::ldigo);
    const memory::desc wl_any({1, D, C, G, H}, dt::f32, tag::any),
        wi_any({1, D, H, G, H}, dt::f32, tag::any), none;
    const auto prop = training ? dnnl::prop_kind::forward_training
                               : dnnl::prop_kind::forward_inference;
    const auto& e = engine();
    const auto attr = scratch_attr();
    const auto bprop = dnnl::prop_kind::backward;
    const memory::desc& s = state_md;
    if (cell == "lstm") {
      dnnl::lstm_forward::primitive_desc f(e, prop, dir, x_md, s, s, wl_any, wi_any, bias_md,
                                           y_md, s, s, attr);
      fwd = f;
      fwd_prim = dnnl::lstm_forward(f);
      if (training) {
        dnnl::lstm_backward::primitive_desc b(e, bprop, dir, x_md, s, s, wl_any, wi_any,
                                              bias_md, y_md, s, s, x_md, s, s, wl_any, wi_any,
                                              bias_md, y_md, s, s, f, attr);
        bwd = b;
        bwd_prim = dnnl::lstm_backward(b);
      }
    } else if (cell == "gru") {
      dnnl::gru_forward::primitive_desc f(e, prop, dir, x_md, s, wl_any, wi_any, bias_md, y_md,
                                          s, attr);
      fwd = f;
      fwd_prim = dnnl::gru_forward(f);
      if (training) {
        dnnl::gru_backward::primitive_desc b(e, bprop, dir, x_md, s, wl_any, wi_any, bias_md,
                                             y_md, s, x_md, s, wl_any, wi_any, bias_md, y_md,
                                             s, f, attr);
        bwd = b;
        bwd_prim = dnnl::gru_backward(b);
      }
    } else {
      dnnl::lbr_gru_forward::primitive_desc f(e, prop, dir, x_md, s, wl_any, wi_any, bias_md,
                                              y_md, s, attr);
      fwd = f;
      fwd_prim = dnnl::lbr_gru_forward(f);
      if (training) {
        dnnl::lbr_gru_backward::primitive_desc b(e, bprop, dir, x_md, s, wl_any, wi_any,
                                                 bias_md, y_md, s, x_md, s, wl_any, wi_any,
                                                 bias_md, y_md, s, f, attr);
        bwd = b;
        bwd_prim = dnnl::lbr_gru_backward(b);
      }
    }
    info = "fwd " + impl(fwd) + (training ? ", bwd " + impl(bwd) : "");
    wl_p = own(wl_plain);
    wi_p = own(wi_plain);
    bias = own(bias_md);
    wl_f = fwd.weights_layer_desc() == wl_plain ? wl_p : own(fwd.weights_layer_desc());
    wi_f = fwd.weights_iter_desc() == wi_plain ? wi_p : own(fwd.weights_iter_desc());
    h_zero = own(state_md);
    h_last = own(state_md);
    if (lstm()) {
      c_zero = own(state_md);
      c_last = own(state_md);
    }
    if (!training) return;
    ws = own(fwd.workspace_desc());
    wl_b = bwd.weights_layer_desc() == wl_plain ? wl_p : own(bwd.weights_layer_desc());
    wi_b = bwd.weights_iter_desc() == wi_plain ? wi_p : own(bwd.weights_iter_desc());
    dwl = own(bwd.diff_weights_layer_desc());
    dwi = own(bwd.diff_weights_iter_desc());
    dbias = own(bwd.diff_bias_desc());
    dwl_p = bwd.diff_weights_layer_desc() == wl_plain ? dwl : own(wl_plain);
    dwi_p = bwd.diff_weights_iter_desc() == wi_plain ? dwi : own(wi_plain);
  }

  float* f32(const memory& m) const { return static_cast<float*>(m.get_data_handle()); }

  // A plan array bound as `md`, or the kernel's own buffer (made once) when there is none.
  memory bind_or_own(const memory::desc& md, const std::optional<py::array>& a, memory& mine,
                     const char* what) {
    if (a) return bind(md, *a, what);
    if (!mine) mine = own(md);
    return mine;
  }
};

using RnnPtr = std::shared_ptr<RnnKernel>;

StepPtr reorder_step(const memory& from, const memory& to, const std::string& name) {
  auto pd = dnnl::reorder::primitive_desc(from, to, scratch_attr());
  return primitive_step(name, dnnl::reorder(pd), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}},
                        pd.scratchpad_desc());
}

// ONNX W [D, G*H, K] (gates in ONNX order) <-> ldigo [1, D, K, G, H] (oneDNN's order).
void onnx_to_ldigo(const float* w, float* out, std::int64_t D, std::int64_t G, std::int64_t H,
                   std::int64_t K, const std::vector<int>& perm) {
#pragma omp parallel for collapse(2)
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t g = 0; g < G; ++g) {
        const float* src = w + (d * G * H + perm[g] * H) * K + k;
        float* dst = out + ((d * K + k) * G + g) * H;
        for (std::int64_t h = 0; h < H; ++h) dst[h] = src[h * K];
      }
}

void ldigo_to_onnx(const float* in, float* w, std::int64_t D, std::int64_t G, std::int64_t H,
                   std::int64_t K, const std::vector<int>& perm) {
#pragma omp parallel for collapse(2)
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t g = 0; g < G; ++g)
      for (std::int64_t h = 0; h < H; ++h) {
        float* dst = w + (d * G * H + perm[g] * H + h) * K;
        const float* src = in + (d * K * G + g) * H + h;
        for (std::int64_t k = 0; k < K; ++k) dst[k] = src[k * G * H];
      }
}

// The weights into the kernels' layouts: W, R, B (None: zero biases) -> ldigo and the
// per-gate bias, then reorders into the forward's (and backward's) layouts.
std::vector<StepPtr> prepare(const RnnPtr& k, const py::array& w, const py::array& r,
                             std::optional<py::array> b) {
  const std::int64_t D = k->D, G = k->G, H = k->H, C = k->C;
  const float* pw = static_cast<const float*>(address(w, D * G * H * C * 4, "rnn W"));
  const float* pr = static_cast<const float*>(address(r, D * G * H * H * 4, "rnn R"));
  const float* pb = b ? static_cast<const float*>(address(*b, D * 2 * G * H * 4, "rnn B"))
                      : nullptr;
  std::vector<StepPtr> steps;
  steps.push_back(std::make_shared<LambdaStep>("rnn weights -> ldigo", [k, pw, pr, pb] {
    const std::int64_t D = k->D, G = k->G, H = k->H;
    onnx_to_ldigo(pw, k->f32(k->wl_p), D, G, H, k->C, k->perm);
    onnx_to_ldigo(pr, k->f32(k->wi_p), D, G, H, H, k->perm);
    float* bias = k->f32(k->bias);
    for (std::int64_t d = 0; d < D; ++d) {
      const float* wb = pb ? pb + d * 2 * G * H : nullptr;
      const float* rb = pb ? wb + G * H : nullptr;
      for (std::int64_t g = 0; g < k->GB; ++g) {
        float* out = bias + (d * k->GB + g) * H;
        if (!pb) {
          std::fill(out, out + H, 0.f);
        } else if (k->cell == "lbr_gru" && g >= 2) {  // o's input half, then its hidden half
          std::copy(g == 2 ? wb + 2 * H : rb + 2 * H, (g == 2 ? wb : rb) + 3 * H, out);
        } else {
          const std::int64_t o = k->perm[g] * H;
          for (std::int64_t h = 0; h < H; ++h) out[h] = wb[o + h] + rb[o + h];
        }
      }
    }
  }));
  if (k->wl_f != k->wl_p) steps.push_back(reorder_step(k->wl_p, k->wl_f, "rnn W -> forward"));
  if (k->wi_f != k->wi_p) steps.push_back(reorder_step(k->wi_p, k->wi_f, "rnn R -> forward"));
  if (k->training) {
    if (k->wl_b != k->wl_p) steps.push_back(reorder_step(k->wl_p, k->wl_b, "rnn W -> backward"));
    if (k->wi_b != k->wi_p) steps.push_back(reorder_step(k->wi_p, k->wi_b, "rnn R -> backward"));
  }
  return steps;
}

// Y [T, D, N, H] <-> oneDNN's [T, N, D*H] (bidirectional).
void split_directions(const float* cat, float* y, std::int64_t T, std::int64_t N,
                      std::int64_t D, std::int64_t H) {
#pragma omp parallel for collapse(2)
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t d = 0; d < D; ++d)
      for (std::int64_t n = 0; n < N; ++n)
        std::memcpy(y + ((t * D + d) * N + n) * H, cat + (t * N + n) * D * H + d * H, H * 4);
}

void join_directions(const float* y, float* cat, std::int64_t T, std::int64_t N,
                     std::int64_t D, std::int64_t H) {
#pragma omp parallel for collapse(2)
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t d = 0; d < D; ++d)
      for (std::int64_t n = 0; n < N; ++n)
        std::memcpy(cat + (t * N + n) * D * H + d * H, y + ((t * D + d) * N + n) * H, H * 4);
}

// The forward's arguments that the backward reads too.
std::unordered_map<int, memory> state_args(const RnnPtr& k, const py::array& x,
                                           const std::optional<py::array>& h0,
                                           const std::optional<py::array>& c0) {
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC_LAYER, bind(k->x_md, x, "rnn X")},
      {DNNL_ARG_SRC_ITER, h0 ? bind(k->state_md, *h0, "rnn initial_h") : k->h_zero},
      {DNNL_ARG_BIAS, k->bias}};
  if (k->lstm())
    args[DNNL_ARG_SRC_ITER_C] = c0 ? bind(k->state_md, *c0, "rnn initial_c") : k->c_zero;
  if (k->training) args[DNNL_ARG_WORKSPACE] = k->ws;
  return args;
}

// Where the forward writes its full output: Y itself (one direction) or the kernel's buffer.
memory output_layer(const RnnPtr& k, const std::optional<py::array>& y) {
  if (y && k->D == 1) return bind(k->y_md, *y, "rnn Y");
  if (!k->y_own) k->y_own = k->own(k->y_md);
  return k->y_own;
}

std::vector<StepPtr> forward(const RnnPtr& k, const py::array& x, std::optional<py::array> h0,
                             std::optional<py::array> c0, std::optional<py::array> y,
                             std::optional<py::array> yh, std::optional<py::array> yc) {
  auto args = state_args(k, x, h0, c0);
  args[DNNL_ARG_WEIGHTS_LAYER] = k->wl_f;
  args[DNNL_ARG_WEIGHTS_ITER] = k->wi_f;
  const memory out = output_layer(k, y);
  args[DNNL_ARG_DST_LAYER] = out;
  args[DNNL_ARG_DST_ITER] = yh ? bind(k->state_md, *yh, "rnn Y_h") : k->h_last;
  if (k->lstm()) args[DNNL_ARG_DST_ITER_C] = yc ? bind(k->state_md, *yc, "rnn Y_c") : k->c_last;
  std::vector<StepPtr> steps{primitive_step(k->cell + " forward", k->fwd_prim, std::move(args),
                                            k->fwd.scratchpad_desc())};
  if (y && k->D > 1) {
    float* dst = static_cast<float*>(address(*y, k->T * k->D * k->N * k->H * 4, "rnn Y"));
    const float* src = k->f32(out);
    steps.push_back(std::make_shared<LambdaStep>("rnn Y [T,N,D*H] -> [T,D,N,H]", [k, src, dst] {
      split_directions(src, dst, k->T, k->N, k->D, k->H);
    }));
  }
  return steps;
}

std::vector<StepPtr> backward(const RnnPtr& k, const py::array& x, std::optional<py::array> h0,
                              std::optional<py::array> c0, std::optional<py::array> y,
                              std::optional<py::array> yh, std::optional<py::array> yc,
                              std::optional<py::array> dy, std::optional<py::array> dyh,
                              std::optional<py::array> dyc, std::optional<py::array> dx,
                              std::optional<py::array> dw, std::optional<py::array> dr,
                              std::optional<py::array> db, std::optional<py::array> dh0,
                              std::optional<py::array> dc0) {
  if (!k->training) throw std::invalid_argument("meta._plan.RNN: built for inference only");
  const std::int64_t D = k->D, G = k->G, H = k->H, C = k->C, T = k->T, N = k->N;
  auto args = state_args(k, x, h0, c0);
  args[DNNL_ARG_WEIGHTS_LAYER] = k->wl_b;
  args[DNNL_ARG_WEIGHTS_ITER] = k->wi_b;
  args[DNNL_ARG_DST_LAYER] = output_layer(k, y);
  args[DNNL_ARG_DST_ITER] = yh ? bind(k->state_md, *yh, "rnn Y_h") : k->h_last;
  if (k->lstm()) args[DNNL_ARG_DST_ITER_C] = yc ? bind(k->state_md, *yc, "rnn Y_c") : k->c_last;
  std::vector<StepPtr> steps;
  // d Y: the plan's gradient (one direction), else the kernel's buffer (zeros when no
  // gradient reaches Y, or the gradient joined into oneDNN's [T, N, D*H]).
  memory dy_mem;
  if (dy && D == 1) {
    dy_mem = bind(k->y_md, *dy, "rnn dY");
  } else {
    if (!k->dy_own) k->dy_own = k->own(k->y_md);
    dy_mem = k->dy_own;
    if (dy) {
      const float* src = static_cast<const float*>(address(*dy, T * D * N * H * 4, "rnn dY"));
      float* dst = k->f32(dy_mem);
      steps.push_back(std::make_shared<LambdaStep>("rnn dY [T,D,N,H] -> [T,N,D*H]",
                                                   [k, src, dst] {
        join_directions(src, dst, k->T, k->N, k->D, k->H);
      }));
    }
  }
  args[DNNL_ARG_DIFF_DST_LAYER] = dy_mem;
  // absent state gradients are zeros: the kernel's zero states, never written
  args[DNNL_ARG_DIFF_DST_ITER] = dyh ? bind(k->state_md, *dyh, "rnn dY_h") : k->h_zero;
  if (k->lstm())
    args[DNNL_ARG_DIFF_DST_ITER_C] = dyc ? bind(k->state_md, *dyc, "rnn dY_c") : k->c_zero;
  args[DNNL_ARG_DIFF_SRC_LAYER] = k->bind_or_own(k->x_md, dx, k->dx_own, "rnn dX");
  args[DNNL_ARG_DIFF_SRC_ITER] = k->bind_or_own(k->state_md, dh0, k->dh_own, "rnn d initial_h");
  if (k->lstm())
    args[DNNL_ARG_DIFF_SRC_ITER_C] =
        k->bind_or_own(k->state_md, dc0, k->dc_own, "rnn d initial_c");
  args[DNNL_ARG_DIFF_WEIGHTS_LAYER] = k->dwl;
  args[DNNL_ARG_DIFF_WEIGHTS_ITER] = k->dwi;
  args[DNNL_ARG_DIFF_BIAS] = k->dbias;
  // oneDNN adds into its weight gradients: they start at zero each backward
  steps.push_back(std::make_shared<LambdaStep>("rnn zero weight gradients", [k] {
    for (const memory* m : {&k->dwl, &k->dwi, &k->dbias})
      std::memset(m->get_data_handle(), 0, m->get_desc().get_size());
  }));
  steps.push_back(primitive_step(k->cell + " backward", k->bwd_prim, std::move(args),
                                 k->bwd.scratchpad_desc()));
  if (dw) {
    if (k->dwl_p != k->dwl) steps.push_back(reorder_step(k->dwl, k->dwl_p, "rnn dW -> ldigo"));
    float* out = static_cast<float*>(address(*dw, D * G * H * C * 4, "rnn dW"));
    steps.push_back(std::make_shared<LambdaStep>("rnn dW -> ONNX", [k, out] {
      ldigo_to_onnx(k->f32(k->dwl_p), out, k->D, k->G, k->H, k->C, k->perm);
    }));
  }
  if (dr) {
    if (k->dwi_p != k->dwi) steps.push_back(reorder_step(k->dwi, k->dwi_p, "rnn dR -> ldigo"));
    float* out = static_cast<float*>(address(*dr, D * G * H * H * 4, "rnn dR"));
    steps.push_back(std::make_shared<LambdaStep>("rnn dR -> ONNX", [k, out] {
      ldigo_to_onnx(k->f32(k->dwi_p), out, k->D, k->G, k->H, k->H, k->perm);
    }));
  }
  if (db) {
    float* out = static_cast<float*>(address(*db, D * 2 * G * H * 4, "rnn dB"));
    steps.push_back(std::make_shared<LambdaStep>("rnn dB -> ONNX", [k, out] {
      const std::int64_t G = k->G, H = k->H;
      const float* in = k->f32(k->dbias);
      for (std::int64_t d = 0; d < k->D; ++d) {
        float* wb = out + d * 2 * G * H;
        float* rb = wb + G * H;
        for (std::int64_t g = 0; g < G; ++g) {
          const float* src = in + (d * k->GB + g) * H;
          const std::int64_t o = k->perm[g] * H;
          std::copy(src, src + H, wb + o);
          // linear-before-reset: o's hidden half has a bias of its own
          const float* rsrc = (k->cell == "lbr_gru" && g == 2) ? src + H : src;
          std::copy(rsrc, rsrc + H, rb + o);
        }
      }
    }));
  }
  return steps;
}

}  // namespace

void bind_rnn(py::module_& m) {
  py::class_<RnnKernel, RnnPtr>(m, "RNN",
                                "One ONNX LSTM or GRU layer's oneDNN primitives for one shape.")
      .def(py::init<std::string, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                    std::string, bool>(),
           py::arg("cell"), py::arg("steps"), py::arg("batch"), py::arg("input_size"),
           py::arg("hidden_size"), py::arg("direction"), py::arg("training"))
      .def_readonly("info", &RnnKernel::info)
      .def_readonly("internal_bytes", &RnnKernel::internal_bytes)
      .def("prepare", &prepare, py::arg("w"), py::arg("r"), py::arg("b"))
      .def("forward", &forward, py::arg("x"), py::arg("h0"), py::arg("c0"), py::arg("y"),
           py::arg("y_h"), py::arg("y_c"))
      .def("backward", &backward, py::arg("x"), py::arg("h0"), py::arg("c0"), py::arg("y"),
           py::arg("y_h"), py::arg("y_c"), py::arg("dy"), py::arg("dy_h"), py::arg("dy_c"),
           py::arg("dx"), py::arg("dw"), py::arg("dr"), py::arg("db"), py::arg("dh0"),
           py::arg("dc0"));
}

}  // namespace meta::plan
