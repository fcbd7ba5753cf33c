// Training data (see train_data.h).
#include "train_data.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/data/helmet.h"
#include "engine/data/longbench_v2.h"
#include "engine/data/synthetic.h"
#include "engine/data/text_windows.h"

namespace kv {

namespace {

// prompt + response + EOS as an SFT example: input = sequence[:-1], the prompt masked.
TrainExample sft_example(const std::vector<int32_t>& prompt, std::vector<int32_t> response, int32_t eos, std::string description) {
    if (eos >= 0) response.push_back(eos);
    if (response.empty()) throw Error(str(description, ": empty response; nothing to train on"));
    TrainExample e;
    e.ids = prompt;
    e.ids.insert(e.ids.end(), response.begin(), response.end() - 1);
    e.targets.assign(e.ids.size(), -100);
    for (size_t j = 0; j < response.size(); ++j) e.targets[prompt.size() - 1 + j] = response[j];
    e.description = std::move(description);
    return e;
}

// An example from a prompt with a class label, for any head.
TrainExample labelled_example(HeadKind head, const std::vector<int32_t>& prompt, int32_t label,
                              const std::vector<int32_t>& class_tokens, int32_t eos, std::string description) {
    if (head == HeadKind::NEXT_TOKEN) {
        TrainExample e = sft_example(prompt, {class_tokens[size_t(label)]}, eos, std::move(description));
        e.label = label;
        return e;
    }
    TrainExample e;
    e.ids = prompt;
    e.label = label;
    e.description = std::move(description);
    return e;
}

}  // namespace

TrainData build_train_data(const RunConfig& cfg, const Tokenizer& tok, const ModelConfig& mc) {
    TrainData d;
    d.head = head_kind_from_name(cfg.train.head_model);
    const int32_t eos = tok.eos_id() >= 0 ? tok.eos_id() : (mc.eos_token_ids.empty() ? -1 : mc.eos_token_ids.front());
    const std::string& name = cfg.data.name;
    if (name == "passkey" || name == "recall" || name == "needle") {
        d.class_tokens = class_tokens(tok).ids;
        d.num_classes = int64_t(d.class_tokens.size());
        SyntheticSpec spec;
        spec.task = name;
        spec.seq_length = cfg.data.seq_length;
        spec.seed = cfg.data.seed;
        spec.num_keys = cfg.data.num_keys;
        for (int64_t i = 0; i < cfg.data.num_samples; ++i) {
            if (!cfg.data.depths.empty()) spec.depth = cfg.data.depths[size_t(i) % cfg.data.depths.size()];
            ClassSample s = make_synthetic_sample(spec, i, tok);
            d.examples.push_back(labelled_example(d.head, s.ids, s.label, d.class_tokens, eos, s.description));
        }
        d.source = str(name, ": ", cfg.data.num_samples, " samples of ~", cfg.data.seq_length, " tokens");
    } else if (name == "text") {
        if (d.head != HeadKind::NEXT_TOKEN)
            throw Error(str("--head_model ", cfg.train.head_model, ": text windows have no labels; expected next_token_prediction"));
        TextWindows w = make_text_windows(cfg.data.files, tok, cfg.data.seq_length, cfg.data.num_samples);
        for (size_t i = 0; i < w.windows.size(); ++i) {
            TrainExample e;
            e.ids = w.windows[i];
            e.targets.assign(e.ids.size(), -100);
            for (size_t t = 0; t + 1 < e.ids.size(); ++t) e.targets[t] = e.ids[t + 1];
            e.description = str("text window ", i);
            d.examples.push_back(std::move(e));
        }
        d.source = str("text: ", w.windows.size(), " windows of ", cfg.data.seq_length, " tokens");
    } else if (name == "longbench") {
        LongBenchV2Options o;
        o.path = cfg.data.path;
        o.head_model = cfg.train.head_model;
        o.model_name = cfg.model;
        o.max_seq_length = cfg.data.max_seq_length;
        o.metadata_dir = cfg.data.metadata_dir;
        LoadedDataset ld = load_longbench_v2(o, tok);
        d.class_tokens = ld.class_token_ids;
        d.num_classes = 4;
        if (d.head != HeadKind::NEXT_TOKEN && d.class_tokens.size() != 4)
            throw Error("longbench: the tokenizer has no single tokens for the answer letters A-D",
                        "use --head_model next_token_prediction");
        for (const auto& r : ld.dev) {
            if (d.head == HeadKind::NEXT_TOKEN) {  // the prompt ends with "... is "; the letter follows as text
                TrainExample e = sft_example(r.prompt_ids, tok.encode(r.targets.empty() ? std::string(1, char('A' + r.label)) : r.targets[0], false),
                                             eos, "longbench " + r.id);
                e.label = r.label;
                d.examples.push_back(std::move(e));
            } else {
                d.examples.push_back(labelled_example(d.head, r.prompt_ids, r.label, d.class_tokens, eos, "longbench " + r.id));
            }
        }
        d.source = str("longbench: ", ld.dev.size(), " records of <= ", cfg.data.max_seq_length, " tokens");
    } else if (name == "helmet") {
        if (d.head != HeadKind::NEXT_TOKEN)
            throw Error(str("--head_model ", cfg.train.head_model, ": HELMET answers are free text; expected next_token_prediction"));
        HelmetOptions o;
        o.path = cfg.data.path;
        o.dataset_key = cfg.data.dataset_key;
        o.model_name = cfg.model;
        o.max_seq_length = cfg.data.max_seq_length;
        o.metadata_dir = cfg.data.metadata_dir;
        LoadedDataset ld = load_helmet(o, tok);
        const std::vector<int32_t> choice = draw_target_choices(ld.dev, cfg.data.seed);
        for (size_t i = 0; i < ld.dev.size(); ++i) {
            const DataRecord& r = ld.dev[i];
            if (r.targets.empty()) continue;
            d.examples.push_back(sft_example(r.prompt_ids, tok.encode(r.targets[size_t(choice[i])], false), eos, "helmet " + r.id));
        }
        d.source = str("helmet ", cfg.data.dataset_key, ": ", d.examples.size(), " records");
    } else {
        throw Error(str("--data ", name, " cannot be used for training; expected passkey, recall, needle, text, longbench or helmet"));
    }
    if (d.examples.empty()) throw Error(str("--data ", name, ": no training examples"));
    d.split = split_train_val(int64_t(d.examples.size()), cfg.data.val_split_fraction, cfg.data.seed);
    if (d.split.train.empty())
        throw Error(str("--data.num_samples: ", d.examples.size(), " examples leave none for training after the validation split (",
                        cfg.data.val_split_fraction, ")"));
    return d;
}

std::vector<int64_t> example_lengths(const TrainData& d, const std::vector<int64_t>& indices) {
    std::vector<int64_t> out;
    out.reserve(indices.size());
    for (int64_t i : indices) out.push_back(int64_t(d.examples[size_t(i)].ids.size()));
    return out;
}

MicroBatch make_micro_batch(const TrainData& d, const std::vector<int64_t>& examples, int32_t pad_id, Device device) {
    if (examples.empty()) throw Error("make_micro_batch: no examples");
    const int64_t B = int64_t(examples.size());
    int64_t T = 0;
    for (int64_t i : examples) T = std::max<int64_t>(T, int64_t(d.examples[size_t(i)].ids.size()));
    MicroBatch mb;
    std::vector<int32_t> ids(size_t(B * T), pad_id < 0 ? 0 : pad_id);
    HeadSpec& h = mb.head;
    h.kind = d.head;
    h.B = B;
    h.T = T;
    if (d.head == HeadKind::NEXT_TOKEN) h.token_targets.assign(size_t(B * T), -100);
    if (d.head == HeadKind::CLASS_ON_LOGITS) h.class_tokens = d.class_tokens;
    for (int64_t b = 0; b < B; ++b) {
        const TrainExample& e = d.examples[size_t(examples[size_t(b)])];
        const int64_t n = int64_t(e.ids.size()), pad = T - n;
        std::copy(e.ids.begin(), e.ids.end(), ids.begin() + b * T + pad);
        if (d.head == HeadKind::NEXT_TOKEN) std::copy(e.targets.begin(), e.targets.end(), h.token_targets.begin() + b * T + pad);
        else h.labels.push_back(e.label);
        mb.tokens += n;
    }
    mb.ids = Tensor::from_i32({B, T}, ids, {device, MemCategory::ACTIVATIONS, "input ids"});
    return mb;
}

}  // namespace kv
