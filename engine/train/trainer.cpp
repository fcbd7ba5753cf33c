// The training loop (see trainer.h).
//
// Index: [SECTION] helpers  [SECTION] construction and resume  [SECTION] gradients and steps
//        [SECTION] validation  [SECTION] checkpoints  [SECTION] the run
#include "trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <random>

#include "engine/core/error.h"
#include "engine/driver/long_context.h"
#include "engine/run/run_plan.h"
#include "engine/telemetry/trace.h"
#include "grad_clip.h"
#include "model_weights.h"
#include "train_checkpoint.h"
#include "engine/core/join.h"
#include "engine/core/run_mode.h"

namespace kv {

// ==== [SECTION] helpers ======================================================================

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr int64_t kUnitsPerMicroBatch = 1000;  // progress units of one gradient computation

// LoRA dropout draws masks for the duration of one micro-batch's gradient computation only.
struct TrainingPass {
    Lora* lora;
    TrainingPass(Lora* l, uint64_t pass) : lora(l) {
        if (lora) lora->begin_training_pass(pass);
    }
    ~TrainingPass() {
        if (lora) lora->end_training_pass();
    }
    TrainingPass(const TrainingPass&) = delete;
    TrainingPass& operator=(const TrainingPass&) = delete;
};

// Elementwise max of peak statistics (the gradient pipeline restarts the tracker's peaks at
// every phase, so a run's peaks are gathered from each phase's report).
void merge_peaks(std::vector<DeviceMemoryStats>& into, const std::vector<DeviceMemoryStats>& from) {
    for (const auto& s : from) {
        DeviceMemoryStats* d = nullptr;
        for (auto& x : into)
            if (x.device == s.device) d = &x;
        if (!d) {
            into.push_back(s);
            continue;
        }
        for (size_t c = 0; c < kNumMemCategories; ++c) d->peak[c] = std::max(d->peak[c], s.peak[c]);
        d->peak_total = std::max(d->peak_total, s.peak_total);
        d->current = s.current;
        d->current_total = s.current_total;
    }
}

}  // namespace

bool is_train_mode(const std::string& mode) {
    const RunModeInfo* m = find_run_mode(mode);
    return m && m->kind == RunKind::TRAIN;
}
bool is_lora_mode(const std::string& mode) { return is_train_mode(mode) && find_run_mode(mode)->lora; }
bool is_offload_mode(const std::string& mode) { return is_train_mode(mode) && find_run_mode(mode)->offload; }

// ==== [SECTION] construction and resume ======================================================

Trainer::Trainer(const RunConfig& cfg, LoadedModel& lm, TrainCallbacks cb) : cfg_(cfg), lm_(lm), cb_(std::move(cb)) {
    if (!is_train_mode(cfg.mode)) {
        std::vector<std::string> modes;
        for (const RunModeInfo& m : run_mode_registry())
            if (m.kind == RunKind::TRAIN) modes.push_back(m.name);
        throw Error(str("mode '", cfg.mode, "' is not a training mode; expected one of ", join(modes, ", ")));
    }
    validate_run_config(cfg);
    Transformer& m = *lm.model;
    if (m.config().latent_attention()) {  // gradients run through the expanded form, from the same weights
        m.set_mla_cache(mla_cache_choice(cfg));
        lm.config.latent.cache = m.config().latent.cache;
    }
    if (m.act_dtype() != DType::F32 && m.act_dtype() != DType::F64)
        throw Error(str("training needs f32 weights; the model runs in ", cfg.dtype), "use --precision f32");
    const bool lora = is_lora_mode(cfg.mode);
    if (m.has_packed_weights() && (!lora || cfg.train.qlora))
        throw Error(str("mode ", cfg.mode, cfg.train.qlora ? " with --lora.qlora" : "",
                        ": the model's weights are packed (GGUF blocks, frozen and not rewritable); ",
                        cfg.train.qlora ? "QLoRA rewrites the base as NF4" : "full fine-tuning updates every weight"),
                    "load the model with --model.weights f32");
    if (cfg.train.qlora && !lora)
        throw Error(str("--lora.qlora: QLoRA trains adapters on a frozen NF4 base; mode ", cfg.mode, " trains every weight"),
                    "use finetune_long_lora or finetune_offload_lora");
    if (is_offload_mode(cfg.mode) && !m.options().device.is_cpu())
        throw Error(str("mode ", cfg.mode, ": the offload modes run on the CPU backend only in this build"), "use --device cpu");
    accum_ = cfg.train.global_batch_size / cfg.train.micro_batch_size;

    sum_.mode = cfg.mode;
    sum_.offload = is_offload_mode(cfg.mode);
    sum_.micro_steps_per_step = accum_;

    data_ = build_train_data(cfg, *lm.tokenizer, lm.config);
    sum_.data_source = data_.source;

    // ---- trainable parameters ----
    if (cfg.train.qlora) {
        sum_.qlora = true;
        sum_.qlora_stats = qlora_quantize_base(m);
    }
    if (lora) {
        LoraConfig lc;
        lc.r = cfg.train.lora_r;
        lc.alpha = cfg.train.lora_alpha;
        lc.dropout = cfg.train.lora_dropout;
        lc.targets = parse_lora_targets(cfg.train.lora_targets);
        lc.seed = cfg.model_seed;
        lora_ = std::make_unique<Lora>(m, lc);
        m.set_adapters(lora_.get());
        for (auto& a : lora_->adapters()) {
            params_.push_back({"base_model.model." + a.module + ".lora_A.weight", &a.A, &a.dA});
            params_.push_back({"base_model.model." + a.module + ".lora_B.weight", &a.B, &a.dB});
        }
    } else {
        grads_ = ModelGrads::zeros_like(m);
        for (auto& [name, wg] : grads_.pairs(m)) params_.push_back({name, wg.first, wg.second});
    }
    if (data_.head == HeadKind::SEQ_CLASS) {
        // nn.Linear(E, C)'s default initialisation: uniform in +-1/sqrt(E) for weight and bias.
        const int64_t C = data_.num_classes, E = lm.config.hidden_size;
        const Device dev = m.options().device;
        std::mt19937_64 rng(cfg.model_seed ^ 0x73636f7265ull);
        const double bound = 1.0 / std::sqrt(double(E));
        std::uniform_real_distribution<double> u(-bound, bound);
        std::vector<double> w(static_cast<size_t>(C * E)), b(static_cast<size_t>(C));
        for (double& x : w) x = u(rng);
        for (double& x : b) x = u(rng);
        class_w_ = Tensor::from_f64({C, E}, w, m.act_dtype(), {dev, MemCategory::WEIGHTS, "score.weight"});
        class_b_ = Tensor::from_f64({C}, b, m.act_dtype(), {dev, MemCategory::WEIGHTS, "score.bias"});
        dclass_w_ = Tensor::zeros({C, E}, m.act_dtype(), {dev, MemCategory::GRADIENTS, "score.weight grad"});
        dclass_b_ = Tensor::zeros({C}, m.act_dtype(), {dev, MemCategory::GRADIENTS, "score.bias grad"});
        params_.push_back({"score.weight", &class_w_, &dclass_w_});
        params_.push_back({"score.bias", &class_b_, &dclass_b_});
    }
    for (const auto& p : params_) {
        sum_.trainable_parameters += p.param->numel();
        sum_.trainable_bytes += p.param->nbytes();
        sum_.gradient_bytes += p.grad->nbytes();
    }
    sum_.weight_bytes = m.weight_bytes();
    optimizer_ = std::make_unique<Optimizer>(optimizer_config_from_train(cfg.train), params_);
    sum_.optimizer_bytes = optimizer_->state_bytes();

    // ---- data order and schedule ----
    BatchOrderOptions bo;
    bo.micro_batch_size = cfg.train.micro_batch_size;
    bo.shuffle = true;
    bo.seed = cfg.data.seed;
    iterator_ = std::make_unique<BatchIterator>(example_lengths(data_, data_.split.train), bo);
    const int64_t micro_total = cfg.train.epochs * iterator_->num_batches();
    total_steps_ = cfg.train.max_steps > 0 ? cfg.train.max_steps : std::max<int64_t>(1, (micro_total + accum_ - 1) / accum_);
    schedule_ = lr_schedule_for(cfg.train, total_steps_);

    gopt_.layers_per_cell = cfg.grad.layers_per_cell;
    gopt_.layercp_qname = cfg.grad.layercp_qname;
    gopt_.cachecp_qname = cfg.grad.cachecp_qname;
    gopt_.host = Device{};

    if (sum_.offload) {
        sum_.offload_traffic = offload_traffic(m, lora_.get(), cfg.grad.layers_per_cell);
        sum_.offload_h2d_per_step = sum_.offload_traffic.h2d_bytes * size_t(accum_);
        sum_.offload_d2h_per_step = sum_.offload_traffic.d2h_bytes * size_t(accum_);
    }
    sum_.train_examples = int64_t(data_.split.train.size());
    sum_.val_examples = int64_t(data_.split.val.size());
    sum_.total_steps = total_steps_;
    if (!cfg.train.resume.empty()) resume(cfg.train.resume);

    // ---- data parallelism ----
    comm_ = dist::process_communicator();
    if (comm_) {
        std::vector<Tensor*> grads;
        std::vector<int> layers;
        for (auto& p : params_) grads.push_back(p.grad), layers.push_back(dist::GradSync::layer_of_name(p.name));
        gsync_ = std::make_unique<dist::GradSync>(*comm_, grads, size_t(cfg.dist.bucket_mb) << 20, layers);
        sum_.ranks = comm_->size();
        sum_.dist_backend = comm_->backend();
        if (cb_.log && comm_->rank() == 0 && accum_ % comm_->size() != 0)
            cb_.log(str("data parallelism: ", accum_, " micro-batches per step over ", comm_->size(), " ranks: ",
                        accum_ < comm_->size() ? "some ranks idle" : "ranks unevenly loaded",
                        " (make train.global_batch_size / train.micro_batch_size a multiple of the ranks)"));
    }
}

Trainer::~Trainer() {
    if (lora_ && lm_.model && lm_.model->adapters() == lora_.get()) lm_.model->set_adapters(nullptr);
}

void Trainer::resume(const std::string& path) {
    TensorMap opt_state;
    std::string dir;
    TrainingState st = load_training_state(path, &opt_state, &dir);
    const std::string hint = "resume with the mode, optimizer, LoRA settings and data the checkpoint was saved with";
    if (is_lora_mode(st.mode) != is_lora_mode(cfg_.mode))
        throw Error(str("--resume: the checkpoint was saved by mode ", st.mode, ", this run is ", cfg_.mode), hint);
    if (st.optimizer != optim_kind_name(optimizer_->config().kind))
        throw Error(str("--resume: the checkpoint's optimizer is ", st.optimizer, ", this run uses ",
                        optim_kind_name(optimizer_->config().kind)),
                    hint);
    namespace fs = std::filesystem;
    if (lora_) {
        const std::string f = (fs::path(dir) / "adapter_model.safetensors").string();
        if (!fs::is_regular_file(f)) throw Error(str("--resume: '", f, "' is missing"));
        lora_->load_state_dict(load_tensors(f));
    } else {
        const std::string f = (fs::path(dir) / "model.safetensors").string();
        if (!fs::is_regular_file(f)) throw Error(str("--resume: '", f, "' is missing"));
        load_model_state_dict(*lm_.model, load_tensors(f));
    }
    if (class_w_.defined()) {
        const std::string f = (fs::path(dir) / "classifier.safetensors").string();
        if (!fs::is_regular_file(f)) throw Error(str("--resume: '", f, "' is missing (seq_classification head)"));
        TensorMap c = load_tensors(f);
        for (auto [name, t] : {std::pair<const char*, Tensor*>{"score.weight", &class_w_}, {"score.bias", &class_b_}}) {
            auto it = c.find(name);
            if (it == c.end() || it->second.shape() != t->shape())
                throw Error(str("--resume: '", f, "' has no tensor '", name, "' of shape ", t->shape().str()), hint);
            t->copy_from(it->second);
        }
    }
    optimizer_->load_state_dict(opt_state, st.optimizer_steps);
    // The saved split and data position: a resumed run sees the same examples in the same order.
    data_.split = split_from_json(st.split, int64_t(data_.examples.size()));
    BatchOrderOptions bo;
    bo.micro_batch_size = cfg_.train.micro_batch_size;
    bo.shuffle = true;
    bo.seed = cfg_.data.seed;
    iterator_ = std::make_unique<BatchIterator>(example_lengths(data_, data_.split.train), bo);
    iterator_->restore(st.batch_iterator);
    step_ = st.step;
    micro_batches_ = st.micro_batches;
    losses_ = st.losses;
    if (st.total_steps == total_steps_) {
        schedule_ = st.schedule;
    } else if (cb_.log) {
        cb_.log(str("resume: the run now has ", total_steps_, " steps (the checkpoint's had ", st.total_steps,
                    "); the learning-rate schedule follows the new length"));
    }
    sum_.start_step = step_;
    if (cb_.log) cb_.log(str("resumed from ", dir, " at step ", step_, " of ", total_steps_));
}

// ==== [SECTION] gradients and steps ==========================================================

KVCacheConfig Trainer::cache_config() const { return run_cache_config(cfg_, lm_.config, lm_.model->act_dtype()); }

ChunkPlan Trainer::plan_for(int64_t T, uint64_t seed) const { return run_chunk_plan(cfg_, cache_config(), lm_.config, T, seed); }

std::vector<std::vector<int64_t>> Trainer::next_global_batch() {
    std::vector<std::vector<int64_t>> out;
    for (int64_t j = 0; j < accum_; ++j) {
        std::vector<int64_t> ex;
        for (int64_t p : iterator_->next()) ex.push_back(data_.split.train[size_t(p)]);
        out.push_back(std::move(ex));
        ++micro_batches_;
    }
    return out;
}

double Trainer::compute_gradients(const std::vector<std::vector<int64_t>>& micro_batches, int64_t* tokens_out) {
    Transformer& m = *lm_.model;
    optimizer_->zero_grad();
    int64_t rows = 0;
    for (const auto& mb : micro_batches) rows += int64_t(mb.size());
    if (rows == 0) throw Error("compute_gradients: no examples");
    const int32_t pad = lm_.tokenizer->pad_id() >= 0 ? lm_.tokenizer->pad_id() : std::max<int32_t>(lm_.config.pad_token_id, 0);
    const KVCacheConfig kc = cache_config();
    double loss = 0;
    int64_t tokens = 0;
    // Data parallelism: the backward of this rank's last micro-batch finishes the gradients row
    // by row (top layers first); each finished bucket's all-reduce starts there (grad_sync.h).
    size_t last_local = micro_batches.size();
    for (size_t j = 0; j < micro_batches.size(); ++j)
        if (is_local(j)) last_local = j;
    for (size_t j = 0; j < micro_batches.size(); ++j) {
        if (!is_local(j)) continue;  // another rank's share of the global batch
        MicroBatch b = make_micro_batch(data_, micro_batches[j], pad, m.options().device);
        if (class_w_.defined()) b.head.class_weight = class_w_, b.head.class_bias = class_b_;
        b.head.average_loss_per_batch = cfg_.train.average_loss_per_batch;  // validation stays per row
        const int64_t T = b.ids.size(1);
        KVCache cache(kc, lm_.config, m.options().device, m.act_dtype(), T, nullptr);
        // The chunk plan depends on the batch alone (its first example), never on how many
        // batches came before, so resumed runs draw the same randomized plans.
        const ChunkPlan plan = plan_for(T, cfg_.data.seed * 1000003ull + uint64_t(micro_batches[j][0]));
        GradientTargets tg;
        if (!lora_) tg.model = &grads_;
        if (class_w_.defined()) tg.class_weight = &dclass_w_, tg.class_bias = &dclass_b_;
        DriverCallbacks dcb;
        // Ranks agree on cancellation at step boundaries (run()); one rank stopping mid-step
        // would leave the others waiting in the all-reduce.
        dcb.cancel = distributed() ? nullptr : cb_.cancel;
        const int64_t base = (step_ * accum_ + int64_t(j)) * kUnitsPerMicroBatch;
        const std::string what = str("step ", step_ + 1, "/", total_steps_);
        dcb.progress = [&](int64_t d, int64_t t) {
            if (cb_.progress && t > 0) cb_.progress(base + d * kUnitsPerMicroBatch / t, total_steps_ * accum_ * kUnitsPerMicroBatch, what);
        };
        // Dropout masks are keyed on the micro-batch's index in the run (the same after a resume).
        TrainingPass pass(lora_.get(), uint64_t(step_ * accum_ + int64_t(j)));
        GradientOptions gopt = gopt_;
        if (gsync_ && cfg_.dist.overlap && j == last_local) gopt.layers_final = [this](int first) { gsync_->layers_final(first); };
        GradientStats st = gradient_step(m, cache, b.ids, plan, b.head, double(b.ids.size(0)) / double(rows), gopt, tg, dcb);
        merge_peaks(sum_.memory, st.phase1_memory);
        merge_peaks(sum_.memory, st.phase2_memory);
        loss += st.loss;
        tokens += b.tokens;
    }
    last_comm_seconds_ = 0;
    if (gsync_) {
        // The local sums of every rank add up to the global batch's gradient and loss.
        const dist::GradSyncStats gs = gsync_->finish();
        double lt[2] = {loss, double(tokens)};
        comm_->allreduce_sum(lt, 2, dist::ReduceType::F64, "loss and tokens");
        loss = lt[0];
        tokens = int64_t(std::llround(lt[1]));
        last_comm_seconds_ = gs.seconds;
        sum_.allreduce_bytes_per_step = gs.bytes;
        sum_.allreduce_buckets = gs.buckets;
        sum_.allreduce_overlapped_buckets = gs.overlapped;
    }
    if (tokens_out) *tokens_out = tokens;
    return loss;
}

TrainStepRecord Trainer::step() {
    if (step_ >= total_steps_) throw Error(str("the run has taken all its ", total_steps_, " steps"));
    dist::maybe_injected_death(step_ + 1);
    const uint64_t t0_ns = kv::now_ns();
    TrainStepRecord r;
    r.step = step_ + 1;
    // A cancelled step leaves no trace: the data position goes back to the step's start, so a
    // checkpoint saved now resumes with this step's batch.
    const nlohmann::json iterator_before = iterator_->state();
    const int64_t micro_batches_before = micro_batches_;
    try {
        r.loss = compute_gradients(next_global_batch(), &r.tokens);
    } catch (const Cancelled&) {
        iterator_->restore(iterator_before);
        micro_batches_ = micro_batches_before;
        throw;
    }
    if (!std::isfinite(r.loss))
        throw Error(str("step ", r.step, ": the loss is not finite (", r.loss, ")"), "lower --train.lr or set --train.max_grad_norm");
    std::vector<Tensor*> grads;
    for (auto& p : params_) grads.push_back(p.grad);
    r.grad_norm = clip_grad_norm_(grads, cfg_.train.max_grad_norm);
    r.lr = schedule_.lr_at(step_);
    optimizer_->step(r.lr);
    ++step_;
    losses_.push_back(r.loss);
    r.comm_seconds = last_comm_seconds_;
    if (distributed() && cfg_.dist.check_interval > 0 && step_ % cfg_.dist.check_interval == 0) verify_replicas(str("after step ", step_));
    // One span per optimizer step ("train_step"), timed by the same clock reads as r.seconds,
    // so the all-reduce share can be checked from the spans alone.
    static const trace::Name kTrainStep("train_step");
    const uint64_t t1_ns = kv::now_ns();
    trace::span_complete(trace::SpanCategory::OTHER, kTrainStep, t0_ns, t1_ns);
    r.seconds = double(t1_ns - t0_ns) * 1e-9;
    r.tokens_per_s = r.seconds > 0 ? double(r.tokens) / r.seconds : 0;
    sum_.steps.push_back(r);
    sum_.tokens += r.tokens;
    if (cb_.on_step) cb_.on_step(r);
    return r;
}

// ==== [SECTION] validation ===================================================================

ValRecord Trainer::validate() {
    const double t0 = now_s();
    ValRecord v;
    v.step = step_;
    const std::vector<int64_t>& val = data_.split.val;
    if (val.empty()) return v;
    Transformer& m = *lm_.model;
    const int32_t pad = lm_.tokenizer->pad_id() >= 0 ? lm_.tokenizer->pad_id() : std::max<int32_t>(lm_.config.pad_token_id, 0);
    const KVCacheConfig kc = cache_config();
    double loss = 0;
    int64_t correct = 0, n = 0;
    const bool classify = data_.head != HeadKind::NEXT_TOKEN;
    const auto parts = similar_length_batches(example_lengths(data_, val), cfg_.train.micro_batch_size);
    for (size_t pi = 0; pi < parts.size(); ++pi) {
        if (!is_local(pi)) continue;  // data parallelism: batches split over ranks as in training
        const auto& part = parts[pi];
        std::vector<int64_t> ex;
        for (int64_t p : part) ex.push_back(val[size_t(p)]);
        MicroBatch b = make_micro_batch(data_, ex, pad, m.options().device);
        if (class_w_.defined()) b.head.class_weight = class_w_, b.head.class_bias = class_b_;
        const int64_t T = b.ids.size(1);
        KVCache cache(kc, lm_.config, m.options().device, m.act_dtype(), T, nullptr);
        HeadResult res;
        DriverCallbacks dcb;
        dcb.cancel = distributed() ? nullptr : cb_.cancel;
        long_context_forward(m, cache, b.ids, plan_for(T, cfg_.data.seed * 1000003ull + uint64_t(ex[0])), b.head, res, dcb);
        for (size_t r = 0; r < ex.size(); ++r) {
            loss += res.count[r] > 0 ? res.loss_sum[r] / res.count[r] : 0.0;
            if (classify && res.prediction[r] == data_.examples[size_t(ex[r])].label) ++correct;
            ++n;
        }
    }
    if (comm_) {
        double sums[3] = {loss, double(correct), double(n)};
        comm_->allreduce_sum(sums, 3, dist::ReduceType::F64, "validation");
        loss = sums[0];
        correct = int64_t(std::llround(sums[1]));
        n = int64_t(std::llround(sums[2]));
    }
    merge_peaks(sum_.memory, current_memory_tracker().all_stats());
    v.examples = n;
    v.loss = loss / double(n);
    v.accuracy = classify ? double(correct) / double(n) : -1.0;
    v.seconds = now_s() - t0;
    sum_.validations.push_back(v);
    if (cb_.on_validation) cb_.on_validation(v);
    return v;
}

// ==== [SECTION] checkpoints ==================================================================

std::string Trainer::save_checkpoint(const std::string& dir) {
    // Data parallelism: the replicas are identical, so rank 0 alone writes (the other ranks
    // keep the same bookkeeping, so their summaries match).
    if (!writes_files()) {
        sum_.checkpoints.push_back(dir);
        state_dirs_.erase(std::remove(state_dirs_.begin(), state_dirs_.end(), dir), state_dirs_.end());
        state_dirs_.push_back(dir);
        const size_t keep = size_t(std::max<int64_t>(cfg_.train.training_state_num, 0));
        while (keep > 0 && state_dirs_.size() > keep) state_dirs_.erase(state_dirs_.begin());
        sum_.resumable = state_dirs_;
        return dir;
    }
    if (lora_) save_lora_adapter(dir, *lora_, cfg_.model);
    else save_full_weights(dir, *lm_.model);
    if (class_w_.defined())
        save_tensors((std::filesystem::path(dir) / "classifier.safetensors").string(), {{"score.weight", class_w_}, {"score.bias", class_b_}});
    TrainingState st;
    st.step = step_;
    st.total_steps = total_steps_;
    st.micro_batches = micro_batches_;
    st.schedule = schedule_;
    st.mode = cfg_.mode;
    st.optimizer = optim_kind_name(optimizer_->config().kind);
    st.optimizer_steps = optimizer_->steps_taken();
    st.split = split_to_json(data_.split);
    st.batch_iterator = iterator_->state();
    st.run_config = nlohmann::json::parse(run_config_to_json(cfg_, false));
    st.losses = losses_;
    save_training_state(dir, st, optimizer_->state_dict());
    sum_.checkpoints.push_back(dir);
    if (cb_.log) cb_.log(str("checkpoint at step ", step_, ": ", dir));
    // Resumable states of older checkpoints go once the newest training_state_num hold one.
    state_dirs_.erase(std::remove(state_dirs_.begin(), state_dirs_.end(), dir), state_dirs_.end());
    state_dirs_.push_back(dir);
    const size_t keep = size_t(std::max<int64_t>(cfg_.train.training_state_num, 0));
    while (keep > 0 && state_dirs_.size() > keep) {
        remove_training_state(state_dirs_.front());
        if (cb_.log) cb_.log(str("training state removed from ", state_dirs_.front(), " (", keep, " newer checkpoints hold one)"));
        state_dirs_.erase(state_dirs_.begin());
    }
    sum_.resumable = state_dirs_;
    return dir;
}

// ==== [SECTION] the run ======================================================================

TrainSummary Trainer::run() {
    const double t0 = now_s();
    current_memory_tracker().reset_peaks();
    if (cb_.log) {
        cb_.log(str(cfg_.mode, ": ", data_.source, " (", data_.split.train.size(), " train / ", data_.split.val.size(),
                    " validation), ", total_steps_, " steps of ", accum_, " micro-batch(es) of ", cfg_.train.micro_batch_size,
                    ", ", sum_.trainable_parameters, " trainable parameters"));
        if (data_.split.val.empty()) cb_.log("no validation examples (raise --data.num_samples or --data.val_split_fraction)");
        if (sum_.qlora) {
            const QloraStats& q = sum_.qlora_stats;
            cb_.log(str("QLoRA: ", q.tensors, " base weights as NF4, ", q.nf4_bytes >> 10, " KiB for ", q.dense_bytes >> 10,
                        " KiB of floats, max |w - nf4(w)| ", q.max_abs_error,
                        q.packed ? " (kept packed: the matmuls read the NF4 blocks)"
                                 : " (round-tripped in place: packed NF4 needs the CPU, f32 activations and widths that are multiples of 64)"));
        }
    }
    const std::string& out = cfg_.train.out_dir;
    if (distributed()) verify_replicas("at the start (same model, seed and checkpoint on every rank?)");
    try {
        if (step_ == 0) validate();
        while (step_ < total_steps_) {
            bool stop = cancel_requested();
            if (distributed()) {
                // Ctrl-C reaches the ranks at different moments: stop when any rank asks.
                double c = stop ? 1.0 : 0.0;
                comm_->allreduce_sum(&c, 1, dist::ReduceType::F64, "cancel");
                stop = c > 0;
            }
            if (stop) throw Cancelled();
            step();
            if (cfg_.train.eval_interval > 0 && step_ % cfg_.train.eval_interval == 0 && step_ < total_steps_) validate();
            if (cfg_.train.save_interval > 0 && !out.empty() && step_ % cfg_.train.save_interval == 0)
                save_checkpoint(checkpoint_dir_name(out, step_));
        }
        if (sum_.validations.empty() || sum_.validations.back().step != step_) validate();
        if (distributed()) verify_replicas("at the end");
    } catch (const Cancelled&) {
        // The state after the last finished step (a validation cut short changes nothing).
        sum_.cancelled = true;
        if (step_ > sum_.start_step && !out.empty()) {
            sum_.resume_checkpoint = save_checkpoint(checkpoint_dir_name(out, step_));
        } else if (step_ == sum_.start_step && !cfg_.train.resume.empty()) {
            sum_.resume_checkpoint = cfg_.train.resume;  // nothing new: resume where this run did
        }
        if (cb_.log)
            cb_.log(sum_.resume_checkpoint.empty()
                        ? str("cancelled at step ", step_, "; no checkpoint (", out.empty() ? "no --out_dir" : "no step finished", ")")
                        : str("cancelled at step ", step_, "; resume with --resume ", sum_.resume_checkpoint));
        return finish(t0);
    }
    if (!out.empty()) {
        const std::string fin = save_checkpoint((std::filesystem::path(out) / "final").string());
        if (lora_ && writes_files()) {
            // The adapters folded into the base, as a model folder eval_long can load.
            const std::string merged = (std::filesystem::path(fin) / "merged").string();
            try {
                save_merged_model(merged, *lm_.model, *lora_);
                sum_.merged_model = merged;
                if (cb_.log) cb_.log(str("merged model (base + adapters): ", merged));
            } catch (const Error& e) {
                if (cb_.log) cb_.log(str("no merged model: ", e.what()));
            }
        }
    }
    TrainSummary s = finish(t0);
    if (cb_.progress) cb_.progress(total_steps_ * accum_ * kUnitsPerMicroBatch, total_steps_ * accum_ * kUnitsPerMicroBatch, "done");
    return s;
}

void Trainer::verify_replicas(const std::string& when) {
    std::vector<const Tensor*> ts;
    for (const auto& p : params_) ts.push_back(p.param);
    const TensorMap state = optimizer_->state_dict();
    for (const auto& [name, t] : state) ts.push_back(&t);
    dist::check_identical(*comm_, dist::checksum_tensors(ts), str("weights and optimizer state ", when));
    ++sum_.replica_checks;
}

TrainSummary Trainer::finish(double t0) {
    if (comm_) {
        // Per-rank timings for rank 0's summary (doubles travel as their bits).
        double comm = 0, steps = 0;
        for (const auto& r : sum_.steps) comm += r.comm_seconds, steps += r.seconds;
        auto gather = [&](double v) {
            uint64_t bits;
            std::memcpy(&bits, &v, 8);
            std::vector<double> out;
            for (uint64_t b : comm_->allgather_u64(bits, "per-rank timings")) {
                double d;
                std::memcpy(&d, &b, 8);
                out.push_back(d);
            }
            return out;
        };
        sum_.rank_comm_seconds = gather(comm);
        sum_.rank_step_seconds = gather(steps);
    }
    sum_.seconds = now_s() - t0;
    sum_.tokens_per_s = sum_.seconds > 0 ? double(sum_.tokens) / sum_.seconds : 0;
    merge_peaks(sum_.memory, current_memory_tracker().all_stats());
    return sum_;
}

TrainSummary run_train(const RunConfig& cfg, LoadedModel& lm, const TrainCallbacks& cb) {
    Trainer t(cfg, lm, cb);
    return t.run();
}

}  // namespace kv
