// Loops over rows of 32-bit words (int32, or the bits of float32).
//
// The build's -O2 lets GCC vectorize only loops whose trip count it knows, so
// rows are walked in blocks of a fixed kBlock words, which it turns into one
// 256-bit AVX operation each, and then a scalar tail. The words are moved by
// bits only; no floating-point arithmetic happens here.

#ifndef TF_ECREC_OPS_CC_KERNELS_WORD_LOOPS_H_
#define TF_ECREC_OPS_CC_KERNELS_WORD_LOOPS_H_

#include <cstdint>
#include <cstring>

namespace tensorflow {
namespace ec_rec {

constexpr int64_t kBlock = 8;

// The bits of a 32-bit value (memcpy: no aliasing of float by int32).
template <typename T>
inline int32_t WordBits(T value) {
  static_assert(sizeof(T) == sizeof(int32_t), "32-bit words only");
  int32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// dst[j] = bits(src[j]) for j < n.
template <typename T>
inline void CopyWords(const T* __restrict__ src, int32_t* __restrict__ dst,
                      int64_t n) {
  int64_t j = 0;
  for (; j + kBlock <= n; j += kBlock) {
    for (int64_t k = 0; k < kBlock; ++k) dst[j + k] = WordBits(src[j + k]);
  }
  for (; j < n; ++j) dst[j] = WordBits(src[j]);
}

// dst[j] ^= bits(src[j]) for j < n.
template <typename T>
inline void XorWords(const T* __restrict__ src, int32_t* __restrict__ dst,
                     int64_t n) {
  int64_t j = 0;
  for (; j + kBlock <= n; j += kBlock) {
    for (int64_t k = 0; k < kBlock; ++k) dst[j + k] ^= WordBits(src[j + k]);
  }
  for (; j < n; ++j) dst[j] ^= WordBits(src[j]);
}

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_WORD_LOOPS_H_
