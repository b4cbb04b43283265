// Recurrent layers in a plan: ONNX LSTM and GRU (linear_before_reset 0 and 1) on oneDNN's RNN
// primitives, one layer, forward, reverse or bidirectional, for inference or training (the
// forward keeps oneDNN's workspace; the backward gives dX, dW, dR, dB, d initial_h and
// d initial_c). ONNX and oneDNN differ in four things our loops bridge:
// - gate order: ONNX LSTM i, o, f, c against oneDNN i, f, c~, o (ONNX GRU's z, r, h is
//   oneDNN's u, r, o);
// - weight layout: ONNX W [D, G*H, I] and R [D, G*H, H] against the primitives' own: oneDNN
//   3.2's forward wants ldigo [1, D, I, G, H] with padded rows, its backward ldgoi (ONNX's
//   layout, gates permuted), its weight gradients padded ldigo. The weights are read as rows
//   (one pointer per ONNX row) and written straight into each layout, the gradients likewise
//   back: no reorder, and the rows may lie in the parameters an exporter slices and
//   concatenates W, R and B from (the lowering folds those nodes; PyTorch's exporter writes
//   24 Slices and 11 Concats around a bidirectional LSTM to reorder its gates);
// - biases: ONNX keeps Wb and Rb per gate, oneDNN one bias per gate (their sum), four for
//   the linear-before-reset GRU (u, r, and the input and hidden halves of o);
// - a bidirectional output: ONNX Y [T, D, N, H], oneDNN [T, N, D*H]: the kernel writes
//   either straight into the value after the exporter's Transpose back to oneDNN's order
//   (output "tnc"), or into its own buffer and then Y ("onnx").
// The kernel owns what only it reads (weights in its layouts, workspace, gradients in
// oneDNN's layout, zeros for absent states); the plan's arrays hold what the graph sees.
#include <omp.h>

#include <cstring>
#include <stdexcept>

#include "plan.hpp"

namespace meta::plan {

namespace {

// Rows of a weight where the plan holds them: the arrays, and per row (source array, element
// offset). W and R: D*G*H rows of K floats (direction, ONNX gate, unit); B: D*2*G rows of H
// floats (direction, input or recurrent half, ONNX gate).
using RowsArg = std::pair<std::vector<py::array>,
                          py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>>;

std::vector<float*> row_pointers(const RowsArg& a, std::int64_t n, std::int64_t len,
                                 const char* what) {
  const auto& table = a.second;
  if (table.ndim() != 2 || table.shape(0) != n || table.shape(1) != 2)
    throw std::invalid_argument(std::string("meta._plan.RNN: ") + what + " rows: expected [" +
                                std::to_string(n) + ", 2]");
  std::vector<float*> base;
  std::vector<std::int64_t> size;
  for (const auto& arr : a.first) {
    if (!py::isinstance<py::array_t<float>>(arr))
      throw std::invalid_argument(std::string("meta._plan.RNN: ") + what + " is not float32");
    base.push_back(static_cast<float*>(address(arr, 0, what)));
    size.push_back(arr.size());
  }
  auto t = table.unchecked<2>();
  std::vector<float*> rows(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t src = t(i, 0), off = t(i, 1);
    if (src < 0 || src >= std::int64_t(base.size()) || off < 0 || off + len > size[src])
      throw std::invalid_argument(std::string("meta._plan.RNN: ") + what + " row " +
                                  std::to_string(i) + " lies outside its array");
    rows[i] = base[src] + off;
  }
  return rows;
}

bool strided(const memory::desc& md) {
  return md.get_format_kind() == memory::format_kind::blocked && md.get_inner_nblks() == 0;
}

// ONNX rows (direction d, ONNX gate q, unit h: K floats) -> a strided [1, D, K, G, H] weights
// memory whose gate g is ONNX gate perm[g]: ldgoi (the backward's: rows copied) or ldigo
// (the forward's, rows padded: 16x16 tiles transposed).
void rows_to_weights(const std::vector<float*>& rows, const memory& m, std::int64_t D,
                     std::int64_t G, std::int64_t H, std::int64_t K,
                     const std::vector<int>& perm) {
  const auto s = m.get_desc().get_strides();
  const std::int64_t sd = s[1], sk = s[2], sg = s[3], sh = s[4];
  float* out = static_cast<float*>(m.get_data_handle());
#pragma omp parallel for collapse(2)
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t g = 0; g < G; ++g) {
      float* const* src = rows.data() + (d * G + perm[g]) * H;
      float* base = out + d * sd + g * sg;
      if (sk == 1) {
        for (std::int64_t h = 0; h < H; ++h) std::memcpy(base + h * sh, src[h], K * 4);
        continue;
      }
      for (std::int64_t h0 = 0; h0 < H; h0 += 16)
        for (std::int64_t k0 = 0; k0 < K; k0 += 16) {
          const std::int64_t h1 = std::min(H, h0 + 16), k1 = std::min(K, k0 + 16);
          for (std::int64_t k = k0; k < k1; ++k) {
            float* dst = base + k * sk;
            for (std::int64_t h = h0; h < h1; ++h) dst[h * sh] = src[h][k];
          }
        }
    }
}

// The inverse: a strided weights-shaped memory (the gradients) -> ONNX rows.
void weights_to_rows(const memory& m, const std::vector<float*>& rows, std::int64_t D,
                     std::int64_t G, std::int64_t H, std::int64_t K,
                     const std::vector<int>& perm) {
  const auto s = m.get_desc().get_strides();
  const std::int64_t sd = s[1], sk = s[2], sg = s[3], sh = s[4];
  const float* in = static_cast<const float*>(m.get_data_handle());
#pragma omp parallel for collapse(2)
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t g = 0; g < G; ++g) {
      float* const* dst = rows.data() + (d * G + perm[g]) * H;
      const float* base = in + d * sd + g * sg;
      if (sk == 1) {
        for (std::int64_t h = 0; h < H; ++h) std::memcpy(dst[h], base + h * sh, K * 4);
        continue;
      }
      for (std::int64_t h0 = 0; h0 < H; h0 += 16)
        for (std::int64_t k0 = 0; k0 < K; k0 += 16) {
          const std::int64_t h1 = std::min(H, h0 + 16), k1 = std::min(K, k0 + 16);
          for (std::int64_t h = h0; h < h1; ++h) {
            float* row = dst[h];
            for (std::int64_t k = k0; k < k1; ++k) row[k] = base[k * sk + h * sh];
          }
        }
    }
}

struct RnnKernel {
  std::string cell;  // "lstm", "gru" or "lbr_gru"
  std::string output;  // "onnx" (Y [T, D, N, H]) or "tnc" ([T, N, D*H])
  std::int64_t T, N, C, H, D, G, GB;
  bool training;
  std::vector<int> perm;  // oneDNN gate g is ONNX gate perm[g]
  memory::desc x_md, state_md, y_md, bias_md, wl_plain, wi_plain;
  dnnl::rnn_primitive_desc_base fwd, bwd;
  dnnl::primitive fwd_prim, bwd_prim;
  // owned by the kernel
  memory wl_f, wi_f, wl_b, wi_b, wl_stage, wi_stage, bias, ws, y_own, dy_own, h_zero, c_zero,
      h_last, c_last, dwl, dwi, dbias, dwl_p, dwi_p, dx_own, dh_own, dc_own;
  std::int64_t internal_bytes = 0;
  std::string info;

  memory own(const memory::desc& md) {
    memory m(md, engine());
    std::memset(m.get_data_handle(), 0, md.get_size());
    internal_bytes += std::int64_t(md.get_size());
    return m;
  }

  bool lstm() const { return cell == "lstm"; }
  // Y is bound as oneDNN's output itself (one direction, or a layout the graph gives)
  bool y_direct() const { return D == 1 || output != "onnx"; }

  RnnKernel(std::string cell_, std::int64_t t, std::int64_t n, std::int64_t c, std::int64_t h,
            const std::string& direction, bool train, std::string output_)
      : cell(std::move(cell_)), output(std::move(output_)), T(t), N(n), C(c), H(h),
        training(train) {
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
    if (output != "onnx" && output != "tnc")
      throw std::invalid_argument("meta._plan.RNN: unknown output layout '" + output + "'");
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
    bias = own(bias_md);
    wl_f = own(fwd.weights_layer_desc());
    wi_f = own(fwd.weights_iter_desc());
    h_zero = own(state_md);
    h_last = own(state_md);
    if (lstm()) {
      c_zero = own(state_md);
      c_last = own(state_md);
    }
    if (!training) return;
    ws = own(fwd.workspace_desc());
    wl_b = bwd.weights_layer_desc() == fwd.weights_layer_desc() ? wl_f
                                                                : own(bwd.weights_layer_desc());
    wi_b = bwd.weights_iter_desc() == fwd.weights_iter_desc() ? wi_f
                                                              : own(bwd.weights_iter_desc());
    dwl = own(bwd.diff_weights_layer_desc());
    dwi = own(bwd.diff_weights_iter_desc());
    dbias = own(bwd.diff_bias_desc());
    // a blocked gradient layout (not oneDNN 3.2's) is reordered to plain ldigo first
    dwl_p = strided(dwl.get_desc()) ? dwl : own(wl_plain);
    dwi_p = strided(dwi.get_desc()) ? dwi : own(wi_plain);
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

// The weights into the primitives' layouts: W and R rows straight into each strided layout
// the forward (and backward) wants; a blocked one (the inference kernels' packed weights)
// through a plain ldigo copy and a reorder. B rows (None: zero biases) -> the per-gate bias.
std::vector<StepPtr> prepare(const RnnPtr& k, const RowsArg& w, const RowsArg& r,
                             std::optional<RowsArg> b) {
  const std::int64_t D = k->D, G = k->G, H = k->H, C = k->C;
  auto wrows = row_pointers(w, D * G * H, C, "W");
  auto rrows = row_pointers(r, D * G * H, H, "R");
  std::vector<float*> brows = b ? row_pointers(*b, D * 2 * G, H, "B") : std::vector<float*>();
  // (target, staged): each distinct weights memory, and whether it is written through the
  // plain copy and a reorder
  std::vector<std::pair<memory, memory>> layer, iter;
  std::vector<StepPtr> reorders;
  auto add = [&](std::vector<std::pair<memory, memory>>& list, const memory& target,
                 memory& stage, const memory::desc& plain, const char* name) {
    for (const auto& [m, _] : list)
      if (m == target) return;
    if (strided(target.get_desc())) {
      list.emplace_back(target, memory());
      return;
    }
    if (!stage) {
      stage = k->own(plain);
      list.emplace_back(stage, memory());
    }
    list.emplace_back(target, stage);
    reorders.push_back(reorder_step(stage, target, name));
  };
  add(layer, k->wl_f, k->wl_stage, k->wl_plain, "rnn W -> forward");
  add(iter, k->wi_f, k->wi_stage, k->wi_plain, "rnn R -> forward");
  if (k->training) {
    add(layer, k->wl_b, k->wl_stage, k->wl_plain, "rnn W -> backward");
    add(iter, k->wi_b, k->wi_stage, k->wi_plain, "rnn R -> backward");
  }
  std::vector<StepPtr> steps;
  steps.push_back(std::make_shared<LambdaStep>(
      "rnn weights -> oneDNN layouts", [k, wrows, rrows, brows, layer, iter] {
        const std::int64_t D = k->D, G = k->G, H = k->H;
        for (const auto& [m, staged] : layer)
          if (!staged) rows_to_weights(wrows, m, D, G, H, k->C, k->perm);
        for (const auto& [m, staged] : iter)
          if (!staged) rows_to_weights(rrows, m, D, G, H, H, k->perm);
        float* bias = k->f32(k->bias);
        for (std::int64_t d = 0; d < D; ++d) {
          for (std::int64_t g = 0; g < k->GB; ++g) {
            float* out = bias + (d * k->GB + g) * H;
            if (brows.empty()) {
              std::fill(out, out + H, 0.f);
              continue;
            }
            const float* const* wb = brows.data() + d * 2 * G;  // row q: ONNX gate q
            const float* const* rb = wb + G;
            if (k->cell == "lbr_gru" && g >= 2) {  // o's input half, then its hidden half
              std::copy(g == 2 ? wb[2] : rb[2], (g == 2 ? wb[2] : rb[2]) + H, out);
            } else {
              const float* x = wb[k->perm[g]];
              const float* y = rb[k->perm[g]];
              for (std::int64_t h = 0; h < H; ++h) out[h] = x[h] + y[h];
            }
          }
        }
      }));
  for (auto& s : reorders) steps.push_back(s);
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

// Where the forward writes its full output: Y itself (one direction, or oneDNN's layout) or
// the kernel's buffer.
memory output_layer(const RnnPtr& k, const std::optional<py::array>& y) {
  if (y && k->y_direct()) return bind(k->y_md, *y, "rnn Y");
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
  if (y && !k->y_direct()) {
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
                              std::optional<RowsArg> dw, std::optional<RowsArg> dr,
                              std::optional<RowsArg> db, std::optional<py::array> dh0,
                              std::optional<py::array> dc0, std::vector<py::array> zero) {
  if (!k->training) throw std::invalid_argument("meta._plan.RNN: built for inference only");
  const std::int64_t D = k->D, G = k->G, H = k->H, C = k->C, T = k->T, N = k->N;
  auto args = state_args(k, x, h0, c0);
  args[DNNL_ARG_WEIGHTS_LAYER] = k->wl_b;
  args[DNNL_ARG_WEIGHTS_ITER] = k->wi_b;
  args[DNNL_ARG_DST_LAYER] = output_layer(k, y);
  args[DNNL_ARG_DST_ITER] = yh ? bind(k->state_md, *yh, "rnn Y_h") : k->h_last;
  if (k->lstm()) args[DNNL_ARG_DST_ITER_C] = yc ? bind(k->state_md, *yc, "rnn Y_c") : k->c_last;
  std::vector<StepPtr> steps;
  // d Y: the plan's gradient (in oneDNN's layout), else the kernel's buffer (zeros when no
  // gradient reaches Y, or the gradient joined into oneDNN's [T, N, D*H]).
  memory dy_mem;
  if (dy && k->y_direct()) {
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
  if (k->dwl_p != k->dwl && dw) steps.push_back(reorder_step(k->dwl, k->dwl_p, "rnn dW -> ldigo"));
  if (k->dwi_p != k->dwi && dr) steps.push_back(reorder_step(k->dwi, k->dwi_p, "rnn dR -> ldigo"));
  // gradient arrays the rows do not cover (a parameter sliced in part) hold zeros elsewhere
  std::vector<std::pair<void*, std::size_t>> zeros;
  for (const auto& z : zero) zeros.emplace_back(address(z, 0, "rnn gradient"), z.nbytes());
  auto wrows = dw ? row_pointers(*dw, D * G * H, C, "dW") : std::vector<float*>();
  auto rrows = dr ? row_pointers(*dr, D * G * H, H, "dR") : std::vector<float*>();
  auto brows = db ? row_pointers(*db, D * 2 * G, H, "dB") : std::vector<float*>();
  steps.push_back(std::make_shared<LambdaStep>(
      "rnn weight gradients -> ONNX rows", [k, zeros, wrows, rrows, brows] {
        for (const auto& [p, n] : zeros) std::memset(p, 0, n);
        const std::int64_t D = k->D, G = k->G, H = k->H;
        if (!wrows.empty()) weights_to_rows(k->dwl_p, wrows, D, G, H, k->C, k->perm);
        if (!rrows.empty()) weights_to_rows(k->dwi_p, rrows, D, G, H, H, k->perm);
        if (brows.empty()) return;
        const float* in = k->f32(k->dbias);
        for (std::int64_t d = 0; d < D; ++d) {
          float* const* wb = brows.data() + d * 2 * G;
          float* const* rb = wb + G;
          for (std::int64_t g = 0; g < G; ++g) {
            const float* src = in + (d * k->GB + g) * H;
            std::copy(src, src + H, wb[k->perm[g]]);
            // linear-before-reset: o's hidden half has a bias of its own
            const float* rsrc = (k->cell == "lbr_gru" && g == 2) ? src + H : src;
            std::copy(rsrc, rsrc + H, rb[k->perm[g]]);
          }
        }
      }));
  return steps;
}

}  // namespace

void bind_rnn(py::module_& m) {
  py::class_<RnnKernel, RnnPtr>(m, "RNN",
                                "One ONNX LSTM or GRU layer's oneDNN primitives for one shape.")
      .def(py::init<std::string, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                    std::string, bool, std::string>(),
           py::arg("cell"), py::arg("steps"), py::arg("batch"), py::arg("input_size"),
           py::arg("hidden_size"), py::arg("direction"), py::arg("training"),
           py::arg("output") = "onnx")
      .def_readonly("info", &RnnKernel::info)
      .def_readonly("internal_bytes", &RnnKernel::internal_bytes)
      .def("prepare", &prepare, py::arg("w"), py::arg("r"), py::arg("b"))
      .def("forward", &forward, py::arg("x"), py::arg("h0"), py::arg("c0"), py::arg("y"),
           py::arg("y_h"), py::arg("y_c"))
      .def("backward", &backward, py::arg("x"), py::arg("h0"), py::arg("c0"), py::arg("y"),
           py::arg("y_h"), py::arg("y_c"), py::arg("dy"), py::arg("dy_h"), py::arg("dy_c"),
           py::arg("dx"), py::arg("dw"), py::arg("dr"), py::arg("db"), py::arg("dh0"),
           py::arg("dc0"), py::arg("zero"));
}

}  // namespace meta::plan
