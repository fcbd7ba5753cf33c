// kv::split (engine/core/split.h): every piece between separators, empty ones kept, so list
// options can name an empty item ("1,,2") in their messages.
#include <gtest/gtest.h>

#include "engine/core/split.h"

namespace kv::test {
namespace {

using V = std::vector<std::string>;

TEST(Split, KeepsEveryPieceBetweenSeparators) {
    EXPECT_EQ(split("h2o,lastrec"), (V{"h2o", "lastrec"}));
    EXPECT_EQ(split("one"), (V{"one"}));
    EXPECT_EQ(split(""), (V{""}));
    EXPECT_EQ(split("a,,b"), (V{"a", "", "b"}));
    EXPECT_EQ(split(",a,"), (V{"", "a", ""}));
    EXPECT_EQ(split("a;b,c", ';'), (V{"a", "b,c"}));
}

}  // namespace
}  // namespace kv::test
