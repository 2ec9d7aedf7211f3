// The model table (teraio/models.h, data/models.json): the compiled-in copy is the file, every
// consumer name resolves, one old name may mean different shapes for different consumers, and the
// shapes teraio synth traced before the table are unchanged.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "teraio/error.h"
#include "teraio/models.h"
#include "teraio/synth.h"

namespace teraio {
namespace {

TEST(ModelTable, CompiledInCopyIsTheFile) {
  std::ifstream in(TERAIO_SOURCE_DIR "/data/models.json");
  ASSERT_TRUE(in.good());
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(model_table_json(), file) << "rebuild: CMake embeds data/models.json at configure time";
}

TEST(ModelTable, EveryConsumerNameMeansOneEntry) {
  for (const char* consumer : {"synth", "train", "bench"}) {
    ASSERT_FALSE(model_names(consumer).empty()) << consumer;
    for (const auto& [name, canonical] : model_names(consumer)) {
      EXPECT_EQ(find_model(consumer, name).name, canonical) << consumer << " " << name;
      EXPECT_EQ(find_model(consumer, canonical).name, canonical) << consumer << " " << canonical;
    }
  }
  // The clash the table resolves: llama-1b is Llama 3.2 1B for synth and train, and the bench's
  // 32,000-token shape for bench.
  EXPECT_EQ(find_model("synth", "llama-1b").vocab, 128256u);
  EXPECT_EQ(find_model("train", "llama-1b").name, "llama3.2-1b");
  EXPECT_EQ(find_model("bench", "llama-1b").name, "llama-1b-v32k");
  EXPECT_EQ(find_model("bench", "llama-1b").vocab, 32000u);
  EXPECT_EQ(find_model("bench", "llama-3b").layers, 26u);
  EXPECT_EQ(find_model("train", "llama-3b").layers, 28u);
  // One 8B entry for all three.
  EXPECT_EQ(&find_model("synth", "llama3-8b"), &find_model("train", "llama-8b"));
  EXPECT_EQ(&find_model("bench", "llama-8b"), &find_model("train", "llama-8b"));
}

TEST(ModelTable, UnknownNamesListTheKnownOnes) {
  try {
    find_model("synth", "llama-small");  // a bench model
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--model \"llama-small\": unknown model (known: tiny (synth-tiny), llama-1b "
              "(llama3.2-1b), llama-3b (llama3.2-3b), llama3-8b (llama3.1-8b), llama3-70b "
              "(llama3.1-70b))");
  }
  EXPECT_THROW(model_names("nobody"), Error);
}

// teraio synth's table before data/models.json: name, layers, d_model, heads, kv heads, ffn,
// vocab, tied, default batch, seq, micro-batches.
TEST(ModelTable, SynthShapesAreTheOnesTracedBefore) {
  struct Old {
    const char* name;
    uint32_t layers, d, heads, kv, ffn, vocab;
    bool tied;
    uint32_t batch, seq, micro;
  };
  const Old old[] = {
      {"tiny", 2, 64, 4, 2, 128, 256, false, 2, 32, 2},
      {"llama-1b", 16, 2048, 32, 8, 8192, 128256, true, 8, 4096, 8},
      {"llama-3b", 28, 3072, 24, 8, 8192, 128256, true, 8, 4096, 8},
      {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, false, 13, 4096, 13},
      {"llama3-70b", 80, 8192, 64, 8, 28672, 128256, false, 27, 2048, 27},
  };
  ASSERT_EQ(synth_models().size(), std::size(old));
  for (size_t i = 0; i < std::size(old); ++i) {
    const Old& o = old[i];
    EXPECT_EQ(synth_models()[i], o.name);
    for (const std::string& name : {std::string(o.name), model_shape(o.name).canonical}) {
      const ModelShape s = model_shape(name);
      EXPECT_EQ(s.name, name);
      EXPECT_EQ(s.layers, o.layers) << name;
      EXPECT_EQ(s.d_model, o.d) << name;
      EXPECT_EQ(s.heads, o.heads) << name;
      EXPECT_EQ(s.kv_heads, o.kv) << name;
      EXPECT_EQ(s.ffn, o.ffn) << name;
      EXPECT_EQ(s.vocab, o.vocab) << name;
      EXPECT_EQ(s.tied_embeddings, o.tied) << name;
      EXPECT_EQ(s.default_batch, o.batch) << name;
      EXPECT_EQ(s.default_seq, o.seq) << name;
      EXPECT_EQ(s.default_micro_batches, o.micro) << name;
    }
  }
}

}  // namespace
}  // namespace teraio
