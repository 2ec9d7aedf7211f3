// Synth options shared by the tests of steps in backward (synth_test.cpp, transform_test.cpp): a
// `layers`-layer shape of `model` with one micro-batch of 16 tokens, gradients set to none.
#pragma once

#include "teraio/synth.h"

namespace teraio {

inline SynthOptions one_micro_batch(const char* model, bool foreach, SynthDtype dtype,
                                    uint32_t layers = 2) {
  SynthOptions o;
  o.model = model;
  o.layers = layers;
  o.batch = 1;
  o.seq = 16;
  o.micro_batches = 1;
  o.foreach = foreach;
  o.dtype = dtype;
  o.persistent_gradients = false;
  return o;
}

}  // namespace teraio
