// load_gguf_model: reader + config + names + shape checks + Q/K un-permutation. All checks run
// before any tensor is converted, so a bad file fails fast and allocates nothing.
#include "formats/gguf/gguf_model.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/core/weight_check.h"
#include "formats/gguf/gguf_config.h"
#include "formats/gguf/gguf_dequant.h"
#include "formats/gguf/gguf_experts.h"
#include "formats/gguf/gguf_latent.h"
#include "formats/gguf/gguf_names.h"
#include "formats/gguf/gguf_reader.h"
#include "formats/gguf/gguf_rope_permute.h"
#include "formats/gguf/packed_regroup.h"
#include "kernels/common/packed_blocks.h"

namespace kv {

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += str(i ? ", " : "", s[i]);
    return out + "]";
}

bool ends_with(const std::string& s, const char* suffix) {
    size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Which of llama.cpp's alternative forms a file holds (decided from layer 0's tensors).
struct FileForms {
    bool fused_experts = false;  // gpt-oss: ffn_gate_up_exps rather than ffn_gate_exps + ffn_up_exps
    bool split_kv_b = false;     // DeepSeek-V2: attn_k_b + attn_v_b rather than attn_kv_b
};

// HF name -> expected PyTorch shape, from the config. gpt-oss's experts and DeepSeek-V2's split
// kv_b_proj are named and shaped as llama.cpp stores them (gguf_experts.h, gguf_latent.h).
std::map<std::string, std::vector<int64_t>> expected_shapes(const ModelConfig& c, const FileForms& forms) {
    const int64_t E = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size, V = c.vocab_size;
    std::map<std::string, std::vector<int64_t>> s;
    s["model.embed_tokens.weight"] = {V, E};
    s["model.norm.weight"] = {E};
    if (!c.tie_word_embeddings) s["lm_head.weight"] = {V, E};
    for (int64_t l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        if (c.short_conv_layer(l)) {
            s[p + "conv.in_proj.weight"] = {3 * E, E};
            s[p + "conv.conv.weight"] = {E, c.conv_kernel};  // squeezed by the converter; [E, 1, L] once loaded
            s[p + "conv.out_proj.weight"] = {E, E};
        } else if (c.latent_attention()) {
            const LatentAttention& a = c.latent;
            if (a.q_lora_rank > 0) {
                s[p + "self_attn.q_a_proj.weight"] = {a.q_lora_rank, E};
                s[p + "self_attn.q_a_layernorm.weight"] = {a.q_lora_rank};
                s[p + "self_attn.q_b_proj.weight"] = {Q, a.q_lora_rank};
            } else {
                s[p + "self_attn.q_proj.weight"] = {Q, E};
            }
            s[p + "self_attn.kv_a_proj_with_mqa.weight"] = {a.kv_lora_rank + a.qk_rope_head_dim, E};
            s[p + "self_attn.kv_a_layernorm.weight"] = {a.kv_lora_rank};
            if (forms.split_kv_b) {
                s[p + "self_attn.k_b_proj.weight"] = {c.num_heads, a.kv_lora_rank, a.qk_nope_head_dim};
                s[p + "self_attn.v_b_proj.weight"] = {c.num_heads, a.v_head_dim, a.kv_lora_rank};
            } else {
                s[p + "self_attn.kv_b_proj.weight"] = {c.num_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank};
            }
        } else if (c.fused_projections) {
            s[p + "self_attn.qkv_proj.weight"] = {Q + 2 * KV, E};
        } else {
            s[p + "self_attn.q_proj.weight"] = {Q, E};
            s[p + "self_attn.k_proj.weight"] = {KV, E};
            s[p + "self_attn.v_proj.weight"] = {KV, E};
        }
        if (!c.short_conv_layer(l)) s[p + "self_attn.o_proj.weight"] = {E, c.num_heads * c.v_head_dim()};
        if (c.o_bias && !c.short_conv_layer(l)) s[p + "self_attn.o_proj.bias"] = {E};
        if (c.attention_sinks) s[p + "self_attn.sinks"] = {c.num_heads};
        if (c.experts_layer(l)) {
            const int64_t N = c.moe.num_experts;
            const std::string x = p + "mlp.experts.";
            s[p + "mlp.router.weight"] = {N, E};
            s[p + "mlp.router.bias"] = {N};
            for (const char* b : {".weight", ".bias"}) {
                const bool w = b[1] == 'w';
                if (forms.fused_experts) {
                    s[x + "gate_up_proj" + b] = w ? std::vector<int64_t>{N, 2 * I, E} : std::vector<int64_t>{N, 2 * I};
                } else {
                    s[x + "gate_proj" + b] = w ? std::vector<int64_t>{N, I, E} : std::vector<int64_t>{N, I};
                    s[x + "up_proj" + b] = w ? std::vector<int64_t>{N, I, E} : std::vector<int64_t>{N, I};
                }
                s[x + "down_proj" + b] = w ? std::vector<int64_t>{N, E, I} : std::vector<int64_t>{N, E};
            }
        } else {
            if (c.fused_projections) {
                s[p + "mlp.gate_up_proj.weight"] = {2 * I, E};
            } else {
                s[p + "mlp.gate_proj.weight"] = {I, E};
                s[p + "mlp.up_proj.weight"] = {I, E};
            }
            s[p + "mlp.down_proj.weight"] = {E, I};
        }
        // Norms by placement, named as transformer.cpp reads them.
        if (c.norm_placement != NormPlacement::POST) s[p + "input_layernorm.weight"] = {E};
        s[p + "post_attention_layernorm.weight"] = {E};
        if (c.norm_placement == NormPlacement::BOTH) s[p + "pre_feedforward_layernorm.weight"] = {E};
        if (c.norm_placement != NormPlacement::PRE) s[p + "post_feedforward_layernorm.weight"] = {E};
        if (c.qk_norm && !c.short_conv_layer(l)) {
            s[p + "self_attn.q_norm.weight"] = {c.qk_norm_whole ? Q : c.head_dim};
            s[p + "self_attn.k_norm.weight"] = {c.qk_norm_whole ? KV : c.head_dim};
        }
        if (c.qkv_bias && !c.short_conv_layer(l) && !c.latent_attention()) {
            s[p + "self_attn.q_proj.bias"] = {Q};
            s[p + "self_attn.k_proj.bias"] = {KV};
            s[p + "self_attn.v_proj.bias"] = {KV};
        }
    }
    return s;
}

// Reorders the elements of a 1-D tensor in place: element r moves to map[r].
void permute_elements(Tensor& t, const std::vector<int64_t>& map) {
    const size_t es = size_t(dtype_size(t.dtype()));
    std::vector<uint8_t> tmp(t.nbytes());
    const uint8_t* src = static_cast<const uint8_t*>(t.data_ptr());
    for (size_t r = 0; r < map.size(); ++r) std::memcpy(tmp.data() + size_t(map[r]) * es, src + r * es, es);
    std::memcpy(t.data_ptr(), tmp.data(), tmp.size());
}

// The finiteness/magnitude check of check_weight_values over packed tensors' dequantized
// values (block by block; nothing the size of a tensor is allocated).
void check_packed_values(const TensorMap& tensors, const std::string& source, WeightCheckStats& stats) {
    for (const auto& [name, t] : tensors) {
        if (t.dtype() != DType::U8 || t.ndim() != 3) continue;
        PackedFormat f = PackedFormat::NONE;
        for (int k = 1; k < int(PackedFormat::COUNT); ++k)
            if (packed_block_bytes(PackedFormat(k)) == t.size(2)) f = PackedFormat(k);
        if (f == PackedFormat::NONE) continue;
        const int64_t blocks = t.size(0) * t.size(1), bb = t.size(2), be = packed_block_elems(f);
        const uint8_t* p = t.data<uint8_t>();
        float y[512];  // the largest block (Q4_1_R16)
        for (int64_t b = 0; b < blocks; ++b) {
            packed_dequant_block(f, p + b * bb, y);
            for (int64_t i = 0; i < be; ++i)
                if (!(std::fabs(y[i]) <= kMaxPlausibleWeight))
                    throw Error(str(source, ": tensor '", name, "' element ", b * be + i, " (of ", blocks * be, ") is ", y[i],
                                    ", expected a finite weight of magnitude <= ", kMaxPlausibleWeight,
                                    " (a damaged block scale or a mislabelled type)"));
        }
        stats.elements += blocks * be;
    }
}

}  // namespace

GgufModel load_gguf_model(const std::string& path, const GgufLoadOptions& opt) {
    if (opt.dtype != DType::F32 && opt.dtype != DType::BF16)
        throw Error(str(path, ": GGUF models load as f32 or bf16, not dtype ", int(opt.dtype)));
    GgufReader reader(path);
    const GgufFile& f = reader.file();
    GgufModel m;
    m.tokenizer = gguf_tokenizer_data(f);
    m.config = gguf_model_config(f, m.tokenizer);
    ModelConfig& c = m.config;
    c.dtype = opt.dtype;
    if (c.name.empty()) {
        size_t slash = path.find_last_of('/');
        c.name = slash == std::string::npos ? path : path.substr(slash + 1);
    }

    // ---- names: every tensor must belong to the layout --------------------------------------
    struct Item {
        const GgufTensorInfo* info;
        std::string hf;
    };
    std::vector<Item> items;
    const GgufLayout layout{c.norm_placement, c.fused_projections, c.arch == Arch::GPT_OSS, c.arch == Arch::LFM2};
    for (const GgufTensorInfo& t : f.tensors) {
        GgufHfName n = gguf_to_hf_name(t.name, layout);
        if (n.hf.empty())
            throw Error(
                str(f.source, ": tensor '", t.name, "' is not part of the ", c.model_type,
                    " layout kvlab loads, expected token_embd, ", layout.short_conv ? "token_embd_norm, " : "",
                    "output_norm, output or blk.N.{", layout.fused ? "attn_qkv" : "attn_q, attn_k, attn_v", ", attn_output, ",
                    layout.fused ? "" : "ffn_gate, ", "ffn_up, ffn_down, ",
                    layout.norms == NormPlacement::PRE
                        ? (layout.pre_mlp_norm_is_post_attention ? "attn_norm, post_attention_norm" : "attn_norm, ffn_norm")
                    : layout.norms == NormPlacement::BOTH ? "attn_norm, post_attention_norm, ffn_norm, post_ffw_norm"
                                                          : "post_attention_norm, post_ffw_norm",
                    c.qk_norm ? ", attn_q_norm, attn_k_norm" : "",
                    c.arch == Arch::GPT_OSS
                        ? ", attn_sinks, ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_gate_up_exps, ffn_down_exps"
                        : "",
                    c.latent_attention()
                        ? ", attn_q_a, attn_q_a_norm, attn_q_b, attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b, attn_k_b, attn_v_b"
                        : "",
                    layout.short_conv ? ", shortconv.conv, shortconv.in_proj, shortconv.out_proj" : "", "} (.weight/.bias)"));
        if (n.layer >= c.num_layers)
            throw Error(str(f.source, ": tensor '", t.name, "' belongs to layer ", n.layer, " but ", c.model_type,
                            ".block_count is ", c.num_layers));
        // A file with both forms of DeepSeek-V2's kv_b_proj is read through attn_kv_b.
        if ((ends_with(n.hf, "self_attn.k_b_proj.weight") || ends_with(n.hf, "self_attn.v_b_proj.weight")) &&
            f.find_tensor("blk." + std::to_string(n.layer) + ".attn_kv_b.weight"))
            continue;
        items.push_back({&t, n.hf});
    }

    // ---- facts that depend on which tensors exist --------------------------------------------
    const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw Error(str(f.source, ": tensor 'token_embd.weight' is missing"));
    if (emb->n_dims == 2 && emb->ne[1] != c.vocab_size) {
        // Embeddings may be padded beyond the token list; never shorter than it.
        if (emb->ne[1] < c.vocab_size)
            throw Error(str(f.source, ": token_embd.weight has ", emb->ne[1], " rows but the vocabulary has ",
                            c.vocab_size, " tokens, expected at least one row per token"));
        c.vocab_size = emb->ne[1];
    }
    c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
    c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
    FileForms forms;
    forms.fused_experts = f.find_tensor("blk.0.ffn_gate_up_exps.weight") != nullptr;
    forms.split_kv_b = f.find_tensor("blk.0.attn_k_b.weight") != nullptr && f.find_tensor("blk.0.attn_kv_b.weight") == nullptr;

    // ---- shapes -----------------------------------------------------------------------------
    std::map<std::string, std::vector<int64_t>> want = expected_shapes(c, forms);
    for (const Item& it : items) {
        auto w = want.find(it.hf);
        if (w == want.end())
            throw Error(str(f.source, ": tensor '", it.info->name, "' (", it.hf, ") is not expected in a ", c.model_type,
                            " model with these settings (qkv_bias ", c.qkv_bias ? "on" : "off", ", o_bias ",
                            c.o_bias ? "on" : "off", c.has_experts() ? str(", ", c.moe.num_experts, " experts") : std::string(),
                            ")"));
        std::vector<int64_t> got = it.info->torch_shape();
        if (got != w->second)
            throw Error(str(f.source, ": tensor '", it.info->name, "' (", it.hf, ") has shape ", shape_text(got),
                            " (ggml ", it.info->shape_str(), "), expected ", shape_text(w->second), " from the metadata"));
        if (!gguf_can_dequantize(it.info->type))
            throw Error(str(f.source, ": tensor '", it.info->name, "' has ggml type ", ggml_type_name(it.info->type),
                            ", which kvlab cannot dequantize; supported: ", ggml_dequantizable_type_list()));
        want.erase(w);
    }
    if (!want.empty()) {
        std::string missing;
        int shown = 0;
        for (const auto& [name, shape] : want) {
            if (shown++ == 3) { missing += ", ..."; break; }
            missing += str(shown > 1 ? ", " : "", hf_to_gguf_name(name, layout), " (", name, ")");
        }
        throw Error(str(f.source, ": ", want.size(), " tensor(s) of the ", c.model_type, " layout are missing: ", missing));
    }

    // ---- load (one batch: one parallel region for the whole model) -------------------------
    // llama.cpp permutes Q/K rows only for architectures it runs with interleaved ("normal")
    // RoPE: llama and smollm3 (converted as llama) yes; qwen2, gpt-oss and the others (NeoX RoPE) no.
    const bool unpermute = c.arch == Arch::LLAMA || c.arch == Arch::SMOLLM3;
    std::vector<GgufLoadJob> jobs(items.size());
    std::vector<std::vector<int64_t>> bias_maps(items.size());  // 1-D q/k biases: permuted after loading
    // A file whose large tensors are quantized is copied out (packed or dequantized) almost
    // whole: its small f32 tensors (norms) are then copied too, so no tensor views the mapping
    // and it is unmapped after loading. A zero-copy view of a few KiB would keep the mapping
    // alive and, at its first read, map the whole 2 MiB page-cache folio around it (SmolLM2 Q4_1:
    // 55 MiB of the file stayed resident for 140 KiB of norms).
    constexpr uint64_t kSmallBytes = uint64_t(1) << 20;
    bool copied_out = false;
    for (const Item& it : items)
        copied_out = copied_out || (it.info->nbytes >= kSmallBytes && it.info->type != GgmlType::F32 && it.info->type != GgmlType::BF16);
    for (size_t i = 0; i < items.size(); ++i) {
        const Item& it = items[i];
        GgufLoadJob& job = jobs[i];
        job.info = it.info;
        job.dtype = opt.dtype;
        job.zero_copy = opt.zero_copy && !(copied_out && it.info->nbytes < kSmallBytes);
        job.release_source = true;  // each tensor is loaded once; copies need not keep the file's pages
        const bool is_q = ends_with(it.hf, "self_attn.q_proj.weight") || ends_with(it.hf, "self_attn.q_proj.bias");
        const bool is_k = ends_with(it.hf, "self_attn.k_proj.weight") || ends_with(it.hf, "self_attn.k_proj.bias");
        if (!unpermute || !(is_q || is_k)) continue;
        const int64_t heads = is_q ? c.num_heads : c.num_kv_heads;
        const std::string what = str(f.source, ": tensor '", it.info->name, "'");
        job.zero_copy = false;
        if (it.info->n_dims == 1)
            bias_maps[i] = gguf_unpermute_rows(it.info->ne[0], heads, what);
        else
            job.row_map = gguf_unpermute_rows(it.info->n_rows(), heads, what);
    }
    // ---- stacked groups ------------------------------------------------------------------
    // The forward pass multiplies by [q; k; v] and [gate; up] as one matrix each: loading the
    // members straight into one buffer means nothing is copied again (no transient second
    // copy of the weights; the run's weights peak is the steady state).
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < items.size(); ++i) index[items[i].hf] = i;
    // A matrix stays packed when its type has a packed format and its rows are whole blocks (F16
    // and BF16 rows are cut into blocks of 32 / 64 values; other widths are dequantized).
    auto packable = [](const GgufTensorInfo& t) {
        const PackedFormat pf = gguf_packed_format(t.type);
        return pf != PackedFormat::NONE && t.n_dims == 2 && t.ne[0] % packed_block_elems(pf) == 0;
    };
    // Latent attention and the short convolution read float weights only: their matrices are
    // dequantized.
    auto is_matrix = [&c](const std::string& hf) {
        if (hf.find(".conv.") != std::string::npos || (c.latent_attention() && hf.find(".self_attn.") != std::string::npos))
            return false;
        return ends_with(hf, "_proj.weight") || hf == "lm_head.weight" || hf == "model.embed_tokens.weight";
    };
    // Every packed matrix of the layers lies in one arena: the decode GEMVs stream them all once
    // per token, and one allocation over 2 MiB is backed by transparent huge pages (the CPU
    // backend's alloc), where a few hundred KiB per matrix stayed in 4 KiB pages with a TLB miss
    // every 4 KiB (SmolLM2 Q4_1: 66 MiB in 120 matrices of 0.2-1.1 MiB).
    struct Group {
        std::vector<size_t> ids;
        std::string label;
        bool packed = false;
        int64_t rows = 0;
    };
    std::vector<Group> groups;
    std::vector<bool> grouped(items.size(), false);
    auto stack = [&](const std::vector<std::string>& names, const std::string& label) {
        Group g;
        g.label = label;
        for (const auto& n : names) g.ids.push_back(index.at(n));
        const GgufTensorInfo& first = *items[g.ids[0]].info;
        bool same_type = true;
        for (size_t i : g.ids) same_type = same_type && items[i].info->type == first.type;
        g.packed = opt.packed && is_matrix(items[g.ids[0]].hf) && same_type && packable(first);
        for (size_t i : g.ids) {
            g.rows += items[i].info->n_dims == 1 ? items[i].info->ne[0] : items[i].info->n_rows();
            jobs[i].packed = g.packed;
            grouped[i] = true;
        }
        groups.push_back(std::move(g));
    };
    for (int64_t l = 0; l < c.num_layers && !c.fused_projections; ++l) {  // fused files hold them stacked already
        const std::string p = "model.layers." + std::to_string(l) + ".";
        if (!c.latent_attention() && !c.short_conv_layer(l))
            stack({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"},
                  p + "self_attn.qkv");
        if (c.qkv_bias)
            stack({p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"}, p + "self_attn.qkv.bias");
        if (!c.experts_layer(l)) stack({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, p + "mlp.gate_up");
    }
    if (opt.packed)
        for (size_t i = 0; i < items.size(); ++i)
            if (!grouped[i] && is_matrix(items[i].hf) && packable(*items[i].info)) {
                jobs[i].packed = true;
                if (items[i].hf.rfind("model.layers.", 0) == 0) groups.push_back(Group{{i}, items[i].hf, true, items[i].info->n_rows()});
            }
    auto packed_row_bytes = [&](const Group& g) {
        const GgufTensorInfo& first = *items[g.ids[0]].info;
        const PackedFormat pf = gguf_packed_format(first.type);
        return std::pair<int64_t, int64_t>{first.ne[0] / packed_block_elems(pf), packed_block_bytes(pf)};
    };
    // Back to back, unpadded: block rows are not cache-line multiples anyway (20-byte Q4_1
    // blocks), and the tracked weights stay exactly the bytes as stored.
    int64_t arena_bytes = 0;
    for (const Group& g : groups)
        if (g.packed) {
            const auto [blocks, bb] = packed_row_bytes(g);
            arena_bytes += g.rows * blocks * bb;
        }
    TensorOptions wo;
    wo.category = MemCategory::WEIGHTS;
    Tensor arena;
    if (arena_bytes > 0) {
        wo.label = "model.layers (packed matrices)";
        arena = Tensor::empty({arena_bytes}, DType::U8, wo);
    }
    int64_t at = 0;
    for (const Group& g : groups) {
        Tensor all;
        if (g.packed) {
            const auto [blocks, bb] = packed_row_bytes(g);
            all = arena.as_strided({g.rows, blocks, bb}, {blocks * bb, bb, 1}, at);
            at += g.rows * blocks * bb;
        } else {
            const GgufTensorInfo& first = *items[g.ids[0]].info;
            wo.label = g.label;
            all = first.n_dims == 1 ? Tensor::empty({g.rows}, opt.dtype, wo) : Tensor::empty({g.rows, first.ne[0]}, opt.dtype, wo);
        }
        int64_t r = 0;
        for (size_t i : g.ids) {
            const int64_t n = items[i].info->n_dims == 1 ? items[i].info->ne[0] : items[i].info->n_rows();
            jobs[i].dst = all.slice(0, r, r + n);
            r += n;
        }
    }
    arena = Tensor();

    std::vector<Tensor> loaded = reader.load_batch(jobs);
    jobs.clear();  // drops the jobs' references to the stacked buffers
    for (size_t i = 0; i < items.size(); ++i) {
        if (!bias_maps[i].empty()) permute_elements(loaded[i], bias_maps[i]);
        m.tensors[items[i].hf] = std::move(loaded[i]);
    }
    m.qk_unpermuted = unpermute;
    for (int64_t l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        if (c.experts_layer(l)) gguf_experts_to_hf(m.tensors, p, c.moe.num_experts, c.intermediate_size, c.hidden_size);
        if (c.short_conv_layer(l)) {
            Tensor& conv = m.tensors.at(p + "conv.conv.weight");
            conv = conv.contiguous().reshape({c.hidden_size, 1, c.conv_kernel});
        }
        if (c.latent_attention() && forms.split_kv_b)
            gguf_join_kv_b(m.tensors, p, c.num_heads, c.latent.kv_lora_rank, c.latent.qk_nope_head_dim, c.latent.v_head_dim);
    }
    c.validate(f.source);
    // Every block scale went into the dequantized values: a NaN/Inf scale or weight shows here.
    // Packed tensors are checked through their dequantized values, one row block at a time.
    m.weight_check = check_weight_values(m.tensors, f.source);
    if (opt.packed) check_packed_values(m.tensors, f.source, m.weight_check);
    // Q4_1 matrices of the layers regrouped by 16 rows in place where the CPU kernels multiply
    // that layout faster (KernelBackend::preferred_packed_format), after the checks above (their
    // messages count elements in the file's order); a stacked group all or none, so [q; k; v]
    // and [gate; up] stay one matrix of one format. KVLAB_PACKED_REGROUP=0 keeps the file's
    // layout (A/B measurements, docs/PERFORMANCE.md).
    const char* regroup_env = std::getenv("KVLAB_PACKED_REGROUP");
    const bool regroup = !(regroup_env && std::string(regroup_env) == "0");
    if (regroup && opt.packed && cpu_backend().preferred_packed_format(int(PackedFormat::Q4_1)) == int(PackedFormat::Q4_1_R16))
        for (const Group& g : groups) {
            bool ok = g.packed;
            for (size_t i : g.ids) {
                const Tensor& t = m.tensors.at(items[i].hf);
                ok = ok && t.ndim() == 3 && t.size(2) == packed_block_bytes(PackedFormat::Q4_1) && t.size(0) % gguf_blocks::kQ41Rows == 0;
            }
            if (ok)
                for (size_t i : g.ids) {
                    Tensor& t = m.tensors.at(items[i].hf);
                    t = regroup_q4_1_rows(t);
                }
        }
    return m;
}

}  // namespace kv
