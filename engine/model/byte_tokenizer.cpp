// Byte tokenizer (see byte_tokenizer.h).
#include "byte_tokenizer.h"

#include "engine/core/error.h"
#include "presets.h"

namespace kv {

namespace {
class ByteTokenizer final : public Tokenizer {
   public:
    std::string token_to_piece(int32_t id) const override {
        if (id >= 0 && id < 256) return std::string(1, char(id));
        if (id == kByteBos) return "<bos>";
        if (id == kByteEos) return "<eos>";
        if (id == kBytePad) return "<pad>";
        return "";
    }
    int32_t token_id(const std::string& piece) const override {
        if (piece.size() == 1) return int32_t(uint8_t(piece[0]));
        if (piece == "<bos>") return kByteBos;
        if (piece == "<eos>") return kByteEos;
        if (piece == "<pad>") return kBytePad;
        return -1;
    }
    int32_t vocab_size() const override { return int32_t(kByteVocab); }
    int32_t bos_id() const override { return kByteBos; }
    const std::vector<int32_t>& eos_ids() const override {
        static const std::vector<int32_t> e = {kByteEos};
        return e;
    }
    int32_t pad_id() const override { return kBytePad; }
    bool is_special(int32_t id) const override { return id >= 256; }
    std::string kind() const override { return "bytes"; }

   protected:
    std::vector<int32_t> encode_impl(const std::string& text, bool, bool) const override {
        std::vector<int32_t> ids;
        ids.reserve(text.size());
        for (unsigned char c : text) ids.push_back(int32_t(c));
        return ids;
    }
    std::string decode_impl(const std::vector<int32_t>& ids, bool skip_special) const override {
        std::string s;
        for (int32_t id : ids) {
            if (id < 0 || id >= int32_t(kByteVocab)) throw Error(str("byte tokenizer: id ", id, " is outside [0, ", kByteVocab, ")"));
            if (id < 256) s += char(id);
            else if (!skip_special) s += token_to_piece(id);
        }
        return s;
    }
};
}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace kv
