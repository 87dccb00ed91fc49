// Fused CPU forward and backward of r-softmax (Bałazy et al., Eq. 3) and t-softmax (Eq. 1) over
// the rows (last dim) of a float32/float64 tensor; rows are split across threads.
//
// Both are the weighted softmax p_i = w_i exp(x_i - max) / sum_j w_j exp(x_j - max) with
// w = relu(x - tau); they differ in tau:
//   r-softmax: tau = lerp(x_(lo), x_(hi), frac), the linear-interpolated quantile of the row;
//   t-softmax: tau = max - t.
// The rules are those of sparsenorm/kernels/reference/rsoftmax.py: entries at or below
// finfo.min / 2 (-inf included) are not there (probability 0; the quantile is over the others, r
// the fraction of zeros among them); a row with none there gives zeros; a row whose weights are
// all 0 (tau >= max) is uniform over its arg-max entries ("dead": zero gradient); NaN gives a NaN
// row, and so does +inf unless the row is dead.
//
// r-softmax's order statistics by bucket selection, no sort and no nth_element on the row: one
// pass for max, min and the count of entries there; one pass counting the entries per bucket of
// [min, max] (bucket = int((x - min) * scale), a monotone map of x, so every entry of a bucket is
// <= every entry of the next); one pass gathering the (value, index) pairs of the bucket(s)
// holding ranks lo and lo + 1, in index order. The few candidates are bucketed again while many
// are left, then stably sorted: ties come in index order, as the reference's stable sort, which
// also gives the order statistics' indices. Then the weighted exp pass (at::vec's exp, the Sleef
// routine torch's softmax calls) and the division by the sum.
//
// Backward, per row, two passes as softmax's: <g, p>; then grad = (p + e)(g - <g, p>) on the
// support with e = p / w (divided by the weight itself, subnormal weights included; from
// exp(x - max) where p is subnormal, see backward_row), C = -sum(grad); C (1 - frac) and C frac are
// added at the order statistics' indices (t-softmax: C at the arg-max).
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace {

template <typename scalar_t>
inline scalar_t lerp(scalar_t start, scalar_t end, scalar_t weight) {
  // torch.lerp's formula (ATen/native/Lerp.h), so tau and hence the support match the reference.
  const scalar_t diff = end - start;
  return std::abs(weight) < scalar_t(0.5) ? start + weight * diff : end - diff * (scalar_t(1) - weight);
}

template <typename scalar_t>
inline scalar_t not_there_level() {
  return std::numeric_limits<scalar_t>::lowest() / 2;
}

// Max over the row, min over the entries there, their count, the index of the first maximum, and
// whether the row holds NaN.
template <typename scalar_t>
struct RowScan {
  scalar_t max, min;
  int64_t n_there, argmax;
  bool nan;
};

// The first index i with x[i] == v (0 if none), a SIMD compare per vector: a scalar search read
// half the row on average (issue 28 profile: t-softmax's scan was ~30% of its forward).
template <typename scalar_t>
int64_t first_index_of(const scalar_t* x, int64_t k, scalar_t v) {
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  const Vec vv(v);
  int64_t i = 0;
  // zero_mask: a bit per lane whose compare result is 0 (not equal); all set: no match here
  for (; i + W <= k && (Vec::loadu(x + i) == vv).zero_mask() == (1 << W) - 1; i += W) {
  }
  for (; i < k; ++i) {
    if (x[i] == v) return i;
  }
  return 0;
}

template <typename scalar_t>
RowScan<scalar_t> scan_row(const scalar_t* x, int64_t k, bool find_argmax) {
  constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
  const scalar_t level = not_there_level<scalar_t>();
  scalar_t mx = -kInf, mn = kInf;
  int32_t there = 0, nans = 0;  // int32 lanes as wide as float's (int64 counts widened every step)
#pragma omp simd reduction(max : mx) reduction(min : mn) reduction(+ : there, nans)
  for (int64_t i = 0; i < k; ++i) {
    const scalar_t v = x[i];
    const bool in = v > level;
    mx = v > mx ? v : mx;
    mn = (in && v < mn) ? v : mn;
    there += in ? 1 : 0;
    nans += (v != v) ? 1 : 0;
  }
  return {mx, mn, there, find_argmax ? first_index_of(x, k, mx) : 0, nans > 0};
}

// Per-thread buffers of the selection, sized to the row once.
template <typename scalar_t>
struct Scratch {
  std::vector<scalar_t> value;   // candidates' values ...
  std::vector<int64_t> index;    // ... and indices, in index order
  std::vector<int32_t> bucket;   // bucket of each entry (or candidate)
  std::vector<int32_t> hist;     // entries per bucket (kLanes interleaved copies, see count_buckets)
  void reserve(int64_t k) {
    value.resize(k);
    index.resize(k);
    bucket.resize(k);
  }
};

// A monotone map of [lo, hi] onto buckets 0 .. count - 1 (x <= y gives bucket(x) <= bucket(y)):
// (v - lo) * scale rounds monotonically and the conversion truncates. Invalid when the range is
// empty, overflows, or is too narrow for a finite scale.
template <typename scalar_t>
struct Buckets {
  scalar_t lo, scale;
  int32_t count;
  bool valid;
  Buckets(scalar_t lo_, scalar_t hi, int64_t count_) : lo(lo_), count(static_cast<int32_t>(count_)) {
    const scalar_t range = hi - lo_;
    scale = static_cast<scalar_t>(count_) / range;
    valid = hi > lo_ && std::isfinite(range) && std::isfinite(scale) && scale > 0;
  }
};

// bucket[i] of v[0 .. n): its bucket, or `count` (a bucket past the end) for an entry not there.
template <typename scalar_t>
void assign_buckets(const scalar_t* v, int64_t n, const Buckets<scalar_t>& b, int32_t* bucket) {
  const scalar_t level = not_there_level<scalar_t>();
  const scalar_t lo = b.lo, scale = b.scale, last = static_cast<scalar_t>(b.count - 1);
  const int32_t past = b.count;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    scalar_t f = (v[i] - lo) * scale;  // >= 0 for an entry there; at most count (1 + eps)
    f = f < last ? f : last;
    f = f > 0 ? f : scalar_t(0);
    bucket[i] = v[i] > level ? static_cast<int32_t>(f) : past;
  }
}

// Histogram of bucket[0 .. n) into hist[0 .. count] (the past-the-end bucket included). Four
// interleaved copies, summed at the end: consecutive entries of one bucket would otherwise wait
// on each other's increment.
inline void count_buckets(const int32_t* bucket, int64_t n, int32_t count, std::vector<int32_t>& hist) {
  const int64_t stride = count + 1;
  hist.assign(4 * stride, 0);
  int32_t* h = hist.data();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h[bucket[i]];
    ++h[stride + bucket[i + 1]];
    ++h[2 * stride + bucket[i + 2]];
    ++h[3 * stride + bucket[i + 3]];
  }
  for (; i < n; ++i) ++h[bucket[i]];
  for (int64_t j = 0; j < stride; ++j) h[j] += h[stride + j] + h[2 * stride + j] + h[3 * stride + j];
}

// The buckets holding ranks a <= b, and the count below the first.
inline void locate(const int32_t* hist, int32_t count, int64_t a, int64_t b, int32_t* first, int32_t* last,
                   int64_t* below) {
  int64_t cum = 0;
  int32_t j = 0;
  while (j < count && cum + hist[j] <= a) cum += hist[j++];
  *first = j;
  *below = cum;
  while (j < count && cum + hist[j] <= b) cum += hist[j++];
  *last = j;
}

// Keep, in order, the candidates whose bucket is in [first, last] (branch-free); returns how many.
template <typename scalar_t>
int64_t keep_buckets(const scalar_t* v_in, const int64_t* i_in, const int32_t* bucket, int64_t n, int32_t first,
                     int32_t last, scalar_t* v_out, int64_t* i_out) {
  const uint32_t width = static_cast<uint32_t>(last - first);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    v_out[kept] = v_in[i];
    i_out[kept] = i_in ? i_in[i] : i;
    kept += static_cast<uint32_t>(bucket[i] - first) <= width;
  }
  return kept;
}

// The entries of ranks `rank` <= `rank_hi` (0-based, ascending, ties in index order) among the
// entries of x there, whose min and max are lo and hi: (value, index) of each.
template <typename scalar_t>
void order_statistics(const scalar_t* x, int64_t k, int64_t n_there, scalar_t lo, scalar_t hi, int64_t rank,
                      int64_t rank_hi, Scratch<scalar_t>& s, std::pair<scalar_t, int64_t>* out_lo,
                      std::pair<scalar_t, int64_t>* out_hi) {
  scalar_t* cv = s.value.data();
  int64_t* ci = s.index.data();
  int32_t* bucket = s.bucket.data();
  int64_t n;
  const Buckets<scalar_t> first(lo, hi, std::min<int64_t>(4096, std::max<int64_t>(16, n_there / 4)));
  if (first.valid) {
    assign_buckets(x, k, first, bucket);
    count_buckets(bucket, k, first.count, s.hist);
    int32_t b_first, b_last;
    int64_t below;
    locate(s.hist.data(), first.count, rank, rank_hi, &b_first, &b_last, &below);
    n = keep_buckets<scalar_t>(x, nullptr, bucket, k, b_first, b_last, cv, ci);
    rank -= below;
    rank_hi -= below;
  } else {  // one value, or a range too wide/narrow to bucket (+inf, subnormal spread): all there
    const Buckets<scalar_t> none(0, 1, 1);  // bucket 0 for every entry there
    assign_buckets(x, k, none, bucket);
    n = keep_buckets<scalar_t>(x, nullptr, bucket, k, 0, 0, cv, ci);
  }
  // Refine while many candidates are left and the buckets still split them (in place: the
  // write position never passes the read position).
  while (n > 48) {
    scalar_t c_lo = cv[0], c_hi = cv[0];
    for (int64_t i = 1; i < n; ++i) {
      c_lo = std::min(c_lo, cv[i]);
      c_hi = std::max(c_hi, cv[i]);
    }
    const Buckets<scalar_t> level2(c_lo, c_hi, std::min<int64_t>(4096, n / 4));
    if (!level2.valid) break;
    assign_buckets(cv, n, level2, bucket);
    count_buckets(bucket, n, level2.count, s.hist);
    int32_t b_first, b_last;
    int64_t below;
    locate(s.hist.data(), level2.count, rank, rank_hi, &b_first, &b_last, &below);
    const int64_t kept = keep_buckets(cv, ci, bucket, n, b_first, b_last, cv, ci);
    if (kept == n) break;  // no progress (ranks in the end buckets, nothing between)
    n = kept;
    rank -= below;
    rank_hi -= below;
  }
  // Candidates are in index order: a stable sort by value orders ties by index.
  if (n <= 64) {  // insertion sort (stable)
    for (int64_t i = 1; i < n; ++i) {
      const scalar_t v = cv[i];
      const int64_t id = ci[i];
      int64_t j = i;
      for (; j > 0 && v < cv[j - 1]; --j) {
        cv[j] = cv[j - 1];
        ci[j] = ci[j - 1];
      }
      cv[j] = v;
      ci[j] = id;
    }
  } else if (!std::is_sorted(cv, cv + n)) {
    std::vector<int64_t> order(n);
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [cv](int64_t a, int64_t b) { return cv[a] < cv[b]; });
    *out_lo = {cv[order[rank]], ci[order[rank]]};
    *out_hi = {cv[order[rank_hi]], ci[order[rank_hi]]};
    return;
  }
  *out_lo = {cv[rank], ci[rank]};
  *out_hi = {cv[rank_hi], ci[rank_hi]};
}

// The weighted softmax of one row given tau (finite) and the row max; returns whether the row is
// dead (tau >= max: uniform over the arg-max entries).
template <typename scalar_t>
bool weighted_softmax_row(const scalar_t* x, int64_t k, scalar_t tau, scalar_t mx, scalar_t* p) {
  constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
  if (tau >= mx) {  // every weight 0: the tau -> max limit, uniform over the arg-max entries
    int64_t ties = 0;
    for (int64_t i = 0; i < k; ++i) ties += x[i] == mx;
    const scalar_t u = scalar_t(1) / static_cast<scalar_t>(ties);
    for (int64_t i = 0; i < k; ++i) p[i] = x[i] == mx ? u : scalar_t(0);
    return true;
  }
  if (mx == kInf) {  // +inf with some weight: exp(inf - inf), a NaN row as in the reference
    std::fill(p, p + k, std::numeric_limits<scalar_t>::quiet_NaN());
    return false;
  }
  // p_i = relu(x_i - tau) exp(x_i - mx): x_i <= mx, so exp <= 1; an entry not there is below
  // tau (tau >= the least entry there), so its weight is 0, and exp(x - mx) is finite or 0.
  using Vec = at::vec::Vectorized<scalar_t>;
  constexpr int64_t W = Vec::size();
  // (t-softmax's tau = max - t can fall below the not-there level for a huge t: those entries
  // are masked explicitly.)
  const scalar_t level = not_there_level<scalar_t>();
  // Weights near finfo.max (t-softmax with a huge t) would overflow the sum: scale them by a power
  // of two (exact, and p does not change) so that the largest, max - tau, is about 1.
  const scalar_t top = mx - tau;
  const scalar_t scale = top > std::numeric_limits<scalar_t>::max() / static_cast<scalar_t>(4 * k)
                             ? std::ldexp(scalar_t(1), -std::ilogb(top)) : scalar_t(1);
  const Vec vtau(tau), vmx(mx), vzero(scalar_t(0)), vlevel(level), vscale(scale);
  Vec vsum(scalar_t(0));
  int64_t i = 0;
  for (; i + W <= k; i += W) {
    const Vec v = Vec::loadu(x + i);
    const Vec e = Vec::blendv(vzero, at::vec::maximum(v - vtau, vzero) * vscale * (v - vmx).exp(), v > vlevel);
    e.store(p + i);
    vsum = vsum + e;
  }
  scalar_t sum = at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return a + b; }, vsum);
  for (; i < k; ++i) {
    const scalar_t w = x[i] - tau;
    const scalar_t e = (w > 0 && x[i] > level) ? w * scale * std::exp(x[i] - mx) : scalar_t(0);
    p[i] = e;
    sum += e;
  }
  // Divide, not multiply by 1 / sum: the weights can be subnormal (x = (0, tiny), r = 0.75 gives
  // sum = tiny / 4), whose reciprocal overflows to inf (and 0 * inf = NaN); the quotient is exact.
  const Vec vsum_all(sum);
  i = 0;
  for (; i + W <= k; i += W) (Vec::loadu(p + i) / vsum_all).store(p + i);
  for (; i < k; ++i) p[i] /= sum;
  return false;
}


template <typename scalar_t>
void r_forward_row(const scalar_t* x, scalar_t r, int64_t k, scalar_t* p, scalar_t* tau_out, int64_t* lo_out,
                   int64_t* hi_out, scalar_t* frac_out, scalar_t* dtau_out, bool* dead_out, Scratch<scalar_t>& s) {
  constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
  const RowScan<scalar_t> scan = scan_row(x, k, false);
  const int64_t n_valid = scan.n_there;
  const scalar_t n_valid_m1 = static_cast<scalar_t>(std::max<int64_t>(n_valid - 1, 0));
  const scalar_t pos = r * n_valid_m1;
  const scalar_t lo_f = std::floor(pos);
  const scalar_t frac = pos - lo_f;
  *frac_out = frac;
  if (scan.nan) {
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
  const int64_t rank = std::min<int64_t>(static_cast<int64_t>(lo_f), n_valid - 1);
  const int64_t rank_hi = std::min<int64_t>(rank + 1, n_valid - 1);
  std::pair<scalar_t, int64_t> lo, hi;
  order_statistics(x, k, n_valid, scan.min, scan.max, rank, rank_hi, s, &lo, &hi);
  const scalar_t tau = lerp(lo.first, hi.first, frac);
  *tau_out = tau;
  *lo_out = lo.second;
  *hi_out = hi.second;
  *dtau_out = (hi.first - lo.first) * n_valid_m1;
  *dead_out = weighted_softmax_row(x, k, tau, scan.max, p);
}

// The entry points take rows along the last dim of a tensor of any shape (made contiguous here: a
// no-op for the usual contiguous input) and per-row tensors of any dtype broadcastable to
// x.shape[:-1] + (1,) (converted, expanded and made contiguous here), and return their outputs in
// those shapes: the Python kernel wrappers then pass their arguments as they are, where each
// reshape, view or .to of a small tensor costs Python dispatch per call
// (benchmarks/results/tuning_cpu.json#python_dispatch).
struct Rows {
  at::Tensor x;                       // contiguous, x's shape
  std::vector<int64_t> per_row_shape;  // x.shape[:-1] + (1,)
  int64_t rows, k;
};

Rows rows_of(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1 && x.device().is_cpu() && x.numel() > 0, "expected a non-empty CPU tensor of rows");
  Rows out{x.contiguous(), x.sizes().vec(), 0, x.size(-1)};
  out.per_row_shape.back() = 1;
  out.rows = x.numel() / out.k;
  TORCH_CHECK(out.k < std::numeric_limits<int32_t>::max(), "rows longer than 2^31 - 1 entries");
  return out;
}

// A per-row tensor as a contiguous tensor of shape `shape`, converted to `dtype` if given (else the
// caller checks its dtype).
at::Tensor per_row(const at::Tensor& v, const std::vector<int64_t>& shape, const char* name,
                   c10::optional<at::ScalarType> dtype = c10::nullopt) {
  TORCH_CHECK(v.device().is_cpu(), name, " must be a CPU tensor");
  at::Tensor out = dtype ? v.to(*dtype) : v;
  return out.expand(shape).contiguous();
}

inline int64_t grain_for(int64_t k) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1)); }

std::vector<at::Tensor> r_forward(const at::Tensor& x_in, const at::Tensor& r_in) {
  const Rows in = rows_of(x_in);
  const at::Tensor& x = in.x;
  const at::Tensor r = per_row(r_in, in.per_row_shape, "r", x.scalar_type());
  const int64_t rows = in.rows, k = in.k;
  const auto& shape = in.per_row_shape;
  auto p = at::empty_like(x);
  auto tau = at::empty(shape, x.options());
  auto frac = at::empty(shape, x.options());
  auto dtau = at::empty(shape, x.options());
  auto lo = at::empty(shape, x.options().dtype(at::kLong));
  auto hi = at::empty(shape, x.options().dtype(at::kLong));
  auto dead = at::empty(shape, x.options().dtype(at::kBool));
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
    at::parallel_for(0, rows, grain_for(k), [&](int64_t begin, int64_t end) {
      Scratch<scalar_t> scratch;
      scratch.reserve(k);
      for (int64_t i = begin; i < end; ++i) {
        r_forward_row<scalar_t>(xp + i * k, rp[i], k, pp + i * k, taup + i, lop + i, hip + i, fracp + i, dtaup + i,
                                deadp + i, scratch);
      }
    });
  });
  return {p, tau, lo, hi, frac, dtau, dead};
}

// t-softmax: (p, tau, argmax, dead) with tau = max - t; the backward is r_backward's with
// lo = hi = argmax and frac = 0.
std::vector<at::Tensor> t_forward(const at::Tensor& x_in, const at::Tensor& t_in) {
  const Rows in = rows_of(x_in);
  const at::Tensor& x = in.x;
  const at::Tensor t = per_row(t_in, in.per_row_shape, "t", x.scalar_type());
  const int64_t rows = in.rows, k = in.k;
  const auto& shape = in.per_row_shape;
  auto p = at::empty_like(x);
  auto tau = at::empty(shape, x.options());
  auto argmax = at::empty(shape, x.options().dtype(at::kLong));
  auto dead = at::empty(shape, x.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "t_softmax_forward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* tp = t.const_data_ptr<scalar_t>();
    scalar_t* pp = p.mutable_data_ptr<scalar_t>();
    scalar_t* taup = tau.mutable_data_ptr<scalar_t>();
    int64_t* ap = argmax.mutable_data_ptr<int64_t>();
    bool* deadp = dead.mutable_data_ptr<bool>();
    at::parallel_for(0, rows, grain_for(k), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xr = xp + i * k;
        scalar_t* pr = pp + i * k;
        const RowScan<scalar_t> scan = scan_row(xr, k, true);
        ap[i] = scan.argmax;
        if (scan.nan) {
          std::fill(pr, pr + k, std::numeric_limits<scalar_t>::quiet_NaN());
          taup[i] = std::numeric_limits<scalar_t>::quiet_NaN();
          deadp[i] = false;
        } else if (scan.n_there == 0) {
          std::fill(pr, pr + k, scalar_t(0));
          taup[i] = -std::numeric_limits<scalar_t>::infinity();
          deadp[i] = true;
        } else {
          taup[i] = scan.max - tp[i];
          deadp[i] = weighted_softmax_row(xr, k, taup[i], scan.max, pr);
        }
      }
    });
  });
  return {p, tau, argmax, dead};
}

// grad = (p + e)(g - <g, p>) on the support (0 elsewhere), e = p / w, w = x - tau; returns its sum.
// Where p_i is subnormal on the support, p_i / w_i has lost every digit (w_i tiny, e_i O(1): found
// by the fuzz suite), so there e_i = exp(x_i - max) * (p_top / w_top), the arg-max entry's exp
// being 1 and its p the row's largest (p_top >= 1/k, a normal number). That slower pass runs only
// for rows that have such an entry. A zero (g - <g, p>) gives 0 even where e overflows (inf * 0).
template <typename scalar_t>
scalar_t backward_row(const scalar_t* g, const scalar_t* p, const scalar_t* x, scalar_t tau, int64_t k,
                      scalar_t* out) {
  constexpr scalar_t kMinNormal = std::numeric_limits<scalar_t>::min();
  scalar_t dot = 0;
  int64_t tiny_on_support = 0;
#pragma omp simd reduction(+ : dot, tiny_on_support)
  for (int64_t i = 0; i < k; ++i) {
    dot += p[i] * g[i];
    tiny_on_support += (x[i] - tau > 0) & (p[i] < kMinNormal);
  }
  scalar_t total = 0;
  if (tiny_on_support == 0) {
    // Lanes off the support compute p / w with w <= 0 too; the select drops them.
#pragma omp simd reduction(+ : total)
    for (int64_t i = 0; i < k; ++i) {
      const scalar_t d = g[i] - dot;
      const scalar_t w = x[i] - tau;
      // w below the smallest normal is taken at it, as the reference does (jacobian_weight's clamp):
      // the exact p / w overflows there, and +-inf terms would meet as inf - inf in C and in dq.
      const scalar_t v = (w > 0) & (d != 0) ? (p[i] + p[i] / std::max(w, kMinNormal)) * d : scalar_t(0);
      out[i] = v;
      total += v;
    }
    return total;
  }
  scalar_t mx = -std::numeric_limits<scalar_t>::infinity(), p_top = 0;
  for (int64_t i = 0; i < k; ++i) {
    mx = std::max(mx, x[i]);
    p_top = std::max(p_top, p[i]);
  }
  const scalar_t inv_sum = p_top / std::max(mx - tau, kMinNormal);
  for (int64_t i = 0; i < k; ++i) {
    const scalar_t d = g[i] - dot;
    const scalar_t w = x[i] - tau;
    scalar_t v = 0;
    if (w > 0 && d != 0) {
      const scalar_t e = p[i] >= kMinNormal ? p[i] / std::max(w, kMinNormal) : std::exp(x[i] - mx) * inv_sum;
      v = (p[i] + e) * d;
    }
    out[i] = v;
    total += v;
  }
  return total;
}

// The sum of grad where e overflowed (w below 1 / max: +inf and -inf terms, a NaN sum): with
// e_i = exp(x_i - max) * inv_sum, sum = inv_sum * S + sum_i p_i (g_i - <g, p>), S the finite sum of
// exp(x_i - max)(g_i - <g, p>) over the support; an exact zero S gives a finite sum, any other S an
// infinite one of the right sign, never NaN (reference/rsoftmax.py overflowed_c; found by the fuzz suite).
template <typename scalar_t>
scalar_t overflowed_total(const scalar_t* g, const scalar_t* p, const scalar_t* x, scalar_t tau, int64_t k) {
  scalar_t dot = 0, mx = -std::numeric_limits<scalar_t>::infinity(), p_top = 0;
  for (int64_t i = 0; i < k; ++i) {
    dot += p[i] * g[i];
    mx = std::max(mx, x[i]);
    p_top = std::max(p_top, p[i]);
  }
  const scalar_t inv_sum = p_top / std::max(mx - tau, std::numeric_limits<scalar_t>::min());
  scalar_t s = 0, p_part = 0;
  for (int64_t i = 0; i < k; ++i) {
    const scalar_t d = g[i] - dot;
    if (x[i] - tau > 0) s += std::exp(x[i] - mx) * d;
    p_part += p[i] * d;
  }
  return (s == 0 ? scalar_t(0) : inv_sum * s) + p_part;
}

// grad (p's shape) and C (per row), C = -sum(grad) before the order-statistic terms. g is
// converted to p's dtype; x and the per-row tensors must have their forward's dtypes.
std::vector<at::Tensor> backward(const at::Tensor& g_in, const at::Tensor& p_in, const at::Tensor& x_in,
                                 const at::Tensor& tau_in, const at::Tensor& lo_in, const at::Tensor& hi_in,
                                 const at::Tensor& frac_in, const at::Tensor& dead_in) {
  const Rows in = rows_of(p_in);
  const at::Tensor& p = in.x;
  const at::Tensor g = g_in.to(p.scalar_type()).contiguous();
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(g.sizes() == p.sizes() && x.sizes() == p.sizes() && x.scalar_type() == p.scalar_type(),
              "expected g, p and x of one shape (x of p's dtype)");
  const auto& shape = in.per_row_shape;
  const at::Tensor tau = per_row(tau_in, shape, "tau"), frac = per_row(frac_in, shape, "frac");
  const at::Tensor lo = per_row(lo_in, shape, "lo_idx"), hi = per_row(hi_in, shape, "hi_idx");
  const at::Tensor dead = per_row(dead_in, shape, "dead");
  TORCH_CHECK(tau.scalar_type() == p.scalar_type() && frac.scalar_type() == p.scalar_type() &&
                  lo.scalar_type() == at::kLong && hi.scalar_type() == at::kLong && dead.scalar_type() == at::kBool,
              "expected tau and frac of p's dtype, int64 lo_idx and hi_idx, bool dead");
  const int64_t rows = in.rows, k = in.k;
  auto grad = at::empty_like(p);
  auto c = at::empty(shape, p.options());
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
    at::parallel_for(0, rows, grain_for(k), [&](int64_t begin, int64_t end) {
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
        scalar_t total = backward_row(gr, pr, xr, taup[row], k, o);
        if (std::isnan(total)) total = overflowed_total(gr, pr, xr, taup[row], k);
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
  m.def("forward", &r_forward, "r-softmax forward over the rows (last dim) of x: (p, tau, lo, hi, frac, dtau_dr, dead)");
  m.def("t_forward", &t_forward, "t-softmax forward over the rows (last dim) of x: (p, tau, argmax, dead)");
  m.def("backward", &backward, "r-/t-softmax backward over the rows (last dim): (dL/dx, C per row)");
}
