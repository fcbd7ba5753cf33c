// RULER-style tasks (see ruler.h). Numbers and names are random per sample, so nothing but the
// context predicts them; the filler is plain prose that mentions none of them.
#include "ruler.h"

#include <algorithm>
#include <random>

#include "engine/core/error.h"
#include "filler_text.h"

namespace kv {

const std::vector<std::string>& ruler_task_names() {
    static const std::vector<std::string> n = {"niah_single", "niah_multikey", "niah_multivalue", "vt", "cwe"};
    return n;
}

bool is_ruler_task(const std::string& name) {
    const auto& n = ruler_task_names();
    return std::find(n.begin(), n.end(), name) != n.end();
}

namespace {

const std::vector<std::string>& key_words() {
    static const std::vector<std::string> w = {
        "amber", "velvet", "copper", "harbor", "lantern", "meadow", "orbit", "pepper", "quartz", "saddle", "timber", "violet",
        "walnut", "anchor", "basket", "candle", "dragon", "ember", "falcon", "garnet", "helmet", "island", "jungle", "kettle",
        "ladder", "marble", "needle", "oyster", "pillow", "rocket", "silver", "tunnel", "valley", "wizard", "yellow", "zipper",
    };
    return w;
}

const std::vector<std::string>& filler_sentences() {
    static const std::vector<std::string> s = {
        " The grass is green and the sky is blue.",
        " The sun is warm on the hills in the afternoon.",
        " Here we go, there and back again, along the river.",
        " The town council meets on the first Monday of each month.",
        " Most of the shops close early on Sundays.",
        " A light wind came in from the sea in the evening.",
        " The library keeps its old maps in a room on the second floor.",
        " Trains to the coast leave every hour from the main station.",
    };
    return s;
}

std::vector<int32_t> filler(std::mt19937_64& rng, const Tokenizer& tok, int64_t n) {
    return filler_tokens(rng, tok, n, filler_sentences(), "");
}

std::string number(std::mt19937_64& rng) { return std::to_string(1000000 + rng() % 9000000); }

std::string var_name(std::mt19937_64& rng) {
    std::string s;
    for (int i = 0; i < 5; ++i) s += char('A' + rng() % 26);
    return s;
}

// Distinct pseudo-words of three syllables (cwe's rare words): none is an English word the
// model could prefer, and none equals a common word (those come from key_words()).
std::string pseudo_word(int64_t i) {
    static const char* syl[] = {"ka", "lo", "mi", "nu", "pe", "ri", "so", "ta", "ve", "zo", "bi", "du", "fa", "ge", "ho", "ju"};
    std::string s;
    for (int k = 0; k < 3; ++k, i /= 16) s += syl[i % 16];
    return s;
}

struct Parts {
    std::string instruction;               // before the context
    std::vector<std::string> inserts;      // sentences placed into the filler, in order
    std::vector<int32_t> context;          // a fixed context instead of filler (cwe), else empty
    std::string question;                  // after the context
    std::string answer_prefix;             // the answer's first words, given (RULER's answer_prefix)
    std::string answer;
    std::string description;
};

}  // namespace

RulerSample make_ruler_sample(const RulerSpec& spec, int64_t index, const Tokenizer& tok) {
    if (!is_ruler_task(spec.task))
        throw Error(str("--data: '", spec.task, "' is not a RULER task; expected niah_single, niah_multikey, niah_multivalue, vt or cwe"));
    std::seed_seq seq{uint64_t(spec.seed), uint64_t(index), uint64_t(0x72756c6572ULL)};  // "ruler"
    std::mt19937_64 rng(seq);
    const int64_t K = std::max<int64_t>(spec.num_keys, 1);
    Parts p;
    auto shuffled_keys = [&](int64_t n) {
        std::vector<std::string> k = key_words();
        std::shuffle(k.begin(), k.end(), rng);
        k.resize(size_t(std::min<int64_t>(n, int64_t(k.size()))));
        return k;
    };
    if (spec.task == "niah_single" || spec.task == "niah_multikey") {
        const int64_t nk = spec.task == "niah_single" ? 1 : std::max<int64_t>(K, 2);
        const auto keys = shuffled_keys(nk);
        std::vector<std::string> nums;
        for (size_t i = 0; i < keys.size(); ++i) nums.push_back(number(rng));
        const size_t q = rng() % keys.size();
        p.instruction = " Some special magic numbers are hidden within the following text. Make sure to memorize them. I will quiz you about the numbers afterwards.\n";
        for (size_t i = 0; i < keys.size(); ++i) p.inserts.push_back(str(" One of the special magic numbers for ", keys[i], " is: ", nums[i], "."));
        p.question = str("\n What is the special magic number for ", keys[q], " mentioned in the provided text?");
        p.answer = nums[q];
        p.answer_prefix = str("The special magic number for ", keys[q], " mentioned in the provided text is");
        p.description = str(spec.task, " key '", keys[q], "' of ", keys.size());
    } else if (spec.task == "niah_multivalue") {
        const auto key = shuffled_keys(1)[0];
        std::vector<std::string> nums;
        for (int64_t i = 0; i < std::max<int64_t>(K, 2); ++i) nums.push_back(number(rng));
        p.instruction = " Some special magic numbers are hidden within the following text. Make sure to memorize them. I will quiz you about the numbers afterwards.\n";
        for (const auto& n : nums) p.inserts.push_back(str(" One of the special magic numbers for ", key, " is: ", n, "."));
        p.question = str("\n What are all the special magic numbers for ", key, " mentioned in the provided text? List them in order, separated by commas.");
        for (size_t i = 0; i < nums.size(); ++i) p.answer += (i ? ", " : "") + nums[i];
        p.answer_prefix = str("The special magic numbers for ", key, " mentioned in the provided text are");
        p.description = str("niah_multivalue ", nums.size(), " values of '", key, "'");
    } else if (spec.task == "vt") {
        const std::string value = number(rng);
        std::vector<std::string> vars;
        while (int64_t(vars.size()) < std::max<int64_t>(K, 2)) {
            std::string v = var_name(rng);
            if (std::find(vars.begin(), vars.end(), v) == vars.end()) vars.push_back(v);
        }
        p.instruction = " Memorize and track the chain of variable assignments hidden in the following text.\n";
        p.inserts.push_back(str(" VAR ", vars[0], " = ", value, "."));
        for (size_t i = 1; i < vars.size(); ++i) p.inserts.push_back(str(" VAR ", vars[i], " = VAR ", vars[i - 1], "."));
        p.question = str("\n Question: Find all variables that are assigned the value ", value,
                         " in the text above. List them in the order they were assigned, separated by spaces.");
        for (size_t i = 0; i < vars.size(); ++i) p.answer += (i ? " " : "") + vars[i];
        p.answer_prefix = str("According to the chain of variable assignments in the text above, ", vars.size(),
                              " variables are assigned the value ", value, ", they are:");
        p.description = str("vt chain of ", vars.size(), " variables");
    } else {  // cwe
        const auto common = shuffled_keys(std::max<int64_t>(K, 2));
        p.instruction = " Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n";
        p.question = str("\n Question: What are the ", common.size(),
                         " most common words in the above list? List them in the order they first appear, separated by commas.");
        p.answer_prefix = str("The ", common.size(), " most common words in the list are:");
        p.description = str("cwe ", common.size(), " common words");
    }

    // The frame: BOS, the chat template's user turn around instruction + context + question,
    // the assistant's turn opened with the answer's first words (as RULER prompts do, so the
    // model answers rather than starting a sentence of its own), then the answer. Without a
    // template the question ends with "Answer:" before those words.
    std::string pre, post = "\n Answer:";
    if (spec.chat) {
        try {
            const std::string framed = spec.chat("\x01");
            const size_t m = framed.find('\x01');
            pre = framed.substr(0, m);
            post = framed.substr(m + 1);
        } catch (const Error&) {
            // no chat template in this tokenizer: the plain frame
        }
    }
    post += (pre.empty() ? " " : "") + p.answer_prefix;
    const std::string answer_text = " " + p.answer;
    std::vector<int32_t> ids = tok.encode("", true);
    const std::vector<int32_t> head = tok.encode(pre + p.instruction, false);
    const std::vector<int32_t> tail = tok.encode(p.question + post, false);
    const std::vector<int32_t> ans = tok.encode(answer_text, false);
    std::vector<std::vector<int32_t>> inserts;
    int64_t fixed = int64_t(ids.size() + head.size() + tail.size() + ans.size());
    for (const auto& s : p.inserts) {
        inserts.push_back(tok.encode(s, false));
        fixed += int64_t(inserts.back().size());
    }
    const int64_t room = spec.seq_length - fixed;
    if (room < 16)
        throw Error(str("--data.seq_length: ", spec.seq_length, " tokens cannot hold the ", spec.task, " prompt (", fixed,
                        " tokens without context); expected at least ", fixed + 16));

    std::vector<int32_t> context;
    if (spec.task == "cwe") {
        // Common words each occur `freq` times, rare words once, in random order; the list grows
        // until it fills the room. The answer is the common words by first appearance.
        const auto common = shuffled_keys(std::max<int64_t>(K, 2));
        // The answer is not in `fixed` yet (its order is known only after the shuffle); its
        // length does not depend on the order, so reserve it, plus slack the filler pads.
        std::string all;
        for (size_t i = 0; i < common.size(); ++i) all += (i ? ", " : "") + common[i];
        const int64_t list_room = room - int64_t(tok.encode(" " + all, false).size()) - 8;
        const int64_t per_item = int64_t(tok.encode(" 100. walnut", false).size());
        const int64_t items = std::max<int64_t>(list_room / std::max<int64_t>(per_item, 1), 1);
        const int64_t freq = std::clamp<int64_t>(items / (4 * int64_t(common.size())), 2, 30);
        std::vector<std::string> words;
        for (const auto& c : common)
            for (int64_t i = 0; i < freq; ++i) words.push_back(c);
        const uint64_t rare0 = rng() % 1000;
        for (int64_t i = 0; int64_t(words.size()) < items; ++i) words.push_back(pseudo_word(int64_t(rare0) + i));
        std::shuffle(words.begin(), words.end(), rng);
        // Tokens per item differ; keep the items that fit, then pad with filler to the room.
        std::vector<std::string> kept;
        for (size_t i = 0; i < words.size(); ++i) {
            const auto t = tok.encode(str(" ", i + 1, ". ", words[i]), false);
            if (int64_t(context.size() + t.size()) > list_room) break;
            context.insert(context.end(), t.begin(), t.end());
            kept.push_back(words[i]);
        }
        std::vector<std::string> order;
        for (const auto& w : kept)
            if (std::find(common.begin(), common.end(), w) != common.end() && std::find(order.begin(), order.end(), w) == order.end())
                order.push_back(w);
        // A common word cut off entirely would make the answer ill-posed; the count guarantees
        // each appears (freq * words <= items / 4) unless the room is tiny.
        if (order.size() != common.size())
            throw Error(str("--data.seq_length: ", spec.seq_length, " tokens are too few for cwe with ", common.size(),
                            " common words; expected more room for the word list"));
        p.answer.clear();
        for (size_t i = 0; i < order.size(); ++i) p.answer += (i ? ", " : "") + order[i];
        const std::vector<int32_t> ans2 = tok.encode(" " + p.answer, false);
        // The answer's length changed with its text: pad or trim the filler after the list.
        const int64_t pad = spec.seq_length - int64_t(ids.size() + head.size() + context.size() + tail.size() + ans2.size());
        if (pad < 0)
            throw Error(str("--data.seq_length: ", spec.seq_length, " tokens cannot hold the cwe prompt; expected more"));
        const auto f = filler(rng, tok, pad);
        context.insert(context.end(), f.begin(), f.end());
        ids.insert(ids.end(), head.begin(), head.end());
        ids.insert(ids.end(), context.begin(), context.end());
        ids.insert(ids.end(), tail.begin(), tail.end());
        RulerSample s;
        s.answer_start = int64_t(ids.size());
        ids.insert(ids.end(), ans2.begin(), ans2.end());
        s.answer_length = int64_t(ans2.size());
        s.ids = std::move(ids);
        s.answer = p.answer;
        s.description = p.description;
        return s;
    }

    // Needles at sorted random depths in [0.05, 0.95] of the filler.
    const std::vector<int32_t> hay = filler(rng, tok, room);
    std::vector<int64_t> at;
    for (size_t i = 0; i < inserts.size(); ++i) at.push_back(int64_t((0.05 + 0.9 * double(rng() % 10000) / 10000.0) * double(room)));
    std::sort(at.begin(), at.end());
    int64_t prev = 0;
    for (size_t i = 0; i < inserts.size(); ++i) {
        context.insert(context.end(), hay.begin() + prev, hay.begin() + at[i]);
        context.insert(context.end(), inserts[i].begin(), inserts[i].end());
        prev = at[i];
    }
    context.insert(context.end(), hay.begin() + prev, hay.end());
    ids.insert(ids.end(), head.begin(), head.end());
    ids.insert(ids.end(), context.begin(), context.end());
    ids.insert(ids.end(), tail.begin(), tail.end());
    RulerSample s;
    s.answer_start = int64_t(ids.size());
    ids.insert(ids.end(), ans.begin(), ans.end());
    s.answer_length = int64_t(ans.size());
    s.ids = std::move(ids);
    s.answer = p.answer;
    s.description = str(p.description, at.empty() ? std::string() : str(" at depth ", double(at[0]) / double(room)));
    return s;
}

}  // namespace kv
