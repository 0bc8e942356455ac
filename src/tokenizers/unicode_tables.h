// Unicode data tables generated from Python's unicodedata (see tools/gen_unicode_tables.py), so that
// kiln's NFC and lowercasing give exactly what the Python reference tokenizer gives.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln::tokenizers::tables {

// Code points first, first + stride, ..., last lowercase to cp + delta (simple mappings only;
// U+0130 and U+03A3 are handled in code).
struct LowerRun {
  uint32_t first, last;
  uint8_t stride;
  int32_t delta;
};
// Canonical combining class of [first, last] (ranges absent from the table have class 0).
struct CccRange {
  uint32_t first, last;
  uint8_t ccc;
};
// One level of canonical decomposition: cp -> first (+ second, 0 for singletons). `composes`
// marks primary composites, the pairs NFC recomposes. Hangul syllables are algorithmic.
struct Decomposition {
  uint32_t cp, first, second;
  uint8_t composes;
};

// Sorted by code point.
extern const LowerRun kLowerRuns[];
extern const size_t kLowerRuns_size;
extern const CccRange kCombiningClasses[];
extern const size_t kCombiningClasses_size;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositions_size;

}  // namespace kiln::tokenizers::tables
