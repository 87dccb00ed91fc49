// Fused CPU forward and backward of r-softmax (Bałazy et al., Eq. 3) over the rows of a
// contiguous (rows, K) float32/float64 tensor; rows are split across threads.
//
// Forward, per row: the quantile's two order statistics by selection on a copy of the row's
// float keys (std::nth_element, then the minimum above it: no (value, index) pairs, no sort),
// their indices by one scan, tau = lerp(x_lo, x_hi, frac) exactly as torch.lerp, then the
// weighted softmax p_i = w_i exp(x_i - max) / sum_j w_j exp(x_j - max), w = relu(x - tau), in one
// more pass. The rules are those of sparsenorm/kernels/reference/rsoftmax.py: -inf entries are
// not there (the quantile is over the others, r the fraction of zeros among them); a row with
// none there gives zeros; a row whose weights are all 0 (tau >= max) is uniform over its
// arg-max entries ("dead": zero gradient); NaN gives a NaN row, and so does +inf unless the row
// is dead.
// Backward, per row: grad = (p + e)(g - <g, p>) on the support, e = p / w (from exp(x - max) where
// p is subnormal), C = -sum(grad), and
// C (1 - frac), C frac added at the order statistics' indices.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace {

template <typename scalar_t>
inline scalar_t lerp(scalar_t start, scalar_t end, scalar_t weight) {
  // torch.lerp's formula (ATen/native/Lerp.h), so tau and hence the support match the reference.
  const scalar_t diff = end - start;
  return std::abs(weight) < scalar_t(0.5) ? start + weight * diff : end - diff * (scalar_t(1) - weight);
}

template <typename scalar_t>
void forward_row(const scalar_t* x, scalar_t r, int64_t k, scalar_t* p, scalar_t* tau_out, int64_t* lo_out,
                 int64_t* hi_out, scalar_t* frac_out, scalar_t* dtau_out, bool* dead_out,
                 std::vector<scalar_t>& keys) {
  constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
  keys.clear();
  scalar_t mx = -kInf;
  bool poisoned = false;
  for (int64_t i = 0; i < k; ++i) {
    const scalar_t v = x[i];
    if (v != v) poisoned = true;
    if (v > -kInf) keys.push_back(v);
    mx = v > mx ? v : mx;
  }
  const int64_t n_valid = static_cast<int64_t>(keys.size());
  const int64_t n_masked = k - n_valid;
  const scalar_t n_valid_m1 = static_cast<scalar_t>(std::max<int64_t>(n_valid - 1, 0));
  const scalar_t pos = r * n_valid_m1;
  const scalar_t lo_f = std::floor(pos);
  const scalar_t frac = pos - lo_f;
  *frac_out = frac;
  if (poisoned) {
    std::fill(p, p + k, std::numeric_limits<scalar_t>::quiet_NaN());
    *tau_out = std::numeric_limits<scalar_t>::quiet_NaN();
    *lo_out = *hi_out = 0;
    *dtau_out = std::numeric_limits<scalar_t>::quiet_NaN();
    *dead_out = false;
    return;
  }
  if (n_valid == 0) {
    std::fill(p, p + k, scalar_t(0));
    *tau_out = kInf;
    *lo_out = *hi_out = 0;
    *dtau_out = 0;
    *dead_out = true;
    return;
  }
  // Rank among the valid entries (the -inf entries rank first in the reference's full order).
  const int64_t rank = std::min<int64_t>(static_cast<int64_t>(lo_f), n_valid - 1);
  std::nth_element(keys.begin(), keys.begin() + rank, keys.end());
  const scalar_t x_lo = keys[rank];
  scalar_t x_hi = x_lo;
  if (rank + 1 < n_valid) x_hi = *std::min_element(keys.begin() + rank + 1, keys.end());
  // Indices: the reference's stable ascending sort puts equal values in index order, so the
  // order statistic of rank q among the values equal to it is the j-th occurrence, j = q - (#
  // values below it). Count, then scan.
  int64_t below_lo = 0, below_hi = 0;
  for (int64_t i = 0; i < k; ++i) {
    const scalar_t v = x[i];
    if (v > -kInf) {
      below_lo += v < x_lo;
      below_hi += v < x_hi;
    }
  }
  const int64_t rank_hi = std::min<int64_t>(rank + 1, n_valid - 1);
  int64_t want_lo = rank - below_lo, want_hi = rank_hi - below_hi;
  int64_t lo_idx = -1, hi_idx = -1;
  for (int64_t i = 0; i < k && (lo_idx < 0 || hi_idx < 0); ++i) {
    const scalar_t v = x[i];
    if (lo_idx < 0 && v == x_lo && want_lo-- == 0) lo_idx = i;
    if (hi_idx < 0 && v == x_hi && want_hi-- == 0) hi_idx = i;
  }
  (void)n_masked;
  const scalar_t tau = lerp(x_lo, x_hi, frac);
  *tau_out = tau;
  *lo_out = lo_idx;
  *hi_out = hi_idx;
  *dtau_out = (x_hi - x_lo) * n_valid_m1;
  if (tau >= mx) {  // every weight 0: the r -> 1 limit, uniform over the arg-max entries
    int64_t ties = 0;
    for (int64_t i = 0; i < k; ++i) ties += x[i] == mx;
    const scalar_t u = scalar_t(1) / static_cast<scalar_t>(ties);
    for (int64_t i = 0; i < k; ++i) p[i] = x[i] == mx ? u : scalar_t(0);
    *dead_out = true;
    return;
  }
  *dead_out = false;
  if (mx == kInf) {  // +inf with some weight: exp(inf - inf), a NaN row as in the reference
    std::fill(p, p + k, std::numeric_limits<scalar_t>::quiet_NaN());
    return;
  }
  // p_i = relu(x_i - tau) exp(x_i - mx), SIMD (the exp pass cost as much as the selection when scalar).
  // x_i <= mx, so exp <= 1; a -inf entry gives relu(-inf) = 0 times exp(-inf) = 0.
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  const Vec vtau(tau), vmx(mx), vzero(scalar_t(0));
  Vec vsum(scalar_t(0));
  int64_t i = 0;
  for (; i + W <= k; i += W) {
    const Vec v = Vec::loadu(x + i);
    const Vec e = at::vec::maximum(v - vtau, vzero) * (v - vmx).exp();
    e.store(p + i);
    vsum = vsum + e;
  }
  scalar_t sum = at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return a + b; }, vsum);
  for (; i < k; ++i) {
    const scalar_t w = x[i] - tau;
    const scalar_t e = w > 0 ? w * std::exp(x[i] - mx) : scalar_t(0);
    p[i] = e;
    sum += e;
  }
  // Divide, not multiply by 1 / sum: the weights can be subnormal (x = (0, tiny), r = 0.75 gives
  // sum = tiny / 4), whose reciprocal overflows to inf (and 0 * inf = NaN); the quotient is exact.
  const Vec vsum_all(sum);
  i = 0;
  for (; i + W <= k; i += W) (Vec::loadu(p + i) / vsum_all).store(p + i);
  for (; i < k; ++i) p[i] /= sum;
}

std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& r) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "expected a contiguous 2-D CPU tensor");
  TORCH_CHECK(r.dim() == 2 && r.size(0) == x.size(0) && r.size(1) == 1 && r.is_contiguous() &&
              r.scalar_type() == x.scalar_type(), "r must be a contiguous (rows, 1) tensor of x's dtype");
  const int64_t rows = x.size(0), k = x.size(1);
  auto p = at::empty_like(x);
  auto tau = at::empty({rows, 1}, x.options());
  auto frac = at::empty({rows, 1}, x.options());
  auto dtau = at::empty({rows, 1}, x.options());
  auto lo = at::empty({rows, 1}, x.options().dtype(at::kLong));
  auto hi = at::empty({rows, 1}, x.options().dtype(at::kLong));
  auto dead = at::empty({rows, 1}, x.options().dtype(at::kBool));
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "r_softmax_forward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* rp = r.const_data_ptr<scalar_t>();
    scalar_t* pp = p.mutable_data_ptr<scalar_t>();
    scalar_t* taup = tau.mutable_data_ptr<scalar_t>();
    scalar_t* fracp = frac.mutable_data_ptr<scalar_t>();
    scalar_t* dtaup = dtau.mutable_data_ptr<scalar_t>();
    int64_t* lop = lo.mutable_data_ptr<int64_t>();
    int64_t* hip = hi.mutable_data_ptr<int64_t>();
    bool* deadp = dead.mutable_data_ptr<bool>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> keys;
      keys.reserve(k);
      for (int64_t i = begin; i < end; ++i) {
        forward_row<scalar_t>(xp + i * k, rp[i], k, pp + i * k, taup + i, lop + i, hip + i, fracp + i, dtaup + i,
                              deadp + i, keys);
      }
    });
  });
  return {p, tau, lo, hi, frac, dtau, dead};
}

// grad (rows, K) and C (rows, 1), C = -sum(grad) before the order-statistic terms.
std::vector<at::Tensor> backward(const at::Tensor& g, const at::Tensor& p, const at::Tensor& x,
                                 const at::Tensor& tau, const at::Tensor& lo, const at::Tensor& hi,
                                 const at::Tensor& frac, const at::Tensor& dead) {
  TORCH_CHECK(g.is_contiguous() && p.is_contiguous() && x.is_contiguous() && g.sizes() == p.sizes() &&
              p.sizes() == x.sizes() && p.dim() == 2, "expected contiguous 2-D tensors of one shape");
  const int64_t rows = p.size(0), k = p.size(1);
  auto grad = at::empty_like(p);
  auto c = at::empty({rows, 1}, p.options());
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1));
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "r_softmax_backward", [&] {
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* pp = p.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* taup = tau.const_data_ptr<scalar_t>();
    const scalar_t* fracp = frac.const_data_ptr<scalar_t>();
    const int64_t* lop = lo.const_data_ptr<int64_t>();
    const int64_t* hip = hi.const_data_ptr<int64_t>();
    const bool* deadp = dead.const_data_ptr<bool>();
    scalar_t* op = grad.mutable_data_ptr<scalar_t>();
    scalar_t* cp = c.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* gr = gp + row * k;
        const scalar_t* pr = pp + row * k;
        const scalar_t* xr = xp + row * k;
        scalar_t* o = op + row * k;
        if (deadp[row]) {
          std::fill(o, o + k, scalar_t(0));
          cp[row] = 0;
          continue;
        }
        scalar_t dot = 0, mx = -std::numeric_limits<scalar_t>::infinity(), p_top = 0;
        for (int64_t i = 0; i < k; ++i) {
          dot += pr[i] * gr[i];
          if (xr[i] > mx) {
            mx = xr[i];
            p_top = pr[i];
          }
        }
        const scalar_t t = taup[row];
        // e_i = p_i / w_i = exp(x_i - max) / sum_j w_j exp(x_j - max). Where p_i is subnormal the
        // quotient has lost every digit (w_i tiny, e_i O(1): found by the fuzz suite), so there
        // e_i = exp(x_i - max) * (p_top / w_top), the arg-max entry's exp being 1 (p_top >= 1/k).
        const scalar_t inv_sum = p_top / (mx - t);
        constexpr scalar_t kMinNormal = std::numeric_limits<scalar_t>::min();
        scalar_t total = 0;
        for (int64_t i = 0; i < k; ++i) {
          const scalar_t w = xr[i] - t;
          const scalar_t e = pr[i] >= kMinNormal ? pr[i] / w : std::exp(xr[i] - mx) * inv_sum;
          const scalar_t d = gr[i] - dot;  // d = 0 gives 0 even where e overflowed (inf * 0 = NaN)
          const scalar_t v = w > 0 && d != 0 ? (pr[i] + e) * d : scalar_t(0);
          o[i] = v;
          total += v;
        }
        const scalar_t cc = -total;
        cp[row] = cc;
        o[lop[row]] += cc * (scalar_t(1) - fracp[row]);
        o[hip[row]] += cc * fracp[row];
      }
    });
  });
  return {grad, c};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "r-softmax forward over the rows of a (rows, K) tensor");
  m.def("backward", &backward, "r-softmax backward over the rows of a (rows, K) tensor");
}
