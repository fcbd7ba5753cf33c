// SentencePiece models (tokenizer.model: Llama 2, Mistral) through Debian's libsentencepiece.
// Control pieces ("<s>", "</s>") are matched in the text when parse_special is set, as llama.cpp
// does; BOS is added by default like transformers' LlamaTokenizer. Must not reimplement SentencePiece.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "added_tokens.h"
#include "engine/core/error.h"
#include "special_ids.h"
#include "tokenizer.h"

namespace kv {

namespace {

const char kSpaceMark[] = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

class SentencePieceTokenizer final : public Tokenizer {
   public:
    SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;  // matcher_ points into controls_
    SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

    explicit SentencePieceTokenizer(const std::string& path) : source_(path) {
        const auto st = sp_.Load(path);
        if (!st.ok())
            throw Error(str(path, ": not a valid SentencePiece model (", st.ToString(), ")"),
                        "expected the tokenizer.model file of a SentencePiece tokenizer");
        n_ = sp_.GetPieceSize();
        for (int32_t id = 0; id < n_; ++id) {
            if (!sp_.IsControl(id)) continue;
            AddedToken t;
            t.content = sp_.IdToPiece(id);
            t.id = id;
            t.special = true;
            controls_.push_back(std::move(t));
        }
        matcher_.build(controls_, std::vector<bool>(controls_.size(), true));

        const SideConfig cfg = read_side_config(std::filesystem::path(path).parent_path().string());
        if (cfg.any_file) {
            auto lookup = [this](const std::string& t) { return token_id(t); };
            const SpecialIds ids = resolve_special_ids(cfg, lookup, n_, sp_.bos_id());
            bos_ = ids.bos;
            eos_ = ids.eos;
            pad_ = ids.pad >= 0 ? ids.pad : sp_.pad_id();
        } else {
            bos_ = sp_.bos_id();
            if (sp_.eos_id() >= 0) eos_.push_back(sp_.eos_id());
            pad_ = sp_.pad_id();
        }
        add_bos_ = cfg.add_bos_token.value_or(true) && bos_ >= 0;
        add_eos_ = cfg.add_eos_token.value_or(false) && !eos_.empty();
    }

    std::string token_to_piece(int32_t id) const override {
        check(id);
        const std::string& piece = sp_.IdToPiece(id);
        if (sp_.IsByte(id)) {
            unsigned v = 0;
            if (std::sscanf(piece.c_str(), "<0x%02X>", &v) == 1) return std::string(1, char(v));
        }
        if (sp_.IsControl(id)) return piece;
        std::string out;
        for (size_t i = 0; i < piece.size();) {
            if (piece.compare(i, 3, kSpaceMark) == 0) {
                out.push_back(' ');
                i += 3;
            } else {
                out.push_back(piece[i++]);
            }
        }
        return out;
    }

    int32_t token_id(const std::string& piece) const override {
        std::string form;
        for (char c : piece) {
            if (c == ' ') {
                form += kSpaceMark;
            } else {
                form.push_back(c);
            }
        }
        // PieceToId answers unk_id for unknown pieces: confirm by the round trip.
        int32_t id = sp_.PieceToId(form);
        if (id >= 0 && id < n_ && sp_.IdToPiece(id) == form) return id;
        if (piece.size() == 1) {
            char name[8];
            std::snprintf(name, sizeof(name), "<0x%02X>", unsigned(static_cast<uint8_t>(piece[0])));
            id = sp_.PieceToId(name);
            if (id >= 0 && id < n_ && sp_.IdToPiece(id) == name) return id;
        }
        return -1;
    }

    int32_t vocab_size() const override { return n_; }
    int32_t bos_id() const override { return bos_; }
    const std::vector<int32_t>& eos_ids() const override { return eos_; }
    int32_t pad_id() const override { return pad_; }
    bool is_special(int32_t id) const override { return id >= 0 && id < n_ && sp_.IsControl(id); }
    std::string kind() const override { return "sentencepiece"; }

   protected:
    std::vector<int32_t> encode_impl(const std::string& text, bool add_special_tokens,
                                     bool parse_special) const override {
        std::vector<int32_t> out;
        if (add_special_tokens && add_bos_) out.push_back(bos_);
        std::vector<TextSegment> segs;
        if (parse_special) {
            matcher_.split(text, true, segs);
        } else {
            segs.push_back({0, text.size(), -1});
        }
        std::vector<int> ids;
        for (const TextSegment& s : segs) {
            if (s.id >= 0) {
                out.push_back(s.id);
                continue;
            }
            ids.clear();
            const auto st = sp_.Encode(std::string_view(text).substr(s.begin, s.end - s.begin), &ids);
            if (!st.ok()) throw Error(str(source_, ": SentencePiece could not encode the text (", st.ToString(), ")"));
            out.insert(out.end(), ids.begin(), ids.end());
        }
        if (add_special_tokens && add_eos_) out.push_back(eos_.front());
        return out;
    }

    std::string decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
        // SentencePiece drops control pieces; without skipping they are written as their text,
        // with the runs between them decoded by SentencePiece.
        std::string out;
        std::vector<int> run;
        auto flush = [&] {
            if (run.empty()) return;
            std::string text;
            const auto st = sp_.Decode(run, &text);
            if (!st.ok()) throw Error(str(source_, ": SentencePiece could not decode (", st.ToString(), ")"));
            out += text;
            run.clear();
        };
        for (int32_t id : ids) {
            check(id);
            if (sp_.IsControl(id)) {
                if (skip_special_tokens) continue;
                flush();
                out += sp_.IdToPiece(id);
            } else {
                run.push_back(id);
            }
        }
        flush();
        return out;
    }

   private:
    void check(int32_t id) const {
        if (id < 0 || id >= n_)
            throw Error(str(source_, ": token id ", id, " is out of range (expected 0..", n_ - 1, ")"));
    }

    std::string source_;
    sentencepiece::SentencePieceProcessor sp_;
    int32_t n_ = 0;
    std::vector<AddedToken> controls_;
    AddedTokenMatcher matcher_;
    int32_t bos_ = -1, pad_ = -1;
    std::vector<int32_t> eos_;
    bool add_bos_ = false, add_eos_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(model_path, ec))
        throw Error(str(model_path, ": SentencePiece model file does not exist"));
    return std::make_unique<SentencePieceTokenizer>(model_path);
}

}  // namespace kv
