// Model checksum verification (see model_verify.h).
#include "engine/model/model_verify.h"

#include <openssl/evp.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "engine/core/error.h"

namespace kv {

std::string file_sha256(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw Error(str(path, ": cannot open to compute its SHA-256: ", std::strerror(errno)));
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, std::fclose);
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
        throw Error("SHA-256: OpenSSL could not start a digest");
    std::vector<unsigned char> buf(size_t(4) << 20);
    size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) EVP_DigestUpdate(ctx.get(), buf.data(), n);
    if (std::ferror(f)) throw Error(str(path, ": read error while computing its SHA-256"));
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx.get(), md, &len);
    std::string hex;
    char b[3];
    for (unsigned int i = 0; i < len; ++i) {
        std::snprintf(b, sizeof b, "%02x", md[i]);
        hex += b;
    }
    return hex;
}

void verify_model_checksum(const std::string& path) {
    const std::string sidecar = path + ".sha256";
    std::ifstream in(sidecar);
    if (!in)
        throw Error(str("--model.verify: ", sidecar, " is missing, so there is no checksum to verify ", path, " against"),
                    str("scripts/fetch_assets.sh writes it for the downloaded model; for another file run `sha256sum ",
                        path, " > ", sidecar, "` where the file is known to be good"));
    std::string want;
    in >> want;  // "HEX  NAME" (sha256sum) or just "HEX"
    for (char& c : want) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (want.size() != 64 || want.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw Error(str("--model.verify: ", sidecar, " does not start with a 64-digit hex SHA-256 (got '", want.substr(0, 80),
                        "')"));
    const std::string got = file_sha256(path);
    if (got != want)
        throw Error(str("--model.verify: ", path, " has SHA-256 ", got, " but ", sidecar, " says ", want,
                        "; the file is damaged or not the one the checksum was made for"),
                    "re-download the model (scripts/fetch_assets.sh) or re-copy it");
}

}  // namespace kv
