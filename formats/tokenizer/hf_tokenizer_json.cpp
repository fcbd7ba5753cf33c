// Loader for Hugging Face tokenizer.json (model type BPE): reads the model, added tokens,
// normalizer, pre-tokenizer, decoder and post-processor into a BpePipeline, plus BOS/EOS/PAD
// from the side files. Every error names the file and the JSON location. Must not tokenize.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bpe_tokenizer.h"
#include "byte_level.h"
#include "engine/core/error.h"
#include "regex.h"
#include "special_ids.h"
#include "tokenizer.h"

namespace kv {

namespace {

using nlohmann::json;

class JsonReader {
   public:
    explicit JsonReader(std::string file) : file_(std::move(file)) {}

    [[noreturn]] void fail(const std::string& where, const std::string& what) const {
        throw Error(str(file_, ": ", where, ": ", what));
    }
    const std::string& file() const { return file_; }

    std::string type_of(const json& j, const std::string& where) const {
        if (!j.is_object()) fail(where, "expected an object with a \"type\"");
        auto it = j.find("type");
        if (it == j.end() || !it->is_string()) fail(where, "missing \"type\" string");
        return it->get<std::string>();
    }
    bool opt_bool(const json& j, const char* key, bool def, const std::string& where) const {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) return def;
        if (!it->is_boolean()) fail(where + "." + key, "expected true or false");
        return it->get<bool>();
    }
    std::string opt_string(const json& j, const char* key, const std::string& def, const std::string& where) const {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) return def;
        if (!it->is_string()) fail(where + "." + key, "expected a string");
        return it->get<std::string>();
    }
    const json& array(const json& j, const char* key, const std::string& where) const {
        auto it = j.find(key);
        if (it == j.end() || !it->is_array()) fail(where + "." + key, "expected an array");
        return *it;
    }
    // {"String": "x"} or {"Regex": "..."} -> a PCRE2 pattern.
    std::string pattern(const json& j, const std::string& where) const {
        auto it = j.find("pattern");
        if (it == j.end() || !it->is_object()) fail(where + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
        if (it->contains("Regex") && (*it)["Regex"].is_string()) return (*it)["Regex"].get<std::string>();
        if (it->contains("String") && (*it)["String"].is_string())
            return Regex::escape((*it)["String"].get<std::string>());
        fail(where + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
    }

   private:
    std::string file_;
};

std::shared_ptr<const Regex> compile(const JsonReader& r, const std::string& pattern, const std::string& where) {
    try {
        return shared_regex(pattern);
    } catch (const Error& e) {
        r.fail(where, e.what());
    }
}

// ---- normalizer -------------------------------------------------------------------------------
void parse_normalizer(const JsonReader& r, const json& j, const std::string& where, Normalizer& out) {
    if (j.is_null()) return;
    const std::string type = r.type_of(j, where);
    NormStep s;
    if (type == "Sequence") {
        const json& list = r.array(j, "normalizers", where);
        for (size_t i = 0; i < list.size(); ++i)
            parse_normalizer(r, list[i], str(where, ".normalizers[", i, "]"), out);
        return;
    } else if (type == "NFC") {
        s.kind = NormKind::NFC;
    } else if (type == "NFD") {
        s.kind = NormKind::NFD;
    } else if (type == "NFKC") {
        s.kind = NormKind::NFKC;
    } else if (type == "NFKD") {
        s.kind = NormKind::NFKD;
    } else if (type == "Lowercase") {
        s.kind = NormKind::LOWERCASE;
    } else if (type == "Prepend") {
        s.kind = NormKind::PREPEND;
        s.text = r.opt_string(j, "prepend", "", where);
    } else if (type == "Replace") {
        s.kind = NormKind::REPLACE;
        s.text = r.opt_string(j, "content", "", where);
        const json& p = j.value("pattern", json());
        if (p.is_object() && p.contains("String") && p["String"].is_string()) {
            s.literal = p["String"].get<std::string>();
        } else {
            s.regex = compile(r, r.pattern(j, where), where + ".pattern");
        }
    } else if (type == "Strip") {
        s.kind = NormKind::STRIP;
        s.strip_left = r.opt_bool(j, "strip_left", true, where);
        s.strip_right = r.opt_bool(j, "strip_right", true, where);
    } else {
        r.fail(where, str("normalizer type \"", type,
                          "\" is not supported (expected NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip or "
                          "Sequence)"));
    }
    out.add(std::move(s));
}

// ---- pre-tokenizer ----------------------------------------------------------------------------
SplitBehavior parse_behavior(const JsonReader& r, const std::string& b, const std::string& where) {
    if (b == "Isolated") return SplitBehavior::ISOLATED;
    if (b == "Removed") return SplitBehavior::REMOVED;
    if (b == "MergedWithPrevious") return SplitBehavior::MERGED_WITH_PREVIOUS;
    if (b == "MergedWithNext") return SplitBehavior::MERGED_WITH_NEXT;
    if (b == "Contiguous") return SplitBehavior::CONTIGUOUS;
    r.fail(where, str("split behavior \"", b,
                      "\" is not known (expected Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous)"));
}

PrependScheme parse_prepend(const JsonReader& r, const json& j, const std::string& where) {
    if (j.contains("prepend_scheme")) {
        const std::string s = r.opt_string(j, "prepend_scheme", "always", where);
        if (s == "always") return PrependScheme::ALWAYS;
        if (s == "first") return PrependScheme::FIRST;
        if (s == "never") return PrependScheme::NEVER;
        r.fail(where + ".prepend_scheme", str("\"", s, "\" is not known (expected always, first or never)"));
    }
    return r.opt_bool(j, "add_prefix_space", true, where) ? PrependScheme::ALWAYS : PrependScheme::NEVER;
}

void parse_pre_tokenizer(const JsonReader& r, const json& j, const std::string& where, PreTokenizer& out) {
    if (j.is_null()) return;
    const std::string type = r.type_of(j, where);
    PreTokStep s;
    if (type == "Sequence") {
        const json& list = r.array(j, "pretokenizers", where);
        for (size_t i = 0; i < list.size(); ++i)
            parse_pre_tokenizer(r, list[i], str(where, ".pretokenizers[", i, "]"), out);
        return;
    } else if (type == "ByteLevel") {
        s.kind = PreTokKind::BYTE_LEVEL;
        s.add_prefix_space = r.opt_bool(j, "add_prefix_space", true, where);
        if (r.opt_bool(j, "use_regex", true, where)) s.regex = compile(r, pretok_pattern::kGpt2, where);
    } else if (type == "Split") {
        s.kind = PreTokKind::SPLIT;
        s.regex = compile(r, r.pattern(j, where), where + ".pattern");
        s.behavior = parse_behavior(r, r.opt_string(j, "behavior", "Isolated", where), where + ".behavior");
        s.invert = r.opt_bool(j, "invert", false, where);
    } else if (type == "Digits") {
        s.kind = PreTokKind::SPLIT;
        s.regex = compile(r, R"(\p{N})", where);
        s.behavior = r.opt_bool(j, "individual_digits", false, where) ? SplitBehavior::ISOLATED
                                                                        : SplitBehavior::CONTIGUOUS;
    } else if (type == "Metaspace") {
        s.kind = PreTokKind::METASPACE;
        s.replacement = r.opt_string(j, "replacement", "\xE2\x96\x81", where);
        s.prepend = parse_prepend(r, j, where);
        s.split = r.opt_bool(j, "split", true, where);
    } else if (type == "Whitespace") {  // keep \w+ and [^\w\s]+ runs, drop whitespace
        s.kind = PreTokKind::SPLIT;
        s.regex = compile(r, R"(\w+|[^\w\s]+)", where);
        s.behavior = SplitBehavior::REMOVED;
        s.invert = true;
    } else if (type == "WhitespaceSplit") {
        s.kind = PreTokKind::SPLIT;
        s.regex = compile(r, R"(\s+)", where);
        s.behavior = SplitBehavior::REMOVED;
    } else if (type == "Punctuation") {
        s.kind = PreTokKind::SPLIT;
        s.regex = compile(r, R"([\p{P}\x21-\x2F\x3A-\x40\x5B-\x60\x7B-\x7E])", where);
        s.behavior = parse_behavior(r, r.opt_string(j, "behavior", "Isolated", where), where + ".behavior");
    } else {
        r.fail(where, str("pre-tokenizer type \"", type,
                          "\" is not supported (expected ByteLevel, Split, Digits, Metaspace, Whitespace, "
                          "WhitespaceSplit, Punctuation or Sequence)"));
    }
    out.add(std::move(s));
}

// ---- decoder ----------------------------------------------------------------------------------
void parse_decoder(const JsonReader& r, const json& j, const std::string& where, TokenDecoder& out) {
    if (j.is_null()) return;
    const std::string type = r.type_of(j, where);
    DecoderStep s;
    if (type == "Sequence") {
        const json& list = r.array(j, "decoders", where);
        for (size_t i = 0; i < list.size(); ++i) parse_decoder(r, list[i], str(where, ".decoders[", i, "]"), out);
        return;
    } else if (type == "ByteLevel") {
        s.kind = DecoderKind::BYTE_LEVEL;
    } else if (type == "Metaspace") {
        s.kind = DecoderKind::METASPACE;
        s.replacement = r.opt_string(j, "replacement", "\xE2\x96\x81", where);
        s.prepend = parse_prepend(r, j, where) != PrependScheme::NEVER;
    } else if (type == "Replace") {
        s.kind = DecoderKind::REPLACE;
        const json& p = j.value("pattern", json());
        if (!p.is_object() || !p.contains("String") || !p["String"].is_string())
            r.fail(where + ".pattern", "only {\"String\": ...} patterns are supported in decoders");
        s.from = p["String"].get<std::string>();
        s.to = r.opt_string(j, "content", "", where);
    } else if (type == "ByteFallback") {
        s.kind = DecoderKind::BYTE_FALLBACK;
    } else if (type == "Fuse") {
        s.kind = DecoderKind::FUSE;
    } else if (type == "Strip") {
        s.kind = DecoderKind::STRIP;
        s.strip_content = r.opt_string(j, "content", " ", where);
        s.strip_start = j.value("start", 0);
        s.strip_stop = j.value("stop", 0);
    } else {
        r.fail(where, str("decoder type \"", type,
                          "\" is not supported (expected ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip or "
                          "Sequence)"));
    }
    out.add(std::move(s));
}

// ---- post-processor ---------------------------------------------------------------------------
// `wrap` is applied outside what is already in `out` (Sequence processors nest in order).
void parse_post_processor(const JsonReader& r, const json& j, const std::string& where, PostProcessor& out) {
    if (j.is_null()) return;
    const std::string type = r.type_of(j, where);
    PostProcessor add;
    if (type == "Sequence") {
        const json& list = r.array(j, "processors", where);
        for (size_t i = 0; i < list.size(); ++i)
            parse_post_processor(r, list[i], str(where, ".processors[", i, "]"), out);
        return;
    } else if (type == "ByteLevel") {
        return;  // only trims offsets; adds no tokens
    } else if (type == "TemplateProcessing") {
        const json& single = r.array(j, "single", where);
        const json& specials = j.value("special_tokens", json::object());
        bool seen_sequence = false;
        for (size_t i = 0; i < single.size(); ++i) {
            const std::string w = str(where, ".single[", i, "]");
            const json& item = single[i];
            if (item.contains("Sequence")) {
                seen_sequence = true;
                continue;
            }
            if (!item.contains("SpecialToken") || !item["SpecialToken"].is_object())
                r.fail(w, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
            const std::string name = r.opt_string(item["SpecialToken"], "id", "", w);
            auto it = specials.find(name);
            if (it == specials.end() || !it->is_object() || !it->contains("ids") || !(*it)["ids"].is_array())
                r.fail(w, str("special token \"", name, "\" is not listed in special_tokens with its ids"));
            for (const json& id : (*it)["ids"]) {
                if (!id.is_number_integer()) r.fail(w, str("special token \"", name, "\" has a non-integer id"));
                (seen_sequence ? add.suffix : add.prefix).push_back(id.get<int32_t>());
            }
        }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
        auto id_of = [&](const char* key) {
            const json& v = j.value(key, json());
            if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
                r.fail(where + "." + key, "expected [token, id]");
            return v[1].get<int32_t>();
        };
        add.prefix.push_back(id_of("cls"));
        add.suffix.push_back(id_of("sep"));
    } else {
        r.fail(where, str("post-processor type \"", type,
                          "\" is not supported (expected TemplateProcessing, ByteLevel, RobertaProcessing, "
                          "BertProcessing or Sequence)"));
    }
    out.prefix.insert(out.prefix.begin(), add.prefix.begin(), add.prefix.end());
    out.suffix.insert(out.suffix.end(), add.suffix.begin(), add.suffix.end());
}

// ---- model ------------------------------------------------------------------------------------
std::unique_ptr<BpeModel> parse_model(const JsonReader& r, const json& root) {
    auto mit = root.find("model");
    if (mit == root.end() || !mit->is_object())
        r.fail("model", "missing \"model\" object (expected {\"type\": \"BPE\", \"vocab\": ..., \"merges\": ...})");
    const json& m = *mit;
    std::string type;
    if (m.contains("type")) {
        type = r.opt_string(m, "type", "", "model");
    } else if (m.contains("vocab") && m.contains("merges")) {
        type = "BPE";  // older files omit the tag; vocab + merges is unambiguous
    }
    if (type != "BPE")
        r.fail("model.type", str("model type \"", type,
                                 "\" is not supported (expected \"BPE\"; SentencePiece models load from tokenizer.model)"));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (!r.opt_string(m, key, "", "model").empty())
            r.fail(str("model.", key), "is set, but only byte-level/SentencePiece-style BPE without word affixes is supported");
    }

    auto vit = m.find("vocab");
    if (vit == m.end() || !vit->is_object()) r.fail("model.vocab", "expected an object mapping token strings to ids");
    std::vector<std::pair<std::string, int32_t>> vocab;
    vocab.reserve(vit->size());
    for (auto it = vit->begin(); it != vit->end(); ++it) {
        if (!it.value().is_number_integer())
            r.fail("model.vocab", str("token \"", it.key(), "\" has a non-integer id"));
        const int64_t id = it.value().get<int64_t>();
        if (id < 0 || id > kMaxTokenId)
            r.fail("model.vocab", str("token \"", it.key(), "\" has id ", id, " (expected 0..", kMaxTokenId, ")"));
        vocab.emplace_back(it.key(), int32_t(id));
    }

    const json& jm = r.array(m, "merges", "model");
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(jm.size());
    for (size_t i = 0; i < jm.size(); ++i) {
        const json& e = jm[i];
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            const size_t sp = s.find(' ', 1);  // from 1: a part is never empty
            if (sp == std::string::npos || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
                r.fail(str("model.merges[", i, "]"), str("\"", s, "\" is not two tokens separated by one space"));
            merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
        } else {
            r.fail(str("model.merges[", i, "]"), "expected \"a b\" or [\"a\", \"b\"]");
        }
    }

    BpeOptions opt;
    opt.ignore_merges = r.opt_bool(m, "ignore_merges", false, "model");
    opt.byte_fallback = r.opt_bool(m, "byte_fallback", false, "model");
    opt.fuse_unk = r.opt_bool(m, "fuse_unk", false, "model");
    opt.unk_token = r.opt_string(m, "unk_token", "", "model");
    return std::make_unique<BpeModel>(vocab, merges, opt, r.file());
}

std::vector<AddedToken> parse_added_tokens(const JsonReader& r, const json& root) {
    std::vector<AddedToken> out;
    auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return out;
    if (!it->is_array()) r.fail("added_tokens", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
        const json& e = (*it)[i];
        const std::string w = str("added_tokens[", i, "]");
        if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0 ||
            e["id"].get<int64_t>() > kMaxTokenId)
            r.fail(w, str("expected an object with an integer \"id\" in 0..", kMaxTokenId));
        AddedToken t;
        t.id = e["id"].get<int32_t>();
        t.content = r.opt_string(e, "content", "", w);
        if (t.content.empty()) r.fail(w, "\"content\" is missing or empty");
        t.special = r.opt_bool(e, "special", false, w);
        t.lstrip = r.opt_bool(e, "lstrip", false, w);
        t.rstrip = r.opt_bool(e, "rstrip", false, w);
        t.single_word = r.opt_bool(e, "single_word", false, w);
        t.normalized = r.opt_bool(e, "normalized", !t.special, w);  // Hugging Face's default
        out.push_back(std::move(t));
    }
    return out;
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(str(path, ": cannot be opened for reading"));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The whole load; json::exception escapes only for values of an unexpected type. `side_dir`:
// folder of tokenizer_config.json & co ("" = read none).
std::unique_ptr<Tokenizer> build_from_json(const std::string& text, const std::string& json_path,
                                           const std::string& side_dir) {
    const JsonReader r(json_path);
    json root;
    try {
        root = json::parse(text);
    } catch (const json::parse_error& e) {
        throw Error(str(json_path, ": not valid JSON (", e.what(), ")"),
                    "expected a Hugging Face tokenizer.json; re-download the file if it is truncated");
    }
    if (!root.is_object()) r.fail("top level", "expected a JSON object");

    BpePipeline p;
    p.source = json_path;
    p.model = parse_model(r, root);
    p.added = parse_added_tokens(r, root);
    parse_normalizer(r, root.value("normalizer", json()), "normalizer", p.normalizer);
    parse_pre_tokenizer(r, root.value("pre_tokenizer", json()), "pre_tokenizer", p.pre);
    parse_decoder(r, root.value("decoder", json()), "decoder", p.decoder);
    parse_post_processor(r, root.value("post_processor", json()), "post_processor", p.post);

    // Special ids: side files first, then what the post-processor adds, then well-known names.
    std::unordered_map<std::string, int32_t> added_ids;
    int32_t vocab_size = p.model->max_id() + 1;
    for (const AddedToken& t : p.added) {
        added_ids.emplace(t.content, t.id);
        vocab_size = std::max(vocab_size, t.id + 1);
    }
    const BpeModel& model = *p.model;
    auto lookup = [&](const std::string& text) -> int32_t {
        if (auto it = added_ids.find(text); it != added_ids.end()) return it->second;
        const int32_t id = model.token_to_id(text);
        return id >= 0 ? id : model.token_to_id(byte_level_encode(text));
    };
    const SideConfig cfg = side_dir.empty() ? SideConfig{} : read_side_config(side_dir);
    const SpecialIds ids = resolve_special_ids(cfg, lookup, vocab_size, p.post.prefix.empty() ? -1 : p.post.prefix[0]);
    p.bos = ids.bos;
    p.eos = ids.eos;
    p.pad = ids.pad;
    // tokenizer_config.json's add_bos_token/add_eos_token override the template (as transformers'
    // Llama fast tokenizer rebuilds its post-processor from them).
    if (cfg.add_bos_token && p.bos >= 0) {
        const bool has = !p.post.prefix.empty() && p.post.prefix.front() == p.bos;
        if (*cfg.add_bos_token && !has) p.post.prefix.insert(p.post.prefix.begin(), p.bos);
        if (!*cfg.add_bos_token && has) p.post.prefix.erase(p.post.prefix.begin());
    }
    if (cfg.add_eos_token && !p.eos.empty()) {
        const bool has = !p.post.suffix.empty() && p.post.suffix.back() == p.eos.front();
        if (*cfg.add_eos_token && !has) p.post.suffix.push_back(p.eos.front());
        if (!*cfg.add_eos_token && has) p.post.suffix.pop_back();
    }
    return std::make_unique<BpeTokenizer>(std::move(p));
}

}  // namespace

std::unique_ptr<Tokenizer> parse_tokenizer_json(const std::string& text, const std::string& source) {
    try {
        return build_from_json(text, source, "");
    } catch (const json::exception& e) {
        // A value of an unexpected JSON type deep inside a part (e.g. a string where a number goes).
        throw Error(str(source, ": unexpected JSON value (", e.what(), ")"));
    }
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& json_path) {
    const std::string text = read_file(json_path);
    std::string dir = std::filesystem::path(json_path).parent_path().string();
    if (dir.empty()) dir = ".";
    try {
        return build_from_json(text, json_path, dir);
    } catch (const json::exception& e) {
        throw Error(str(json_path, ": unexpected JSON value (", e.what(), ")"));
    }
}

}  // namespace kv
