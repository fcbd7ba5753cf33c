// --model.verify: a model file's SHA-256 recomputed and compared with its sidecar FILE.sha256
// (`sha256sum` format; scripts/fetch_assets.sh writes it from the wheel's RECORD). Catches bit
// rot and truncated copies that still parse: those only show as wrong numbers otherwise.
#pragma once

#include <string>

namespace kv {

// Lowercase hex SHA-256 of a file's bytes. Throws kv::Error naming the file when unreadable.
std::string file_sha256(const std::string& path);

// Throws kv::Error when FILE.sha256 is missing or unreadable, or disagrees with the file.
void verify_model_checksum(const std::string& path);

}  // namespace kv
