// Fused CPU forward and backward of blockwise ev-softmax attention: the CPU kernels of the registered
// ops sparsenorm::ev_softmax_attention_blockwise and ..._backward (Python side: kernels/ops/evidential_attention.py).
//
// ev-softmax (ev-softmax paper, Eq. 7) keeps, in query row i, the valid keys whose score
// s_ij = (q_i * scale) . k_j (+ b_ij) is at least the row's mean valid score t_i. The mean is
// linear in the keys, so t_i is known before any score is computed; the caller passes it in
// (computed by kernels/reference/evidential_attention.threshold, the reference's own function,
// so both paths share it bit for bit). What is left is one flash-style pass per tile of queries
// over the tiles of keys with the online-softmax recurrence restricted to the support:
//
//   c_ij = s_ij - t_i  if key j is valid and c_ij >= 0, else -inf       (Eq. 7's support)
//   m_i  = max_j c_ij,  l_i = sum_j exp(c_ij - m_i),  o_i = sum_j exp(c_ij - m_i) v_j
//   out_i = o_i / l_i,  lse_i = m_i + log(l_i)   (lse of the shifted scores, as the backward reads it)
//
// exactly the recurrence of the reference's _forward_block, tile for tile (the same tile sizes),
// so the results differ from the reference only by the rounding of the tile products. A key tile
// in which no score of the query tile reaches its threshold adds nothing: its P.V product is
// skipped. Under a causal mask, key tiles wholly after the query tile are not visited and a tile's
// products stop at the last key its last query sees.
//
// The backward is FlashAttention-2's from the saved out, lse and thr (the reference's backward, tile
// for tile): P = exp(c - lse) on the support, dV += P^T dO, dS = P * (dO V^T - delta) with
// delta_i = dO_i . out_i (softmax's Jacobian on the support, Eq. 9; the threshold carries no
// gradient), dQ += dS K, dK += dS^T Q; key tiles with no support are skipped. It is split over the
// batch only (each batch entry owns its rows of dK and dV).
//
// As in the reference: "c >= 0" is tested as c > -smallest_normal (NaN is never kept); a row whose
// threshold rounding put above every valid score ("stranded": no support, some valid key) is redone
// with the threshold set to its largest valid score; a row with no valid key gives out 0, lse +inf.
//
// Tile products go to the BLAS torch links (MKL's exported SGEMM/DGEMM, as ATen's own
// flash-attention CPU kernel calls cpublas::gemm); where that symbol is absent (another BLAS),
// to at::mm on views of the tiles. The forward is split over batch x query tiles with
// at::parallel_for; the BLAS calls inside run on one thread each.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

// MKL's Fortran BLAS entry points (LP64), exported by libtorch_cpu where torch links MKL; weak, so
// that the library loads against a torch without them (then the at::mm fallback runs).
extern "C" {
void SGEMM(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
           const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
           const int* ldc) __attribute__((weak));
void DGEMM(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
           const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
           const int* ldc) __attribute__((weak));
}

namespace {

using at::vec::Vectorized;

std::atomic<bool> force_aten_gemm{false};  // tests: run the at::mm fallback where the BLAS is there

bool have_blas() { return !force_aten_gemm.load() && SGEMM != nullptr && DGEMM != nullptr; }

template <typename scalar_t>
void fortran_gemm(char ta, char tb, int m, int n, int k, scalar_t alpha, const scalar_t* a, int lda,
                  const scalar_t* b, int ldb, scalar_t beta, scalar_t* c, int ldc) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    SGEMM(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
  } else {
    DGEMM(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
  }
}

// Row-major c (m x n, leading dim ldc) = op(a) . op(b) (+ c when `accumulate`), op(a) (m x k) and
// op(b) (k x n) the matrices a, b (row-major, leading dims lda, ldb) or their transposes.
template <typename scalar_t>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
          const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  if (have_blas()) {  // column-major view of row-major storage: c^T = op(b)^T . op(a)^T
    fortran_gemm<scalar_t>(trans_b ? 'T' : 'N', trans_a ? 'T' : 'N', static_cast<int>(n), static_cast<int>(m),
                           static_cast<int>(k), scalar_t(1), b, static_cast<int>(ldb), a, static_cast<int>(lda),
                           scalar_t(accumulate ? 1 : 0), c, static_cast<int>(ldc));
    return;
  }
  auto opt = at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value);
  at::Tensor at_ = trans_a ? at::from_blob(const_cast<scalar_t*>(a), {k, m}, {lda, 1}, opt).t()
                           : at::from_blob(const_cast<scalar_t*>(a), {m, k}, {lda, 1}, opt);
  at::Tensor bt = trans_b ? at::from_blob(const_cast<scalar_t*>(b), {n, k}, {ldb, 1}, opt).t()
                          : at::from_blob(const_cast<scalar_t*>(b), {k, n}, {ldb, 1}, opt);
  at::Tensor ct = at::from_blob(c, {m, n}, {ldc, 1}, opt);
  if (accumulate) {
    ct.addmm_(at_, bt);
  } else {
    at::mm_out(ct, at_, bt);
  }
}

// A mask broadcast to (N, L, S): element (n, i, j) at base + offset[n] + i * row_stride + j * col_stride.
template <typename T>
struct Strided {
  const T* base = nullptr;
  const int64_t* offset = nullptr;
  int64_t row_stride = 0, col_stride = 0;
  bool present() const { return base != nullptr; }
  const T* row(int64_t n, int64_t i) const { return base + offset[n] + i * row_stride; }
};

template <typename T>
Strided<T> strided(const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& offsets) {
  Strided<T> s;
  if (mask.has_value() && mask->defined()) {
    s.base = mask->const_data_ptr<T>();
    s.offset = offsets->const_data_ptr<int64_t>();
    s.row_stride = mask->stride(-2);
    s.col_stride = mask->stride(-1);
  }
  return s;
}

template <typename scalar_t>
struct Problem {
  const scalar_t *q, *k, *v;  // contiguous (N, L, E), (N, S, E), (N, S, Ev); q pre-scaled
  int64_t L, S, E, Ev;
  Strided<bool> keep;
  Strided<scalar_t> bias;
  bool causal;
  int64_t causal_offset;  // under causal, query i sees keys j <= i + causal_offset (0: top-left)
  int64_t block_q, block_k;
};

// What the forward and the backward share: a tile's scores and its support (as the reference's
// _support_scores), for one query tile [i0, i1) of batch n against the key tile starting at j0.
template <typename scalar_t>
class Tiles {
 public:
  explicit Tiles(const Problem<scalar_t>& p) : p_(p), scores_(p.block_q * p.block_k) {}

 protected:
  // Key columns [j0, j0 + width) of the tile that some row of [i0, i1) may see (causal: j <= i + offset).
  int64_t visible_width(int64_t i1, int64_t j0) const {
    const int64_t width = std::min(p_.block_k, p_.S - j0);
    return p_.causal ? std::max<int64_t>(0, std::min(width, i1 + p_.causal_offset - j0)) : width;
  }

  // The end of query i's causally visible columns in the tile starting at key j0.
  int64_t causal_end(int64_t i, int64_t j0, int64_t width) const {
    return p_.causal ? std::max<int64_t>(0, std::min(width, i + p_.causal_offset - j0 + 1)) : width;
  }

  const bool* keep_row(int64_t n, int64_t i, int64_t j0) const {
    return p_.keep.present() ? p_.keep.row(n, i) + j0 * p_.keep.col_stride : nullptr;
  }

  // scores_[r, 0:width) = q_i . k_j (+ b_ij) for the tile (masks are applied by the caller).
  void tile_scores(int64_t n, int64_t i0, int64_t i1, int64_t j0, int64_t width) {
    const int64_t rows = i1 - i0;
    gemm<scalar_t>(false, true, rows, width, p_.E, p_.q + (n * p_.L + i0) * p_.E, p_.E,
                   p_.k + (n * p_.S + j0) * p_.E, p_.E, false, scores_.data(), p_.block_k);
    if (p_.bias.present()) {
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* b = p_.bias.row(n, i0 + r) + j0 * p_.bias.col_stride;
        scalar_t* s = scores_.data() + r * p_.block_k;
        for (int64_t j = 0; j < width; ++j) s[j] += b[j * p_.bias.col_stride];
      }
    }
  }

  // fn(j0, width) for each key tile [j0, j0 + width) some query of [i0, i1) may see, with the
  // tile's scores in scores_ (key tiles after the query tile are skipped under a causal mask).
  template <typename Fn>
  void for_each_key_tile(int64_t n, int64_t i0, int64_t i1, Fn&& fn) {
    for (int64_t j0 = 0; j0 < p_.S; j0 += p_.block_k) {
      if (p_.causal && j0 > i1 - 1 + p_.causal_offset) break;
      const int64_t width = visible_width(i1, j0);
      tile_scores(n, i0, i1, j0, width);
      fn(j0, width);
    }
  }

  // Row r of the tile's scores (query i) in place: c = s - t on the support (valid and c >= 0,
  // tested as c > -smallest_normal, so NaN is left out), -inf off it. Returns the row's max of c
  // and adds the support's size to `count`.
  scalar_t support_row(int64_t n, int64_t i, int64_t j0, int64_t width, int64_t r, scalar_t t, int64_t& count) {
    using Vec = Vectorized<scalar_t>;
    constexpr int64_t W = Vec::size();
    constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
    const scalar_t tiny = -std::numeric_limits<scalar_t>::min();
    scalar_t* c = scores_.data() + r * p_.block_k;
    const int64_t end = causal_end(i, j0, width);
    const bool* keep = keep_row(n, i, j0);
    const int64_t ks = p_.keep.col_stride;
    scalar_t mx = -kInf;
    int64_t j = 0;
    if (keep == nullptr || ks == 1) {  // no mask, or a mask contiguous along the keys (padding): in SIMD
      const Vec vt(t), vtiny(tiny), vneg_inf(-kInf), zero(scalar_t(0)), one(scalar_t(1));
      Vec vmax(-kInf), vcount(scalar_t(0));
      scalar_t there[W];
      for (; j + W <= end; j += W) {
        const Vec x = Vec::loadu(c + j) - vt;
        Vec kept = x > vtiny;
        if (keep != nullptr) {
          for (int64_t e = 0; e < W; ++e) there[e] = keep[j + e] ? scalar_t(1) : scalar_t(0);
          kept = kept & (Vec::loadu(there) > zero);
        }
        const Vec z = Vec::blendv(vneg_inf, x, kept);
        z.store(c + j);
        vmax = at::vec::maximum(vmax, z);
        vcount = vcount + Vec::blendv(zero, one, kept);
      }
      mx = at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); },
                                             vmax);
      count += static_cast<int64_t>(
          at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return a + b; }, vcount));
    }
    for (; j < end; ++j) {
      const scalar_t x = c[j] - t;
      const bool kept = x > tiny && (keep == nullptr || keep[j * ks]);
      c[j] = kept ? x : -kInf;
      count += kept;
      mx = std::max(mx, c[j]);
    }
    for (j = end; j < width; ++j) c[j] = -kInf;
    return mx;
  }

  // In place over row r's first `width` entries: exp(c - shift); returns their sum.
  scalar_t exp_row(int64_t r, int64_t width, scalar_t shift) {
    using Vec = Vectorized<scalar_t>;
    constexpr int64_t W = Vec::size();
    scalar_t* c = scores_.data() + r * p_.block_k;
    const Vec vm(shift);
    Vec acc(scalar_t(0));
    int64_t j = 0;
    for (; j + W <= width; j += W) {
      const Vec e = (Vec::loadu(c + j) - vm).exp();
      e.store(c + j);
      acc = acc + e;
    }
    scalar_t sum = at::vec::vec_reduce_all<scalar_t>([](const Vec& a, const Vec& b) { return a + b; }, acc);
    for (; j < width; ++j) {
      c[j] = std::exp(c[j] - shift);
      sum += c[j];
    }
    return sum;
  }

  const Problem<scalar_t>& p_;
  std::vector<scalar_t> scores_;
};

template <typename scalar_t>
struct Forward {
  const scalar_t* count;  // (N, L): valid keys per row (the threshold's divisor)
  scalar_t *out, *lse, *thr;  // (N, L, Ev), (N, L), (N, L); thr holds the input threshold
  int64_t* support;  // (N, L) or nullptr
};

// One query tile [i0, i1) of batch n: the online softmax over the key tiles (see the header).
template <typename scalar_t>
class ForwardTile : Tiles<scalar_t> {
  using Tiles<scalar_t>::p_;
  using Tiles<scalar_t>::scores_;

 public:
  ForwardTile(const Problem<scalar_t>& p, const Forward<scalar_t>& f) : Tiles<scalar_t>(p), f_(f),
      o_(p.block_q * p.Ev), m_(p.block_q), l_(p.block_q), corr_(p.block_q), n_(p.block_q) {}

  void run(int64_t n, int64_t i0, int64_t i1) {
    const int64_t rows = i1 - i0;
    scalar_t* thr = f_.thr + n * p_.L + i0;
    const scalar_t* count = f_.count + n * p_.L + i0;
    online_softmax(n, i0, i1, thr);
    bool stranded = false;
    for (int64_t r = 0; r < rows; ++r) stranded |= l_[r] == 0 && count[r] > 0;
    if (stranded) {  // rare: cap the threshold at the row's largest valid score, redo the tile
      std::vector<scalar_t> best(rows);
      row_max(n, i0, i1, best.data());
      for (int64_t r = 0; r < rows; ++r) {
        if (l_[r] == 0 && count[r] > 0) thr[r] = best[r];
      }
      online_softmax(n, i0, i1, thr);
    }
    constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      scalar_t* out = f_.out + (n * p_.L + i0 + r) * p_.Ev;
      const bool empty = l_[r] == 0;
      const scalar_t l = empty ? scalar_t(1) : l_[r];
      for (int64_t e = 0; e < p_.Ev; ++e) out[e] = empty ? scalar_t(0) : o_[r * p_.Ev + e] / l;
      f_.lse[n * p_.L + i0 + r] = empty ? kInf : m_[r] + std::log(l);
      if (f_.support) f_.support[n * p_.L + i0 + r] = n_[r];
    }
  }

 private:
  void online_softmax(int64_t n, int64_t i0, int64_t i1, const scalar_t* thr) {
    constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
    const int64_t rows = i1 - i0;
    std::fill(o_.begin(), o_.begin() + rows * p_.Ev, scalar_t(0));
    std::fill(m_.begin(), m_.begin() + rows, -kInf);
    std::fill(l_.begin(), l_.begin() + rows, scalar_t(0));
    std::fill(n_.begin(), n_.begin() + rows, int64_t(0));
    this->for_each_key_tile(n, i0, i1, [&](int64_t j0, int64_t width) {
      bool any_support = false;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t count = 0;
        const scalar_t mx = this->support_row(n, i0 + r, j0, width, r, thr[r], count);
        n_[r] += count;
        const scalar_t m_new = std::max(m_[r], mx);
        const scalar_t m_safe = m_new == -kInf ? scalar_t(0) : m_new;
        corr_[r] = std::exp(m_[r] - m_safe);
        m_[r] = m_new;
        if (count == 0) {  // p = 0 in this tile: zero the row so the tile's P.V (if any) adds nothing
          std::fill(scores_.data() + r * p_.block_k, scores_.data() + r * p_.block_k + width, scalar_t(0));
          l_[r] *= corr_[r];
          continue;
        }
        any_support = true;
        l_[r] = l_[r] * corr_[r] + this->exp_row(r, width, m_safe);
      }
      if (!any_support) return;  // no score of the tile reaches its threshold: P.V is zero
      for (int64_t r = 0; r < rows; ++r) {
        if (corr_[r] != scalar_t(1)) {
          scalar_t* o = o_.data() + r * p_.Ev;
          for (int64_t e = 0; e < p_.Ev; ++e) o[e] *= corr_[r];
        }
      }
      gemm<scalar_t>(false, false, rows, p_.Ev, width, scores_.data(), p_.block_k, p_.v + (n * p_.S + j0) * p_.Ev,
                     p_.Ev, true, o_.data(), p_.Ev);
    });
  }

  // Each row's largest valid score (NaN propagates, as torch.amax; -inf where none is valid).
  void row_max(int64_t n, int64_t i0, int64_t i1, scalar_t* best) {
    constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
    const int64_t rows = i1 - i0;
    std::fill(best, best + rows, -kInf);
    this->for_each_key_tile(n, i0, i1, [&](int64_t j0, int64_t width) {
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* c = scores_.data() + r * p_.block_k;
        const bool* keep = this->keep_row(n, i0 + r, j0);
        const int64_t end = this->causal_end(i0 + r, j0, width);
        for (int64_t j = 0; j < end; ++j) {
          if (keep != nullptr && !keep[j * p_.keep.col_stride]) continue;
          if (std::isnan(c[j]) || c[j] > best[r]) best[r] = std::isnan(best[r]) ? best[r] : c[j];
        }
      }
    });
  }

  const Forward<scalar_t>& f_;
  std::vector<scalar_t> o_, m_, l_, corr_;
  std::vector<int64_t> n_;
};

template <typename scalar_t>
struct Backward {
  const scalar_t *grad_out, *out, *lse, *thr;  // (N, L, Ev), (N, L, Ev), (N, L), (N, L)
  scalar_t *dq, *dk, *dv;  // (N, L, E), (N, S, E), (N, S, Ev), zeroed; dq of the pre-scaled q
};

// FlashAttention-2's backward for all query tiles of batch n (the reference's backward, tile for
// tile): P = exp(c - lse) on the support (0 off it), dV += P^T dO, dS = (dO V^T - delta) * P with
// delta_i = dO_i . out_i, dQ += dS K, dK += dS^T Q. Key tiles where P is zero are skipped.
template <typename scalar_t>
class BackwardBatch : Tiles<scalar_t> {
  using Tiles<scalar_t>::p_;
  using Tiles<scalar_t>::scores_;

 public:
  BackwardBatch(const Problem<scalar_t>& p, const Backward<scalar_t>& b) : Tiles<scalar_t>(p), b_(b),
      dp_(p.block_q * p.block_k), delta_(p.block_q) {}

  void run(int64_t n) {
    constexpr scalar_t kInf = std::numeric_limits<scalar_t>::infinity();
    for (int64_t i0 = 0; i0 < p_.L; i0 += p_.block_q) {
      const int64_t i1 = std::min(p_.L, i0 + p_.block_q), rows = i1 - i0;
      const scalar_t* dout = b_.grad_out + (n * p_.L + i0) * p_.Ev;
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* o = b_.out + (n * p_.L + i0 + r) * p_.Ev;
        scalar_t d = 0;
        for (int64_t e = 0; e < p_.Ev; ++e) d += dout[r * p_.Ev + e] * o[e];
        delta_[r] = d;
      }
      this->for_each_key_tile(n, i0, i1, [&](int64_t j0, int64_t width) {
        bool any_support = false;
        for (int64_t r = 0; r < rows; ++r) {
          int64_t count = 0;
          this->support_row(n, i0 + r, j0, width, r, b_.thr[n * p_.L + i0 + r], count);
          const scalar_t lse = b_.lse[n * p_.L + i0 + r];
          if (count == 0 || lse == kInf) {
            std::fill(scores_.data() + r * p_.block_k, scores_.data() + r * p_.block_k + width, scalar_t(0));
            continue;
          }
          any_support = true;
          this->exp_row(r, width, lse);  // P = exp(c - lse)
        }
        if (!any_support) return;
        const scalar_t* kt = p_.k + (n * p_.S + j0) * p_.E;
        const scalar_t* vt = p_.v + (n * p_.S + j0) * p_.Ev;
        const scalar_t* qt = p_.q + (n * p_.L + i0) * p_.E;
        gemm<scalar_t>(true, false, width, p_.Ev, rows, scores_.data(), p_.block_k, dout, p_.Ev, true,
                       b_.dv + (n * p_.S + j0) * p_.Ev, p_.Ev);  // dV += P^T dO
        gemm<scalar_t>(false, true, rows, width, p_.Ev, dout, p_.Ev, vt, p_.Ev, false, dp_.data(),
                       p_.block_k);  // dO V^T
        for (int64_t r = 0; r < rows; ++r) {
          scalar_t* ds = dp_.data() + r * p_.block_k;
          const scalar_t* pr = scores_.data() + r * p_.block_k;
          const scalar_t d = delta_[r];
          for (int64_t j = 0; j < width; ++j) ds[j] = (ds[j] - d) * pr[j];
        }
        gemm<scalar_t>(false, false, rows, p_.E, width, dp_.data(), p_.block_k, kt, p_.E, true,
                       b_.dq + (n * p_.L + i0) * p_.E, p_.E);  // dQ += dS K
        gemm<scalar_t>(true, false, width, p_.E, rows, dp_.data(), p_.block_k, qt, p_.E, true,
                       b_.dk + (n * p_.S + j0) * p_.E, p_.E);  // dK += dS^T Q
      });
    }
  }

 private:
  const Backward<scalar_t>& b_;
  std::vector<scalar_t> dp_, delta_;
};

void check_mask(const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& offsets, int64_t N,
                at::ScalarType dtype, const char* name) {
  if (!mask.has_value() || !mask->defined()) return;
  TORCH_CHECK(mask->scalar_type() == dtype, "ev_softmax_attention: ", name, " has the wrong dtype");
  TORCH_CHECK(mask->dim() >= 2, "ev_softmax_attention: ", name, " needs 2 dims or more");
  TORCH_CHECK(offsets.has_value() && offsets->defined() && offsets->scalar_type() == at::kLong &&
                  offsets->dim() == 1 && offsets->size(0) == N && offsets->is_contiguous(),
              "ev_softmax_attention: ", name, "_offsets must be a contiguous int64 (N,) tensor");
}

// Checks what the forward and the backward take alike; the problem's sizes (block sizes clamped).
template <typename scalar_t>
Problem<scalar_t> problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const c10::optional<at::Tensor>& keep, const c10::optional<at::Tensor>& keep_offsets,
                          const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& bias_offsets,
                          bool causal, int64_t causal_offset, int64_t block_q, int64_t block_k) {
  const int64_t N = q.size(0), L = q.size(1), E = q.size(2), S = k.size(1), Ev = v.size(2);
  check_mask(keep, keep_offsets, N, at::kBool, "keep");
  check_mask(bias, bias_offsets, N, q.scalar_type(), "bias");
  return {q.const_data_ptr<scalar_t>(), k.const_data_ptr<scalar_t>(), v.const_data_ptr<scalar_t>(), L, S, E, Ev,
          strided<bool>(keep, keep_offsets), strided<scalar_t>(bias, bias_offsets), causal, causal_offset,
          std::min(block_q, L),
          std::min(block_k, S)};
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t block_q, int64_t block_k,
                  std::initializer_list<at::Tensor> rows) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "ev_softmax_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.is_contiguous() && k.is_contiguous() &&
                  v.is_contiguous(), "ev_softmax_attention: q, k, v must be contiguous 3-D tensors");
  const int64_t N = q.size(0), L = q.size(1), E = q.size(2), S = k.size(1), Ev = v.size(2);
  TORCH_CHECK(k.size(0) == N && v.size(0) == N && k.size(2) == E && v.size(1) == S,
              "ev_softmax_attention: q, k, v shapes do not match");
  TORCH_CHECK(N > 0 && L > 0 && S > 0 && E > 0 && Ev > 0, "ev_softmax_attention: empty dims");
  TORCH_CHECK(block_q > 0 && block_k > 0, "ev_softmax_attention: block sizes must be positive");
  TORCH_CHECK(std::max({E, Ev, block_k, block_q}) < (int64_t(1) << 31),  // the BLAS takes 32-bit sizes
              "ev_softmax_attention: dims too large");
  for (const at::Tensor& t : {k, v}) {
    TORCH_CHECK(t.scalar_type() == q.scalar_type(), "ev_softmax_attention: q, k, v must have one dtype");
  }
  for (const at::Tensor& t : rows) {  // per-row (N, L) or (N, L, Ev) tensors
    TORCH_CHECK(t.scalar_type() == q.scalar_type() && t.is_contiguous() && t.size(0) == N && t.size(1) == L &&
                    (t.dim() == 2 || (t.dim() == 3 && t.size(2) == Ev)),
                "ev_softmax_attention: per-query tensors must be contiguous (N, L[, Ev]) in q's dtype");
  }
}

}  // namespace

// (out (N, L, Ev), lse (N, L), thr (N, L), support (N, L) int64 or (0,)).
// q (N, L, E) pre-scaled, k (N, S, E), v (N, S, Ev): contiguous, one float dtype; thr, count (N, L)
// contiguous; keep (bool) / bias (q's dtype): the (.., L, S) expanded masks with per-batch offsets.
std::vector<at::Tensor> ev_softmax_attention_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& thr, const at::Tensor& count,
    const c10::optional<at::Tensor>& keep, const c10::optional<at::Tensor>& keep_offsets,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& bias_offsets, bool causal,
    int64_t causal_offset, bool count_support, int64_t block_q, int64_t block_k) {
  check_inputs(q, k, v, block_q, block_k, {thr, count});
  const int64_t N = q.size(0), L = q.size(1), Ev = v.size(2);
  at::Tensor out = at::empty({N, L, Ev}, q.options());
  at::Tensor lse = at::empty({N, L}, q.options());
  at::Tensor thr_out = thr.clone();
  at::Tensor support = at::empty({count_support ? N * L : 0}, q.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "ev_softmax_attention_forward", [&] {
    const Problem<scalar_t> p = problem<scalar_t>(q, k, v, keep, keep_offsets, bias, bias_offsets, causal,
                                                  causal_offset, block_q, block_k);
    const Forward<scalar_t> f{count.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
                              lse.mutable_data_ptr<scalar_t>(), thr_out.mutable_data_ptr<scalar_t>(),
                              count_support ? support.mutable_data_ptr<int64_t>() : nullptr};
    const int64_t q_tiles = (L + p.block_q - 1) / p.block_q;
    at::parallel_for(0, N * q_tiles, 1, [&](int64_t begin, int64_t end) {
      ForwardTile<scalar_t> tile(p, f);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t n = task / q_tiles, t = task % q_tiles;
        tile.run(n, t * p.block_q, std::min(L, (t + 1) * p.block_q));
      }
    });
  });
  return {out, lse, thr_out, count_support ? support.view({N, L}) : support};
}

// (dq, dk, dv) of the forward from its out, lse, thr (N, L[, Ev]) and grad_out (N, L, Ev); q as in
// the forward (pre-scaled): dq is the gradient of the pre-scaled q (the caller multiplies by scale).
// Parallel over the batch (each batch entry owns its rows of dk, dv).
std::vector<at::Tensor> ev_softmax_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& thr, const c10::optional<at::Tensor>& keep,
    const c10::optional<at::Tensor>& keep_offsets, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& bias_offsets, bool causal, int64_t causal_offset, int64_t block_q,
    int64_t block_k) {
  check_inputs(q, k, v, block_q, block_k, {grad_out, out, lse, thr});
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "ev_softmax_attention_backward", [&] {
    const Problem<scalar_t> p = problem<scalar_t>(q, k, v, keep, keep_offsets, bias, bias_offsets, causal,
                                                  causal_offset, block_q, block_k);
    const Backward<scalar_t> b{grad_out.const_data_ptr<scalar_t>(), out.const_data_ptr<scalar_t>(),
                               lse.const_data_ptr<scalar_t>(), thr.const_data_ptr<scalar_t>(),
                               dq.mutable_data_ptr<scalar_t>(), dk.mutable_data_ptr<scalar_t>(),
                               dv.mutable_data_ptr<scalar_t>()};
    at::parallel_for(0, q.size(0), 1, [&](int64_t begin, int64_t end) {
      BackwardBatch<scalar_t> batch(p, b);
      for (int64_t n = begin; n < end; ++n) batch.run(n);
    });
  });
  return {dq, dk, dv};
}

bool uses_blas() { return have_blas(); }

void set_force_aten_gemm(bool force) { force_aten_gemm.store(force); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("ev_softmax_attention_forward", &ev_softmax_attention_forward,
        "Fused forward of blockwise ev-softmax attention (Eq. 7 per query) given each query's threshold");
  m.def("ev_softmax_attention_backward", &ev_softmax_attention_backward,
        "Fused backward (FlashAttention-2) of blockwise ev-softmax attention from its out, lse, thr");
  m.def("uses_blas", &uses_blas, "Whether the tile products go to the BLAS torch links (else at::mm)");
  m.def("set_force_aten_gemm", &set_force_aten_gemm,
        "Tests only: send the tile products to at::mm even where the BLAS symbols are there");
}
