// The headers most test files include, precompiled once per suite (tests/CMakeLists.txt,
// kvlab_test_suite): GoogleTest, the standard library's common headers and the shared helpers.
// Files still include what they use; this only saves parsing them again.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/support/test_support.h"
