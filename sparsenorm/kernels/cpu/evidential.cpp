// Fused CPU forward of ev-softmax (Eq. 7), its training form (Eq. 10) and the log of Eq. 10.
//
// One call handles a contiguous (rows, K) float32/float64 tensor, normalizing each row; rows are
// split across threads with at::parallel_for. Per row, as many passes as softmax itself:
//   1. sum, max and min together (the sum in double, over partial sums of 4 entries per SIMD
//      lane); the max is always on the support;
//   2. exp(z - max) and its sum, z = x on the support and, off it, x + shift (Eq. 10) or
//      "absent" (Eq. 7);
//   3. normalize (log form: (z - max) - log(sum)).
// The rules are those of sparsenorm/kernels/reference/evidential.py, row by row: entries at or
// below finfo.min / 2 (-inf included) are not there (left out of the mean, probability 0, log
// -inf); the threshold is min(mean, max) (ties with the mean kept); a row with no entry that is
// there gives zeros (log: -inf); NaN or +inf gives a NaN row. Probabilities are exp(x - max) on
// the support, so their accuracy is that of softmax.
//
// The CPU_CAPABILITY_* macro that selects at::vec's SIMD width is set by the build script to
// the one ATen dispatches to on this machine (so exp is the same Sleef routine torch links).
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace {

using at::vec::Vectorized;

enum class Kind : int64_t {
  kSupport = 0,  // Eq. 7: off-support entries are absent (probability 0, log -inf)
  kTrain = 1,    // Eq. 10: off-support entries shifted by log(eps) - log1p(eps)
};

template <typename scalar_t>
struct RowStats {
  double sum = 0.0;
  scalar_t max = -std::numeric_limits<scalar_t>::infinity();
  scalar_t min = std::numeric_limits<scalar_t>::infinity();
};

template <typename scalar_t>
RowStats<scalar_t> sum_and_max(const scalar_t* x, int64_t k) {
  using Vec = Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  constexpr int64_t kBlock = 4 * W;  // summed in scalar_t (4 adds per lane), then added in double
  // NaN is caught by the sum (non-finite rows are rescanned), so max may ignore it.
  Vec vmax(-std::numeric_limits<scalar_t>::infinity());
  Vec vmin(std::numeric_limits<scalar_t>::infinity());
  double lane_sums[W] = {};
  scalar_t block[W];
  int64_t i = 0;
  for (; i + kBlock <= k; i += kBlock) {
    Vec a = Vec::loadu(x + i), b = Vec::loadu(x + i + W), c = Vec::loadu(x + i + 2 * W),
        d = Vec::loadu(x + i + 3 * W);
    vmax = at::vec::maximum(vmax, at::vec::maximum(at::vec::maximum(a, b), at::vec::maximum(c, d)));
    vmin = at::vec::minimum(vmin, at::vec::minimum(at::vec::minimum(a, b), at::vec::minimum(c, d)));
    ((a + b) + (c + d)).store(block);
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) lane_sums[j] += static_cast<double>(block[j]);
  }
  // Horizontal reductions as trees: a serial loop over the lanes costs as much as a short row.
  scalar_t mx = at::vec::vec_reduce_all<scalar_t>(
      [](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }, vmax);
  scalar_t mn = at::vec::vec_reduce_all<scalar_t>(
      [](const Vec& a, const Vec& b) { return at::vec::minimum(a, b); }, vmin);
  for (int64_t w = W / 2; w > 0; w /= 2) {
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) lane_sums[j] += lane_sums[j + w];
  }
  double sum = lane_sums[0];
  for (; i < k; ++i) {
    sum += static_cast<double>(x[i]);
    mx = x[i] > mx ? x[i] : mx;
    mn = x[i] < mn ? x[i] : mn;
  }
  return {sum, mx, mn};
}

// Whether x counts as on the support of threshold thr (ties kept, Eq. 7).
template <typename scalar_t>
inline bool on_support(scalar_t v, scalar_t thr) {
  return v >= thr;
}

// z of one vector: x on the support; off it x + shift (kTrain) or -inf (kSupport); with
// `absent`, entries at or below `level` are -inf (kSupport needs no test: they are below thr).
template <typename scalar_t, Kind kind, bool absent>
inline Vectorized<scalar_t> shifted(const Vectorized<scalar_t>& v, const Vectorized<scalar_t>& thr,
                                    const Vectorized<scalar_t>& off_value, const Vectorized<scalar_t>& level) {
  using Vec = Vectorized<scalar_t>;
  const Vec keep = v >= thr;
  if (kind == Kind::kSupport) {
    return Vec::blendv(off_value, v, keep);  // off_value = -inf
  }
  Vec z = v + Vec::blendv(off_value, Vec(scalar_t(0)), keep);
  if (absent) {
    z = Vec::blendv(Vec(-std::numeric_limits<scalar_t>::infinity()), z, v > level);
  }
  return z;
}

template <typename scalar_t, Kind kind, bool absent>
inline scalar_t shifted_scalar(scalar_t v, scalar_t thr, scalar_t shift, scalar_t level) {
  constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
  if (absent && !(v > level)) return -kInf;
  if (on_support(v, thr)) return v;
  return kind == Kind::kSupport ? -kInf : v + shift;
}

// Passes 2 and 3 on one row with its threshold and max (max finite and on the support).
template <typename scalar_t, Kind kind, bool log_output, bool absent>
void normalize_row(const scalar_t* x, scalar_t* out, int64_t k, scalar_t thr, scalar_t mx, scalar_t shift,
                   scalar_t level) {
  using Vec = Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  const Vec vthr(thr), vmax(mx), vlevel(level);
  const Vec off_value(kind == Kind::kSupport ? -std::numeric_limits<scalar_t>::infinity() : shift);
  const int64_t k_vec = k - k % W;

  Vec acc(scalar_t(0));
  for (int64_t i = 0; i < k_vec; i += W) {
    Vec v = Vec::loadu(x + i);
    Vec e = (shifted<scalar_t, kind, absent>(v, vthr, off_value, vlevel) - vmax).exp();
    if (!log_output) e.store(out + i);
    acc = acc + e;
  }
  scalar_t sum = at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return a + b; }, acc);
  for (int64_t i = k_vec; i < k; ++i) {
    scalar_t e = std::exp(shifted_scalar<scalar_t, kind, absent>(x[i], thr, shift, level) - mx);
    if (!log_output) out[i] = e;
    sum += e;
  }

  if (log_output) {
    // (z - max) - log(sum), as torch.log_softmax: z - (max + log(sum)) rounds the offset to the
    // ulp of max, an error of eps * |max| (3e-5 at max = 512 in float32; found by the fuzz suite).
    const scalar_t log_sum = std::log(sum);
    const Vec vlog_sum(log_sum);
    for (int64_t i = 0; i < k_vec; i += W) {
      Vec v = Vec::loadu(x + i);
      ((shifted<scalar_t, kind, absent>(v, vthr, off_value, vlevel) - vmax) - vlog_sum).store(out + i);
    }
    for (int64_t i = k_vec; i < k; ++i)
      out[i] = (shifted_scalar<scalar_t, kind, absent>(x[i], thr, shift, level) - mx) - log_sum;
  } else {
    const Vec vinv(scalar_t(1) / sum);
    for (int64_t i = 0; i < k_vec; i += W) (Vec::loadu(out + i) * vinv).store(out + i);
    for (int64_t i = k_vec; i < k; ++i) out[i] *= scalar_t(1) / sum;
  }
}

template <typename scalar_t, Kind kind, bool log_output>
void forward_row(const scalar_t* x, scalar_t* out, int64_t k, scalar_t shift) {
  constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
  const scalar_t level = std::numeric_limits<scalar_t>::lowest() / 2;
  const RowStats<scalar_t> stats = sum_and_max(x, k);
  const scalar_t mx = stats.max;
  if (std::isfinite(stats.sum) && stats.min > level) {
    // Every entry is there: the mean of the row, capped at its max (rounding can put the mean
    // of near-equal entries above all of them).
    const scalar_t mean = static_cast<scalar_t>(stats.sum / static_cast<double>(k));
    normalize_row<scalar_t, kind, log_output, false>(x, out, k, std::min(mean, mx), mx, shift, level);
    return;
  }
  // NaN or +inf makes the row NaN; otherwise the mean is over the entries that are there,
  // capped at the max; no entry there -> an empty row.
  int64_t count = 0;
  double total = 0.0;
  bool poisoned = false;
  for (int64_t i = 0; i < k; ++i) {
    if (std::isnan(x[i]) || x[i] == kInf) poisoned = true;
    if (x[i] > level) {
      ++count;
      total += static_cast<double>(x[i]);
    }
  }
  if (poisoned) {
    std::fill(out, out + k, std::numeric_limits<scalar_t>::quiet_NaN());
    return;
  }
  if (count == 0) {
    std::fill(out, out + k, log_output ? -kInf : scalar_t(0));
    return;
  }
  const scalar_t thr = std::min(static_cast<scalar_t>(total / static_cast<double>(count)), mx);
  normalize_row<scalar_t, kind, log_output, true>(x, out, k, thr, mx, shift, level);
}

}  // namespace

// kind 0: Eq. 7, 1: Eq. 10 with off-support shift `shift` = log(eps) - log1p(eps).
at::Tensor ev_softmax_forward(const at::Tensor& x, int64_t kind, double shift, bool log_output) {
  TORCH_CHECK(x.device().is_cpu(), "ev_softmax_forward: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "ev_softmax_forward: expects a contiguous 2-D tensor");
  TORCH_CHECK(x.size(1) > 0, "ev_softmax_forward: rows must be non-empty");
  TORCH_CHECK(kind == 0 || kind == 1, "ev_softmax_forward: kind must be 0 or 1");
  at::Tensor out = at::empty_like(x);
  const int64_t rows = x.size(0), k = x.size(1);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ev_softmax_forward", [&] {
    const scalar_t* in_ptr = x.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / k);
    auto run = [&](auto row_fn) {
      at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          row_fn(in_ptr + r * k, out_ptr + r * k, k, static_cast<scalar_t>(shift));
        }
      });
    };
    // The mode is a template argument so that the inner loops carry no branches.
    if (kind == 0) {
      log_output ? run(forward_row<scalar_t, Kind::kSupport, true>) : run(forward_row<scalar_t, Kind::kSupport, false>);
    } else {
      log_output ? run(forward_row<scalar_t, Kind::kTrain, true>) : run(forward_row<scalar_t, Kind::kTrain, false>);
    }
  });
  return out;
}

namespace {

// Backward of the log form from its output y = log p: grad = g - exp(y) sum(g) with the sum and
// the result over the entries whose y is not -inf only (a -inf output is constant: not there, or
// off the support of Eq. 7); NaN outputs give NaN. Two SIMD passes, as log_softmax's backward,
// with the -inf zeroing folded in (no masked copy of g).
template <typename scalar_t>
void log_backward_row(const scalar_t* g, const scalar_t* y, scalar_t* out, int64_t k) {
  using Vec = Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  const Vec neg_inf(-std::numeric_limits<scalar_t>::infinity()), zero(scalar_t(0));
  Vec vsum(scalar_t(0));
  int64_t i = 0;
  for (; i + W <= k; i += W) {
    vsum = vsum + Vec::blendv(zero, Vec::loadu(g + i), Vec::loadu(y + i) != neg_inf);
  }
  scalar_t sum = at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return a + b; }, vsum);
  for (; i < k; ++i) sum += y[i] != -std::numeric_limits<scalar_t>::infinity() ? g[i] : scalar_t(0);
  const Vec vs(sum);
  i = 0;
  for (; i + W <= k; i += W) {
    const Vec yv = Vec::loadu(y + i);
    Vec::blendv(zero, Vec::loadu(g + i) - yv.exp() * vs, yv != neg_inf).store(out + i);
  }
  for (; i < k; ++i) {
    out[i] = y[i] != -std::numeric_limits<scalar_t>::infinity() ? g[i] - std::exp(y[i]) * sum : scalar_t(0);
  }
}

}  // namespace

at::Tensor log_backward(const at::Tensor& g, const at::Tensor& y) {
  TORCH_CHECK(g.device().is_cpu() && y.device().is_cpu(), "log_backward: CPU tensors only");
  TORCH_CHECK(y.dim() == 2 && y.is_contiguous() && g.is_contiguous() && g.sizes() == y.sizes() &&
              g.scalar_type() == y.scalar_type(), "log_backward: expects contiguous 2-D tensors of one shape and dtype");
  at::Tensor out = at::empty_like(y);
  const int64_t rows = y.size(0), k = y.size(1);
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "ev_softmax_log_backward", [&] {
    const scalar_t* g_ptr = g.const_data_ptr<scalar_t>();
    const scalar_t* y_ptr = y.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1));
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) log_backward_row(g_ptr + r * k, y_ptr + r * k, out_ptr + r * k, k);
    });
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// The autograd kernel of sparsenorm::ev_softmax on CPU (dispatch key AutogradCPU).
//
// Why: the op's Python autograd (register_autograd in sparsenorm/kernels/ops/evidential.py) runs per
// forward+backward in Python frames (the generated autograd.Function, redispatch, setup_context),
// several times the row work at small shapes (benchmarks/results/tuning_cpu.json#cpp_autograd). This kernel, loaded with the extension, takes the
// AutogradCPU key (more specific than the Autograd alias the Python one is registered under), so
// CPU tensors get the same graph node from C++. The formulas are kernels/ops/evidential.py's, op for op, so gradients
// are bit-identical; other devices keep the Python autograd.
//
// The forward always redispatches to the op below autograd (never the raw kernel above): the
// op's registered CPU implementation then decides, as before, between this extension and the
// reference (sparsenorm.kernels.disabled(), use_cpu_kernels, SPARSENORM_CPU_KERNELS, empty rows),
// and fake, functional or batched tensors (torch.compile, vmap), which reach this key too, get
// their own handling.
// ---------------------------------------------------------------------------------------------
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor ev_softmax_op(const at::Tensor& x, std::optional<double> eps, bool log_output) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sparsenorm::ev_softmax", "")
                             .typed<at::Tensor(const at::Tensor&, std::optional<double>, bool)>();
  return op.call(x, eps, log_output);
}

// Called with grad mode off only, so below autograd: the op has no autograd formula, and the Python
// autograd layer torch.library puts on every custom op would only pass the call on (in Python frames).
at::Tensor ev_softmax_log_backward_op(const at::Tensor& grad, const at::Tensor& out) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sparsenorm::ev_softmax_log_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, out);
}

class EvSoftmaxFunction : public torch::autograd::Function<EvSoftmaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::optional<double> eps, bool log_output) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor out = ev_softmax_op(x, eps, log_output);
    ctx->saved_data["log"] = log_output;
    ctx->save_for_backward({out});
    return out;
  }

  // kernels/ops/evidential.py's _ev_softmax_backward: closed form from the saved output.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    const at::Tensor& grad = grads[0];
    at::Tensor dx;
    if (!ctx->saved_data["log"].toBool()) {
      dx = at::_softmax_backward_data(grad, out, -1, out.scalar_type());  // differentiable: double backward
    } else if (!at::GradMode::is_enabled()) {
      dx = ev_softmax_log_backward_op(grad.to(out.scalar_type()).expand_as(out), out);  // the fused op
    } else {  // create_graph: kernels/ops/evidential.py's _log_backward_reference, differentiable (a -inf output is constant)
      const at::Tensor kept = grad.masked_fill(out == -std::numeric_limits<double>::infinity(), 0.0);
      dx = at::_log_softmax_backward_data(kept, out, -1, out.scalar_type());
    }
    return {dx, at::Tensor(), at::Tensor()};  // eps and log: no gradient
  }
};

at::Tensor ev_softmax_autograd(const at::Tensor& x, std::optional<double> eps, bool log_output) {
  if (!(at::GradMode::is_enabled() && x.requires_grad())) {  // no graph to record: just the op below
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return ev_softmax_op(x, eps, log_output);
  }
  return EvSoftmaxFunction::apply(x, eps, log_output);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsenorm, AutogradCPU, m) {
  m.impl("ev_softmax", TORCH_FN(ev_softmax_autograd));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("log_backward", &log_backward,
        "Backward of the log form from its output (the -inf entries get 0) over the rows of a 2-D tensor");
  m.def("ev_softmax_forward", &ev_softmax_forward,
        "Fused forward of ev-softmax (kind 0) / Eq. 10 (kind 1) over the rows of a contiguous 2-D tensor");
}
