// The repeat task (see repeat_task.h). The passage is random words (nothing in the filler or
// in language predicts them), so only a copy from the first occurrence gets them right.
#include "repeat_task.h"

#include <algorithm>
#include <random>

#include "engine/core/error.h"
#include "filler_text.h"

namespace kv {

namespace {

const std::vector<std::string>& passage_words() {
    static const std::vector<std::string> w = {
        "amber",   "velvet",  "copper",  "harbor",  "lantern", "meadow",  "orbit",   "pepper",  "quartz",  "saddle",
        "timber",  "violet",  "walnut",  "anchor",  "basket",  "candle",  "dragon",  "ember",   "falcon",  "garnet",
        "helmet",  "island",  "jungle",  "kettle",  "ladder",  "marble",  "needle",  "oyster",  "pillow",  "rocket",
        "silver",  "tunnel",  "umbrella", "valley", "wizard",  "yellow",  "zipper",  "badger",  "cactus",  "dolphin",
        "engine",  "feather", "glacier", "hammer",  "igloo",   "jigsaw",  "kitten",  "lemon",   "magnet",  "nectar",
        "otter",   "parrot",  "quiver",  "raven",   "spider",  "tulip",   "utensil", "vortex",  "window",  "yogurt",
        "zebra",   "biscuit", "cobalt",  "donkey",  "eclipse", "fossil",  "goblet",  "hazel",   "ivory",   "jasmine",
    };
    return w;
}

const std::vector<std::string>& filler_lines() {
    static const std::vector<std::string> s = {
        "The committee met again on Tuesday and agreed to postpone the decision.",
        "Rain is expected in the north of the region later in the week.",
        "The bridge was repainted last spring after years of complaints.",
        "Visitors are asked to keep to the marked paths in the park.",
        "A new timetable for the local buses starts at the end of the month.",
        "The old school building now houses a small public library.",
        "Prices at the weekly market have barely changed since last year.",
        "The festival drew more people than the organisers had planned for.",
    };
    return s;
}

std::vector<int32_t> filler(std::mt19937_64& rng, const Tokenizer& tok, int64_t n) {
    return filler_tokens(rng, tok, n, filler_lines(), " ");
}

}  // namespace

RepeatSample make_repeat_sample(const RepeatSpec& spec, int64_t index, const Tokenizer& tok) {
    if (spec.passage_length <= kRepeatCue)
        throw Error(str("--data.repeat_length: ", spec.passage_length, " tokens leave nothing to score after the ", kRepeatCue,
                        "-token cue; expected at least ", kRepeatCue + 1));
    std::seed_seq seq{uint64_t(spec.seed), uint64_t(index), uint64_t(0x7265706561ULL)};  // "repea"
    std::mt19937_64 rng(seq);
    std::vector<int32_t> ids = tok.encode("", true);  // BOS when the tokenizer has one
    const int64_t P = spec.passage_length;
    const int64_t room = spec.seq_length - int64_t(ids.size()) - 2 * P;
    const int64_t D = spec.distance < 0 ? room : spec.distance;
    if (room < 0 || D > room)
        throw Error(str("--data.seq_length: ", spec.seq_length, " tokens cannot hold two copies of ", P, " tokens",
                        spec.distance >= 0 ? str(" ", spec.distance, " tokens apart") : std::string(), "; expected at least ",
                        int64_t(ids.size()) + 2 * P + std::max<int64_t>(0, spec.distance)));
    // The passage: random words, cut to P tokens.
    std::vector<int32_t> passage;
    while (int64_t(passage.size()) < P) {
        std::string text;
        for (int i = 0; i < 32; ++i) text += " " + passage_words()[rng() % passage_words().size()];
        auto t = tok.encode(text, false);
        passage.insert(passage.end(), t.begin(), t.end());
    }
    passage.resize(size_t(P));
    const std::vector<int32_t> head = filler(rng, tok, room - D);
    const std::vector<int32_t> gap = filler(rng, tok, D);
    RepeatSample s;
    ids.insert(ids.end(), head.begin(), head.end());
    s.first_copy = int64_t(ids.size());
    ids.insert(ids.end(), passage.begin(), passage.end());
    ids.insert(ids.end(), gap.begin(), gap.end());
    s.second_copy = int64_t(ids.size());
    ids.insert(ids.end(), passage.begin(), passage.end());
    s.ids = std::move(ids);
    s.passage_length = P;
    s.description = str("repeat ", P, " tokens at distance ", D);
    return s;
}

CopyScore score_copy(const std::vector<int32_t>& expected, const std::vector<int32_t>& predicted) {
    CopyScore c;
    c.length = int64_t(expected.size());
    bool in_prefix = true;
    for (size_t i = 0; i < expected.size(); ++i) {
        const bool eq = i < predicted.size() && predicted[i] == expected[i];
        c.matches += eq;
        in_prefix = in_prefix && eq;
        c.prefix += in_prefix;
    }
    c.exact = c.length > 0 && c.matches == c.length;
    return c;
}

}  // namespace kv
