#include "server/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/prng.h"

namespace kvrelay::server {
namespace {

using engine::Token;

TEST(TokenizerTest, WordsMapToFnvModVocab) {
  // FNV-1a-64("hello") % 31999 + 1 = 29604, ("world") → 19681.
  EXPECT_EQ(Tokenize("hello world", 32000), (std::vector<Token>{29604, 19681}));
  EXPECT_EQ(Tokenize("a", 32000),
            (std::vector<Token>{static_cast<Token>(0xaf63dc4c8601ec8cull % 31999 + 1)}));
}

TEST(TokenizerTest, SplitsOnAllAsciiWhitespace) {
  const std::vector<Token> want = Tokenize("hello world", 32000);
  EXPECT_EQ(Tokenize("  hello\t\n\v\f\rworld  ", 32000), want);
  EXPECT_EQ(Tokenize("\nhello world\n", 32000), want);
  // Non-ASCII bytes (here UTF-8 no-break space) are part of a word.
  EXPECT_EQ(Tokenize("hello\xc2\xa0world", 32000).size(), 1u);
}

TEST(TokenizerTest, EmptyAndBlankGiveNoTokens) {
  EXPECT_TRUE(Tokenize("", 32000).empty());
  EXPECT_TRUE(Tokenize(" \t\r\n", 32000).empty());
}

TEST(TokenizerTest, SameWordSameToken) {
  const std::vector<Token> t = Tokenize("x y x y x", 32000);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0], t[2]);
  EXPECT_EQ(t[0], t[4]);
  EXPECT_EQ(t[1], t[3]);
  EXPECT_NE(t[0], t[1]);
}

TEST(TokenizerTest, NeverZeroAndInVocab) {
  Prng rng(7);
  for (uint32_t vocab : {2u, 3u, 10u, 32000u, 128256u}) {
    for (int i = 0; i < 2000; ++i) {
      std::string word;
      const int len = static_cast<int>(rng.Range(1, 12));
      for (int k = 0; k < len; ++k) word += static_cast<char>(rng.Range('!', '~'));
      const std::vector<Token> t = Tokenize(word, vocab);
      ASSERT_EQ(t.size(), 1u) << word;
      EXPECT_GE(t[0], 1u);
      EXPECT_LT(t[0], vocab);
    }
  }
  // vocab 2: the only id is 1.
  EXPECT_EQ(Tokenize("a b c", 2), (std::vector<Token>{1, 1, 1}));
}

TEST(TokenizerTest, VocabBelowTwoIsABug) {
  EXPECT_DEATH((void)Tokenize("a", 1), "vocab");
}

TEST(TokenizerTest, Detokenize) {
  EXPECT_EQ(Detokenize(std::vector<Token>{}), "");
  EXPECT_EQ(Detokenize(std::vector<Token>{17, 4}), " t17 t4");
  EXPECT_EQ(Detokenize(std::vector<Token>{0, 4294967295u}), " t0 t4294967295");
}

TEST(TokenizerTest, DetokenizedTextRetokenizesStably) {
  // Not an inverse, but deterministic: the rendered words tokenize the same
  // way every time, and one word per token.
  const std::vector<Token> t{17, 4, 17};
  const std::vector<Token> again = Tokenize(Detokenize(t), 32000);
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(again[0], again[2]);
  EXPECT_EQ(again, Tokenize(" t17 t4 t17", 32000));
}

}  // namespace
}  // namespace kvrelay::server
