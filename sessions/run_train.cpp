// Fine-tuning modes of a run (see run_train.h).
#include "run_train.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

#include "engine/core/error.h"
#include "engine/telemetry/run_phase.h"
#include "engine/telemetry/trace.h"
#include "engine/dist/communicator.h"
#include "engine/train/trainer.h"

namespace kv::sessions {


RunOutcome run_train_mode(const RunConfig& cfg, LoadedModel& lm, const RunHooks& hooks) {
    TrainCallbacks cb;
    cb.cancel = hooks.cancel;
    cb.progress = hooks.progress;
    cb.log = hooks.output;
    cb.on_step = [&](const TrainStepRecord& r) {
        trace::metric("loss", r.step, r.loss);
        trace::metric("lr", r.step, r.lr);
        trace::metric("grad_norm", r.step, r.grad_norm);
        trace::metric("tokens_per_s", r.step, r.tokens_per_s);
        if (cfg.dist.ranks > 1 || dist::process_communicator()) {
            trace::metric("allreduce_s", r.step, r.comm_seconds);
            if (r.seconds > 0) trace::metric("allreduce_share", r.step, r.comm_seconds / r.seconds);
        }
        if (hooks.output) {
            std::ostringstream line;
            line.precision(4);
            line << "step " << r.step << ": loss " << r.loss << " | lr " << r.lr << " | grad norm " << r.grad_norm << " | "
                 << r.tokens_per_s << " tokens/s";
            hooks.output(line.str());
        }
    };
    cb.on_validation = [&](const ValRecord& v) {
        if (v.examples == 0) return;
        trace::metric("val_loss", v.step, v.loss);
        if (v.accuracy >= 0) trace::metric("val_accuracy", v.step, v.accuracy);
        if (hooks.output) {
            std::ostringstream line;
            line.precision(4);
            line << "validation at step " << v.step << ": loss " << v.loss;
            if (v.accuracy >= 0) line << " | accuracy " << v.accuracy;
            line << " (" << v.examples << " examples)";
            hooks.output(line.str());
        }
    };
    TrainSummary s = run_train(cfg, lm, cb);
    PhaseScope finish(RunPhase::FINISH);  // the summary and text below

    nlohmann::json j;
    j["mode"] = cfg.mode;
    j["data"] = s.data_source;
    j["train_examples"] = s.train_examples;
    j["val_examples"] = s.val_examples;
    j["steps"] = s.steps.size();
    j["start_step"] = s.start_step;
    j["total_steps"] = s.total_steps;
    j["micro_batches_per_step"] = s.micro_steps_per_step;
    if (!s.steps.empty()) {
        j["first_loss"] = s.steps.front().loss;
        j["final_loss"] = s.steps.back().loss;
    }
    const ValRecord* first_val = nullptr;
    const ValRecord* last_val = nullptr;
    for (const auto& v : s.validations)
        if (v.examples > 0) {
            if (!first_val) first_val = &v;
            last_val = &v;
        }
    if (last_val) {
        j["initial_val_loss"] = first_val->loss;
        j["val_loss"] = last_val->loss;
        if (last_val->accuracy >= 0) j["accuracy"] = last_val->accuracy;
    }
    // What comparisons and run tables read as the run's loss: the final validation loss, else
    // the last training loss.
    if (last_val) j["mean_loss"] = last_val->loss;
    else if (!s.steps.empty()) j["mean_loss"] = s.steps.back().loss;
    j["tokens"] = s.tokens;
    j["seconds"] = s.seconds;
    j["tokens_per_s"] = s.tokens_per_s;
    j["trainable_parameters"] = s.trainable_parameters;
    j["weight_bytes"] = s.weight_bytes;
    j["trainable_bytes"] = s.trainable_bytes;
    j["gradient_bytes"] = s.gradient_bytes;
    j["optimizer_bytes"] = s.optimizer_bytes;
    j["checkpoints"] = s.checkpoints;
    j["resumable_checkpoints"] = s.resumable;
    if (s.cancelled) {
        j["cancelled"] = true;
        if (!s.resume_checkpoint.empty()) j["resume_checkpoint"] = s.resume_checkpoint;
    }
    if (!s.merged_model.empty()) j["merged_model"] = s.merged_model;
    if (s.offload) {
        // Weights, gradients and optimizer state are host memory in these modes; the bytes a
        // device build would copy per optimizer step (row-sized shards, offload_traffic.h).
        nlohmann::json o;
        o["placement"] = "host";
        o["h2d_bytes_per_step"] = s.offload_h2d_per_step;
        o["d2h_bytes_per_step"] = s.offload_d2h_per_step;
        o["largest_shard_bytes"] = s.offload_traffic.largest_shard_bytes;
        for (const auto& sh : s.offload_traffic.shards)
            o["shards"].push_back({{"name", sh.name}, {"weight_bytes", sh.weight_bytes}, {"trainable_bytes", sh.trainable_bytes}});
        j["offload"] = o;
    }
    if (s.qlora) {
        j["qlora"] = {{"tensors", s.qlora_stats.tensors},
                      {"dense_bytes", s.qlora_stats.dense_bytes},
                      {"nf4_bytes", s.qlora_stats.nf4_bytes},
                      {"max_abs_error", s.qlora_stats.max_abs_error}};
    }
    j["memory"] = memory_json(s.memory);
    double comm_share = -1;
    if (!s.dist_backend.empty()) {
        // Data parallelism: this is rank 0's record; the other ranks' timings come with it.
        nlohmann::json d;
        d["backend"] = s.dist_backend;
        d["ranks"] = s.ranks;
        d["allreduce_bytes_per_step"] = s.allreduce_bytes_per_step;
        d["allreduce_buckets"] = s.allreduce_buckets;
        d["allreduce_overlapped_buckets"] = s.allreduce_overlapped_buckets;  // started during the backward
        d["overlap"] = cfg.dist.overlap;
        d["rank_allreduce_seconds"] = s.rank_comm_seconds;
        d["rank_step_seconds"] = s.rank_step_seconds;
        d["replica_checks"] = s.replica_checks;
        double comm = 0, steps = 0;
        for (size_t r = 0; r < s.rank_comm_seconds.size() && r < s.rank_step_seconds.size(); ++r)
            comm += s.rank_comm_seconds[r], steps += s.rank_step_seconds[r];
        if (steps > 0) comm_share = comm / steps;
        d["allreduce_share"] = comm_share;  // of the step time, over all ranks
        j["dist"] = d;
    }
    if (last_val) trace::metric("final_val_loss", s.start_step + int64_t(s.steps.size()), last_val->loss);

    RunOutcome out;
    out.cancelled = s.cancelled;
    out.summary_json = j.dump();
    std::ostringstream text;
    text.precision(4);
    if (s.cancelled) text << "cancelled after step " << s.start_step + int64_t(s.steps.size()) << " of " << s.total_steps << " | ";
    text << s.steps.size() << " steps";
    if (s.start_step > 0) text << " (resumed at step " << s.start_step << ")";
    if (!s.steps.empty()) text << " | loss " << s.steps.front().loss << " -> " << s.steps.back().loss;
    if (last_val) {
        text << " | validation loss " << first_val->loss << " -> " << last_val->loss;
        if (last_val->accuracy >= 0) text << ", accuracy " << last_val->accuracy;
    }
    text << " | " << s.tokens_per_s << " tokens/s | " << s.trainable_parameters << " trainable parameters";
    if (!s.dist_backend.empty())
        text << " | " << s.ranks << " rank" << (s.ranks > 1 ? "s" : "") << " (" << s.dist_backend << "), all-reduce "
             << (comm_share >= 0 ? comm_share * 100 : 0.0) << "% of step time";
    if (s.offload)
        text << " | offload per step: " << format_bytes((long long)s.offload_h2d_per_step) << " host->device, "
             << format_bytes((long long)s.offload_d2h_per_step) << " device->host";
    if (s.cancelled) text << (s.resume_checkpoint.empty() ? " | nothing saved to resume from" : " | resume with --resume " + s.resume_checkpoint);
    else if (!s.checkpoints.empty()) text << " | saved " << s.checkpoints.back();
    if (!s.merged_model.empty()) text << " (merged model: " << s.merged_model << ")";
    out.text = text.str();
    return out;
}

}  // namespace kv::sessions
