// LongBench v2 loader (see longbench_v2.h). Every record is validated before any tokenizing,
// so a bad field fails in seconds instead of after minutes of measuring prompt lengths.
#include "longbench_v2.h"

#include <algorithm>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/data/synthetic.h"

namespace kv {

namespace {

using json = nlohmann::json;

const char* kWhat = "--data longbench";
const char* kMetadataFile = "longbench_v2_metadata.json";

// Field references into the parsed file (no copies of the multi-megabyte contexts).
struct Entry {
    std::string id;
    const std::string* question = nullptr;
    std::array<const std::string*, 4> choices{};
    const std::string* context = nullptr;
    const std::string* answer = nullptr;
    int32_t label = -1;
    std::map<std::string, std::string> tags;  // domain, sub_domain, difficulty, length
};

std::string missing_file_hint(const std::string& path) {
    return str(
        "download the train split of THUDM/LongBench-v2 (data.json at "
        "https://huggingface.co/datasets/THUDM/LongBench-v2) and save it as '",
        path,
        "', e.g. python -c \"import datasets; datasets.load_dataset('THUDM/LongBench-v2', split='train')"
        ".to_json('",
        path, "')\"; kvlab never downloads data");
}

Entry parse_entry(const json& obj, int64_t index, const std::string& path) {
    const std::string fname = std::filesystem::path(path).filename().string();
    std::string where = str(kWhat, ": '", fname, "' record ", index);
    Entry e;
    e.id = json_string_field_or(obj, "_id", "", where);
    if (!e.id.empty())
        where += str(" (_id ", e.id, ")");
    else
        e.id = str("#", index);
    e.question = &json_string_field(obj, "question", where);
    static const char* choice_names[4] = {"choice_A", "choice_B", "choice_C", "choice_D"};
    for (int c = 0; c < 4; ++c) e.choices[(size_t)c] = &json_string_field(obj, choice_names[c], where);
    e.context = &json_string_field(obj, "context", where);
    e.answer = &json_string_field(obj, "answer", where);
    e.label = longbench_v2_answer_index(*e.answer, where);
    for (const char* tag : {"domain", "sub_domain", "difficulty", "length"})
        if (obj.contains(tag)) e.tags[tag] = json_string_field(obj, tag, where);
    return e;
}

DataRecord make_record(const Entry& e, PickedPrompt& p) {
    DataRecord r;
    r.id = e.id;
    r.source_index = p.index;
    r.prompt_ids = std::move(p.ids);
    r.num_tokens = p.num_tokens;
    r.label = e.label;
    r.targets = {*e.answer};
    r.fields = e.tags;
    r.fields["question"] = *e.question;
    static const char* choice_names[4] = {"choice_A", "choice_B", "choice_C", "choice_D"};
    for (int c = 0; c < 4; ++c) r.fields[choice_names[c]] = *e.choices[(size_t)c];
    r.fields["answer"] = *e.answer;
    return r;
}

}  // namespace

std::string longbench_v2_prompt(const LongBenchV2Fields& f, HeadKind head) {
    // The 0-shot prompt of THUDM/LongBench (prompts/0shot.txt) as keys_values assembles it.
    std::vector<std::string> lines = {
        "Please read the following text and answer the question below.",
        "",
        "<text>",
        f.context,
        "</text>",
        "",
        "What is the correct answer to this question: " + f.question,
        "Choices:",
        "A: " + f.choices[0],
        "B: " + f.choices[1],
        "C: " + f.choices[2],
        "D: " + f.choices[3],
        "",
    };
    if (head == HeadKind::NEXT_TOKEN) {
        lines.push_back("Format your response as follows: \"The correct answer is (insert answer here)\".");
        lines.push_back("");
        lines.push_back("Answer:");
    }
    lines.push_back("The correct answer is ");
    std::string s;
    for (size_t i = 0; i < lines.size(); ++i) {
        if (i) s += '\n';
        s += lines[i];
    }
    return s;
}

int32_t longbench_v2_answer_index(const std::string& answer, const std::string& where) {
    if (answer.size() == 1 && answer[0] >= 'A' && answer[0] <= 'D') return int32_t(answer[0] - 'A');
    throw Error(str(where, ": answer '", answer, "' is not one of A, B, C, D"));
}

LengthCache longbench_v2_length_cache(const LongBenchV2Options& opt) {
    const std::string dir = metadata_dir_or(opt.metadata_dir, std::filesystem::path(opt.path).parent_path().string());
    const HeadKind head = head_kind_from_name(opt.head_model);
    const std::string key = head == HeadKind::NEXT_TOKEN ? opt.model_name : opt.model_name + "#classification";
    return LengthCache{(std::filesystem::path(dir) / kMetadataFile).string(), {"sequence_lengths", key}};
}

LoadedDataset load_longbench_v2(const LongBenchV2Options& opt, const Tokenizer& tok) {
    if (opt.path.empty())
        throw Error(str(kWhat, ": no data file given; expected --data.path <file.json>"), missing_file_hint("longbench_v2.json"));
    if (!file_exists(opt.path))
        throw Error(
            str(kWhat, ": data file '", opt.path, "' does not exist; expected the THUDM/LongBench-v2 train split as JSON"),
            missing_file_hint(opt.path));
    if (opt.max_seq_length < 1)
        throw Error(str("--data.max_seq_length: ", opt.max_seq_length, " is out of range; expected at least 1"));
    if (!opt.test_set_tag.empty() && opt.test_set_tag != "rest")
        throw Error(str("--data.test_set_tag: '", opt.test_set_tag, "' is not supported; expected '' or 'rest'"));
    if (opt.debug_num_cases < 0)
        throw Error(str("--data.debug_num_cases: ", opt.debug_num_cases, " is out of range; expected 0 (all) or more"));
    if (opt.model_name.empty())
        throw Error(str(kWhat, ": no model name to key the token-length cache; expected the model's name (e.g. 'Qwen2.5-0.5B')"));
    const HeadKind head = head_kind_from_name(opt.head_model);

    LoadedDataset out;
    if (head != HeadKind::NEXT_TOKEN) {
        out.class_token_ids = class_tokens(tok).ids;  // throws naming the label without a single token
    } else {
        try {
            out.class_token_ids = class_tokens(tok).ids;  // handy for accuracy, not required
        } catch (const Error&) {
        }
    }

    const std::vector<json> objs = read_json_records(opt.path, kWhat);
    std::vector<Entry> entries;
    entries.reserve(objs.size());
    for (size_t i = 0; i < objs.size(); ++i) entries.push_back(parse_entry(objs[i], (int64_t)i, opt.path));
    out.num_source_records = (int64_t)entries.size();

    const LengthCache cache = longbench_v2_length_cache(opt);
    out.metadata_path = cache.path;
    auto prompt = [&](int64_t i) {
        const Entry& e = entries[(size_t)i];
        LongBenchV2Fields f{*e.question, {*e.choices[0], *e.choices[1], *e.choices[2], *e.choices[3]}, *e.context};
        return longbench_v2_prompt(f, head);
    };
    const bool rest = opt.test_set_tag == "rest";
    auto pick = [&](int64_t n) {
        if (n <= opt.max_seq_length) return Pick::PICK_KEEP;
        return rest ? Pick::PICK_TEST : Pick::PICK_DROP;
    };
    PromptPass pass = tokenize_and_pick(tok, cache, opt.recompute_lengths, out.num_source_records, prompt, pick,
                                        opt.debug_num_cases, &out.notes);
    out.lengths_from_cache = pass.from_cache;
    for (auto& p : pass.picked) {
        DataRecord r = make_record(entries[(size_t)p.index], p);
        (p.pick == Pick::PICK_KEEP ? out.dev : out.test).push_back(std::move(r));
    }
    // "rest": ascending length, ties in file order (Python's sorted is stable too).
    std::stable_sort(out.test.begin(), out.test.end(),
                     [](const DataRecord& a, const DataRecord& b) { return a.num_tokens < b.num_tokens; });
    return out;
}

}  // namespace kv
