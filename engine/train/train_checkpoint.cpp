// Checkpoints of a training run (see train_checkpoint.h).
#include "train_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "engine/core/error.h"
#include "model_weights.h"
#if KVLAB_HAVE_MODELIO
#include "formats/io/file_util.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "formats/io/safetensors_write.h"
#endif

namespace kv {

namespace {

using Json = nlohmann::json;

[[noreturn, maybe_unused]] void no_modelio() { throw Error("this build has no safetensors support (formats/io was excluded); checkpoints cannot be written"); }

void make_dir(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error(str("cannot create checkpoint folder '", dir, "': ", ec.message()), "choose a writable --out_dir");
}

void write_json(const std::string& path, const Json& j) {
#if KVLAB_HAVE_MODELIO
    write_file_atomic(path, j.dump(2) + "\n");
#else
    (void)path, (void)j;
    no_modelio();
#endif
}

}  // namespace

std::string checkpoint_dir_name(const std::string& out_dir, int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%06lld", (long long)step);
    return (std::filesystem::path(out_dir) / buf).string();
}

std::vector<std::string> peft_target_modules(const std::vector<std::string>& targets) {
    std::vector<std::string> m;
    for (const auto& t : targets) {
        if (t == "q") m.push_back("q_proj");
        else if (t == "k") m.push_back("k_proj");
        else if (t == "v") m.push_back("v_proj");
        else if (t == "proj") m.push_back("o_proj");
        else if (t == "mlp") m.insert(m.end(), {"gate_proj", "up_proj", "down_proj"});
        else if (t == "head") m.push_back("lm_head");
    }
    return m;
}

void save_tensors(const std::string& path, const TensorMap& tensors) {
#if KVLAB_HAVE_MODELIO
    write_safetensors(path, tensors);
#else
    (void)path, (void)tensors;
    no_modelio();
#endif
}

TensorMap load_tensors(const std::string& path) {
#if KVLAB_HAVE_MODELIO
    return load_safetensors(path).tensors;
#else
    (void)path;
    no_modelio();
#endif
}

void save_lora_adapter(const std::string& dir, const Lora& lora, const std::string& base_model) {
    make_dir(dir);
    save_tensors((std::filesystem::path(dir) / "adapter_model.safetensors").string(), lora.state_dict());
    const LoraConfig& c = lora.config();
    Json j;
    j["peft_type"] = "LORA";
    j["task_type"] = "CAUSAL_LM";
    j["base_model_name_or_path"] = base_model;
    j["r"] = c.r;
    j["lora_alpha"] = c.alpha;
    j["lora_dropout"] = c.dropout;
    // the targets' usual names, then any module an adapter sits on under another name (a short
    // convolution's in_proj / out_proj, latent attention's projections): PEFT matches on them
    std::vector<std::string> modules = peft_target_modules(c.targets);
    for (const LoraAdapter& a : lora.adapters()) {
        const std::string leaf = a.module.substr(a.module.rfind('.') + 1);  // npos + 1 = 0: "lm_head"
        if (std::find(modules.begin(), modules.end(), leaf) == modules.end()) modules.push_back(leaf);
    }
    j["target_modules"] = modules;
    j["bias"] = "none";
    j["fan_in_fan_out"] = false;
    j["inference_mode"] = true;
    write_json((std::filesystem::path(dir) / "adapter_config.json").string(), j);
}

void save_full_weights(const std::string& dir, const Transformer& model) {
    make_dir(dir);
#if KVLAB_HAVE_MODELIO
    write_hf_model_folder(dir, model.config(), model_state_dict(model));
#else
    (void)model;
    no_modelio();
#endif
}

void save_merged_model(const std::string& dir, const Transformer& model, const Lora& lora) {
    TensorMap merged = merged_lora_state_dict(model, lora);
    make_dir(dir);
#if KVLAB_HAVE_MODELIO
    write_hf_model_folder(dir, model.config(), merged);
#else
    no_modelio();
#endif
}

void save_training_state(const std::string& dir, const TrainingState& st, const TensorMap& optimizer_state) {
    make_dir(dir);
    // The optimizer state first: a folder whose training_state.json exists is complete.
    save_tensors((std::filesystem::path(dir) / "optimizer.safetensors").string(), optimizer_state);
    Json j;
    j["format"] = "kvlab-training-state";
    j["version"] = 1;
    j["step"] = st.step;
    j["total_steps"] = st.total_steps;
    j["micro_batches"] = st.micro_batches;
    j["schedule"] = {{"peak_lr", st.schedule.peak}, {"warmup_steps", st.schedule.warmup}, {"total_steps", st.schedule.total}};
    j["mode"] = st.mode;
    j["optimizer"] = st.optimizer;
    j["optimizer_steps"] = st.optimizer_steps;
    j["split"] = st.split;
    j["batch_iterator"] = st.batch_iterator;
    j["run_config"] = st.run_config;
    j["losses"] = st.losses;
    write_json((std::filesystem::path(dir) / "training_state.json").string(), j);
}

void remove_training_state(const std::string& dir) {
    namespace fs = std::filesystem;
    for (const char* f : {"training_state.json", "optimizer.safetensors"}) {
        std::error_code ec;
        fs::remove(fs::path(dir) / f, ec);
        if (ec) throw Error(str("cannot delete the old training state '", (fs::path(dir) / f).string(), "': ", ec.message()));
    }
}

TrainingState load_training_state(const std::string& path, TensorMap* optimizer_state, std::string* dir_out) {
    namespace fs = std::filesystem;
    std::string dir = path, file = path;
    if (fs::is_directory(path)) file = (fs::path(path) / "training_state.json").string();
    else dir = fs::path(path).parent_path().string();
    if (!fs::is_regular_file(file))
        throw Error(str("--resume: '", file, "' does not exist; expected a checkpoint folder (out_dir/step-NNNNNN) with training_state.json"));
    Json j;
    try {
#if KVLAB_HAVE_MODELIO
        j = Json::parse(read_text_file(file, "training state"));
#else
        no_modelio();
#endif
    } catch (const Json::exception& e) {
        throw Error(str(file, ": not valid JSON (", e.what(), ")"));
    }
    if (!j.is_object() || j.value("format", std::string()) != "kvlab-training-state")
        throw Error(str(file, ": not a kvlab training state (expected \"format\": \"kvlab-training-state\")"));
    if (j.value("version", 0) != 1) throw Error(str(file, ": training state version ", j.value("version", 0), "; this build reads version 1"));
    TrainingState st;
    try {
        st.step = j.at("step").get<int64_t>();
        st.total_steps = j.at("total_steps").get<int64_t>();
        st.micro_batches = j.at("micro_batches").get<int64_t>();
        st.schedule.peak = j.at("schedule").at("peak_lr").get<double>();
        st.schedule.warmup = j.at("schedule").at("warmup_steps").get<int64_t>();
        st.schedule.total = j.at("schedule").at("total_steps").get<int64_t>();
        st.mode = j.at("mode").get<std::string>();
        st.optimizer = j.at("optimizer").get<std::string>();
        st.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
        st.split = j.at("split");
        st.batch_iterator = j.at("batch_iterator");
        st.run_config = j.at("run_config");
        st.losses = j.at("losses").get<std::vector<double>>();
    } catch (const Json::exception& e) {
        throw Error(str(file, ": a field is missing or has the wrong type (", e.what(), ")"));
    }
    if (optimizer_state) {
        const std::string opt = (fs::path(dir) / "optimizer.safetensors").string();
        if (!fs::is_regular_file(opt)) throw Error(str("--resume: '", opt, "' is missing; the checkpoint is incomplete"));
        *optimizer_state = load_tensors(opt);
    }
    if (dir_out) *dir_out = dir;
    return st;
}

}  // namespace kv
