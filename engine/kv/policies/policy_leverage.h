// The leverage computation of policy_leverage.cpp (docs/POLICIES.md#leverage), shared with
// compactor, which blends it with non-causal attention.
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

struct LeverageSketch {
    int64_t k = 48;           // sketch columns; 0: the keys themselves
    std::vector<double> phi;  // (G, D, k), a pure function of (layer, head, index)

    void init(int64_t layer, int64_t G, int64_t D);
    // The pre-RoPE key of a token at position p (rope: the layer's frequencies, null: a copy);
    // cs: cos and sin of p theta_j for each rotated pair j (interleaved), from rotation().
    static void unrotate(const float* key, int64_t D, const std::vector<double>* rope, const double* cs, double* out);
    // A sketch wider than the key (k > D) gives the leverage of the D x D factor U of
    // Phi_g Phi_g^T = U U^T (Cholesky) in its place: with S = X^T X, push-through gives
    //   Phi (Phi^T S Phi + 0.01 I)^-1 Phi^T = (S P + 0.01 I)^-1 P = U (U^T S U + 0.01 I)^-1 U^T,
    // so y = x U (D columns, not k) has the same leverage at (D / k)^2 the cost per chunk.
    bool factored(int64_t D) const { return k > D; }
    // Columns kept per slot: k, D with the factor, or D when there is no sketch.
    int64_t width(int64_t D) const { return k > 0 && !factored(D) ? k : D; }
    // A key's projection y = x Phi_g (width(D) values; the factor: x U_g; no sketch: x itself),
    // taken once when the key is written: the projection is fixed, so centring after projecting,
    // (x - mean) Phi = x Phi - mean(x Phi), leaves a chunk only the products over the cached rows.
    // stage() un-rotates the key of row r written into `slot`; flush() projects every staged key,
    // a chunk's keys of a head at once (policy_matmul_fma: the same sums as one key at a time),
    // into proj[(r * L + slot) * K].
    void stage(const float* key, int64_t D, const std::vector<double>* rope, double p, int64_t r, int64_t slot);
    void flush(int64_t D, int64_t G, int64_t L, double* proj);
    // The leverage of the m keys whose projections are proj[idx[i] * K ...] (K = width(D)),
    // centred over those m, clamped at 0, into out[i].
    void leverage(const double* proj, const int32_t* idx, int64_t m, int64_t K, double* out);

   private:
    std::vector<double> proj_by_;  // (G, D, width(D)): Phi, or with k > D the factor U
    std::vector<double> mean_, Y_, G_, Li_, LiT_, Z_;  // scratch, kept between calls (no allocation per chunk)
    std::vector<double> staged_, X_, P_;                    // staged pre-RoPE keys (count, D); one head's keys and projections
    std::vector<int64_t> staged_at_;                        // (r, slot) of each staged key
    // cos and sin of R(p) per staged position, taken once for all the rows (KV heads) that
    // stage a key at p: the chunk's positions [rot_p0_, rot_p0_ + rot_n_) (rot_ok_: computed)
    const double* rotation(const std::vector<double>* rope, int64_t p);
    std::vector<double> rot_;
    std::vector<uint8_t> rot_ok_;
    int64_t rot_p0_ = 0, rot_n_ = 0;
    const std::vector<double>* rot_rope_ = nullptr;
    std::vector<double> step_;       // cos and sin of t theta_j for t < step_n_, theta = step_freq_
    std::vector<double> step_freq_;
    int64_t step_n_ = 0;
};

// (x - mean) / max(std, 1e-6) in place over all of v (torch's unbiased std).
void z_normalise(std::vector<double>& v);

}  // namespace kv
