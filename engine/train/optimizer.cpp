// The optimizer of a training run (see optimizer.h).
#include "optimizer.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "engine/run/run_config.h"

namespace kv {

OptimKind optimizer_kind_from_name(const std::string& name) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    for (size_t i = 0; i < size_t(OptimKind::COUNT); ++i)
        if (lower == optim_kind_name(OptimKind(i))) return OptimKind(i);
    throw Error(str("--optimizer: '", name, "' is not an optimizer; expected AdamW, Adam, Adamax, SGD, RMSprop or Adadelta"));
}

OptimizerConfig optimizer_config_from_train(const TrainConfig& t) {
    OptimizerConfig c;
    c.kind = optimizer_kind_from_name(t.optimizer);
    c.lr = t.lr;
    c.weight_decay = t.weight_decay;
    c.beta1 = t.adam_beta1;
    c.beta2 = t.adam_beta2;
    c.eps = t.eps;
    c.momentum = t.momentum;
    c.dampening = t.dampening;
    c.alpha = t.rmsprop_alpha;
    c.rho = t.adadelta_rho;
    return c;
}

std::vector<std::string> optimizer_state_keys(const OptimizerConfig& cfg) {
    switch (cfg.kind) {
        case OptimKind::ADAMW:
        case OptimKind::ADAM: return {"exp_avg", "exp_avg_sq"};
        case OptimKind::ADAMAX: return {"exp_avg", "exp_inf"};
        case OptimKind::SGD: return cfg.momentum != 0.0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
        case OptimKind::RMSPROP:
            return cfg.momentum > 0.0 ? std::vector<std::string>{"square_avg", "momentum_buffer"}
                                      : std::vector<std::string>{"square_avg"};
        case OptimKind::ADADELTA: return {"square_avg", "acc_delta"};
        default: return {};
    }
}

namespace {

OptimParams op_params(const OptimizerConfig& c, double lr, int64_t t) {
    OptimParams o;
    o.kind = int(c.kind);
    o.lr = float(lr);
    o.beta1 = float(c.beta1);
    o.beta2 = float(c.beta2);
    o.eps = float(c.eps);
    o.weight_decay = float(c.weight_decay);
    o.momentum = float(c.momentum);
    o.dampening = float(c.dampening);
    o.nesterov = c.nesterov ? 1 : 0;
    o.alpha = float(c.alpha);
    o.rho = float(c.rho);
    o.grad_scale = 1.0f;
    o.step = t;
    return o;
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& cfg, std::vector<OptimizerParam> params) : cfg_(cfg), params_(std::move(params)) {
    if (cfg.lr < 0 || cfg.eps < 0 || cfg.weight_decay < 0 || cfg.momentum < 0)
        throw Error(str("optimizer ", optim_kind_name(cfg.kind), ": lr, eps, weight_decay and momentum must be >= 0"));
    if (cfg.nesterov && (cfg.momentum <= 0 || cfg.dampening != 0))
        throw Error("optimizer sgd: nesterov momentum needs momentum > 0 and dampening 0");
    const std::vector<std::string> keys = optimizer_state_keys(cfg);
    std::set<std::string> names;
    for (const auto& p : params_) {
        if (!p.param || !p.grad || !p.param->defined() || !p.grad->defined())
            throw Error(str("optimizer: parameter '", p.name, "' has no tensor or no gradient"));
        if (p.param->shape() != p.grad->shape())
            throw Error(str("optimizer: parameter '", p.name, "' is ", p.param->shape().str(), " but its gradient is ",
                            p.grad->shape().str()));
        if (!names.insert(p.name).second) throw Error(str("optimizer: parameter '", p.name, "' is listed twice"));
        const DType sd = p.param->dtype() == DType::F64 ? DType::F64 : DType::F32;
        std::vector<Tensor> st;
        for (const auto& k : keys)
            st.push_back(Tensor::zeros(p.param->shape(), sd, {p.param->device(), MemCategory::OPTIMIZER, p.name + "." + k}));
        state_.push_back(std::move(st));
    }
}

void Optimizer::step(double lr) {
    ++t_;
    const OptimParams o = op_params(cfg_, lr, t_);
    for (size_t i = 0; i < params_.size(); ++i) {
        std::vector<Tensor>& st = state_[i];
        Tensor* s1 = st.size() > 0 ? &st[0] : nullptr;
        Tensor* s2 = st.size() > 1 ? &st[1] : nullptr;
        ops::optimizer_step_(*params_[i].param, *params_[i].grad, s1, s2, o);
    }
}

void Optimizer::zero_grad() {
    for (auto& p : params_) p.grad->fill(0.0);
}

size_t Optimizer::state_bytes() const {
    size_t n = 0;
    for (const auto& st : state_)
        for (const auto& t : st) n += t.nbytes();
    return n;
}

size_t Optimizer::param_bytes() const {
    size_t n = 0;
    for (const auto& p : params_) n += p.param->nbytes();
    return n;
}

TensorMap Optimizer::state_dict() const {
    TensorMap m;
    const std::vector<std::string> keys = optimizer_state_keys(cfg_);
    for (size_t i = 0; i < params_.size(); ++i)
        for (size_t k = 0; k < keys.size(); ++k) m[params_[i].name + "." + keys[k]] = state_[i][k];
    return m;
}

void Optimizer::load_state_dict(const TensorMap& state, int64_t steps_taken) {
    if (steps_taken < 0) throw Error(str("optimizer state: step count ", steps_taken, " is negative"));
    const std::vector<std::string> keys = optimizer_state_keys(cfg_);
    for (size_t i = 0; i < params_.size(); ++i)
        for (size_t k = 0; k < keys.size(); ++k) {
            const std::string name = params_[i].name + "." + keys[k];
            auto it = state.find(name);
            if (it == state.end())
                throw Error(str("optimizer state: missing tensor '", name, "' (", optim_kind_name(cfg_.kind), " keeps ",
                                keys.size(), " per parameter)"),
                            "resume with the optimizer and trainable parameters the state was saved with");
            if (it->second.shape() != state_[i][k].shape())
                throw Error(str("optimizer state: tensor '", name, "' has shape ", it->second.shape().str(), ", expected ",
                                state_[i][k].shape().str()));
            Tensor& dst = state_[i][k];
            dst.copy_from(it->second.device() == dst.device() ? it->second : it->second.to(dst.device()));
        }
    t_ = steps_taken;
}

}  // namespace kv
