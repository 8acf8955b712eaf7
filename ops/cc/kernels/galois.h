// Binary-field arithmetic for parity updates.
//
// Two fields, each the one of a pyeclib backend, so that parity written by
// the ops can be checked and decoded with pyeclib and with tf_ecrec.erasure.codec:
//
//   GF(2^16), polynomial x^16 + x^12 + x^3 + x + 1 (0x1100B), generator 2:
//     liberasurecode_rs_vand (the code of tf_ecrec.erasure.codec);
//   GF(2^8), polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11D), generator 2:
//     isa_l_rs_vand / isa_l_rs_cauchy.
//
// An int32 word holds two 16-bit symbols or four 8-bit symbols: its
// little-endian bytes b0..b3 make the symbols b0 | b1 << 8 and b2 | b3 << 8
// (or b0, b1, b2, b3). The scaler works on the word's value, so this holds
// on any host.

#ifndef TF_ECREC_OPS_CC_KERNELS_GALOIS_H_
#define TF_ECREC_OPS_CC_KERNELS_GALOIS_H_

#include <array>
#include <cstdint>

#ifdef __SSSE3__
#include <tmmintrin.h>
#endif

namespace tensorflow {
namespace ec_rec {
namespace galois {

constexpr uint32_t kPolynomial16 = 0x1100B;
constexpr uint32_t kPolynomial8 = 0x11D;

constexpr uint32_t Polynomial(int bits) {
  return bits == 16 ? kPolynomial16 : kPolynomial8;
}

// Carry-less shift-and-add product of two field elements, reduced modulo
// the field's polynomial.
constexpr uint32_t Multiply(uint32_t a, uint32_t b, int bits) {
  const uint32_t top = 1u << bits;
  const uint32_t polynomial = Polynomial(bits);
  uint32_t product = 0;
  while (b != 0) {
    if (b & 1u) product ^= a;
    b >>= 1;
    a <<= 1;
    if (a & top) a ^= polynomial;
  }
  return product;
}

static_assert(Multiply(2, 0x80, 8) == 0x1D, "x * x^7 reduces by 0x11D");
static_assert(Multiply(2, 0x8000, 16) == 0x100B, "x * x^15 reduces by 0x1100B");
static_assert(Multiply(0xBEEF, 1, 16) == 0xBEEF, "1 is the identity");

// Multiplies every symbol of a 32-bit word by a fixed coefficient with two
// 256-entry tables (1 KB): multiplication distributes over XOR, so
// coef * (lo | hi << 8) == low[lo] ^ high[hi] for a 16-bit symbol.
//
// XorScaled does the same to whole rows, 32 bytes at a time with SSSE3
// `pshufb` on 4-bit split tables: coef * s is the XOR of coef * (nibble k of
// s, in place) over the symbol's nibbles, and each of those products is one
// 16-entry byte lookup per byte of the product. That is a few instructions
// per 16 symbols where the word tables need four loads per word; the word
// tables remain for a row's last words (and for hosts without SSSE3).
class WordScaler {
 public:
  WordScaler(int bits, uint32_t coef) : bits_(bits) {
    for (uint32_t b = 0; b < 256; ++b) {
      low_[b] = static_cast<uint16_t>(Multiply(coef, b, bits));
      high_[b] = bits == 16 ? static_cast<uint16_t>(Multiply(coef, b << 8, 16))
                            : 0;
    }
    // nibble_[k][h][x]: byte h of coef * (x << 4k); the nibbles of a 16-bit
    // symbol are 0-1 in its low byte and 2-3 in its high byte, of an 8-bit
    // one 0-1.
    for (uint32_t x = 0; x < 16; ++x) {
      const uint16_t products[4] = {low_[x], low_[x << 4], high_[x],
                                    high_[x << 4]};
      for (int k = 0; k < 4; ++k) {
        nibble_[k][0][x] = static_cast<uint8_t>(products[k] & 0xFF);
        nibble_[k][1][x] = static_cast<uint8_t>(products[k] >> 8);
      }
    }
  }

  uint32_t operator()(uint32_t word) const {
    if (bits_ == 16) {
      const uint32_t s0 = low_[word & 0xFF] ^ high_[(word >> 8) & 0xFF];
      const uint32_t s1 = low_[(word >> 16) & 0xFF] ^ high_[word >> 24];
      return s0 | (s1 << 16);
    }
    return low_[word & 0xFF] | (low_[(word >> 8) & 0xFF] << 8) |
           (low_[(word >> 16) & 0xFF] << 16) |
           (static_cast<uint32_t>(low_[word >> 24]) << 24);
  }

  // dst[j] ^= coef * src[j], symbol by symbol, for j < n.
  void XorScaled(const int32_t* __restrict__ src, int32_t* __restrict__ dst,
                 int64_t n) const {
    int64_t j = 0;
#ifdef __SSSE3__
    for (; j + 8 <= n; j += 8) XorScaledBlock(src + j, dst + j);
#endif
    for (; j < n; ++j) {
      dst[j] ^= static_cast<int32_t>((*this)(static_cast<uint32_t>(src[j])));
    }
  }

 private:
#ifdef __SSSE3__
  __m128i Table(int k, int h) const {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(nibble_[k][h]));
  }

  // Eight words: 32 bytes, 16 symbols of 16 bits or 32 of 8 bits.
  void XorScaledBlock(const int32_t* src, int32_t* dst) const {
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 4));
    __m128i out_a, out_b;
    if (bits_ == 16) {
      // Low bytes of the 16 symbols into one register, high bytes into
      // another; scale; interleave back.
      const __m128i split =
          _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
      const __m128i sa = _mm_shuffle_epi8(a, split);
      const __m128i sb = _mm_shuffle_epi8(b, split);
      const __m128i lo = _mm_unpacklo_epi64(sa, sb);
      const __m128i hi = _mm_unpackhi_epi64(sa, sb);
      const __m128i n[4] = {_mm_and_si128(lo, mask),
                            _mm_and_si128(_mm_srli_epi16(lo, 4), mask),
                            _mm_and_si128(hi, mask),
                            _mm_and_si128(_mm_srli_epi16(hi, 4), mask)};
      __m128i product[2];
      for (int h = 0; h < 2; ++h) {
        product[h] = _mm_xor_si128(
            _mm_xor_si128(_mm_shuffle_epi8(Table(0, h), n[0]),
                          _mm_shuffle_epi8(Table(1, h), n[1])),
            _mm_xor_si128(_mm_shuffle_epi8(Table(2, h), n[2]),
                          _mm_shuffle_epi8(Table(3, h), n[3])));
      }
      out_a = _mm_unpacklo_epi8(product[0], product[1]);
      out_b = _mm_unpackhi_epi8(product[0], product[1]);
    } else {
      auto scale = [&](__m128i v) {
        return _mm_xor_si128(
            _mm_shuffle_epi8(Table(0, 0), _mm_and_si128(v, mask)),
            _mm_shuffle_epi8(Table(1, 0),
                             _mm_and_si128(_mm_srli_epi16(v, 4), mask)));
      };
      out_a = scale(a);
      out_b = scale(b);
    }
    __m128i* d = reinterpret_cast<__m128i*>(dst);
    _mm_storeu_si128(d, _mm_xor_si128(_mm_loadu_si128(d), out_a));
    _mm_storeu_si128(d + 1, _mm_xor_si128(_mm_loadu_si128(d + 1), out_b));
  }
#endif

  int bits_;
  std::array<uint16_t, 256> low_{};
  std::array<uint16_t, 256> high_{};
  alignas(16) uint8_t nibble_[4][2][16] = {};
};

}  // namespace galois
}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_GALOIS_H_
