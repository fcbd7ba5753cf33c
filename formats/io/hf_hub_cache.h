// Hugging Face repo ids ("Qwen/Qwen3-0.6B") resolved from the local hub cache, as the hub
// client writes it: <cache>/models--<org>--<name>/refs/<revision> holds a commit hash and
// snapshots/<hash>/ holds the files (links into blobs/). Nothing is downloaded: an id that is
// not cached is an error saying where kvlab looked and how to fetch it.
#pragma once

#include <string>
#include <vector>

namespace kv {

// "org/name" or "org/name@revision" (a branch, tag or commit hash): the shape of a hub id
// rather than a path (no leading '/', '.' or '~', one '/', hub-legal characters).
bool looks_like_hf_repo_id(const std::string& s);

// The hub cache folders searched, in order: $HF_HUB_CACHE, $HF_HOME/hub,
// $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub (unset variables skipped).
std::vector<std::string> hf_hub_cache_dirs();

// The snapshot folder of `id` at its revision (default "main"), the first cache that holds it.
// Throws kv::Error naming the id, every folder looked in, and the command that fetches it.
std::string resolve_hf_repo_id(const std::string& id);

}  // namespace kv
