// RULER-style tasks (see ruler.h). Numbers and names are random per sample, so nothing but the
// context predicts them; the filler is plain prose that mentions none of them.
#include "ruler.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <memory>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/core/join.h"
#include "filler_text.h"

namespace kv {

const std::vector<std::string>& ruler_task_names() {
    static const std::vector<std::string> n = {"niah_single", "niah_single_2", "niah_single_3", "niah_multikey", "niah_multikey_2",
                                               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"};
    return n;
}

bool is_ruler_task(const std::string& name) {
    const auto& n = ruler_task_names();
    return std::find(n.begin(), n.end(), name) != n.end();
}

const std::vector<std::string>& ruler_multi_question_tasks() {
    static const std::vector<std::string> n = {"niah_multikey", "niah_multiquery"};
    return n;
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

// The essay haystack (niah_single_2/3, niah_multiquery): RULER fills these with Paul Graham's
// essays, an external set that kvlab does not download; essay-like prose of its own stands in,
// a different register from the noise haystack's repeated plain sentences.
const std::vector<std::string>& essay_sentences() {
    static const std::vector<std::string> s = {
        " Most good ideas look at first like bad ones, which is why so few people work on them.",
        " When you write something down, you find out how much of it you did not really understand.",
        " A small group that ships every week learns faster than a large one that plans every quarter.",
        " The hardest part of a new project is not the work itself but deciding what to leave out.",
        " People tend to overrate what they can do in a year and underrate what they can do in ten.",
        " Good tools disappear while you use them; bad ones keep reminding you that they are there.",
        " It is easier to make something people want than to convince people to want what you made.",
        " Reading old letters shows how little the questions that worry each generation change.",
        " Cities differ less in what they have than in what they quietly encourage you to become.",
        " An essay is an attempt, and the best ones change the writer's mind before the reader's.",
    };
    return s;
}

std::vector<int32_t> filler(std::mt19937_64& rng, const Tokenizer& tok, int64_t n) {
    return filler_tokens(rng, tok, n, filler_sentences(), "");
}

// "3f2a9c1e-07b4-4d2e-9a61-5c0e8b7d4f13": RULER's uuid keys and values, from the sample's stream.
std::string uuid(std::mt19937_64& rng) {
    static const char* hex = "0123456789abcdef";
    std::string u;
    for (int i = 0; i < 32; ++i) {
        if (i == 8 || i == 12 || i == 16 || i == 20) u += '-';
        u += hex[rng() % 16];
    }
    return u;
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

// fwe's coded words: four syllables from a per-sample base, distinct for ranks < 65536.
std::string coded_word(uint64_t base, int64_t rank) {
    static const char* syl[] = {"ka", "lo", "mi", "nu", "pe", "ri", "so", "ta", "ve", "zo", "bi", "du", "fa", "ge", "ho", "ju"};
    uint64_t i = (base + uint64_t(rank)) % 65536;
    std::string s;
    for (int k = 0; k < 4; ++k, i /= 16) s += syl[i % 16];
    return s;
}

// Capitalized pseudo-words of two or three syllables (qa's towns, people, rivers): names no
// model knows facts about, so only the documents can answer.
std::string pseudo_name(std::mt19937_64& rng) {
    std::string s = pseudo_word(int64_t(rng() % 4096)).substr(0, 4) + pseudo_word(int64_t(rng() % 4096)).substr(0, rng() % 2 ? 2 : 4);
    s[0] = char(s[0] - 'a' + 'A');
    return s;
}

// Which haystack the needles hide in (RULER's type_haystack).
enum class Haystack { NOISE, ESSAY, NEEDLES };

struct Parts {
    Haystack haystack = Haystack::NOISE;
    std::function<std::string()> distractor;  // NEEDLES, qa: the next haystack sentence or document (each whole, never cut)
    std::vector<std::string> gold;            // qa: the documents that answer the question
    std::string instruction;               // before the context
    std::vector<std::string> inserts;      // sentences placed into the filler, in order
    std::vector<int32_t> context;          // a fixed context instead of filler (cwe), else empty
    std::string question;                  // after the context
    std::string answer_prefix;             // the answer's first words, given (RULER's answer_prefix)
    std::string answer;
    std::string description;
    struct Question {
        std::string question, answer_prefix, answer;
    };
    std::vector<Question> more;  // questions 2.. of the context (RulerSpec::questions)
};

}  // namespace

double ruler_text_score(const std::string& task, const std::string& prediction, const std::string& answer) {
    if (!is_ruler_task(task)) throw Error(str("--data: '", task, "' is not a RULER task; expected one of ", join(ruler_task_names(), ", ")));
    auto lower = [](std::string x) {
        for (char& c : x) c = char(std::tolower(static_cast<unsigned char>(c)));
        return x;
    };
    const std::string pred = lower(prediction), ans = lower(answer);
    if (task == "qa_1" || task == "qa_2") return pred.find(ans) != std::string::npos ? 1.0 : 0.0;
    const std::string sep = task == "vt" ? " " : ", ";
    std::vector<std::string> items;
    for (size_t a = 0;;) {
        const size_t b = ans.find(sep, a);
        items.push_back(ans.substr(a, b == std::string::npos ? std::string::npos : b - a));
        if (b == std::string::npos) break;
        a = b + sep.size();
    }
    int64_t found = 0;
    for (const auto& it : items) found += !it.empty() && pred.find(it) != std::string::npos;
    return double(found) / double(items.size());
}

RulerSample make_ruler_sample(const RulerSpec& spec, int64_t index, const Tokenizer& tok) {
    if (!is_ruler_task(spec.task))
        throw Error(str("--data: '", spec.task, "' is not a RULER task; expected one of ", join(ruler_task_names(), ", ")));
    std::seed_seq seq{uint64_t(spec.seed), uint64_t(index), uint64_t(0x72756c6572ULL)};  // "ruler"
    std::mt19937_64 rng(seq);
    const int64_t K = std::max<int64_t>(spec.num_keys, 1);
    const auto& multi = ruler_multi_question_tasks();
    if (spec.questions < 1 || (spec.questions > 1 && std::find(multi.begin(), multi.end(), spec.task) == multi.end()))
        throw Error(str("--data.questions: ", spec.questions, " questions per context of ", spec.task, "; expected 1, or a task whose context holds "
                        "several keys to ask about (", join(multi, ", "), ")"));
    const int64_t NQ = spec.questions;
    Parts p;
    const uint64_t fwe_base = spec.task == "fwe" ? rng() % 65536 : 0;
    auto shuffled_keys = [&](int64_t n) {
        std::vector<std::string> k = key_words();
        std::shuffle(k.begin(), k.end(), rng);
        k.resize(size_t(std::min<int64_t>(n, int64_t(k.size()))));
        return k;
    };
    const bool uuid_values = spec.task == "niah_single_3" || spec.task == "niah_multikey_3";
    const std::string what = uuid_values ? "uuid" : "number";
    const std::string magic_instruction = str(" Some special magic ", what,
                                              "s are hidden within the following text. Make sure to memorize them. I will quiz you about the ",
                                              what, "s afterwards.\n");
    if (spec.task == "niah_single" || spec.task == "niah_single_2" || spec.task == "niah_single_3" || spec.task == "niah_multikey") {
        // niah_single (RULER's niah_single_1) and niah_multikey (niah_multikey_1) hide in the noise
        // haystack, niah_single_2/3 in the essay one; _3's value is a uuid.
        const int64_t nk = spec.task == "niah_multikey" ? std::max({K, int64_t(2), NQ}) : 1;
        const auto keys = shuffled_keys(nk);
        std::vector<std::string> nums;
        for (size_t i = 0; i < keys.size(); ++i) nums.push_back(uuid_values ? uuid(rng) : number(rng));
        // One question: one key drawn (as before several questions existed, so samples stay the
        // same); several: distinct keys in random order.
        std::vector<size_t> asked(keys.size());
        for (size_t i = 0; i < asked.size(); ++i) asked[i] = i;
        if (NQ == 1) asked = {size_t(rng() % keys.size())};
        else std::shuffle(asked.begin(), asked.end(), rng);
        const size_t q = asked[0];
        for (int64_t j = 1; j < NQ; ++j) {
            const std::string& k = keys[asked[size_t(j)]];
            p.more.push_back({str("\n What is the special magic ", what, " for ", k, " mentioned in the provided text?"),
                              str("The special magic ", what, " for ", k, " mentioned in the provided text is"), nums[asked[size_t(j)]]});
        }
        p.haystack = spec.task == "niah_single_2" || spec.task == "niah_single_3" ? Haystack::ESSAY : Haystack::NOISE;
        p.instruction = magic_instruction;
        for (size_t i = 0; i < keys.size(); ++i) p.inserts.push_back(str(" One of the special magic ", what, "s for ", keys[i], " is: ", nums[i], "."));
        p.question = str("\n What is the special magic ", what, " for ", keys[q], " mentioned in the provided text?");
        p.answer = nums[q];
        p.answer_prefix = str("The special magic ", what, " for ", keys[q], " mentioned in the provided text is");
        p.description = str(spec.task, " key '", keys[q], "' of ", keys.size());
    } else if (spec.task == "niah_multikey_2" || spec.task == "niah_multikey_3") {
        // The haystack is other needles (RULER's type_haystack: needle): _2 with adjective-noun
        // word keys and numbers, _3 with uuid keys and uuid values. Every key is distinct.
        auto used = std::make_shared<std::set<std::string>>();
        auto fresh_key = [&rng, used, uuid_values]() {
            const auto& w = key_words();
            for (int tries = 0;; ++tries) {
                // adjective-noun style pairs as RULER's keys; a third word once pairs run short
                std::string k = uuid_values ? uuid(rng) : w[rng() % w.size()] + "-" + w[rng() % w.size()];
                if (!uuid_values && tries >= 16) k += "-" + w[rng() % w.size()];
                if (used->insert(k).second) return k;
            }
        };
        const std::string key = fresh_key(), value = uuid_values ? uuid(rng) : number(rng);
        p.haystack = Haystack::NEEDLES;
        p.distractor = [&rng, fresh_key, what, uuid_values]() mutable {
            return str(" One of the special magic ", what, "s for ", fresh_key(), " is: ", uuid_values ? uuid(rng) : number(rng), ".");
        };
        p.instruction = magic_instruction;
        p.inserts.push_back(str(" One of the special magic ", what, "s for ", key, " is: ", value, "."));
        p.question = str("\n What is the special magic ", what, " for ", key, " mentioned in the provided text?");
        p.answer = value;
        p.answer_prefix = str("The special magic ", what, " for ", key, " mentioned in the provided text is");
        p.description = str(spec.task, " key '", key, "' among needles");
    } else if (spec.task == "niah_multiquery") {
        // K keys with a number each in the essay haystack; asked for up to 4 of them at once
        // (RULER's num_needle_q = 4), answered in the question's order.
        const auto keys = shuffled_keys(std::max<int64_t>(K, 2));
        std::vector<std::string> nums;
        for (size_t i = 0; i < keys.size(); ++i) nums.push_back(number(rng));
        // Each question asks its own draw of up to 4 keys (the first drawn as with one question).
        std::vector<std::vector<size_t>> draws;
        for (int64_t j = 0; j < NQ; ++j) {
            std::vector<size_t> a(keys.size());
            for (size_t i = 0; i < a.size(); ++i) a[i] = i;
            std::shuffle(a.begin(), a.end(), rng);
            a.resize(std::min<size_t>(a.size(), 4));
            draws.push_back(std::move(a));
        }
        const std::vector<size_t>& asked = draws[0];
        p.haystack = Haystack::ESSAY;
        p.instruction = magic_instruction;
        for (size_t i = 0; i < keys.size(); ++i) p.inserts.push_back(str(" One of the special magic numbers for ", keys[i], " is: ", nums[i], "."));
        for (const std::vector<size_t>& a : draws) {
            std::string list, answer;
            for (size_t i = 0; i < a.size(); ++i) {
                list += (i == 0 ? "" : i + 1 == a.size() ? " and " : ", ") + keys[a[i]];
                answer += (i ? ", " : "") + nums[a[i]];
            }
            p.more.push_back({str("\n What are all the special magic numbers for ", list,
                                  " mentioned in the provided text? Answer in this order, separated by commas."),
                              str("The special magic numbers for ", list, " mentioned in the provided text are"), answer});
        }
        p.question = p.more[0].question;
        p.answer_prefix = p.more[0].answer_prefix;
        p.answer = p.more[0].answer;
        p.more.erase(p.more.begin());
        p.description = str("niah_multiquery ", asked.size(), " of ", keys.size(), " keys");
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
    } else if (spec.task == "fwe") {
        p.answer = str(coded_word(fwe_base, 0), ", ", coded_word(fwe_base, 1), ", ", coded_word(fwe_base, 2));
        p.instruction = " Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words.\n";
        p.question = "\n Question: What are the three most frequently appeared coded words in the above coded text? List them from the most frequent, separated by commas.";
        p.answer_prefix = "According to the coded text above, the three most frequently appeared words are:";
        p.description = "fwe";
    } else if (spec.task == "qa_1" || spec.task == "qa_2") {
        // RULER reads SQuAD (qa_1) and HotpotQA (qa_2), external sets; here the documents state
        // facts about invented towns, people and rivers, so no model knows the answer beforehand:
        // qa_1 asks one document's fact, qa_2 needs two (where a person was born, then the river
        // of that town). The other documents are distractors of the same form about other names.
        auto used = std::make_shared<std::set<std::string>>();
        auto name = [&rng, used]() {
            while (true)
                if (std::string n = pseudo_name(rng); used->insert(n).second) return n;
        };
        auto year = [&rng]() { return std::to_string(1200 + rng() % 700); };
        static const char* const kGoods[] = {"pottery", "cheese", "glass", "wool", "clocks", "paper", "salt", "bells"};
        // Provinces are names too (drawn through name()): none equals the town asked about.
        auto town_doc = [&rng](const std::string& town, const std::string& province, const std::string& founded) {
            return str(town, " is a town in the province of ", province, ". It was founded in ", founded, " and is known for its ",
                       kGoods[rng() % 8], ".");
        };
        p.instruction = " Answer the question based on the given documents. Only give me the answer and do not output any other words.\n The following are given documents.\n";
        p.answer_prefix = "The answer is";
        p.haystack = Haystack::NEEDLES;
        if (spec.task == "qa_1") {
            const std::string town = name();
            p.answer = year();
            p.gold.push_back(town_doc(town, name(), p.answer));
            p.question = str("\n Question: In which year was ", town, " founded?");
            p.distractor = [name, year, town_doc]() mutable {
                const std::string t = name();
                return town_doc(t, name(), year());
            };
            p.description = str("qa_1 town '", town, "'");
        } else {
            const std::string person = name(), town = name();
            p.answer = name();
            p.gold.push_back(str(person, " was born in ", town, " and later worked there as a teacher."));
            p.gold.push_back(str(town, " lies on the river ", p.answer, ", about a day's walk from the coast."));
            p.question = str("\n Question: On which river lies the town where ", person, " was born?");
            p.distractor = [&rng, name]() mutable {
                const std::string a = name(), b = name();
                return rng() % 2 ? str(a, " was born in ", b, " and later worked there as a teacher.")
                                 : str(a, " lies on the river ", b, ", about a day's walk from the coast.");
            };
            p.description = str("qa_2 person '", person, "'");
        }
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
    std::string pre, post = "\n Answer:", reopen;
    if (spec.chat) {
        try {
            const std::string framed = spec.chat("\x01");
            const size_t m = framed.find('\x01');
            pre = framed.substr(0, m);
            post = framed.substr(m + 1);
            if (spec.chat_turn_end) reopen = spec.chat_turn_end() + pre;  // a later user message, after the answer
        } catch (const Error&) {
            // no chat template in this tokenizer: the plain frame
        }
    }
    const std::string close = post + (pre.empty() ? " " : "");  // the frame after a question, before the answer's first words
    post = close + p.answer_prefix;
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
    // A set depth places the one needle; a task hiding several sentences (or none) has no one depth.
    if (spec.depth >= 0 && inserts.size() != 1)
        throw Error(str("--data.depths: ", spec.task, " hides ", inserts.size(),
                        " sentences; expected a task hiding one needle (niah_single, niah_single_2, niah_single_3, niah_multikey_2, "
                        "niah_multikey_3)"));
    if (spec.depth > 1) throw Error(str("--data.depths: ", spec.depth, " is not a depth; expected a number in [0, 1]"));
    const int64_t room = spec.seq_length - fixed;
    if (room < 16)
        throw Error(str("--data.seq_length: ", spec.seq_length, " tokens cannot hold the ", spec.task, " prompt (", fixed,
                        " tokens without context); expected at least ", fixed + 16));

    std::vector<int32_t> context;
    // Prompt, context and answer into one sample (every task whose answer is known by now).
    auto finish = [&](const std::string& description) {
        ids.insert(ids.end(), head.begin(), head.end());
        ids.insert(ids.end(), context.begin(), context.end());
        ids.insert(ids.end(), tail.begin(), tail.end());
        RulerSample s;
        s.answer_start = int64_t(ids.size());
        s.question_start = s.answer_start - int64_t(tail.size());
        ids.insert(ids.end(), ans.begin(), ans.end());
        s.answer_length = int64_t(ans.size());
        s.ids = std::move(ids);
        s.answer = p.answer;
        s.description = description;
        return s;
    };
    if (spec.task == "fwe") {
        // Coded words with Zipf frequencies (RULER's alpha = 2): rank r (from 0) occurs
        // floor(c0 / (r + 1)^2) times, at least once, until the list is full; the three most
        // frequent are the answer, strictly ahead of the fourth. Shrunk until its tokens fit.
        int64_t per_word = 1;
        for (int64_t r = 0; r < 16; ++r) per_word = std::max(per_word, int64_t(tok.encode(" " + coded_word(fwe_base, r), false).size()));
        for (int64_t items = room / per_word;; items = items * 9 / 10) {
            const int64_t c0 = std::max<int64_t>(18, items * 45 / 100);
            if (items < c0 + c0 / 4 + c0 / 9 + 1)
                throw Error(str("--data.seq_length: ", spec.seq_length, " tokens are too few for fwe's coded text; expected more room"));
            std::vector<int64_t> words;
            for (int64_t r = 0; int64_t(words.size()) < items; ++r)
                for (int64_t c = std::max<int64_t>(1, c0 / ((r + 1) * (r + 1))); c > 0 && int64_t(words.size()) < items; --c) words.push_back(r);
            std::shuffle(words.begin(), words.end(), rng);
            std::string text;
            for (int64_t r : words) text += " " + coded_word(fwe_base, r);
            context = tok.encode(text, false);
            if (int64_t(context.size()) <= room) break;
        }
        const auto f = filler(rng, tok, room - int64_t(context.size()));
        context.insert(context.end(), f.begin(), f.end());
        return finish(p.description);
    }
    if (spec.task == "qa_1" || spec.task == "qa_2") {
        // The gold documents and as many distractors as fit, in random order and numbered; the
        // rest of the room is filler after the last document.
        std::vector<std::string> docs = p.gold;
        int64_t estimate = 0;
        for (const auto& d : docs) estimate += int64_t(tok.encode(d, false).size()) + 8;
        while (true) {
            std::string d = p.distractor();
            const int64_t n = int64_t(tok.encode(d, false).size()) + 8;  // + "\n Document 12:"
            if (estimate + n > room) break;
            estimate += n;
            docs.push_back(std::move(d));
        }
        std::shuffle(docs.begin(), docs.end(), rng);
        while (true) {
            std::string text;
            for (size_t i = 0; i < docs.size(); ++i) text += str("\n Document ", i + 1, ": ", docs[i]);
            context = tok.encode(text, false);
            if (int64_t(context.size()) <= room) break;
            // Over by the numbering's tokens: drop the last distractor.
            auto it = std::find_if(docs.rbegin(), docs.rend(), [&](const std::string& d) {
                return std::find(p.gold.begin(), p.gold.end(), d) == p.gold.end();
            });
            if (it == docs.rend())
                throw Error(str("--data.seq_length: ", spec.seq_length, " tokens cannot hold the ", spec.task, " documents; expected more"));
            docs.erase(std::next(it).base());
        }
        const auto f = filler(rng, tok, room - int64_t(context.size()));
        context.insert(context.end(), f.begin(), f.end());
        return finish(str(p.description, ", ", docs.size(), " documents"));
    }
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
        s.question_start = s.answer_start - int64_t(tail.size());
        ids.insert(ids.end(), ans2.begin(), ans2.end());
        s.answer_length = int64_t(ans2.size());
        s.ids = std::move(ids);
        s.answer = p.answer;
        s.description = p.description;
        return s;
    }

    // Needles at sorted random depths in [0.05, 0.95] of the haystack: anywhere in prose, between
    // two whole sentences in a haystack of other needles (padded with noise after the last).
    std::vector<int32_t> hay;
    std::vector<int64_t> cuts;  // where a needle may go (NEEDLES); empty: anywhere
    if (p.haystack == Haystack::NEEDLES) {
        while (true) {
            const std::vector<int32_t> t = tok.encode(p.distractor(), false);
            if (int64_t(hay.size() + t.size()) > room) break;
            cuts.push_back(int64_t(hay.size()));
            hay.insert(hay.end(), t.begin(), t.end());
        }
        cuts.push_back(int64_t(hay.size()));
        const auto f = filler(rng, tok, room - int64_t(hay.size()));
        hay.insert(hay.end(), f.begin(), f.end());
    } else {
        hay = filler_tokens(rng, tok, room, p.haystack == Haystack::ESSAY ? essay_sentences() : filler_sentences(), "");
    }
    std::vector<int64_t> at;
    for (size_t i = 0; i < inserts.size(); ++i) {
        const double drawn = 0.05 + 0.9 * double(rng() % 10000) / 10000.0;  // drawn either way: the rest of the sample stays the same
        const double depth = spec.depth >= 0 ? spec.depth : drawn;
        at.push_back(cuts.empty() ? int64_t(depth * double(room)) : cuts[size_t(depth * double(cuts.size() - 1))]);
    }
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
    s.question_start = s.answer_start - int64_t(tail.size());
    ids.insert(ids.end(), ans.begin(), ans.end());
    s.answer_length = int64_t(ans.size());
    s.ids = std::move(ids);
    s.answer = p.answer;
    s.description = str(p.description, at.empty() ? std::string() : str(" at depth ", double(at[0]) / double(room)));
    for (const Parts::Question& q : p.more) {
        RulerQuestion rq;
        rq.ids = tok.encode(q.question + close + q.answer_prefix, false);
        const std::vector<int32_t> a = tok.encode(" " + q.answer, false);
        rq.ids.insert(rq.ids.end(), a.begin(), a.end());
        rq.answer_length = int64_t(a.size());
        rq.answer = q.answer;
        if (!reopen.empty()) rq.turn_open = tok.encode(reopen, false);
        s.more_questions.push_back(std::move(rq));
    }
    return s;
}

}  // namespace kv
