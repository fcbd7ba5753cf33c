#include "hf_hub_cache.h"

#include <sys/stat.h>

#include <cctype>
#include <cstdlib>
#include <fstream>

#include "engine/core/error.h"

namespace kv {

namespace {

bool is_directory(const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool hub_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : std::string();
}

// A commit hash as the hub writes it into refs/ (40 hex digits).
bool is_commit_hash(const std::string& s) {
    if (s.size() != 40) return false;
    for (char c : s)
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    return true;
}

}  // namespace

bool looks_like_hf_repo_id(const std::string& s) {
    const std::string id = s.substr(0, s.find('@'));
    const size_t slash = id.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == id.size() || id.find('/', slash + 1) != std::string::npos) return false;
    if (id[0] == '.' || id[0] == '~') return false;
    for (size_t i = 0; i < id.size(); ++i)
        if (i != slash && !hub_name_char(id[i])) return false;
    return true;
}

std::vector<std::string> hf_hub_cache_dirs() {
    std::vector<std::string> dirs;
    if (const std::string v = env("HF_HUB_CACHE"); !v.empty()) dirs.push_back(v);
    if (const std::string v = env("HF_HOME"); !v.empty()) dirs.push_back(v + "/hub");
    if (const std::string v = env("XDG_CACHE_HOME"); !v.empty()) dirs.push_back(v + "/huggingface/hub");
    if (const std::string v = env("HOME"); !v.empty()) dirs.push_back(v + "/.cache/huggingface/hub");
    return dirs;
}

std::string resolve_hf_repo_id(const std::string& spec) {
    if (!looks_like_hf_repo_id(spec))
        throw Error(str("'", spec, "' is not a Hugging Face repo id; expected org/name or org/name@revision"));
    const size_t at = spec.find('@');
    const std::string id = spec.substr(0, at);
    const std::string revision = at == std::string::npos ? "main" : spec.substr(at + 1);
    const std::string folder = "models--" + id.substr(0, id.find('/')) + "--" + id.substr(id.find('/') + 1);
    std::string looked;
    for (const std::string& cache : hf_hub_cache_dirs()) {
        const std::string repo = cache + "/" + folder;
        looked += "\n  " + repo;
        if (!is_directory(repo)) continue;
        // A revision is a ref (branch or tag: refs/<name> holds its commit) or a commit itself.
        std::string commit;
        if (std::ifstream ref(repo + "/refs/" + revision); ref && std::getline(ref, commit)) {
            while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
        } else if (is_commit_hash(revision)) {
            commit = revision;
        }
        if (commit.empty()) {
            looked += " (no refs/" + revision + ")";
            continue;
        }
        const std::string snapshot = repo + "/snapshots/" + commit;
        if (is_directory(snapshot)) return snapshot;
        looked += " (refs/" + revision + " names " + commit + ", which has no snapshots/ folder)";
    }
    throw Error(str("model '", spec, "': not in the local Hugging Face cache; kvlab looked in:", looked.empty() ? "\n  (no cache folder: HF_HUB_CACHE, HF_HOME and HOME are unset)" : looked),
                str("kvlab never downloads; fetch it with `hf download ", id, at == std::string::npos ? "" : " --revision " + revision,
                    "` (or `huggingface-cli download ", id, "`), or give the model's folder"));
}

}  // namespace kv
