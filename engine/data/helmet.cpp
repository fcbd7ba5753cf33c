// HELMET loader (see helmet.h). Both splits are validated before any tokenizing; each split
// has its own entry in the length cache, so a changed eval file does not re-measure dev.
#include "helmet.h"

#include <algorithm>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/core/join.h"

namespace kv {

namespace {

using json = nlohmann::json;

const char* kWhat = "--data helmet";
const char* kMetadataFile = "helmet_metadata.json";


std::string task_dir(const HelmetOptions& opt) {
    return (std::filesystem::path(opt.path) / (opt.dataset_key + "_" + opt.max_length)).string();
}

std::string missing_file_hint(const HelmetOptions& opt) {
    const std::string dir = task_dir(opt);
    return str("build the splits with keys_values (keys_values.data.load_helmet_dev_eval('", opt.dataset_key, "', max_length='",
               opt.max_length, "'), which caches them under ~/.cache/huggingface/helmet/longtrain/", opt.dataset_key, "_",
               opt.max_length,
               ") and export each as JSON Lines: python -c \"import datasets; d = datasets.load_from_disk("
               "'<that folder>'); d['development'].to_json('",
               dir, "/development.jsonl'); d['evaluation'].to_json('", dir, "/evaluation.jsonl')\"; kvlab never downloads data");
}

// Record fields kept for sample metrics: everything but the prompt and the targets.
std::map<std::string, std::string> raw_fields(const json& obj) {
    std::map<std::string, std::string> f;
    for (auto it = obj.begin(); it != obj.end(); ++it) {
        if (it.key() == "input" || it.key() == "output") continue;
        f[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
    }
    return f;
}

std::vector<std::string> parse_targets(const json& obj, const std::string& where) {
    auto it = obj.find("output");
    const char* expected = "expected a string or a non-empty list of strings";
    if (it == obj.end()) throw Error(str(where, ": field 'output' is missing; ", expected));
    if (it->is_string()) return {it->get<std::string>()};
    if (!it->is_array() || it->empty())
        throw Error(str(where, ": field 'output' is ", it->is_array() ? "an empty list" : json_type_phrase(*it), "; ", expected));
    std::vector<std::string> t;
    for (size_t i = 0; i < it->size(); ++i) {
        if (!(*it)[i].is_string())
            throw Error(str(where, ": field 'output' item ", i, " is ", json_type_phrase((*it)[i]), "; ", expected));
        t.push_back((*it)[i].get<std::string>());
    }
    return t;
}

struct Split {
    std::string file;
    std::vector<json> objs;
};

// Reads and validates one split; returns its objects.
Split read_split(const HelmetOptions& opt, const std::string& split) {
    Split s;
    s.file = helmet_split_file(opt, split);
    if (!file_exists(s.file))
        throw Error(str(kWhat, ": the ", split, " split of '", opt.dataset_key, "' (", opt.max_length, ") is missing; expected '",
                        s.file, "' (JSON Lines; a JSON array in ", split, ".json also works)"),
                    missing_file_hint(opt));
    s.objs = read_json_records(s.file, kWhat);
    const std::string fname = std::filesystem::path(s.file).filename().string();
    for (size_t i = 0; i < s.objs.size(); ++i) {
        const json& o = s.objs[i];
        std::string where = str(kWhat, ": '", fname, "' record ", i);
        json_string_field(o, "input", where);
        parse_targets(o, where);
        json_string_field(o, "query_id", where);
        const std::string& ml = json_string_field(o, "max_length", where);
        if (ml != opt.max_length)
            throw Error(str(where, ": max_length is '", ml, "'; expected '", opt.max_length, "' (the folder's bucket)"),
                        "the file belongs to another context-length bucket; check --data.path and the max_length option");
    }
    return s;
}

std::vector<DataRecord> load_split(const HelmetOptions& opt, const Tokenizer& tok, const Split& s, const std::string& key,
                                   LoadedDataset& out) {
    const LengthCache cache = helmet_length_cache(opt, key);
    auto prompt = [&](int64_t i) { return s.objs[(size_t)i]["input"].get<std::string>(); };
    auto pick = [&](int64_t n) { return opt.max_seq_length > 0 && n > opt.max_seq_length ? Pick::PICK_DROP : Pick::PICK_KEEP; };
    PromptPass pass = tokenize_and_pick(tok, cache, opt.recompute_lengths, (int64_t)s.objs.size(), prompt, pick, 0, &out.notes);
    out.lengths_from_cache = out.lengths_from_cache && pass.from_cache;
    std::vector<DataRecord> recs;
    recs.reserve(pass.picked.size());
    for (auto& p : pass.picked) {
        const json& o = s.objs[(size_t)p.index];
        DataRecord r;
        r.id = o["query_id"].get<std::string>();
        r.source_index = p.index;
        r.prompt_ids = std::move(p.ids);
        r.num_tokens = p.num_tokens;
        r.targets = parse_targets(o, "");
        r.fields = raw_fields(o);
        recs.push_back(std::move(r));
    }
    return recs;
}

}  // namespace

const std::vector<std::string>& helmet_dataset_keys() {
    static const std::vector<std::string> k = {"nq",
                                               "trivia_qa",
                                               "hotpot_qa",
                                               "pop_qa",
                                               "alce_asqa",
                                               "alce_qampari",
                                               "ms_macro",
                                               "trec_coarse",
                                               "trec_fine",
                                               "nlu",
                                               "banking77",
                                               "clinc150",
                                               "narrative_qa",
                                               "infinite_bench_qa",
                                               "infinite_bench_mc",
                                               "infinite_bench_sum",
                                               "multi_lex_sum",
                                               "json_kv",
                                               "ruler_mk_needle",
                                               "ruler_mk_uuid",
                                               "ruler_mv"};
    return k;
}

const std::vector<std::string>& helmet_max_lengths() {
    static const std::vector<std::string> m = {"8k", "16k", "32k", "64k", "128k"};
    return m;
}

std::string helmet_split_file(const HelmetOptions& opt, const std::string& split) {
    const std::filesystem::path dir = task_dir(opt);
    const std::string jsonl = (dir / (split + ".jsonl")).string();
    const std::string js = (dir / (split + ".json")).string();
    return !file_exists(jsonl) && file_exists(js) ? js : jsonl;
}

LengthCache helmet_length_cache(const HelmetOptions& opt, const std::string& split) {
    const std::string dir = metadata_dir_or(opt.metadata_dir, opt.path);
    return LengthCache{(std::filesystem::path(dir) / kMetadataFile).string(),
                       {"sequence_lengths", opt.dataset_key, opt.max_length, opt.model_name, split}};
}

LoadedDataset load_helmet(const HelmetOptions& opt, const Tokenizer& tok) {
    const auto& keys = helmet_dataset_keys();
    if (std::find(keys.begin(), keys.end(), opt.dataset_key) == keys.end())
        throw Error(str("--data.dataset_key: '", opt.dataset_key, "' is not a HELMET task; expected one of ", join(keys)));
    const auto& lens = helmet_max_lengths();
    if (std::find(lens.begin(), lens.end(), opt.max_length) == lens.end())
        throw Error(str("helmet max_length: '", opt.max_length, "' is not a HELMET bucket; expected one of ", join(lens)));
    if (opt.path.empty())
        throw Error(str(kWhat, ": no data folder given; expected --data.path <folder holding ", opt.dataset_key, "_",
                        opt.max_length, "/>"),
                    missing_file_hint(opt));
    if (opt.max_seq_length < 0)
        throw Error(str("--data.max_seq_length: ", opt.max_seq_length, " is out of range; expected 0 (no filter) or more"));
    if (opt.model_name.empty())
        throw Error(str(kWhat, ": no model name to key the token-length cache; expected the model's name (e.g. 'Qwen2.5-0.5B')"));

    // Both files first: a missing or malformed eval split should not cost a dev tokenizing pass.
    const Split dev = read_split(opt, "development");
    const Split eval = read_split(opt, "evaluation");
    LoadedDataset out;
    out.num_source_records = (int64_t)(dev.objs.size() + eval.objs.size());
    out.metadata_path = helmet_length_cache(opt, "dev").path;
    out.lengths_from_cache = true;
    out.dev = load_split(opt, tok, dev, "dev", out);
    out.test = load_split(opt, tok, eval, "eval", out);
    return out;
}

}  // namespace kv
