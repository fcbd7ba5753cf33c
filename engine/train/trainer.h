// The training loop of the fine-tuning modes (reference §10): finetune_long_lora and
// finetune_offload_lora train LoRA adapters on a frozen base (QLoRA: an NF4 base, qlora.h);
// finetune_long_full and finetune_offload_full train every weight. Each optimizer step takes
// global_batch_size / micro_batch_size micro-batches through the gradient pipeline with the
// configured cache policy (grad/gradient_pipeline.h), each with loss scale B_micro / B_global
// so the accumulated gradient is that of the mean loss (a micro-batch's loss: the mean over its
// target tokens with train.average_loss_per_batch, as the reference's default, else the mean of
// its rows' token means; validation always per row), clips by the global norm, and steps
// the optimizer with the warm-up + cosine learning rate. Validation runs at the start, every
// eval_interval steps and at the end; checkpoints go to out_dir every save_interval steps and
// at the end (train_checkpoint.h), and --resume continues a run with identical losses. Only the
// newest training_state_num checkpoints this run wrote keep their training state (reference
// §10.3); older ones keep their adapters or weights.
// The offload modes run the same code; on the CPU backend host and device memory are one, so
// they differ only in what the summary accounts (offload_traffic.h).
// Data parallelism (engine/dist): with a process communicator installed (the CLI does under
// mpirun), every rank draws the same global batch and computes micro-batches j with
// j % ranks == rank, with the loss scales of the whole global batch; one bucketed all-reduce
// sums the gradients, so every rank steps the optimizer with the single-process gradient (up
// to reassociation of the sum) and the replicas stay identical (checked every
// dist.check_interval steps). Validation splits its batches the same way. Cancellation is
// agreed at step boundaries; only rank 0 writes checkpoints.
// Must not touch storage or sessions: progress and metrics leave through TrainCallbacks.
//
// Index: [SECTION] records  [SECTION] callbacks  [SECTION] Trainer
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/dist/grad_sync.h"
#include "engine/grad/gradient_pipeline.h"
#include "engine/grad/lora.h"
#include "engine/model/model_grads.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/model_loader.h"
#include "engine/run/run_config.h"
#include "lr_schedule.h"
#include "offload_traffic.h"
#include "optimizer.h"
#include "qlora.h"
#include "train_data.h"

namespace kv {

// ==== [SECTION] records ======================================================================

struct TrainStepRecord {
    int64_t step = 0;         // 1-based optimizer step
    double loss = 0;          // mean loss over the global batch (the loss the gradient is of)
    double lr = 0;            // learning rate of this step
    double grad_norm = 0;     // global L2 norm before clipping
    int64_t tokens = 0;       // real tokens of the global batch
    double seconds = 0;
    double tokens_per_s = 0;
    double comm_seconds = 0;  // data parallelism: the step's gradient all-reduce (0 otherwise)
};

struct ValRecord {
    int64_t step = 0;       // optimizer steps taken when it ran
    double loss = 0;        // mean over validation examples of each example's mean loss
    double accuracy = -1;   // classification heads; -1 otherwise
    int64_t examples = 0;
    double seconds = 0;
};

struct TrainSummary {
    std::string mode;
    std::string data_source;
    int64_t train_examples = 0, val_examples = 0;
    int64_t total_steps = 0;
    int64_t start_step = 0;  // > 0 when resumed
    int64_t micro_steps_per_step = 1;
    std::vector<TrainStepRecord> steps;   // this session's steps
    std::vector<ValRecord> validations;
    std::vector<std::string> checkpoints;  // folders written
    std::vector<std::string> resumable;    // of those, the ones that still hold a training state
    bool cancelled = false;                // stopped by TrainCallbacks::cancel before the end
    std::string resume_checkpoint;         // cancelled: the checkpoint --resume continues from ("" = none)
    std::string merged_model;              // final LoRA checkpoint: base + adapters as a model folder
    int64_t trainable_parameters = 0;
    size_t weight_bytes = 0, trainable_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
    bool offload = false;        // weights, gradients and optimizer state accounted as host memory
    OffloadTraffic offload_traffic;  // per micro-batch
    size_t offload_h2d_per_step = 0, offload_d2h_per_step = 0;
    bool qlora = false;
    QloraStats qlora_stats;
    int64_t tokens = 0;
    double seconds = 0;
    double tokens_per_s = 0;
    std::vector<DeviceMemoryStats> memory;  // peaks by category over the run
    // Data parallelism (ranks > 1 or an explicit backend): per rank, indexed by rank.
    int ranks = 1;
    std::string dist_backend;                // "" when no communicator was installed
    size_t allreduce_bytes_per_step = 0;     // gradient bytes each rank reduces per step
    int64_t allreduce_buckets = 0;
    int64_t allreduce_overlapped_buckets = 0;  // of those, started during the backward (last step)
    std::vector<double> rank_comm_seconds;   // all-reduce wall time over the run's steps
    std::vector<double> rank_step_seconds;   // step wall time (compute + all-reduce)
    int64_t replica_checks = 0;              // checksum comparisons passed
};

// ==== [SECTION] callbacks ====================================================================

struct TrainCallbacks {
    // work units done / total and what is being worked on
    std::function<void(int64_t done, int64_t total, const std::string& what)> progress;
    std::function<void(const std::string& line)> log;
    std::function<void(const TrainStepRecord&)> on_step;
    std::function<void(const ValRecord&)> on_validation;
    const std::atomic<bool>* cancel = nullptr;
};

// ==== [SECTION] Trainer ======================================================================

bool is_train_mode(const std::string& mode);
bool is_lora_mode(const std::string& mode);     // *_lora
bool is_offload_mode(const std::string& mode);  // finetune_offload_*

class Trainer {
   public:
    // Builds the data, the trainable parameters (adapters attached to the model, or model
    // gradients), the optimizer and the schedule, and loads cfg.train.resume when set.
    // The model must stay alive and in place while the trainer exists.
    Trainer(const RunConfig& cfg, LoadedModel& lm, TrainCallbacks cb = {});
    ~Trainer();  // detaches the adapters from the model
    Trainer(const Trainer&) = delete;
    Trainer& operator=(const Trainer&) = delete;

    // The whole run: validation, steps up to total_steps with validations and checkpoints,
    // final validation and checkpoint. When TrainCallbacks::cancel is raised, the step under way
    // is dropped (the data position goes back to its start), the state after the last finished
    // step is saved as out_dir/step-NNNNNN and the summary says cancelled, naming that folder.
    TrainSummary run();

    // One optimizer step on the next global batch of the data iterator.
    TrainStepRecord step();
    // Gradients of the mean loss over these micro-batches (example indices into data()),
    // written into the trainable parameters' gradients (zeroed first); returns that loss.
    double compute_gradients(const std::vector<std::vector<int64_t>>& micro_batches, int64_t* tokens = nullptr);
    ValRecord validate();
    // Adapters or weights, optimizer and training state into `dir`; returns `dir`.
    std::string save_checkpoint(const std::string& dir);

    const TrainData& data() const { return data_; }
    Lora* lora() { return lora_.get(); }
    Optimizer& optimizer() { return *optimizer_; }
    std::vector<OptimizerParam>& params() { return params_; }
    const LrSchedule& schedule() const { return schedule_; }
    int64_t steps_taken() const { return step_; }
    int64_t total_steps() const { return total_steps_; }
    const std::vector<double>& losses() const { return losses_; }
    const TrainSummary& summary() const { return sum_; }

   private:
    void resume(const std::string& path);
    TrainSummary finish(double t0);
    bool cancel_requested() const { return cb_.cancel && cb_.cancel->load(std::memory_order_relaxed); }
    std::vector<std::vector<int64_t>> next_global_batch();
    ChunkPlan plan_for(int64_t T, uint64_t seed) const;
    KVCacheConfig cache_config() const;
    bool distributed() const { return comm_ != nullptr; }
    bool writes_files() const { return !comm_ || comm_->rank() == 0; }
    // Data parallelism: this rank computes micro-batch j of a step when true.
    bool is_local(size_t j) const { return !comm_ || int64_t(j) % comm_->size() == comm_->rank(); }
    // Every rank's weights and optimizer state equal rank 0's (throws DistError otherwise).
    void verify_replicas(const std::string& when);

    RunConfig cfg_;
    LoadedModel& lm_;
    TrainCallbacks cb_;
    TrainData data_;
    std::unique_ptr<Lora> lora_;
    ModelGrads grads_;                     // full modes
    Tensor class_w_, class_b_, dclass_w_, dclass_b_;  // seq_classification head
    std::vector<OptimizerParam> params_;
    std::unique_ptr<Optimizer> optimizer_;
    std::unique_ptr<BatchIterator> iterator_;  // over positions in data_.split.train
    LrSchedule schedule_;
    GradientOptions gopt_;
    int64_t accum_ = 1;
    int64_t total_steps_ = 0;
    int64_t step_ = 0;
    int64_t micro_batches_ = 0;
    std::vector<std::string> state_dirs_;  // this run's checkpoints holding a training state, oldest first
    std::vector<double> losses_;
    TrainSummary sum_;
    dist::Communicator* comm_ = nullptr;  // the process communicator, when installed
    std::unique_ptr<dist::GradSync> gsync_;
    double last_comm_seconds_ = 0;
};

// Convenience: Trainer(cfg, lm, cb).run().
TrainSummary run_train(const RunConfig& cfg, LoadedModel& lm, const TrainCallbacks& cb = {});

}  // namespace kv
