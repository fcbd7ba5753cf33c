// Text generation (see generator.h).
#include "generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/core/error.h"
#include "engine/kv/context_reconstruction.h"
#include "engine/kv/kv_cache.h"
#include "formats/tokenizer/stream_decoder.h"
#include "sampler.h"

namespace kv {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Logits (B, V) of the last position after feeding ids (B, n) at input_pos. Prompts longer
// than what the cache accepts in one call are fed in pieces it does accept (their sizes are
// appended to `chunks` when given).
Tensor feed(Transformer& model, KVCache& cache, const Tensor& ids, int64_t input_pos, ContextReconstruction* rec,
           std::vector<int64_t>* chunks = nullptr) {
    const int64_t n = ids.size(1);
    int64_t done = 0;
    Tensor last;
    while (done < n) {
        int64_t take = input_pos + done == 0 ? std::min(n, cache.min_cache_length()) : std::min(n - done, cache.max_forward_length());
        if (take < 1) throw Error("generation: the cache accepts no more tokens (a dense cache is full)");
        if (chunks) chunks->push_back(take);
        // Policies that read the text (smart-lastrec) see every chunk, decoded tokens included.
        const std::vector<int32_t> tok = chunk_ids(ids.slice(1, done, done + take).contiguous());
        ChunkCall call(cache, ChunkInput{.ids = &tok});
        Tensor x = model.embed(ids.slice(1, done, done + take));
        for (int l = 0; l < int(model.config().num_layers); ++l) x = model.block(l, x, input_pos + done, call);
        if (rec) {  // kvzip: the chunk's reconstruction through every layer before the next chunk plans
            ReconstructionChunk rc = rec->prepare(ids.slice(1, done, done + take).contiguous(), input_pos + done);
            for (int l = 0; l < int(model.config().num_layers); ++l) rec->run_layer(l, rc);
        }
        last = x.slice(1, take - 1, take);
        done += take;
    }
    Tensor logits = model.lm_head(model.final_norm(last));  // (B, 1, V)
    return logits.reshape({logits.size(0), logits.size(2)});
}

// Holds back text that may be the beginning of a stop string.
struct StopMatcher {
    std::vector<std::string> stops;
    std::string pending;  // streamed text not yet emitted
    std::string emitted;
    bool hit = false;
    std::string push(const std::string& piece) {
        pending += piece;
        for (const auto& s : stops) {
            if (s.empty()) continue;
            auto pos = pending.find(s);
            if (pos != std::string::npos) {
                hit = true;
                std::string out = pending.substr(0, pos);
                emitted += out;
                pending.clear();
                return out;
            }
        }
        // Keep the longest suffix that is a prefix of some stop string.
        size_t keep = 0;
        for (const auto& s : stops)
            for (size_t k = std::min(s.size() - 1, pending.size()); k > keep; --k)
                if (pending.compare(pending.size() - k, k, s, 0, k) == 0) {
                    keep = k;
                    break;
                }
        std::string out = pending.substr(0, pending.size() - keep);
        pending.erase(0, pending.size() - keep);
        emitted += out;
        return out;
    }
    std::string flush() {
        std::string out = pending;
        emitted += out;
        pending.clear();
        return out;
    }
};

// The tokenizer as the text codec of policies that read the prompt (smart-lastrec).
TextCodec text_codec(const Tokenizer& tok) {
    return TextCodec{[&tok](const std::vector<int32_t>& ids) { return tok.decode(ids, true); },
                     [&tok](const std::string& s) { return tok.encode(s, false); }};
}

// True when the next token makes some layer evict (its cache is full and its policy evicts).
bool cache_full(const KVCache& cache) {
    for (int l = 0; l < cache.num_layers(); ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        if (p.current_length() == p.cache_length()) return true;
    }
    return false;
}

bool is_eos(const Tokenizer& tok, int32_t id) {
    const auto& e = tok.eos_ids();
    return std::find(e.begin(), e.end(), id) != e.end();
}

GenerationResult generate_beam(Transformer& model, const Tokenizer& tok, const std::vector<int32_t>& prompt, const GenerateConfig& g,
                               const KVCacheConfig& kc, int64_t maxT, const GenerationCallbacks& cb) {
    const int64_t W = g.beam_width, P = int64_t(prompt.size());
    const TextCodec codec = text_codec(tok);
    KVCache cache(kc, model.config(), model.options().device, model.act_dtype(), maxT, &codec);
    if (cb.on_layer_step) cache.set_step_hook(cb.on_layer_step);
    const std::unique_ptr<ContextReconstruction> rec = make_context_reconstruction(model, cache);
    std::vector<int32_t> rows;
    for (int64_t b = 0; b < W; ++b) rows.insert(rows.end(), prompt.begin(), prompt.end());
    GenerationResult r;
    r.prompt_tokens = P;
    double t0 = now_s();
    Tensor logits = feed(model, cache, Tensor::from_i32({W, P}, rows), 0, rec.get(), &r.prompt_chunks);
    r.prefill_seconds = now_s() - t0;
    t0 = now_s();
    struct Beam {
        std::vector<int32_t> toks;
        double logp = 0;
    };
    std::vector<Beam> beams((size_t)W);
    std::vector<std::pair<double, Beam>> finished;
    auto norm_score = [&](const Beam& b) { return b.logp / std::pow(double(std::max<size_t>(1, b.toks.size())), g.length_penalty); };
    bool first = true;
    for (int64_t step = 0; step < g.max_new_tokens; ++step) {
        if (cb.cancel && cb.cancel->load()) {
            r.stop_reason = "cancelled";
            break;
        }
        std::vector<float> z = logits.to_f32_vector();
        const int64_t V = logits.size(1);
        struct Cand {
            double logp;
            int32_t beam, tok;
        };
        std::vector<Cand> cands;
        for (int64_t b = 0; b < (first ? 1 : W); ++b) {  // first step: all beams are identical
            const float* zr = z.data() + b * V;
            double m = *std::max_element(zr, zr + V), s = 0;
            for (int64_t v = 0; v < V; ++v) s += std::exp(double(zr[v]) - m);
            const double lse = m + std::log(s);
            std::vector<int32_t> idx((size_t)V);
            for (int64_t v = 0; v < V; ++v) idx[size_t(v)] = int32_t(v);
            const size_t k = size_t(std::min<int64_t>(2 * W, V));
            std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                              [zr](int32_t a, int32_t c) { return zr[a] > zr[c] || (zr[a] == zr[c] && a < c); });
            for (size_t i = 0; i < k; ++i) cands.push_back({beams[size_t(b)].logp + double(zr[idx[i]]) - lse, int32_t(b), idx[i]});
        }
        first = false;
        std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& c) { return a.logp > c.logp; });
        std::vector<Beam> next;
        std::vector<int32_t> src, toks;
        for (const Cand& c : cands) {
            Beam nb = beams[size_t(c.beam)];
            nb.toks.push_back(c.tok);
            nb.logp = c.logp;
            if (!g.ignore_eos && is_eos(tok, c.tok)) {
                finished.push_back({norm_score(nb), nb});
                continue;
            }
            next.push_back(nb);
            src.push_back(c.beam);
            toks.push_back(c.tok);
            if (int64_t(next.size()) == W) break;
        }
        if (int64_t(finished.size()) >= W || next.empty()) {
            r.stop_reason = "eos";
            break;
        }
        while (int64_t(next.size()) < W) {  // keep the batch size fixed
            next.push_back(next.back());
            src.push_back(src.back());
            toks.push_back(toks.back());
        }
        beams = next;
        cache.reorder_batch(src);
        r.evicting_forwards += cache_full(cache) ? 1 : 0;
        logits = feed(model, cache, Tensor::from_i32({W, 1}, toks), P + step, rec.get());
        ++r.decode_forwards;
        if (step + 1 == g.max_new_tokens) r.stop_reason = "max_new_tokens";
    }
    for (const Beam& b : beams) finished.push_back({norm_score(b), b});
    auto best = std::max_element(finished.begin(), finished.end(), [](auto& a, auto& c) { return a.first < c.first; });
    r.tokens = best->second.toks;
    while (!g.ignore_eos && !r.tokens.empty() && is_eos(tok, r.tokens.back())) r.tokens.pop_back();
    r.text = tok.decode(r.tokens, true);
    if (cb.on_text) cb.on_text(r.text);
    r.decode_seconds = now_s() - t0;
    return r;
}

}  // namespace

GenerationResult generate(Transformer& model, const Tokenizer& tok, const std::vector<int32_t>& prompt, const GenerateConfig& g,
                          KVCacheConfig kc, const GenerationCallbacks& cb) {
    if (prompt.empty()) throw Error("generate: the prompt is empty");
    if (g.max_new_tokens < 1) throw Error(str("--max_new_tokens: ", g.max_new_tokens, " must be >= 1"));
    const int64_t P = int64_t(prompt.size()), maxT = P + g.max_new_tokens;
    model.set_context_width(std::max(maxT, model.config().max_position_embeddings));
    kc.dtype = model.act_dtype();
    if (g.beam_width > 1) return generate_beam(model, tok, prompt, g, kc, maxT, cb);

    const TextCodec codec = text_codec(tok);
    KVCache cache(kc, model.config(), model.options().device, model.act_dtype(), maxT, &codec);
    if (cb.on_layer_step) cache.set_step_hook(cb.on_layer_step);
    const std::unique_ptr<ContextReconstruction> rec = make_context_reconstruction(model, cache);
    GenerationResult r;
    r.prompt_tokens = P;
    std::mt19937_64 rng(g.seed);
    SamplingParams sp{g.temperature, g.top_k, g.top_p};
    StreamDecoder stream(tok, true, std::vector<int32_t>(prompt.end() - std::min<int64_t>(P, 8), prompt.end()));
    StopMatcher stop{g.stop, {}, {}, false};
    double t0 = now_s();
    Tensor logits = feed(model, cache, Tensor::from_i32({1, P}, prompt), 0, rec.get(), &r.prompt_chunks);
    r.prefill_seconds = now_s() - t0;
    t0 = now_s();
    r.stop_reason = "max_new_tokens";
    for (int64_t i = 0; i < g.max_new_tokens; ++i) {
        if (cb.cancel && cb.cancel->load()) {
            r.stop_reason = "cancelled";
            break;
        }
        std::vector<float> z = logits.to_f32_vector();
        const int32_t next = sample_token(z.data(), int64_t(z.size()), sp, rng);
        if (!g.ignore_eos && is_eos(tok, next)) {
            r.stop_reason = "eos";
            break;
        }
        r.tokens.push_back(next);
        const std::string piece = stop.push(stream.push(next));
        if (cb.on_text && !piece.empty()) cb.on_text(piece);
        if (stop.hit) {
            r.stop_reason = "stop string";
            break;
        }
        if (i + 1 == g.max_new_tokens) break;
        r.evicting_forwards += cache_full(cache) ? 1 : 0;
        logits = feed(model, cache, Tensor::from_i32({1, 1}, {next}), P + i, rec.get());
        ++r.decode_forwards;
    }
    if (!stop.hit) {
        const std::string tail = stop.push(stream.flush()) + stop.flush();
        if (cb.on_text && !tail.empty()) cb.on_text(tail);
    }
    r.text = stop.emitted;
    r.decode_seconds = now_s() - t0;
    return r;
}

}  // namespace kv
