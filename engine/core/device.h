// Device names as users write them ("cpu", "cuda:N"): the one parser and the one printer.
#pragma once

#include <string>

#include "engine/core/error.h"
#include "kernels/common/tensor_view.h"

namespace kv {

// "cpu" or "cuda:N" (N = 0..99); throws Error "'<text>' is not a device; expected cpu or cuda:N"
// for anything else (callers prefix the option name).
inline Device parse_device(const std::string& text) {
    if (text == "cpu") return Device{};
    if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 7 &&
        text.find_first_not_of("0123456789", 5) == std::string::npos)
        return Device{DeviceType::CUDA, std::stoi(text.substr(5))};
    throw Error("'" + text + "' is not a device; expected cpu or cuda:N");
}

inline std::string device_name(Device d) { return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index); }

}  // namespace kv
