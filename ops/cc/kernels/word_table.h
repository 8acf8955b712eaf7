// A tensor seen as a matrix of 32-bit words (no locking: see word_tables.h).

#ifndef TF_ECREC_OPS_CC_KERNELS_WORD_TABLE_H_
#define TF_ECREC_OPS_CC_KERNELS_WORD_TABLE_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace ec_rec {

// A variable seen as a matrix of 32-bit words: rows = dim 0 (1 for a
// scalar), `words` per row = elements of a row * sizeof(element) / 4.
struct WordTable {
  char* base = nullptr;
  int64_t rows = 0;
  int64_t words = 0;
};

inline WordTable WordsOf(Tensor* t) {
  WordTable table;
  const TensorShape& shape = t->shape();
  int64_t row_elements = 1;
  for (int d = 1; d < shape.dims(); ++d) row_elements *= shape.dim_size(d);
  table.rows = shape.dims() == 0 ? 1 : shape.dim_size(0);
  table.words = row_elements * static_cast<int64_t>(DataTypeSize(t->dtype())) /
                static_cast<int64_t>(sizeof(int32_t));
  table.base = const_cast<char*>(t->tensor_data().data());
  return table;
}

// Copies rows `row(0) .. row(count - 1)` of `tables` into `words`, an int32
// [count, width] matrix holding the tables' rows side by side (`width` = the
// tables' words per row summed).
template <typename RowOf>
void GatherRowWords(const std::vector<WordTable>& tables, int64_t count,
                    int64_t width, RowOf row, char* words) {
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(int32_t));
  int64_t offset = 0;
  for (const WordTable& table : tables) {
    const int64_t bytes = table.words * static_cast<int64_t>(sizeof(int32_t));
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(words + i * row_bytes + offset, table.base + row(i) * bytes,
                  bytes);
    }
    offset += bytes;
  }
}

// Writes `from`, one row of words of the tables side by side, into row `row`
// of the tables; with `add`, XORs it in instead.
inline void PutRowWords(const std::vector<WordTable>& tables, int64_t row,
                        const int32_t* from, bool add) {
  for (const WordTable& table : tables) {
    char* dst = table.base + row * table.words * sizeof(int32_t);
    if (add) {
      for (int64_t j = 0; j < table.words; ++j) {
        uint32_t word;
        std::memcpy(&word, dst + j * sizeof(uint32_t), sizeof(word));
        word ^= static_cast<uint32_t>(from[j]);
        std::memcpy(dst + j * sizeof(uint32_t), &word, sizeof(word));
      }
    } else {
      std::memcpy(dst, from, table.words * sizeof(int32_t));
    }
    from += table.words;
  }
}

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_WORD_TABLE_H_
