// Which row formats the quantized buffer attends over directly (fp8_e4m3, fp8_e5m2, nvfp4,
// mxfp4, turboquant's TQK/TQV): their rows are read by SDPA_QROWS (ops::sdpa_qrows_, kernels
// in kernels/cpu/sdpa_qrows.cpp), which decodes the codes as it reads them, so a decode step
// reads the codes once and no f32 copy of the cache exists.
#pragma once

#include "kernels/common/qrows_op.h"

namespace kv {

inline bool quant_attention_format(QuantFormat f) { return qrows_format(f); }

}  // namespace kv
