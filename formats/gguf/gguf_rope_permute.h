// Undoing llama.cpp's Q/K row permutation for Llama models.
//
// llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute; docs/gguf.md,
// llama.tensor_data_layout) reorders the rows of q_proj (with n_head) and k_proj (with n_head_kv)
// so that its "normal" RoPE, which rotates consecutive pairs (2i, 2i+1), sees what Hugging Face's
// rotate-half RoPE sees in pairs (i, i + D/2):
//     W.reshape(n_head, 2, D/2, in).swapaxes(1, 2).reshape(n_head * D, in)
// i.e. GGUF row h*D + 2i + j = HF row h*D + j*D/2 + i   (h < n_head, i < D/2, j in {0, 1}).
// kvlab applies rotate-half RoPE, so rows are moved back. Qwen2 uses NeoX RoPE and is not permuted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kv {

// Destination (HF) row of every GGUF row of a permuted Q or K weight (or bias) with `n_rows`
// rows = n_heads * D:  map[h*D + 2i + j] = h*D + j*D/2 + i. Throws kv::Error naming `what`
// unless n_rows is a positive multiple of 2 * n_heads.
std::vector<int64_t> gguf_unpermute_rows(int64_t n_rows, int64_t n_heads, const std::string& what);

}  // namespace kv
