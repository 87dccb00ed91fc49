// Fused CPU forward and backward of sparsemax and 1.5-entmax, and of sparsehourglass (sparsemax of
// a rescaled row), see sparsenorm/kernels/cpu/__init__.py.
//
// One call handles a contiguous (rows, K) float32/float64 tensor, normalizing each row; rows are
// split across threads with at::parallel_for. Per row:
//   1. the row max (and whether the row holds NaN or +inf: such rows are NaN);
//   2. the exact threshold without sorting (threshold_by_iteration: Michelot's iteration for
//      sparsemax, root/Newton steps for 1.5-entmax, as the Triton kernel), over the whole row
//      when it is short (SIMD passes) and else over the candidates z = x - max (halved for
//      1.5-entmax) above the threshold's lower bound (tau >= -1: sparsemax's p_max = -tau <= 1,
//      entmax's p_max = tau^2 <= 1), gathered once. Rows that take more than 64 passes fall back
//      to sorting the candidates and the entmax package's sort-based formula (Martins & Astudillo
//      2016, Alg. 1; Peters et al. 2019, Alg. 2);
//   3. write p = [z - tau]_+ (squared for 1.5-entmax).
// Rows with no entry above finfo.min / 2 ("not there") give zeros. Backward: w = 1{p > 0} (sparsemax) or sqrt(p)
// (1.5-entmax), grad = w * (g - sum(w g) / sum(w)), in two SIMD passes (at::vec).
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace {

template <typename scalar_t>
void write_output(const scalar_t* x, scalar_t* out, int64_t k, scalar_t mx, scalar_t half, scalar_t tau,
                  bool entmax);

// Sums over the entries u = (v - shift) * half above tau: sum (u - tau), sum (u - tau)^2
// (1.5-entmax only) and their count. Four independent accumulators per sum: with one, each SIMD
// step waits on the previous add (the loop ran at ~8 cycles per 16 floats, latency-bound, perf
// annotate); the count is kept in scalar_t lanes (widening a mask to int64 lanes cost as much again)
// and flushed to int64 every kCountBlock entries, so a lane never counts past 2^24 (exact in float).
template <typename scalar_t>
struct AboveSums {
  scalar_t s1 = 0, s2 = 0;
  int64_t n = 0;
};

template <typename scalar_t, bool entmax>
AboveSums<scalar_t> sums_above(const scalar_t* v, int64_t len, scalar_t shift, scalar_t half, scalar_t tau) {
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  constexpr int64_t kUnroll = 4;
  constexpr int64_t kCountBlock = int64_t(1) << 20;  // a multiple of kUnroll * W
  const auto add = [](const Vec& a, const Vec& b) { return a + b; };
  const Vec vshift(shift), vhalf(half), vtau(tau), vzero(scalar_t(0)), vone(scalar_t(1));
  Vec s1[kUnroll], s2[kUnroll];
  for (int u = 0; u < kUnroll; ++u) s1[u] = s2[u] = vzero;
  AboveSums<scalar_t> out;
  const int64_t body = len - len % (kUnroll * W);
  int64_t i = 0;
  while (i < body) {
    const int64_t block_end = std::min(body, i + kCountBlock);
    Vec count[kUnroll];
    for (int u = 0; u < kUnroll; ++u) count[u] = vzero;
    for (; i < block_end; i += kUnroll * W) {
      for (int u = 0; u < kUnroll; ++u) {
        const Vec d = (Vec::loadu(v + i + u * W) - vshift) * vhalf - vtau;
        const Vec on = d > vzero;  // all-ones lanes where d > 0 (NaN: not counted, as before)
        const Vec kept = Vec::blendv(vzero, d, on);
        s1[u] = s1[u] + kept;
        if (entmax) s2[u] = s2[u] + kept * kept;
        count[u] = count[u] + Vec::blendv(vzero, vone, on);
      }
    }
    out.n += static_cast<int64_t>(
        at::vec::vec_reduce_all<scalar_t>(add, (count[0] + count[1]) + (count[2] + count[3])));
  }
  out.s1 = at::vec::vec_reduce_all<scalar_t>(add, (s1[0] + s1[1]) + (s1[2] + s1[3]));
  if (entmax) out.s2 = at::vec::vec_reduce_all<scalar_t>(add, (s2[0] + s2[1]) + (s2[2] + s2[3]));
  for (; i < len; ++i) {
    const scalar_t d = (v[i] - shift) * half - tau;
    if (d > 0) {
      out.s1 += d;
      if (entmax) out.s2 += d * d;
      ++out.n;
    }
  }
  return out;
}

// The exact threshold without sorting, on the candidates u (row max 0, every entry of the support
// among them; 1.5-entmax in units of x / 2), as the Triton kernel (kernels/triton/projection.py):
// * sparsemax: Michelot's iteration from the lower bound tau = -1: tau = (sum_S u - 1) / |S| over
//   S = {u > tau} increases, S shrinks, and once |S| stops changing tau is exact;
// * 1.5-entmax: f(tau) = sum (u - tau)_+^2 - 1 is convex and decreasing. From a lower bound
//   (f >= 0) the smaller root of sum_S (u - t)^2 = 1 over S = {u > tau} is exact if S is the
//   support and an upper bound otherwise; from an upper bound a Newton step lands below the root
//   again. The root is accepted once S stops changing (or f vanishes to rounding).
// Returns false (the caller sorts) if that takes more than 64 passes (adversarial rows).
// The entries are u_i = (v_i - shift) * half: the candidates as gathered (shift 0, half 1, exact)
// or a whole short row (shift = its max; entries not there give -inf or far below -1).
template <typename scalar_t, bool entmax>
bool threshold_by_iteration(const scalar_t* v, int64_t n_cand, scalar_t shift, scalar_t half, scalar_t* tau_out) {
  const scalar_t eps = std::numeric_limits<scalar_t>::epsilon();
  scalar_t tau = -1;
  int64_t prev_n = -1;
  bool was_root = false;
  for (int it = 0; it < 64; ++it) {
    const AboveSums<scalar_t> sums = sums_above<scalar_t, entmax>(v, n_cand, shift, half, tau);
    const scalar_t s1 = sums.s1, s2 = sums.s2;
    const int64_t n = sums.n;
    if (n == 0) {  // tau at the max: only from rounding; the current tau is the answer
      *tau_out = tau;
      return true;
    }
    const scalar_t rho = static_cast<scalar_t>(n);
    if (!entmax) {
      const scalar_t final = tau + (s1 - 1) / rho;  // (sum_S u - 1) / |S|, relative to tau
      if (n == prev_n) {
        *tau_out = final;
        return true;
      }
      prev_n = n;
      tau = std::max(tau, final);
      continue;
    }
    const scalar_t f = s2 - 1;
    const scalar_t disc = s1 * s1 - rho * f;
    const scalar_t final = tau + (s1 - std::sqrt(disc > 0 ? disc : scalar_t(0))) / rho;
    if ((was_root && n == prev_n) || std::abs(f) <= 16 * eps) {
      *tau_out = final;
      return true;
    }
    was_root = f >= 0;
    tau = was_root ? final : tau + f / (2 * s1);
    prev_n = n;
  }
  return false;
}

template <typename scalar_t>
bool threshold_by_iteration(const scalar_t* v, int64_t n_cand, scalar_t shift, scalar_t half, bool entmax,
                            scalar_t* tau_out) {
  return entmax ? threshold_by_iteration<scalar_t, true>(v, n_cand, shift, half, tau_out)
                : threshold_by_iteration<scalar_t, false>(v, n_cand, shift, half, tau_out);
}

// The row max, NaN if the row holds NaN (at::vec::maximum propagates it), in four independent
// SIMD chains (one chain waits on each max's latency).
template <typename scalar_t>
scalar_t row_max(const scalar_t* x, int64_t k) {
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  const auto vmax = [](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); };
  Vec m[4];
  for (auto& a : m) a = Vec(-std::numeric_limits<scalar_t>::infinity());
  int64_t i = 0;
  for (; i + 4 * W <= k; i += 4 * W) {
    for (int u = 0; u < 4; ++u) m[u] = at::vec::maximum(m[u], Vec::loadu(x + i + u * W));
  }
  scalar_t mx = at::vec::vec_reduce_all<scalar_t>(vmax, vmax(vmax(m[0], m[1]), vmax(m[2], m[3])));
  for (; i < k; ++i) mx = (x[i] > mx || x[i] != x[i]) ? x[i] : mx;  // a NaN max stays NaN
  return mx;
}

constexpr int64_t kWholeRow = 1024;

// What row_threshold found about a row.
enum class RowKind { kNaN, kEmpty, kThreshold };

// The row's max and its exact threshold tau, p = [(x - max) half - tau]_+ (squared for 1.5-entmax,
// half = 1/2; sparsemax half = 1). kNaN: the row holds NaN or +inf; kEmpty: no entry is there.
template <typename scalar_t>
RowKind row_threshold(const scalar_t* x, int64_t k, bool entmax, std::vector<scalar_t>& cand, scalar_t* mx_out,
                      scalar_t* tau_out) {
  const scalar_t mx = row_max(x, k);
  *mx_out = mx;
  if (mx != mx || mx == std::numeric_limits<scalar_t>::infinity()) return RowKind::kNaN;
  if (mx <= std::numeric_limits<scalar_t>::lowest() / 2) return RowKind::kEmpty;
  const scalar_t half = entmax ? scalar_t(0.5) : scalar_t(1);
  // Window in units of x, widened beyond rounding so that no candidate is lost.
  const scalar_t offset = (entmax ? scalar_t(2) : scalar_t(1)) * scalar_t(1.001) +
                          8 * std::numeric_limits<scalar_t>::epsilon() * std::abs(mx);
  const scalar_t lo = mx - offset;
  // A short row is iterated on whole (each pass a few SIMD steps), a long one on its candidates.
  if (k <= kWholeRow && threshold_by_iteration(x, k, mx, half, entmax, tau_out)) return RowKind::kThreshold;
  // Gather the candidates branch-free (write, then advance on the test) into a buffer of K.
  // A SIMD test first skips the vectors with no candidate (most of a long row: the scalar gather
  // was ~70 % of entmax15's forward at K = 32000 in the issue 28 profile); same candidates, same order.
  if (static_cast<int64_t>(cand.size()) < k) cand.resize(k);  // kept across rows (no shrinking)
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  constexpr int kNoneAbove = (1 << W) - 1;  // zero_mask of a compare with no lane true
  const Vec vlo(lo);
  int64_t n_cand = 0, i = 0;
  for (; i + W <= k; i += W) {
    if ((Vec::loadu(x + i) > vlo).zero_mask() == kNoneAbove) continue;
    for (int64_t j = i; j < i + W; ++j) {
      cand[n_cand] = (x[j] - mx) * half;
      n_cand += x[j] > lo;
    }
  }
  for (; i < k; ++i) {
    cand[n_cand] = (x[i] - mx) * half;
    n_cand += x[i] > lo;
  }
  if (threshold_by_iteration(cand.data(), n_cand, scalar_t(0), scalar_t(1), entmax, tau_out)) {
    return RowKind::kThreshold;
  }
  std::sort(cand.begin(), cand.begin() + n_cand, std::greater<scalar_t>());
  // As the entmax package: the support size is the NUMBER of prefixes passing the test.
  int64_t support = 0;
  scalar_t tau_at = 0;
  scalar_t s = 0, s2 = 0;
  std::vector<scalar_t>& taus = cand;  // overwritten in place: cand[r] is read before taus[r] is set
  for (int64_t r = 0; r < n_cand; ++r) {
    const scalar_t rho = scalar_t(r + 1);
    const scalar_t z = cand[r];
    s += z;
    scalar_t t;
    bool pass;
    if (!entmax) {
      t = (s - 1) / rho;
      pass = rho * z > s - 1;
    } else {
      s2 += z * z;
      const scalar_t mean = s / rho;
      const scalar_t mean_sq = s2 / rho;
      const scalar_t delta = (1 - rho * (mean_sq - mean * mean)) / rho;
      t = mean - std::sqrt(delta > 0 ? delta : scalar_t(0));
      pass = t <= z;
    }
    taus[r] = t;
    support += pass ? 1 : 0;
  }
  if (support > 0) tau_at = taus[support - 1];
  *tau_out = tau_at;
  return RowKind::kThreshold;
}

template <typename scalar_t>
void forward_row(const scalar_t* x, scalar_t* out, int64_t k, bool entmax, std::vector<scalar_t>& cand) {
  scalar_t mx, tau;
  switch (row_threshold(x, k, entmax, cand, &mx, &tau)) {
    case RowKind::kNaN:
      std::fill(out, out + k, std::numeric_limits<scalar_t>::quiet_NaN());
      return;
    case RowKind::kEmpty:
      std::fill(out, out + k, scalar_t(0));
      return;
    case RowKind::kThreshold:
      write_output(x, out, k, mx, entmax ? scalar_t(0.5) : scalar_t(1), tau, entmax);
  }
}

// p = [(x - max) half - tau]_+ (squared for 1.5-entmax).
template <typename scalar_t>
void write_output(const scalar_t* x, scalar_t* out, int64_t k, scalar_t mx, scalar_t half, scalar_t tau,
                  bool entmax) {
  if (entmax) {
#pragma omp simd
    for (int64_t i = 0; i < k; ++i) {
      scalar_t p = (x[i] - mx) * half - tau;
      p = p > 0 ? p : scalar_t(0);
      out[i] = p * p;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < k; ++i) {
      const scalar_t p = (x[i] - mx) - tau;
      out[i] = p > 0 ? p : scalar_t(0);
    }
  }
}

torch::Tensor forward(const torch::Tensor& x, bool entmax) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "expected a contiguous 2-D CPU tensor");
  auto out = torch::empty_like(x);
  const int64_t rows = x.size(0), k = x.size(1);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sparsemax_forward", [&] {
    const scalar_t* in_ptr = x.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> cand;
      cand.reserve(64);
      for (int64_t r = begin; r < end; ++r) forward_row<scalar_t>(in_ptr + r * k, out_ptr + r * k, k, entmax, cand);
    });
  });
  return out;
}

// Each row's threshold relative to its max, in units of x: p = [(x - max) - tau]_+ (sparsemax) or
// [((x - max) - tau) / 2]_+^2 (1.5-entmax; tau = 2 x the half-unit threshold row_threshold finds,
// exact: a product by 2). NaN rows give NaN, rows with no entry there 0. The blockwise attention
// solves a query block's kept score rows with it (kernels/ops/projection_attention.py).
torch::Tensor thresholds(const torch::Tensor& x, bool entmax) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "expected a contiguous 2-D CPU tensor");
  auto tau = torch::empty({x.size(0)}, x.options());
  const int64_t rows = x.size(0), k = x.size(1);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "projection_thresholds", [&] {
    const scalar_t* in_ptr = x.const_data_ptr<scalar_t>();
    scalar_t* tau_ptr = tau.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> cand;
      cand.reserve(64);
      for (int64_t r = begin; r < end; ++r) {
        scalar_t mx, t;
        switch (row_threshold<scalar_t>(in_ptr + r * k, k, entmax, cand, &mx, &t)) {
          case RowKind::kNaN:
            tau_ptr[r] = std::numeric_limits<scalar_t>::quiet_NaN();
            break;
          case RowKind::kEmpty:
            tau_ptr[r] = 0;
            break;
          case RowKind::kThreshold:
            tau_ptr[r] = entmax ? 2 * t : t;
        }
      }
    });
  });
  return tau;
}

// w = 1{p > 0} (sparsemax) or sqrt(p) (1.5-entmax); grad = w * (g - sum(w g) / sum(w)), in two
// SIMD passes that read p and g (w is recomputed in the second: cheaper than writing and reading
// it back). sqrt(0) = 0 exactly and sqrt(NaN) = NaN, so NaN rows stay NaN.
template <typename scalar_t>
inline at::vec::Vectorized<scalar_t> weight(const at::vec::Vectorized<scalar_t>& p, bool entmax) {
  using Vec = at::vec::Vectorized<scalar_t>;
  if (entmax) return p.sqrt();
  // 1 on the support, 0 off it, NaN for NaN: (p > 0) as 1/0, then p's NaN through a blend.
  const Vec on = Vec::blendv(Vec(scalar_t(0)), Vec(scalar_t(1)), p > Vec(scalar_t(0)));
  return Vec::blendv(on, p, p != p);
}

template <typename scalar_t>
inline scalar_t weight(scalar_t p, bool entmax) {
  if (entmax) return std::sqrt(p);
  return p != p ? p : (p > 0 ? scalar_t(1) : scalar_t(0));
}

template <typename scalar_t>
void backward_row(const scalar_t* pr, const scalar_t* gr, scalar_t* o, int64_t k, bool entmax) {
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  // Two independent accumulators per sum (one would wait on each add's latency).
  Vec vw[2] = {Vec(scalar_t(0)), Vec(scalar_t(0))}, vwg[2] = {Vec(scalar_t(0)), Vec(scalar_t(0))};
  int64_t i = 0;
  for (; i + 2 * W <= k; i += 2 * W) {
    for (int u = 0; u < 2; ++u) {
      const Vec w = weight(Vec::loadu(pr + i + u * W), entmax);
      vw[u] = vw[u] + w;
      vwg[u] = vwg[u] + w * Vec::loadu(gr + i + u * W);
    }
  }
  for (; i + W <= k; i += W) {
    const Vec w = weight(Vec::loadu(pr + i), entmax);
    vw[0] = vw[0] + w;
    vwg[0] = vwg[0] + w * Vec::loadu(gr + i);
  }
  const auto add = [](const Vec& a, const Vec& b) { return a + b; };
  scalar_t w_sum = at::vec::vec_reduce_all<scalar_t>(add, vw[0] + vw[1]);
  scalar_t wg_sum = at::vec::vec_reduce_all<scalar_t>(add, vwg[0] + vwg[1]);
  for (; i < k; ++i) {
    const scalar_t w = weight(pr[i], entmax);
    w_sum += w;
    wg_sum += w * gr[i];
  }
  const scalar_t q = w_sum != 0 ? wg_sum / w_sum : scalar_t(0);
  const Vec vq(q);
  i = 0;
  for (; i + W <= k; i += W) (weight(Vec::loadu(pr + i), entmax) * (Vec::loadu(gr + i) - vq)).store(o + i);
  for (; i < k; ++i) o[i] = weight(pr[i], entmax) * (gr[i] - q);
}

torch::Tensor backward(const torch::Tensor& p, const torch::Tensor& g, bool entmax) {
  TORCH_CHECK(p.dim() == 2 && p.is_contiguous() && g.is_contiguous() && p.sizes() == g.sizes(),
              "expected contiguous 2-D tensors of one shape");
  auto out = torch::empty_like(p);
  const int64_t rows = p.size(0), k = p.size(1);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "sparsemax_backward", [&] {
    const scalar_t* p_ptr = p.const_data_ptr<scalar_t>();
    const scalar_t* g_ptr = g.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        backward_row<scalar_t>(p_ptr + r * k, g_ptr + r * k, out_ptr + r * k, k, entmax);
      }
    });
  });
  return out;
}

// Sparsehourglass (Laha et al. 2018): sparsemax(alpha z) with alpha = (1 + qK) / (|sum z| + qK)
// over the K entries there (a row with none: alpha = 1). Forward: one pass for K and sum z (summed
// in double), the scaled row (not there: -inf) into a buffer, then sparsemax's row. Returns
// (p, alpha, sum z), the last two per row (x.shape[:-1] + (1,)).
template <typename scalar_t>
void hourglass_row(const scalar_t* x, scalar_t q, int64_t k, scalar_t* out, scalar_t* alpha_out, scalar_t* total_out,
                   std::vector<scalar_t>& scaled, std::vector<scalar_t>& cand) {
  const scalar_t level = std::numeric_limits<scalar_t>::lowest() / 2;
  double total = 0;
  int64_t there = 0;
#pragma omp simd reduction(+ : total, there)
  for (int64_t i = 0; i < k; ++i) {
    const bool in = !(x[i] <= level);  // NaN counts as there (its row is NaN)
    total += in ? static_cast<double>(x[i]) : 0.0;
    there += in ? 1 : 0;
  }
  const scalar_t sum = static_cast<scalar_t>(total);
  const scalar_t qk = q * static_cast<scalar_t>(there);
  const scalar_t alpha = there == 0 ? scalar_t(1) : (1 + qk) / (std::abs(sum) + qk);
  *alpha_out = alpha;
  *total_out = sum;
  if (static_cast<int64_t>(scaled.size()) < k) scaled.resize(k);
  const scalar_t neg_inf = -std::numeric_limits<scalar_t>::infinity();
#pragma omp simd
  for (int64_t i = 0; i < k; ++i) scaled[i] = x[i] <= level ? neg_inf : x[i] * alpha;
  forward_row<scalar_t>(scaled.data(), out, k, false, cand);
}

// The hourglass entry points take rows along the last dim of a tensor of any shape (made
// contiguous here) and per-row tensors broadcastable to x.shape[:-1] + (1,) (converted to x's
// dtype, expanded, made contiguous here), and return their outputs in those shapes, so the Python
// kernel wrappers pass their arguments as they are (benchmarks/results/tuning_cpu.json#python_dispatch).
std::vector<int64_t> hourglass_per_row_shape(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1 && x.device().is_cpu() && x.numel() > 0, "expected a non-empty CPU tensor of rows");
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = 1;
  return shape;
}

torch::Tensor hourglass_per_row(const torch::Tensor& v, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  TORCH_CHECK(v.device().is_cpu(), "expected CPU per-row tensors");
  return v.to(dtype).expand(shape).contiguous();
}

std::vector<torch::Tensor> hourglass_forward(const torch::Tensor& x_in, const torch::Tensor& q_in) {
  const std::vector<int64_t> shape = hourglass_per_row_shape(x_in);
  const torch::Tensor x = x_in.contiguous();
  const torch::Tensor q = hourglass_per_row(q_in, shape, x.scalar_type());
  auto out = torch::empty_like(x);
  const int64_t k = x.size(-1), rows = x.numel() / k;
  auto alpha = torch::empty(shape, x.options());
  auto total = torch::empty(shape, x.options());
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sparsehourglass_forward", [&] {
    const scalar_t* in_ptr = x.const_data_ptr<scalar_t>();
    const scalar_t* q_ptr = q.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    scalar_t* alpha_ptr = alpha.mutable_data_ptr<scalar_t>();
    scalar_t* total_ptr = total.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scaled, cand;
      for (int64_t r = begin; r < end; ++r) {
        hourglass_row<scalar_t>(in_ptr + r * k, q_ptr[r], k, out_ptr + r * k, alpha_ptr + r, total_ptr + r, scaled,
                                cand);
      }
    });
  });
  return {out, alpha, total};
}

// Backward: gy = s (g - mean_S g) (sparsemax's, s the support), c = sum_S gy z; for an entry
// there dL/dz = alpha gy + c d alpha / d(sum z), d alpha / d(sum z) = -alpha sign(sum z) / D with
// D = |sum z| + qK (0 for entries not there); dL/dq = c K (|sum z| - 1) / D^2. Returns (dL/dx,
// dL/dq per row). Two passes (sums; then the gradient).
template <typename scalar_t>
void hourglass_backward_row(const scalar_t* g, const scalar_t* p, const scalar_t* x, scalar_t alpha, scalar_t sum,
                            scalar_t q, int64_t k, scalar_t* out, scalar_t* dq) {
  const scalar_t level = std::numeric_limits<scalar_t>::lowest() / 2;
  scalar_t n_on = 0, g_on = 0, gz_on = 0, z_on = 0;
  int64_t there = 0;
#pragma omp simd reduction(+ : n_on, g_on, gz_on, z_on, there)
  for (int64_t i = 0; i < k; ++i) {
    const bool on = p[i] > 0;
    n_on += on ? scalar_t(1) : scalar_t(0);
    g_on += on ? g[i] : scalar_t(0);
    gz_on += on ? g[i] * x[i] : scalar_t(0);
    z_on += on ? x[i] : scalar_t(0);
    there += x[i] <= level ? 0 : 1;
  }
  const scalar_t mean = n_on > 0 ? g_on / n_on : scalar_t(0);
  const scalar_t c = gz_on - mean * z_on;  // sum_S (g - mean) z
  const scalar_t qk = q * static_cast<scalar_t>(there);
  const scalar_t d = std::abs(sum) + qk;
  const scalar_t sign = sum > 0 ? scalar_t(1) : (sum < 0 ? scalar_t(-1) : scalar_t(0));
  const scalar_t shift = there == 0 ? scalar_t(0) : -c * alpha * sign / d;
  *dq = there == 0 ? scalar_t(0) : c * static_cast<scalar_t>(there) * (std::abs(sum) - 1) / (d * d);
  const bool nan_row = p[0] != p[0];
#pragma omp simd
  for (int64_t i = 0; i < k; ++i) {
    const scalar_t gy = p[i] > 0 ? g[i] - mean : scalar_t(0);
    out[i] = x[i] <= level ? scalar_t(0) : alpha * gy + shift;
  }
  if (nan_row) std::fill(out, out + k, std::numeric_limits<scalar_t>::quiet_NaN());
}

// g is converted to p's dtype and broadcast to p's shape; x must have p's shape and dtype.
std::vector<torch::Tensor> hourglass_backward(const torch::Tensor& g_in, const torch::Tensor& p_in,
                                              const torch::Tensor& x_in, const torch::Tensor& alpha_in,
                                              const torch::Tensor& total_in, const torch::Tensor& q_in) {
  const std::vector<int64_t> shape = hourglass_per_row_shape(p_in);
  const torch::Tensor p = p_in.contiguous(), x = x_in.contiguous();
  const torch::Tensor g = g_in.to(p.scalar_type()).expand_as(p).contiguous();
  TORCH_CHECK(x.sizes() == p.sizes() && x.scalar_type() == p.scalar_type(), "expected x of p's shape and dtype");
  const torch::Tensor alpha = hourglass_per_row(alpha_in, shape, p.scalar_type());
  const torch::Tensor total = hourglass_per_row(total_in, shape, p.scalar_type());
  const torch::Tensor q = hourglass_per_row(q_in, shape, p.scalar_type());
  const int64_t k = p.size(-1), rows = p.numel() / k;
  auto out = torch::empty_like(p);
  auto dq = torch::empty(shape, p.options());
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "sparsehourglass_backward", [&] {
    const scalar_t* g_ptr = g.const_data_ptr<scalar_t>();
    const scalar_t* p_ptr = p.const_data_ptr<scalar_t>();
    const scalar_t* x_ptr = x.const_data_ptr<scalar_t>();
    const scalar_t* a_ptr = alpha.const_data_ptr<scalar_t>();
    const scalar_t* t_ptr = total.const_data_ptr<scalar_t>();
    const scalar_t* q_ptr = q.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    scalar_t* dq_ptr = dq.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        hourglass_backward_row<scalar_t>(g_ptr + r * k, p_ptr + r * k, x_ptr + r * k, a_ptr[r], t_ptr[r], q_ptr[r], k,
                                         out_ptr + r * k, dq_ptr + r);
      }
    });
  });
  return {out, dq};
}

// alpha-entmax (alpha > 1, one alpha for all rows) without bisection's fixed 50 passes: p_i =
// [(alpha - 1)(x_i - max) - tau]_+^(1 / (alpha - 1)) with f(tau) = sum p - 1 = 0 solved by Newton's
// method on (sum p)^(alpha - 1) - 1 (same root, nearly affine in tau) safeguarded by the bracket
// [-1, -(1/K)^(alpha - 1)] (f >= 0 >= f there; a step leaving the bracket bisects it instead),
// stopped when a step or the bracket is below rounding (|tau| <= 1, so that is within a few eps
// of the root). Then p, divided by its sum if ensure_sum_one. Rows
// with NaN or +inf give NaN, rows with no entry there (<= finfo.min / 2) zeros.
template <typename scalar_t>
void bisect_row(const scalar_t* x, scalar_t* out, int64_t k, scalar_t alpha, bool ensure_sum_one) {
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  const scalar_t inf = std::numeric_limits<scalar_t>::infinity();
  const scalar_t level = std::numeric_limits<scalar_t>::lowest() / 2;
  const scalar_t eps = std::numeric_limits<scalar_t>::epsilon();
  const scalar_t mx = row_max(x, k);
  if (mx != mx || mx == inf) {
    std::fill(out, out + k, std::numeric_limits<scalar_t>::quiet_NaN());
    return;
  }
  if (mx <= level) {
    std::fill(out, out + k, scalar_t(0));
    return;
  }
  const scalar_t am1 = alpha - 1, inv = 1 / am1;
  const bool square = inv == 2;  // alpha = 1.5: d^2 exactly
  // Otherwise d^inv as exp(inv log d) (Sleef's exp and log, within a few ulps each: an error of
  // about inv |log d| ulps, far cheaper than its pow).
  // (f(tau), f'(tau)) = (sum d^inv - 1, -inv sum d^(inv - 1)) over d = (x - max) am1 - tau > 0
  const auto evaluate = [&](scalar_t tau, scalar_t* f, scalar_t* fp) {
    const Vec vmx(mx), vam1(am1), vtau(tau), vzero(scalar_t(0)), vinv(inv), vlevel(level);
    Vec s(scalar_t(0)), sd(scalar_t(0));
    int64_t i = 0;
    for (; i + W <= k; i += W) {
      const Vec v = Vec::loadu(x + i);
      const Vec d = (v - vmx) * vam1 - vtau;
      const auto on = (d > vzero) & (v > vlevel);
      const Vec dpos = Vec::blendv(Vec(scalar_t(1)), d, on);
      const Vec pw = square ? dpos * dpos : (dpos.log() * vinv).exp();
      s = s + Vec::blendv(vzero, pw, on);
      // d^(inv - 1): for alpha = 1.5 d itself (a division per entry cost as much as the rest)
      sd = sd + Vec::blendv(vzero, square ? dpos : pw / dpos, on);
    }
    const auto add = [](const Vec& a, const Vec& b) { return a + b; };
    scalar_t sum = at::vec::vec_reduce_all<scalar_t>(add, s), sum_d = at::vec::vec_reduce_all<scalar_t>(add, sd);
    for (; i < k; ++i) {
      const scalar_t d = (x[i] - mx) * am1 - tau;
      if (d > 0 && x[i] > level) {
        const scalar_t pw = square ? d * d : std::pow(d, inv);
        sum += pw;
        sum_d += square ? d : pw / d;
      }
    }
    *f = sum - 1;
    *fp = -inv * sum_d;
  };
  scalar_t lo = -1, hi = -std::pow(scalar_t(1) / static_cast<scalar_t>(k), am1);
  scalar_t tau = lo, f, fp;
  evaluate(tau, &f, &fp);
  // |f| <= 8 eps is f at rounding: |f'| >= min(1, inv) there (sum d^(inv - 1) >= sum d^inv = 1
  // for d <= 1 when inv >= 1, and d^(inv - 1) >= 1 otherwise), so tau is within 8 eps / min(1, inv)
  // of the root; iterating further would chase the rounding of the sum.
  for (int it = 0; it < 200 && std::abs(f) > 8 * eps; ++it) {
    if (f > 0) lo = tau; else hi = tau;
    // Newton on g = (sum d^inv)^(alpha - 1) - 1 = S^am1 - 1 (the root of f; for alpha <= 2 a
    // norm of the d, convex and decreasing, so the steps from the lower bound stay below the root,
    // and nearly affine: one step is exact on a support of one), g' = S^(am1 - 1) f' / inv.
    const scalar_t S = f + 1;
    scalar_t next = tau - (std::pow(S, am1) - 1) * inv / (std::pow(S, am1 - 1) * fp);
    if (!(next > lo && next < hi)) next = lo + (hi - lo) / 2;  // outside the bracket (or NaN): bisect
    const scalar_t step = std::abs(next - tau);
    tau = next;
    if (step <= 2 * eps * std::max(std::abs(tau), std::numeric_limits<scalar_t>::min()) ||
        hi - lo <= 2 * eps * std::max(std::abs(lo), std::numeric_limits<scalar_t>::min())) {
      break;
    }
    evaluate(tau, &f, &fp);
  }
  const Vec vmx(mx), vam1(am1), vtau(tau), vzero(scalar_t(0)), vinv(inv), vlevel(level), vone(scalar_t(1));
  Vec vtotal(scalar_t(0));
  int64_t i = 0;
  for (; i + W <= k; i += W) {
    const Vec v = Vec::loadu(x + i);
    const Vec d = (v - vmx) * vam1 - vtau;
    const auto on = (d > vzero) & (v > vlevel);
    const Vec dpos = Vec::blendv(vone, d, on);
    const Vec p = Vec::blendv(vzero, square ? dpos * dpos : (dpos.log() * vinv).exp(), on);
    p.store(out + i);
    vtotal = vtotal + p;
  }
  scalar_t total = at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return a + b; }, vtotal);
  for (; i < k; ++i) {
    const scalar_t d = (x[i] - mx) * am1 - tau;
    const scalar_t p = (d > 0 && x[i] > level) ? (square ? d * d : std::pow(d, inv)) : scalar_t(0);
    out[i] = p;
    total += p;
  }
  if (ensure_sum_one && total > 0) {
    const Vec vt(total);
    i = 0;
    for (; i + W <= k; i += W) (Vec::loadu(out + i) / vt).store(out + i);
    for (; i < k; ++i) out[i] /= total;
  }
}

torch::Tensor bisect_forward(const torch::Tensor& x, double alpha, bool ensure_sum_one) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "expected a contiguous 2-D CPU tensor");
  TORCH_CHECK(alpha > 1, "bisect_forward: alpha must be > 1");
  auto out = torch::empty_like(x);
  const int64_t rows = x.size(0), k = x.size(1);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "entmax_bisect_forward", [&] {
    const scalar_t* in_ptr = x.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        bisect_row<scalar_t>(in_ptr + r * k, out_ptr + r * k, k, static_cast<scalar_t>(alpha), ensure_sum_one);
      }
    });
  });
  return out;
}

// Backward of alpha-entmax from p: w = p^(2 - alpha) on the support, grad = w (g - sum(w g) / sum(w)).
template <typename scalar_t>
void bisect_backward_row(const scalar_t* p, const scalar_t* g, scalar_t* o, int64_t k, scalar_t two_minus_alpha) {
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  const Vec vzero(scalar_t(0)), vone(scalar_t(1)), vexp(two_minus_alpha);
  const bool root = two_minus_alpha == scalar_t(0.5);  // alpha = 1.5: sqrt, as torch's pow(p, 0.5)
  Vec vw(scalar_t(0)), vwg(scalar_t(0));
  int64_t i = 0;
  for (; i + W <= k; i += W) {  // w stored for the second pass (one pow per entry)
    const Vec pv = Vec::loadu(p + i);
    const auto on = pv > vzero;
    // off the support 0, NaN stays NaN (p itself), on it p^(2 - alpha)
    const Vec base = Vec::blendv(vone, pv, on);
    const Vec w = Vec::blendv(Vec::blendv(vzero, pv, pv != pv), root ? base.sqrt() : base.pow(vexp), on);
    w.store(o + i);
    vw = vw + w;
    vwg = vwg + w * Vec::loadu(g + i);
  }
  const auto add = [](const Vec& a, const Vec& b) { return a + b; };
  scalar_t w_sum = at::vec::vec_reduce_all<scalar_t>(add, vw), wg_sum = at::vec::vec_reduce_all<scalar_t>(add, vwg);
  for (; i < k; ++i) {
    const scalar_t w = p[i] > 0 ? (root ? std::sqrt(p[i]) : std::pow(p[i], two_minus_alpha))
                                : (p[i] != p[i] ? p[i] : scalar_t(0));
    o[i] = w;
    w_sum += w;
    wg_sum += w * g[i];
  }
  const scalar_t q = w_sum > 0 ? wg_sum / w_sum : (w_sum != w_sum ? w_sum : scalar_t(0));
  const Vec vq(q);
  i = 0;
  for (; i + W <= k; i += W) (Vec::loadu(o + i) * (Vec::loadu(g + i) - vq)).store(o + i);
  for (; i < k; ++i) o[i] = o[i] * (g[i] - q);
}

torch::Tensor bisect_backward(const torch::Tensor& p, const torch::Tensor& g, double alpha) {
  TORCH_CHECK(p.dim() == 2 && p.is_contiguous() && g.is_contiguous() && p.sizes() == g.sizes(),
              "expected contiguous 2-D tensors of one shape");
  auto out = torch::empty_like(p);
  const int64_t rows = p.size(0), k = p.size(1);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "entmax_bisect_backward", [&] {
    const scalar_t* p_ptr = p.const_data_ptr<scalar_t>();
    const scalar_t* g_ptr = g.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        bisect_backward_row<scalar_t>(p_ptr + r * k, g_ptr + r * k, out_ptr + r * k, k,
                                      static_cast<scalar_t>(2 - alpha));
      }
    });
  });
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The autograd kernels of sparsenorm::project and sparsenorm::entmax_bisect on CPU (AutogradCPU).
//
// Why: the ops' Python autograd (register_autograd in sparsenorm/kernels/ops/projection.py) costs tens of us
// per forward+backward in Python frames, several times the row work at small shapes. These
// kernels take the AutogradCPU key (more specific than the Autograd alias the Python ones are
// registered under) once the extension is loaded; other devices keep the Python autograd. The
// backward formulas are kernels/ops/projection.py's (bit-identical gradients): without create_graph the fused backward
// op, with it the differentiable Python reference itself.
//
// The forwards always redispatch to the op below autograd (never the raw kernels above): the
// op's registered CPU implementation then decides, as before, between this extension and the
// reference (sparsenorm.kernels.disabled(), use_cpu_kernels, SPARSENORM_CPU_KERNELS, empty rows,
// too few bisection steps), and fake, functional or batched tensors (torch.compile, vmap), which
// reach this key too, get their own handling.
// ---------------------------------------------------------------------------------------------
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor project_op(const at::Tensor& x, c10::string_view kind, std::optional<c10::SymInt> k) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sparsenorm::project", "")
                             .typed<at::Tensor(const at::Tensor&, c10::string_view, std::optional<c10::SymInt>)>();
  return op.call(x, kind, std::move(k));
}

// The backward ops are called with grad mode off only, so below autograd: they have no autograd
// formula, and the Python autograd layer torch.library puts on every custom op would only pass the
// call on (in Python frames).
at::Tensor project_backward_op(const at::Tensor& p, const at::Tensor& grad, c10::string_view kind) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sparsenorm::project_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(p, grad, kind);
}

at::Tensor entmax_bisect_op(const at::Tensor& x, double alpha, c10::SymInt n_iter, bool ensure_sum_one) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sparsenorm::entmax_bisect", "")
                             .typed<at::Tensor(const at::Tensor&, double, c10::SymInt, bool)>();
  return op.call(x, alpha, std::move(n_iter), ensure_sum_one);
}

at::Tensor entmax_bisect_backward_op(const at::Tensor& p, const at::Tensor& grad, double alpha) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sparsenorm::entmax_bisect_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(p, grad, alpha);
}

// Under create_graph (double backward) the backward is the differentiable Python reference itself,
// called back through the interpreter: one formula, not a port to keep equal (the path is rare;
// a few Python frames do not matter there). `module.name(args...)` with the GIL held.
template <typename... Args>
at::Tensor python_reference(const char* module, const char* name, Args&&... args) {
  pybind11::gil_scoped_acquire gil;
  return pybind11::module_::import(module).attr(name)(std::forward<Args>(args)...).template cast<at::Tensor>();
}

class ProjectFunction : public torch::autograd::Function<ProjectFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::string_view kind,
                            std::optional<c10::SymInt> k) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor out = project_op(x, kind, std::move(k));
    ctx->saved_data["kind"] = std::string(kind);
    ctx->save_for_backward({out});
    return out;
  }

  // kernels/ops/projection.py's _project_autograd
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0];
    const std::string kind = ctx->saved_data["kind"].toStringRef();
    at::Tensor dx = at::GradMode::is_enabled()  // double backward: reference/projection.py's dense_backward
                        ? python_reference("sparsenorm.kernels.reference.projection", "dense_backward", p, grads[0], kind)
                                               : project_backward_op(p, grads[0], kind);
    return {dx, at::Tensor(), at::Tensor()};  // kind and k: no gradient
  }
};

class EntmaxBisectFunction : public torch::autograd::Function<EntmaxBisectFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double alpha, c10::SymInt n_iter,
                            bool ensure_sum_one) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor out = entmax_bisect_op(x, alpha, std::move(n_iter), ensure_sum_one);
    ctx->saved_data["alpha"] = alpha;
    ctx->save_for_backward({out});
    return out;
  }

  // kernels/ops/projection.py's _entmax_bisect_autograd
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0];
    const double alpha = ctx->saved_data["alpha"].toDouble();
    at::Tensor dx = at::GradMode::is_enabled()  // double backward: kernels/ops/projection.py's _bisect_backward_reference
                        ? python_reference("sparsenorm.kernels.ops", "_bisect_backward_reference", p, grads[0], alpha)
                                               : entmax_bisect_backward_op(p, grads[0], alpha);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};  // alpha, n_iter, ensure_sum_one: no gradient
  }
};

bool records_graph(const at::Tensor& x) { return at::GradMode::is_enabled() && x.requires_grad(); }

at::Tensor project_autograd(const at::Tensor& x, c10::string_view kind, std::optional<c10::SymInt> k) {
  if (!records_graph(x)) {  // no graph to record: just the op below
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return project_op(x, kind, std::move(k));
  }
  return ProjectFunction::apply(x, kind, std::move(k));
}

at::Tensor entmax_bisect_autograd(const at::Tensor& x, double alpha, c10::SymInt n_iter, bool ensure_sum_one) {
  if (!records_graph(x)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return entmax_bisect_op(x, alpha, std::move(n_iter), ensure_sum_one);
  }
  return EntmaxBisectFunction::apply(x, alpha, std::move(n_iter), ensure_sum_one);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsenorm, AutogradCPU, m) {
  m.impl("project", TORCH_FN(project_autograd));
  m.impl("entmax_bisect", TORCH_FN(entmax_bisect_autograd));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "sparsemax / 1.5-entmax forward over the rows of a (rows, K) tensor");
  m.def("thresholds", &thresholds, "sparsemax / 1.5-entmax threshold of each row, relative to its max");
  m.def("backward", &backward, "sparsemax / 1.5-entmax backward over the rows of a (rows, K) tensor");
  m.def("hourglass_forward", &hourglass_forward, "sparsehourglass forward: (p, alpha, sum z) per row");
  m.def("hourglass_backward", &hourglass_backward, "sparsehourglass backward: (dL/dx, dL/dq per row)");
  m.def("bisect_forward", &bisect_forward, "alpha-entmax (alpha > 1) forward by safeguarded Newton");
  m.def("bisect_backward", &bisect_backward, "alpha-entmax backward from p");
}
