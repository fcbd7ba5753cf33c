// ggml block formats: the definitions moved to kernels/common/packed_blocks.h so the
// packed-weight kernels read blocks with the very same arithmetic as the loader.
#pragma once

#include "kernels/common/packed_blocks.h"
