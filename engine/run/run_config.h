// A run's full configuration: every option of every mode, with keys_values' dotted names
// (kv_cache.name, grad.layers_per_cell, train.micro_batch_size, ...). One option table drives
// the CLI flags, the JSON stored with each run (which re-runs the same run), the GUI's run
// form (defaults, tooltips, choices) and validation messages, so they can never disagree.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/core/model_config.h"
#include "engine/kv/kv_config.h"
#include "protocol.h"

namespace kv {

struct DataConfig {
    std::string name = "passkey";   // passkey | recall | needle | repeat | RULER (engine/data/ruler.h) | text | longbench | helmet
    int64_t seq_length = 2048;      // tokens per sample (synthetic tasks, text windows)
    int64_t num_samples = 4;        // samples (or text windows) to evaluate
    uint64_t seed = 1234;
    std::vector<double> depths;     // needle, passkey, RULER one-needle tasks: insertion depths in [0, 1] (empty: 0.5; RULER: random)
    int64_t num_keys = 16;          // recall: key-value pairs in the context
    int64_t ruler_keys = 4;         // RULER: keys (multikey), values (multivalue), chain length (vt), common words (cwe)
    int64_t questions = 1;          // RULER: questions asked of each context (compress-then-ask; ruler_multi_question_tasks())
    std::string turns = "multi-request";  // how those questions are asked (protocol.h: multi-request | multi-turn)
    int64_t repeat_length = 64;     // repeat: tokens of the passage (each copy)
    int64_t repeat_distance = -1;   // repeat: filler tokens between the copies (-1: the rest of seq_length)
    std::vector<std::string> files; // text: input files
    std::string path;               // longbench / helmet: JSON file
    std::string dataset_key;        // helmet task name
    int64_t max_seq_length = 100000;  // longbench / helmet: keep records up to this length
    double val_split_fraction = 0.1;
    std::string metadata_dir;       // longbench / helmet metadata cache (default: next to the file)
};

struct DriverConfig {
    int64_t chunk_size = 16;        // keys_values default (scripts use 1024)
    bool randomize_chunk_sizes = false;
    int64_t prefill_length = 0;     // tokens of the first chunk (0: the smallest cache length)
    int64_t micro_batch_size = 1;
};

struct GradConfig {
    int64_t layers_per_cell = 1;
    double chunks_per_cell_multiplier = 1.0;
    std::string layercp_qname = "default";  // layer-input checkpoints: default | q8 | q4
    std::string cachecp_qname = "";         // KV checkpoints ("" = layercp_qname)
    bool single_tokens_for_targets = false;
};

struct TrainConfig {
    std::string head_model = "next_token_prediction";  // | seq_classification_on_logits | seq_classification
    std::string optimizer = "AdamW";  // Adam, AdamW, Adamax, SGD, RMSprop, Adadelta
    double lr = 5e-4;
    double weight_decay = 0.0;
    double momentum = 0.0;
    double dampening = 0.0;
    double adam_beta1 = 0.9, adam_beta2 = 0.999, eps = 1e-8;
    double rmsprop_alpha = 0.99, adadelta_rho = 0.9;
    double lr_warmup_fraction = 0.15;
    int64_t lr_warmup_steps = -1;
    double max_grad_norm = 1.0;
    int64_t micro_batch_size = 2;
    int64_t global_batch_size = 2;
    int64_t epochs = 5;
    int64_t max_steps = 0;          // 0: epochs * batches
    int64_t save_interval = 50;
    int64_t training_state_num = 3;  // checkpoints that keep their resumable state (0: all)
    int64_t eval_interval = 0;      // 0: only at the end
    std::string out_dir;
    std::string resume;             // path of a saved training state
    bool average_loss_per_batch = true;  // token mean over the micro-batch (false: per-row means, averaged)
    // LoRA (script defaults of keys_values' long_lora: r 8, alpha 16, q and v)
    int64_t lora_r = 8;
    double lora_alpha = 16.0;
    double lora_dropout = 0.0;
    std::string lora_targets = "q,v";  // any of q,k,v,proj,mlp,head
    bool qlora = false;                // NF4-quantized frozen base weights
};

struct GenerateConfig {
    std::string prompt;
    int64_t max_new_tokens = 50;
    double temperature = 0.8;
    int64_t top_k = 50;
    double top_p = 1.0;
    int64_t beam_width = 1;
    double length_penalty = 1.0;
    uint64_t seed = 42;
    std::vector<std::string> stop;   // stop strings
    bool chat = false;               // wrap the prompt in the tokenizer's chat template
    bool ignore_eos = false;         // keep generating past end-of-sequence (fixed-length benchmarks)
};

// Data parallelism (engine/dist, docs/DISTRIBUTED.md): the training step's micro-batches split
// over ranks, gradients summed by a bucketed all-reduce.
struct DistConfig {
    std::string backend = "auto";  // auto (mpi under mpirun, else none) | none | mpi | nccl
    int64_t ranks = 1;             // set by the launcher (the communicator's size); recorded with the run
    double timeout = 300;          // seconds a collective waits before naming the missing ranks
    int64_t check_interval = 10;   // steps between replica checksums (0: only at the end)
    int64_t bucket_mb = 25;        // all-reduce bucket size (MiB), as PyTorch DDP's default
    bool overlap = true;           // start a bucket's all-reduce during the backward once its layers are done
};

struct TelemetryConfig {
    bool enabled = true;
    int64_t score_interval = 0;      // 0: every chunk for tiny models, every 8th otherwise
    bool cupti = true;
    // What a run does when its events cannot be written (disk full, I/O error): "stop" ends it
    // (status failed), "continue" carries on without telemetry (status degraded).
    std::string on_error = "stop";
};

struct RunConfig {
    std::string mode = "eval_long";  // eval_long | infer | generate | finetune_long_lora | ...
    std::string model = "tiny";      // preset name or model folder / GGUF file
    std::string name;                // run name in the session (default: derived)
    std::string dtype = "f32";       // f32 | bf16
    std::string rope = "yarn";       // yarn | plain | hf
    uint64_t model_seed = 0;         // preset weights
    bool model_verify = false;       // check the model file against FILE.sha256 before loading
    std::string model_weights = "packed";  // GGUF weights: packed | f32 | bf16 (ModelOptions::weights)
    std::string mla_cache = "auto";  // latent-attention models' cache: auto | latent | expanded (mla_cache_choice)
    int64_t threads = 0;
    std::string device = "cpu";
    std::string memory_budget;       // e.g. 8GiB ("" = none)
    bool fidelity = false;           // eval: per-(layer, chunk) fidelity against full attention (engine/driver/fidelity.h)
    int64_t fidelity_kl_positions = 0;  // fidelity: positions per chunk of the next-token KL (0: every position)
    bool fidelity_oracle = true;        // fidelity: also the oracle's kept mass and the policy's efficiency against it
    ProtocolConfig protocol;          // eval: how a sample meets the cache (protocol.h)
    DataConfig data;
    KVCacheConfig kv_cache;
    DriverConfig driver;
    GradConfig grad;
    TrainConfig train;
    GenerateConfig generate;
    TelemetryConfig telemetry;
    DistConfig dist;
};

enum class OptionType { INT, FLOAT, BOOL, STRING, LIST };

struct OptionDef {
    std::string name;     // dotted, as on the command line without "--"
    OptionType type;
    std::string group;    // model, data, mode, cache, gradient, training, generation, telemetry
    std::string help;     // one line (GUI tooltip)
    std::vector<std::string> choices;  // allowed values ("" list = free)
    std::function<void(RunConfig&, const std::string&)> set;  // throws kv::Error naming the option
    std::function<std::string(const RunConfig&)> get;
};

// Every option, in display order.
const std::vector<OptionDef>& run_options();
const OptionDef* find_run_option(const std::string& name);

// Set one option from text; throws kv::Error "--name: 'value' ...; expected ...".
void set_run_option(RunConfig& cfg, const std::string& name, const std::string& value);

// JSON (nested by dots) round trip; from_json throws kv::Error naming the bad field.
std::string run_config_to_json(const RunConfig& cfg, bool pretty = true);
RunConfig run_config_from_json(const std::string& json, const std::string& source);

// Cross-field checks (cache vs chunk sizes, modes, ...): one message per problem; the first
// is thrown. Model-dependent checks happen when the run starts.
void validate_run_config(const RunConfig& cfg);
std::vector<std::string> run_config_problems(const RunConfig& cfg);

const std::vector<std::string>& run_modes();

// The cache form of a latent-attention model for this run (--model.mla_cache, ModelOptions::
// mla_cache): auto is the latent cache, except in training modes, whose gradients run through
// the expanded form; latent in a training mode is refused (kv::Error naming the option).
LatentAttention::Cache mla_cache_choice(const RunConfig& cfg);

}  // namespace kv
