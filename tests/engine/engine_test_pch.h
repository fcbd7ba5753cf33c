// The engine suite's precompiled header (tests/CMakeLists.txt, kvlab_test_suite): the common
// test headers and the model and cache headers a third of its files include.
#pragma once

#include "tests/support/test_pch.h"

#include "engine/kv/kv_cache.h"
#include "engine/model/transformer.h"
