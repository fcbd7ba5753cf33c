// Head-model losses (see head_model.h).
#include "head_model.h"

#include "engine/core/error.h"

namespace kv {

HeadKind head_kind_from_name(const std::string& name) {
    if (name == "next_token_prediction") return HeadKind::NEXT_TOKEN;
    if (name == "seq_classification_on_logits") return HeadKind::CLASS_ON_LOGITS;
    if (name == "seq_classification") return HeadKind::SEQ_CLASS;
    throw Error(str("--head_model: '", name, "' is unknown; expected next_token_prediction, seq_classification_on_logits or seq_classification"));
}

const char* head_kind_name(HeadKind k) {
    switch (k) {
        case HeadKind::NEXT_TOKEN: return "next_token_prediction";
        case HeadKind::CLASS_ON_LOGITS: return "seq_classification_on_logits";
        case HeadKind::SEQ_CLASS: return "seq_classification";
    }
    return "?";
}

void HeadResult::init(int64_t B) {
    loss_sum.assign(size_t(B), 0.0);
    count.assign(size_t(B), 0.0);
    prediction.assign(size_t(B), -1);
    class_logprob.clear();
    target_argmax.clear();
    token_loss.clear();
    pool_sum.clear();
    pooled = 0;
}

double HeadResult::mean_loss() const {
    double s = 0;
    int n = 0;
    for (size_t b = 0; b < loss_sum.size(); ++b)
        if (count[b] > 0) {
            s += loss_sum[b] / count[b];
            ++n;
        }
    return n ? s / n : 0.0;
}

double HeadResult::token_mean_loss() const {
    double s = 0, n = 0;
    for (size_t b = 0; b < loss_sum.size(); ++b) s += loss_sum[b], n += count[b];
    return n > 0 ? s / n : 0.0;
}

}  // namespace kv
