// Synthetic task generators (see synthetic.h). Filler text is built from a fixed set of plain
// sentences chosen by the seed, then trimmed in tokens so the prompt hits the target length.
#include "synthetic.h"

#include <algorithm>
#include <functional>
#include <random>

#include "engine/core/error.h"

namespace kv {

namespace {

const std::vector<std::string>& filler_sentences() {
    static const std::vector<std::string> s = {
        "The grass is green and the sky is blue.",
        "A river runs past the old mill at the edge of town.",
        "Most mornings the market opens before the bakery does.",
        "The train to the coast leaves twice a day in summer.",
        "Clouds gathered over the hills but no rain came.",
        "The library keeps its maps in a cabinet by the window.",
        "Someone left a bicycle leaning against the fence.",
        "The soup needed more salt than anyone expected.",
        "Children played chess in the shade of the plane trees.",
        "The lighthouse keeper wrote the weather down every evening.",
        "A cat slept on the warm stones of the garden wall.",
        "The museum closes early on the first Monday of the month.",
    };
    return s;
}

std::string filler(std::mt19937_64& rng, size_t approx_chars) {
    const auto& s = filler_sentences();
    std::string out;
    while (out.size() < approx_chars) {
        out += s[rng() % s.size()];
        out += ' ';
    }
    return out;
}

int32_t random_number(std::mt19937_64& rng, int32_t lo, int32_t hi) { return int32_t(lo + int64_t(rng() % uint64_t(hi - lo))); }

// Four distinct choices including the answer at a random index.
std::vector<std::string> choices_with(std::mt19937_64& rng, const std::string& answer, const std::function<std::string()>& draw,
                                      int32_t* label) {
    std::vector<std::string> c = {answer};
    while (c.size() < 4) {
        std::string d = draw();
        if (std::find(c.begin(), c.end(), d) == c.end()) c.push_back(d);
    }
    std::shuffle(c.begin(), c.end(), rng);
    *label = int32_t(std::find(c.begin(), c.end(), answer) - c.begin());
    return c;
}

// Assemble head + haystack (with `inserts` placed at relative depths) + tail so the token count
// is close to (and not above) `target`.
std::vector<int32_t> assemble(const Tokenizer& tok, const std::string& head, const std::vector<std::pair<double, std::string>>& inserts,
                              const std::string& tail, int64_t target, std::mt19937_64& rng) {
    const int64_t fixed = int64_t(tok.encode(head, false).size() + tok.encode(tail, false).size());
    int64_t inserts_len = 0;
    for (const auto& in : inserts) inserts_len += int64_t(tok.encode(" " + in.second + " ", false).size());
    const int64_t budget = target - fixed - inserts_len - 1;
    if (budget < 8)
        throw Error(str("--data.seq_length: ", target, " tokens are too few for this task (the question alone takes ",
                        fixed + inserts_len, "); expected at least ", fixed + inserts_len + 16));
    // Filler tokens: generate generously, then cut in token space.
    std::string hay = filler(rng, size_t(budget) * 6 + 64);
    std::vector<int32_t> hay_ids = tok.encode(hay, false);
    if (int64_t(hay_ids.size()) > budget) hay_ids.resize(size_t(budget));
    std::vector<int32_t> ids = tok.encode(head, true);
    // Inserts at their depths, in order.
    std::vector<std::pair<double, std::string>> ins = inserts;
    std::sort(ins.begin(), ins.end(), [](auto& a, auto& b) { return a.first < b.first; });
    size_t at = 0;
    for (const auto& [depth, text] : ins) {
        const size_t cut = std::min(hay_ids.size(), size_t(depth * double(hay_ids.size())));
        ids.insert(ids.end(), hay_ids.begin() + long(at), hay_ids.begin() + long(std::max(at, cut)));
        at = std::max(at, cut);
        std::vector<int32_t> t = tok.encode(" " + text + " ", false);
        ids.insert(ids.end(), t.begin(), t.end());
    }
    ids.insert(ids.end(), hay_ids.begin() + long(at), hay_ids.end());
    std::vector<int32_t> t = tok.encode(tail, false);
    ids.insert(ids.end(), t.begin(), t.end());
    return ids;
}

std::string question_tail(const std::string& question, const std::vector<std::string>& choices, const ClassTokens& ct) {
    std::string s = "\n" + question + "\nA: " + choices[0] + "\nB: " + choices[1] + "\nC: " + choices[2] + "\nD: " + choices[3] +
                    "\n" + ct.answer_prefix;
    return s;
}

}  // namespace

ClassTokens class_tokens(const Tokenizer& tok) {
    ClassTokens ct;
    bool spaced = true;
    for (const char* l : {" A", " B", " C", " D"}) spaced = spaced && tok.token_id(l) >= 0;
    for (const char* l : {"A", "B", "C", "D"}) {
        int32_t id = spaced ? tok.token_id(std::string(" ") + l) : tok.token_id(l);
        if (id < 0) throw Error(str("the tokenizer has no single token for the class label '", l, "'"));
        ct.ids.push_back(id);
    }
    ct.answer_prefix = spaced ? "Answer:" : "Answer: ";
    return ct;
}

ClassSample make_synthetic_sample(const SyntheticSpec& spec, int64_t index, const Tokenizer& tok) {
    std::mt19937_64 rng(spec.seed * 1000003ull + uint64_t(index) * 7919ull + 17);
    const ClassTokens ct = class_tokens(tok);
    ClassSample s;
    const double depth = spec.depth >= 0 ? spec.depth : std::uniform_real_distribution<double>(0.05, 0.95)(rng);
    auto five_digits = [&] { return std::to_string(random_number(rng, 10000, 99999)); };
    if (spec.task == "passkey") {
        const std::string key = five_digits();
        s.choices = choices_with(rng, key, five_digits, &s.label);
        const std::string head =
            "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it.\n";
        const std::string needle = "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
        s.ids = assemble(tok, head, {{depth, needle}}, question_tail("What is the pass key?", s.choices, ct), spec.seq_length, rng);
        s.description = str("passkey ", key, " at depth ", depth);
    } else if (spec.task == "recall") {
        if (spec.num_keys < 4) throw Error(str("--data.num_keys: ", spec.num_keys, " must be >= 4 for recall"));
        std::vector<std::pair<double, std::string>> inserts;
        std::vector<std::string> keys, values;
        for (int64_t k = 0; k < spec.num_keys; ++k) {
            std::string key, val;
            do key = std::to_string(random_number(rng, 1000, 9999));
            while (std::find(keys.begin(), keys.end(), key) != keys.end());
            val = five_digits();
            keys.push_back(key);
            values.push_back(val);
            inserts.push_back({std::uniform_real_distribution<double>(0.0, 1.0)(rng), "The value of key " + key + " is " + val + "."});
        }
        const size_t q = size_t(rng() % keys.size());
        size_t pick = 0;
        s.choices = choices_with(rng, values[q], [&] { return values[(++pick + q) % values.size()]; }, &s.label);
        s.ids = assemble(tok, "Remember the value of every key below.\n", inserts,
                         question_tail("What is the value of key " + keys[q] + "?", s.choices, ct), spec.seq_length, rng);
        s.description = str("recall key ", keys[q], " of ", spec.num_keys);
    } else if (spec.task == "needle") {
        static const std::vector<std::string> cities = {"Lisbon", "Oslo", "Quito", "Nairobi", "Hanoi", "Tbilisi", "Lima", "Perth"};
        const std::string city = cities[rng() % cities.size()];
        const std::string num = std::to_string(random_number(rng, 1000000, 9999999));
        auto seven = [&] { return std::to_string(random_number(rng, 1000000, 9999999)); };
        s.choices = choices_with(rng, num, seven, &s.label);
        s.ids = assemble(tok, "Read the document and answer the question at the end.\n",
                         {{depth, "The special magic number for " + city + " is " + num + "."}},
                         question_tail("What is the special magic number for " + city + "?", s.choices, ct), spec.seq_length, rng);
        s.description = str("needle ", city, " at depth ", depth);
    } else {
        throw Error(str("--data: unknown synthetic task '", spec.task, "'; expected passkey, recall or needle"));
    }
    return s;
}

}  // namespace kv
