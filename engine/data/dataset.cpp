// Shared data-loader machinery (see dataset.h). Randomness uses mt19937_64 with our own
// bounded draw and Fisher-Yates, because std::uniform_int_distribution and std::shuffle differ
// between standard libraries and a saved split or batch order must mean the same everywhere.
//
// Index: [SECTION] randomness  [SECTION] records  [SECTION] json files  [SECTION] metadata cache
//        [SECTION] tokenizing with the cache  [SECTION] train/val split  [SECTION] batches
#include "dataset.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <unistd.h>

#include "engine/core/error.h"

namespace kv {

using json = nlohmann::json;

namespace {

// ==== [SECTION] randomness ==================================================================

// splitmix64 finaliser: independent streams from (seed, stream) without correlated starts.
uint64_t mix_seed(uint64_t seed, uint64_t stream) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (stream + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [0, n) by rejection (no modulo bias), identical on every platform.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng();
    while (x >= limit);
    return x % n;
}

void fisher_yates(std::vector<int64_t>& v, std::mt19937_64& rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[(size_t)uniform_below(rng, i)]);
}

}  // namespace

// ==== [SECTION] records =====================================================================

std::vector<int32_t> draw_target_choices(const std::vector<DataRecord>& records, uint64_t seed) {
    std::vector<int32_t> choice(records.size(), -1);
    for (size_t i = 0; i < records.size(); ++i) {
        const size_t n = records[i].targets.size();
        if (n == 0) continue;
        // One stream per record: adding or removing a record leaves the others' choices alone.
        std::mt19937_64 rng(mix_seed(seed, uint64_t(records[i].source_index >= 0 ? records[i].source_index : (int64_t)i)));
        choice[i] = int32_t(uniform_below(rng, n));
    }
    return choice;
}

// ==== [SECTION] json files ==================================================================

const char* json_type_phrase(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::string: return "a string";
        case json::value_t::array: return "an array";
        case json::value_t::object: return "an object";
        case json::value_t::binary: return "binary";
        case json::value_t::discarded: return "discarded";
        default: return "a number";
    }
}

bool file_exists(const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_regular_file(path, ec);
}

std::vector<json> read_json_records(const std::string& path, const std::string& what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(str(what, ": cannot read '", path, "'; expected a readable JSON file"));
    // A UTF-8 byte-order mark (Windows editors) would hide the first character.
    char bom[3] = {0, 0, 0};
    in.read(bom, 3);
    if (!(in.gcount() == 3 && bom[0] == '\xEF' && bom[1] == '\xBB' && bom[2] == '\xBF')) {
        in.clear();
        in.seekg(0);
    }
    // The first non-blank character tells a JSON array from JSON Lines.
    char first = 0;
    while (in.get(first) && std::isspace((unsigned char)first)) {
    }
    if (!in) throw Error(str(what, ": '", path, "' is empty; expected a JSON array of objects or JSON Lines"));
    in.unget();
    std::vector<json> out;
    if (first == '[') {
        json root;
        try {
            root = json::parse(in);
        } catch (const json::parse_error& e) {
            throw Error(str(what, ": '", path, "' is not valid JSON (", e.what(), ")"),
                        "expected a JSON array of objects, or JSON Lines with one object per line");
        }
        out.reserve(root.size());
        for (size_t i = 0; i < root.size(); ++i) {
            if (!root[i].is_object())
                throw Error(str(what, ": '", path, "' element ", i, " is ", json_type_phrase(root[i]), "; expected an object"));
            out.push_back(std::move(root[i]));
        }
        return out;
    }
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        json obj;
        try {
            obj = json::parse(line);
        } catch (const json::parse_error& e) {
            throw Error(str(what, ": '", path, "' line ", line_no, " is not valid JSON (", e.what(), ")"),
                        "expected JSON Lines (one object per line) or a JSON array of objects");
        }
        if (!obj.is_object())
            throw Error(str(what, ": '", path, "' line ", line_no, " is ", json_type_phrase(obj), "; expected an object"));
        out.push_back(std::move(obj));
    }
    return out;
}

const std::string& json_string_field(const json& obj, const char* name, const std::string& where) {
    auto it = obj.find(name);
    if (it == obj.end()) throw Error(str(where, ": field '", name, "' is missing; expected a string"));
    if (!it->is_string()) throw Error(str(where, ": field '", name, "' is ", json_type_phrase(*it), "; expected a string"));
    return it->get_ref<const std::string&>();
}

std::string json_string_field_or(const json& obj, const char* name, const std::string& fallback, const std::string& where) {
    if (!obj.contains(name)) return fallback;
    return json_string_field(obj, name, where);
}

// ==== [SECTION] metadata cache ==============================================================

namespace {

// The whole cache file, or an empty object when it is missing or unreadable (*why says so).
json read_cache_file(const std::string& path, std::string* why) {
    if (!file_exists(path)) {
        if (why) *why = str("no metadata file '", path, "' yet");
        return json::object();
    }
    std::ifstream in(path, std::ios::binary);
    try {
        json j = json::parse(in);
        if (j.is_object()) return j;
        if (why) *why = str("metadata file '", path, "' is not a JSON object");
    } catch (const json::exception& e) {
        if (why) *why = str("metadata file '", path, "' is not valid JSON (", e.what(), ")");
    }
    return json::object();
}

std::string key_path_text(const std::vector<std::string>& keys) {
    std::string s;
    for (const auto& k : keys) s += "[\"" + k + "\"]";
    return s;
}

}  // namespace

std::optional<std::vector<int64_t>> length_cache_load(const LengthCache& cache, int64_t expected_count, std::string* why) {
    std::string reason;
    json root = read_cache_file(cache.path, &reason);
    const json* node = &root;
    for (const auto& k : cache.key_path) {
        if (!node->is_object() || !node->contains(k)) {
            if (why) *why = reason.empty() ? str("no entry ", key_path_text(cache.key_path), " in '", cache.path, "'") : reason;
            return std::nullopt;
        }
        node = &(*node)[k];
    }
    const std::string entry = str(key_path_text(cache.key_path), " in '", cache.path, "'");
    if (!node->is_array()) {
        if (why) *why = str(entry, " is ", json_type_phrase(*node), ", not a list of lengths");
        return std::nullopt;
    }
    if ((int64_t)node->size() != expected_count) {
        if (why) *why = str(entry, " has ", node->size(), " lengths for ", expected_count, " records (the data file changed)");
        return std::nullopt;
    }
    std::vector<int64_t> lengths;
    lengths.reserve(node->size());
    for (const auto& v : *node) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0) {
            if (why) *why = str(entry, " holds ", v.dump(), "; expected token counts (integers >= 0)");
            return std::nullopt;
        }
        lengths.push_back(v.get<int64_t>());
    }
    return lengths;
}

bool length_cache_store(const LengthCache& cache, const std::vector<int64_t>& lengths, std::string* why) {
    namespace fs = std::filesystem;
    json root = read_cache_file(cache.path, nullptr);
    json* node = &root;
    for (const auto& k : cache.key_path) {
        if (!node->is_object()) *node = json::object();
        node = &(*node)[k];
    }
    *node = lengths;
    std::error_code ec;
    const fs::path target(cache.path);
    if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
    // A unique sibling temp file then rename: readers see the old or the new file, never half.
    static std::atomic<uint64_t> counter{0};
    const std::string tmp = str(cache.path, ".tmp.", ::getpid(), ".", counter++);
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << root.dump();
        out.flush();
        if (!out) {
            if (why) *why = str("cannot write the metadata file '", tmp, "'");
            out.close();
            fs::remove(tmp, ec);
            return false;
        }
    }
    fs::rename(tmp, target, ec);
    if (ec) {
        if (why) *why = str("cannot replace the metadata file '", cache.path, "': ", ec.message());
        fs::remove(tmp, ec);
        return false;
    }
    return true;
}

std::string metadata_dir_or(const std::string& metadata_dir, const std::string& default_dir) {
    if (!metadata_dir.empty()) return metadata_dir;
    return default_dir.empty() ? std::string(".") : default_dir;
}

// ==== [SECTION] tokenizing with the cache ===================================================

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& prompt) {
    return tok.encode(prompt, /*add_special_tokens=*/true, /*parse_special=*/false);
}

PromptPass tokenize_and_pick(const Tokenizer& tok, const LengthCache& cache, bool recompute, int64_t count,
                             const std::function<std::string(int64_t)>& prompt, const std::function<Pick(int64_t)>& pick,
                             int64_t max_keep, std::vector<std::string>* notes) {
    auto note = [&](const std::string& s) {
        if (notes) notes->push_back(s);
    };
    std::optional<std::vector<int64_t>> cached;
    if (recompute) {
        note(str("recompute_lengths is set: tokenizing all ", count, " records for '", cache.path, "'"));
    } else {
        std::string why;
        cached = length_cache_load(cache, count, &why);
        if (!cached) note(str(why, ": tokenizing all ", count, " records"));
    }
    // At most two passes: with the cache, then (if it proved stale) without.
    for (;;) {
        PromptPass pass;
        pass.from_cache = cached.has_value();
        std::vector<int64_t> measured;
        int64_t kept = 0;
        bool stale = false, complete = true;
        for (int64_t i = 0; i < count; ++i) {
            std::vector<int32_t> ids;
            int64_t len;
            if (cached) {
                len = (*cached)[(size_t)i];
            } else {
                ids = encode_prompt(tok, prompt(i));
                len = (int64_t)ids.size();
                measured.push_back(len);
            }
            const Pick p = pick(len);
            if (p != Pick::PICK_DROP) {
                if (cached) {
                    ids = encode_prompt(tok, prompt(i));
                    if ((int64_t)ids.size() != len) {
                        note(str("'", cache.path, "' says record ", i, " has ", len, " tokens but its prompt has ", ids.size(),
                                 " (stale cache): tokenizing all ", count, " records"));
                        stale = true;
                        break;
                    }
                }
                pass.picked.push_back(PickedPrompt{i, len, std::move(ids), p});
                if (p == Pick::PICK_KEEP && max_keep > 0 && ++kept >= max_keep) {
                    complete = i + 1 == count;
                    break;
                }
            }
        }
        if (stale) {
            cached.reset();
            continue;
        }
        if (!cached) {
            if (!complete) {
                note(str("debug_num_cases: measured ", measured.size(), " of ", count, " records; '", cache.path,
                         "' is written only after a full pass"));
            } else {
                std::string why;
                if (!length_cache_store(cache, measured, &why)) note(why + " (lengths will be recomputed next time)");
            }
        }
        return pass;
    }
}

// ==== [SECTION] train/val split =============================================================

TrainValSplit split_train_val(int64_t n, double val_fraction, uint64_t seed) {
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        throw Error(str("--data.val_split_fraction: ", val_fraction, " is out of range; expected a fraction in [0, 1)"));
    if (n < 0) throw Error(str("split_train_val: ", n, " records; expected at least 0"));
    // Sizes as torch.utils.data.random_split computes them for fractional lengths.
    int64_t sizes[2] = {(int64_t)std::floor(double(n) * (1.0 - val_fraction)), (int64_t)std::floor(double(n) * val_fraction)};
    const int64_t remainder = n - sizes[0] - sizes[1];
    for (int64_t i = 0; i < remainder; ++i) sizes[i % 2] += 1;
    std::vector<int64_t> perm((size_t)n);
    std::iota(perm.begin(), perm.end(), int64_t(0));
    std::mt19937_64 rng(mix_seed(seed, 0x5e1177));
    fisher_yates(perm, rng);
    TrainValSplit s;
    s.train.assign(perm.begin(), perm.begin() + sizes[0]);
    s.val.assign(perm.begin() + sizes[0], perm.end());
    return s;
}

json split_to_json(const TrainValSplit& split) { return json{{"train_data_index", split.train}, {"val_data_index", split.val}}; }

TrainValSplit split_from_json(const json& j, int64_t n) {
    const char* expected = "expected {\"train_data_index\": [...], \"val_data_index\": [...]}";
    if (!j.is_object() || !j.contains("train_data_index") || !j.contains("val_data_index"))
        throw Error(str("saved train/val split: ", j.is_object() ? "an index list is missing" : "not an object", "; ", expected));
    TrainValSplit s;
    std::vector<char> seen((size_t)std::max<int64_t>(n, 0), 0);
    auto read = [&](const char* key, std::vector<int64_t>& out) {
        const json& a = j[key];
        if (!a.is_array()) throw Error(str("saved train/val split: '", key, "' is ", json_type_phrase(a), "; ", expected));
        for (const auto& v : a) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n)
                throw Error(str("saved train/val split: '", key, "' holds ", v.dump(), "; expected indices in [0, ", n, ")"),
                            "the split was saved for a different dataset; start without --resume or use the same data");
            const int64_t x = v.get<int64_t>();
            if (seen[(size_t)x]) throw Error(str("saved train/val split: index ", x, " appears twice; expected disjoint sets"));
            seen[(size_t)x] = 1;
            out.push_back(x);
        }
    };
    read("train_data_index", s.train);
    read("val_data_index", s.val);
    if ((int64_t)(s.train.size() + s.val.size()) != n)
        throw Error(str("saved train/val split: covers ", s.train.size() + s.val.size(), " records; the dataset has ", n),
                    "the split was saved for a different dataset (or max_seq_length); use the same data to resume");
    return s;
}

std::vector<DataRecord> select_records(const std::vector<DataRecord>& records, const std::vector<int64_t>& indices) {
    std::vector<DataRecord> out;
    out.reserve(indices.size());
    for (int64_t i : indices) {
        if (i < 0 || i >= (int64_t)records.size())
            throw Error(str("select_records: index ", i, " is outside [0, ", records.size(), ")"));
        out.push_back(records[(size_t)i]);
    }
    return out;
}

// ==== [SECTION] batches =====================================================================

std::vector<std::vector<int64_t>> similar_length_batches(const std::vector<int64_t>& lengths, int64_t micro_batch_size) {
    if (micro_batch_size < 1)
        throw Error(str("--train.micro_batch_size: ", micro_batch_size, " is out of range; expected at least 1"));
    std::vector<int64_t> order(lengths.size());
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[(size_t)a] < lengths[(size_t)b]; });
    std::vector<std::vector<int64_t>> batches;
    for (size_t s = 0; s < order.size(); s += (size_t)micro_batch_size) {
        const size_t e = std::min(order.size(), s + (size_t)micro_batch_size);
        batches.emplace_back(order.begin() + (long)s, order.begin() + (long)e);
    }
    return batches;
}

BatchIterator::BatchIterator(std::vector<int64_t> lengths, const BatchOrderOptions& opt) : opt_(opt) {
    if (opt.longest_first && opt.shortest_first)
        throw Error("trainloader_longest_first and trainloader_shortest_first are both set; expected at most one");
    if (lengths.empty())
        throw Error("batch iterator: no records to iterate over",
                    "lower --data.val_split_fraction or raise --data.max_seq_length");
    partition_ = similar_length_batches(lengths, opt.micro_batch_size);
}

void BatchIterator::start_epoch() {
    const int64_t n = (int64_t)partition_.size();
    // Epoch e is a function of (seed, e) only, so restoring needs no generator state.
    std::mt19937_64 rng(mix_seed(opt_.seed, uint64_t(epoch_)));
    const bool lead_longest = opt_.longest_first && epoch_ == 0;  // reference: first epoch only
    const bool lead_shortest = opt_.shortest_first;               // reference: every epoch
    std::vector<int64_t> rest;
    for (int64_t i = 0; i < n; ++i)
        if (!(lead_longest && i == n - 1) && !(lead_shortest && i == 0)) rest.push_back(i);
    if (opt_.shuffle) fisher_yates(rest, rng);
    permutation_.clear();
    if (lead_longest) permutation_.push_back(n - 1);
    if (lead_shortest) permutation_.push_back(0);
    permutation_.insert(permutation_.end(), rest.begin(), rest.end());
    ++epoch_;
    position_ = 0;
}

const std::vector<int64_t>& BatchIterator::next() {
    if (epoch_ == 0 || position_ >= (int64_t)permutation_.size()) start_epoch();
    return partition_[(size_t)permutation_[(size_t)position_++]];
}

json BatchIterator::state() const {
    return json{{"epoch", epoch_},
                {"position", position_},
                {"permutation", permutation_},
                {"partition", partition_},
                {"micro_batch_size", opt_.micro_batch_size},
                {"seed", opt_.seed}};
}

void BatchIterator::restore(const json& s) {
    const char* hint =
        "the state was saved for other data or options; resume with the same dataset, "
        "max_seq_length, micro batch size and seed";
    if (!s.is_object()) throw Error(str("batch iterator state: ", json_type_phrase(s), "; expected an object"));
    for (const char* k : {"epoch", "position", "permutation", "partition", "micro_batch_size", "seed"})
        if (!s.contains(k)) throw Error(str("batch iterator state: field '", k, "' is missing"));
    int64_t epoch = 0, position = 0, mbs = 0;
    uint64_t seed = 0;
    std::vector<int64_t> perm;
    std::vector<std::vector<int64_t>> partition;
    try {
        epoch = s["epoch"].get<int64_t>();
        position = s["position"].get<int64_t>();
        mbs = s["micro_batch_size"].get<int64_t>();
        seed = s["seed"].get<uint64_t>();
        perm = s["permutation"].get<std::vector<int64_t>>();
        partition = s["partition"].get<std::vector<std::vector<int64_t>>>();
    } catch (const json::exception& e) {
        throw Error(str("batch iterator state: a field has the wrong type (", e.what(), ")"));
    }
    if (mbs != opt_.micro_batch_size)
        throw Error(str("batch iterator state: saved with micro batch size ", mbs, ", now ", opt_.micro_batch_size), hint);
    if (seed != opt_.seed) throw Error(str("batch iterator state: saved with seed ", seed, ", now ", opt_.seed), hint);
    if (partition != partition_)
        throw Error(str("batch iterator state: its ", partition.size(), " micro-batches differ from the ", partition_.size(),
                        " of this dataset"),
                    hint);
    const int64_t n = (int64_t)partition_.size();
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> ids((size_t)n);
    std::iota(ids.begin(), ids.end(), int64_t(0));
    const bool fresh = epoch == 0 && position == 0 && perm.empty();
    if (!fresh && (epoch < 1 || sorted != ids || position < 0 || position > n))
        throw Error(str("batch iterator state: epoch ", epoch, ", position ", position, " and a permutation of ", perm.size(),
                        " batches do not fit ", n, " micro-batches"),
                    hint);
    epoch_ = epoch;
    position_ = position;
    permutation_ = std::move(perm);
}

}  // namespace kv
