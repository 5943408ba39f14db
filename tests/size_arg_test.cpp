// examples/size_arg.hpp: the size parser every example and benchmark uses. Suffixes are powers of 1024, and junk is
// an error naming the text, never a silent prefix ("64K" was read as 64 by strtoull before).
#include "examples/size_arg.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using example::parseSize;

TEST(SizeArg, SuffixesArePowersOf1024) {
  EXPECT_EQ(parseSize("0"), 0u);
  EXPECT_EQ(parseSize("4096"), 4096u);
  EXPECT_EQ(parseSize("64K"), 65536u);
  EXPECT_EQ(parseSize("64k"), 65536u);
  EXPECT_EQ(parseSize("64KiB"), 65536u);
  EXPECT_EQ(parseSize("4M"), uint64_t{4} << 20);
  EXPECT_EQ(parseSize("256MiB"), uint64_t{256} << 20);
  EXPECT_EQ(parseSize("1G"), uint64_t{1} << 30);
  EXPECT_EQ(parseSize("18446744073709551615"), ~uint64_t{0});
}

TEST(SizeArg, JunkIsRefusedNamingTheText) {
  for (const std::string junk : {"", "K", "-5", "+5", " 5", "5 ", "0x10", "64KB", "64Kx", "4T", "1.5M", "abc",
                                 "18446744073709551616", "17179869184G"}) {
    try {
      parseSize(junk);
      ADD_FAILURE() << "'" << junk << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + junk + "' is not a size"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
