// Weight-only quantized matmuls, out[m, n] = sum_k x[m, k] * w[n, k], reading the packed weights
// directly (no dequantized copy of the matrix). Weights are row-major per output channel and
// split into groups of `group` input features, each with a float16 scale (int4 also an offset;
// float16 as in GGUF's blocks, so they are kept as they are):
//   int8: w = q * scale                      q: int8, one byte per weight
//   int4: w = q * scale + offset             q: 0..15, two per byte; in each group byte j holds
//                                            element j (low nibble) and j + group/2 (high nibble),
//                                            the layout of GGUF's Q4_0/Q4_1 blocks.
//   fp8:  w = e4m3(q) * scale                q: float8 E4M3 (fn) bits, widened through a table.
// Each thread widens one output channel at a time into a K-float buffer that stays in L1 and
// dots every row of x with it: memory traffic is the packed bytes, and the widening is paid once
// per channel however many rows x has. AVX-512, else AVX2+FMA, where the compiler targets it
// (plain loops elsewhere and for tails); output channels are spread over torch's OpenMP threads.
// Up to 64 rows against 32-input int4/int8 groups (GGUF's Q4/Q8 shape: decode steps, a
// speculative draft's verification), in AVX2 builds int4 groups of a multiple of 64 too and in
// AVX-512 builds int4/int8 groups of any multiple of 32 (few_rows_fit), skip the buffer and
// unpack each group into registers once for all rows; each row's arithmetic is then the same
// whatever the number of rows.
// A bfloat16 model's int4 g32 decode rows can instead take AMX bf16 tiles (few_rows_int4_amx,
// opt-in): weights and activations rounded to bf16, every row in one tile product per group.
// A second pair of kernels (int4_gemm_q8/int8_gemm_q8, after quantize_rows_q8) multiplies in
// integers, as llama.cpp does on the CPU: each row of x is first rounded to int8 with one float
// scale per `block` inputs (32, or the whole row for per-token W8A8), then every 32 weights cost
// one u8 x s8 multiply-add instruction instead of a widen-and-FMA per 8. Per 32-input sub-block:
//   sum_k w[k] x[k] ~ scale_w * dx * sum_k q[k] xq[k]  (+ offset_w * dx * sum_k xq[k] for int4)
// It needs K a multiple of 32 and int4 groups of 32 or a multiple of 64 (so each 32-input
// sub-block is one run of low or high nibbles); the caller checks (quantization.py).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__AVX512VBMI__) && defined(__F16C__)
#define CODEYARD_FEW_ROWS_AMX 1
#include "amx.h"
#if defined(_OPENMP)
#include <omp.h>
#endif
#endif

namespace {

inline float half_to_float(uint16_t h) {  // IEEE binary16 -> float32, subnormals included
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    exponent = 113;
    while (!(mantissa & 0x400)) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline float f16(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return half_to_float(h);
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

inline float max_of_lanes(__m256 v) {  // of non-negative lanes, NaNs skipped (std::fmax): 0 if all are NaN
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float max = 0.0f;
  for (float lane : lanes) max = std::fmax(max, lane);
  return max;
}

inline __m256 widen(__m128i bytes8, bool is_signed) {  // 8 integers in the low bytes -> 8 floats
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes8) : _mm256_cvtepu8_epi32(bytes8));
}
#endif

// One group's weights as floats, q * scale + offset (int8: offset 0; int4: low nibbles then high).
inline void widen_int8(const int8_t* q, int64_t n, float scale, float* out) {
  int64_t k = 0;
#if defined(__AVX512F__)
  for (; k + 16 <= n; k += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k));
    _mm512_storeu_ps(out + k, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), _mm512_set1_ps(scale)));
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; k + 8 <= n; k += 8)
    _mm256_storeu_ps(out + k, _mm256_mul_ps(widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k)), true), s));
#endif
  for (; k < n; ++k) out[k] = static_cast<float>(q[k]) * scale;
}

// A product, then a sum (two roundings, no FMA): the very weights quantization.py's dequantize gives.
inline void widen_int4(const uint8_t* q, int64_t n, float scale, float offset, float* out) {
  const int64_t half = n / 2;
  int64_t j = 0;
#if defined(__AVX512F__)
  for (; j + 16 <= half; j += 16) {  // 16 bytes: elements j.. (low nibbles) and j + half.. (high)
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j)));
    const __m512 s = _mm512_set1_ps(scale), o = _mm512_set1_ps(offset);
    const __m512 low = _mm512_cvtepi32_ps(_mm512_and_si512(codes, _mm512_set1_epi32(15)));
    _mm512_storeu_ps(out + j, _mm512_add_ps(_mm512_mul_ps(low, s), o));
    _mm512_storeu_ps(out + j + half, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(codes, 4)), s), o));
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  const __m128i low = _mm_set1_epi8(15);
  const __m256 s = _mm256_set1_ps(scale), o = _mm256_set1_ps(offset);
  for (; j + 8 <= half; j += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
    _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_mul_ps(widen(_mm_and_si128(bytes, low), false), s), o));
    _mm256_storeu_ps(out + j + half,
                     _mm256_add_ps(_mm256_mul_ps(widen(_mm_and_si128(_mm_srli_epi16(bytes, 4), low), false), s), o));
  }
#endif
  for (; j < half; ++j) {
    out[j] = static_cast<float>(q[j] & 15) * scale + offset;
    out[j + half] = static_cast<float>(q[j] >> 4) * scale + offset;
  }
}

// float8 E4M3 (fn: no infinities, 0x7F/0xFF NaN) -> float32, all 256 codes.
struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int code = 0; code < 256; ++code) {
      const int exponent = (code >> 3) & 15, mantissa = code & 7;
      float v = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                              : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
      if (exponent == 15 && mantissa == 7) v = NAN;
      value[code] = code & 0x80 ? -v : v;
    }
  }
};
const Fp8Table FP8;

inline void widen_fp8(const uint8_t* q, int64_t n, float scale, float* out) {
  int64_t k = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; k + 8 <= n; k += 8) {
    const __m256i index = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k)));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_i32gather_ps(FP8.value, index, 4), s));
  }
#endif
  for (; k < n; ++k) out[k] = FP8.value[q[k]] * scale;
}

inline float dot(const float* x, const float* w, int64_t n) {
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(w + k), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(w + k + 16), acc1);
  }
  for (; k < n; k += 16) {  // the tail through masked loads (zeros past the end)
    const __mmask16 mask = n - k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - k)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + k), _mm512_maskz_loadu_ps(mask, w + k), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  int64_t k = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; k + 16 <= n; k += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(w + k + 8), acc1);
  }
  sum = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; k < n; ++k) sum += x[k] * w[k];
  return sum;
#endif
}

enum class Weights { INT8, INT4, FP8 };

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__))
#define CODEYARD_G32_AVX2 1  // the AVX2 kernels below, not the AVX-512 one: int4 rows take int16 activations
#endif
#ifndef CODEYARD_G32_AVX2
// R decode rows against one weight row of int4/int8 groups of any multiple of 32 inputs (AVX-512;
// the AVX2 kernels below are for CPUs without it): sixteen groups' float16 scales (and offsets)
// convert at once, a masked load for the last ones. int4 skips the int-to-float conversions: per
// group a 16-float table, code * scale + offset (quantization.py's dequantized weights bit for
// bit), and one permute per 16 codes (vpermps reads the low 4 bits of each index: the low nibbles
// as they are, the high ones after a shift) gives 32 of the group's weights, 16 of its first half
// from the low nibbles and the matching 16 of its second half from the high ones (a group's byte
// j holds its elements j and j + length / 2). Each row then costs two FMAs per 32 weights, into
// one accumulator for the first halves' inputs and one for the second halves'. A group of 128
// (AWQ's, GPTQ's, our int4's) builds one table for 4 such steps; before stop 38 groups other
// than 32 took the buffered kernel below, which widens every code to float into L1 and reads it
// back: 1.4-2.2x the CPU time on ~1B shapes. int8 widens each 32 codes into two 16-lane vectors
// times the scale (dequantize's weights too; per channel, the group is the whole row), then the
// same two FMAs per row. Every row gets the same operations whatever R is. Sums in another order
// than the AVX2 int8 kernel, which factors the scale out of each group; AVX2's int4 kernel rounds
// x to int16.
template <Weights KIND, int R>
void rows_dot_float(const float* x, int64_t k_in, const uint8_t* q, const uint16_t* scales,
                    const uint16_t* offsets, float* out, int64_t n_out, int64_t group) {
  const int64_t groups = (k_in + group - 1) / group, row_bytes = KIND == Weights::INT4 ? k_in / 2 : k_in;
  const __m512 codes16 = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_out; ++n) {
    const uint8_t* qn = q + n * row_bytes;
    // The codes of the channel two ahead start on their way to L1 while this one is multiplied: a
    // sequence's step reads ~90 MB of weights, and without it the rows' arithmetic waited on those
    // reads (SmolLM2 Q4_1 + Q8_0 head, one thread: one row 21.8 -> 15.2 ms, six rows 34.4 -> 25.9 ms).
    if (n + 2 < n_out)
      for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(qn + 2 * row_bytes + b), _MM_HINT_T0);
    __m512 even[R], odd[R];
    for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
    alignas(64) float scale16[16], offset16[16];
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
      const int64_t count = groups - g0 < 16 ? groups - g0 : 16;
      const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
      _mm512_store_ps(scale16, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, scales + n * groups + g0)));
      if constexpr (KIND == Weights::INT4)
        _mm512_store_ps(offset16, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, offsets + n * groups + g0)));
      for (int64_t j = 0; j < count; ++j) {
        const int64_t start = (g0 + j) * group, length = k_in - start < group ? k_in - start : group;
        const __m512 scale = _mm512_set1_ps(scale16[j]);
        // 16 weights for inputs k.. and 16 for inputs k + apart.. into every row's two accumulators
        const auto rows_fma = [&](__m512 w0, __m512 w1, int64_t k, int64_t apart) {
          for (int r = 0; r < R; ++r) {
            const float* xk = x + r * k_in + k;
            even[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xk), even[r]);
            odd[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xk + apart), odd[r]);
          }
        };
        if constexpr (KIND == Weights::INT4) {
          const __m512 table = _mm512_add_ps(_mm512_mul_ps(codes16, scale), _mm512_set1_ps(offset16[j]));
          const int64_t half = length / 2;
          for (int64_t b = 0; b < half; b += 16) {  // bytes b..b+15: elements b.. (low), half + b.. (high)
            const __m512i codes =
                _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qn + start / 2 + b)));
            rows_fma(_mm512_permutexvar_ps(codes, table), _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table),
                     start + b, half);
          }
        } else {
          for (int64_t b = 0; b < length; b += 32) {  // 32 consecutive codes: the first 16, the last 16
            const __m128i* bytes = reinterpret_cast<const __m128i*>(qn + start + b);
            rows_fma(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(bytes))), scale),
                     _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(bytes + 1))), scale),
                     start + b, 16);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) out[r * n_out + n] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r]));
  }
}
#else
// Without AVX-512, R decode rows against one weight row of 32-input groups, without the L1
// buffer. Each group is unpacked once for all R rows, and every row gets the same operations in
// the same order whatever R is, so a row's result does not depend on the rows beside it (a
// speculative verification step gives the very logits of one-token steps).
// int8 (GGUF's Q8_0): the codes widen straight from memory (8 bytes -> 8 int32 lanes -> floats),
// eight groups' float16 scales convert at once, and each row sums s * sum_k x_k q_k in float32.
template <int R>
void rows_dot_int8_g32(const float* x, int64_t k_in, const uint8_t* q, const uint16_t* scales, float* out,
                       int64_t n_out) {
  const int64_t groups = k_in / 32;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_out; ++n) {
    const uint8_t* qn = q + n * k_in;
    const uint16_t* scale_n = scales + n * groups;
    if (n + 2 < n_out)  // as in the AVX-512 kernel (without AVX-512: one row 24.1 -> 15.4 ms, six 49.5 -> 34.5 ms)
      for (int64_t b = 0; b < k_in; b += 64) _mm_prefetch(reinterpret_cast<const char*>(qn + 2 * k_in + b), _MM_HINT_T0);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    alignas(32) float scale8[8];
    for (int64_t g0 = 0; g0 < groups; g0 += 8) {
      const int64_t count = groups - g0 < 8 ? groups - g0 : 8;
      if (count == 8) _mm256_store_ps(scale8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_n + g0))));
      else for (int64_t j = 0; j < count; ++j) scale8[j] = f16(scale_n[g0 + j]);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t g = g0 + j;
        const int8_t* qg = reinterpret_cast<const int8_t*>(qn + g * 32);
        const __m256 w0 = widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qg)), true);
        const __m256 w1 = widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qg + 8)), true);
        const __m256 w2 = widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qg + 16)), true);
        const __m256 w3 = widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qg + 24)), true);
        const __m256 scale = _mm256_broadcast_ss(scale8 + j);
        for (int r = 0; r < R; ++r) {
          const float* xg = x + r * k_in + g * 32;
          __m256 sum = _mm256_mul_ps(w0, _mm256_loadu_ps(xg));
          sum = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xg + 8), sum);
          sum = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xg + 16), sum);
          sum = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xg + 24), sum);
          acc[r] = _mm256_fmadd_ps(sum, scale, acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) out[r * n_out + n] = hsum(acc[r]);
  }
}

// A row of activations rounded to int16, one scale per 32 inputs, for the int4 kernel below.
struct Int16Rows {
  std::vector<int16_t> xq;  // [rows, K]: round(x / dx), |xq| <= 32767
  std::vector<float> dx;    // [rows, K/32]: the group's max |x| / 32767
  std::vector<float> sums;  // [rows, K/32]: dx * sum_k xq_k (int4's offset term)
};

// x's rows as Int16Rows. A group holding a NaN or an infinity gets a NaN scale, so the outputs
// it feeds are NaN as the float kernel's would be (the integers cannot carry it).
Int16Rows int16_rows(const float* x, int64_t rows, int64_t k_in) {
  const int64_t groups = k_in / 32;
  Int16Rows r{std::vector<int16_t>(rows * k_in), std::vector<float>(rows * groups), std::vector<float>(rows * groups)};
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < rows * groups; ++i) {
    const float* xg = x + i * 32;  // group i % groups of row i / groups: rows are contiguous
    __m256 amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
    for (int k = 0; k < 32; k += 8) {
      const __m256 v = _mm256_loadu_ps(xg + k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
      sum = _mm256_add_ps(sum, v);
    }
    const float max = max_of_lanes(amax);
    // groups below 1e-30 count as zeros: 1 / d would overflow to infinity
    const float d = (max > 1e-30f ? max / 32767.0f : 0.0f) + 0.0f * hsum(sum), inverse = d > 0.0f ? 1.0f / d : 0.0f;
    const __m256 scale = _mm256_set1_ps(inverse);
    __m256i codes_sum = _mm256_setzero_si256();
    for (int k = 0; k < 32; k += 16) {  // to nearest (even), then packed in order (packs interleaves 128-bit lanes)
      const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + k), scale));
      const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + k + 8), scale));
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.xq.data() + i * 32 + k), packed);
      codes_sum = _mm256_add_epi32(codes_sum, _mm256_madd_epi16(packed, _mm256_set1_epi16(1)));
    }
    r.dx[i] = d;
    r.sums[i] = d * static_cast<float>(hsum_epi32(codes_sum));
  }
  return r;
}

// Where each 32-input sub-block of an int4 weight row lies, for groups of 32 inputs or a multiple
// of 64 (the last group too): its first byte in the row and which nibbles hold its 32 codes. A
// 32-input group is 16 bytes, low nibbles its first 16 inputs and high nibbles its last 16
// (PAIRED); in a group of 64 or more the low nibbles are its first half and the high ones its
// second, so a sub-block is a run of 32 bytes' low (LOW_RUN) or high (HIGH_RUN) nibbles.
enum class Nibbles : uint8_t { PAIRED, LOW_RUN, HIGH_RUN };

struct Int4Subs {
  std::vector<int32_t> byte;  // per sub-block t (its group is t / subs_per_group: groups start a group apart)
  std::vector<Nibbles> nibbles;
  int64_t subs_per_group = 1;
  // Groups of 64, 128 or 256 inputs (2, 4 or 8 sub-blocks: eight sub-blocks hold whole groups):
  // groups per eight sub-blocks, and the lane -> group-in-block map that spreads their scales over
  // their sub-blocks; 0 for other groups, which take a sub-block at a time.
  int per_block = 0;
  alignas(32) int32_t expand[8] = {};
};

Int4Subs int4_subs(int64_t k_in, int64_t group) {
  Int4Subs layout;
  layout.subs_per_group = group / 32;
  if (group >= 64 && 8 % layout.subs_per_group == 0) {
    layout.per_block = static_cast<int>(8 / layout.subs_per_group);
    for (int j = 0; j < 8; ++j) layout.expand[j] = static_cast<int32_t>(j / layout.subs_per_group);
  }
  for (int64_t start = 0; start < k_in; start += group) {
    const int64_t length = k_in - start < group ? k_in - start : group, chunks = length / 64;
    for (int64_t s = 0; s < length / 32; ++s) {
      layout.byte.push_back(static_cast<int32_t>(start / 2 + (length == 32 ? 0 : (s % chunks) * 32)));
      layout.nibbles.push_back(length == 32 ? Nibbles::PAIRED : s < chunks ? Nibbles::LOW_RUN : Nibbles::HIGH_RUN);
    }
  }
  return layout;
}

// n (1, 2 or 4) float16 values, the rest of the vector zero: nothing read past them.
inline __m128i halves(const uint16_t* p, int n) {
  if (n == 4) return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const uint32_t bits = n == 2 ? static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 16 : p[0];
  return _mm_cvtsi32_si128(static_cast<int>(bits));
}

// Whether rows_dot_int4 takes this shape: K in 32-input sub-blocks, every group 32 or a multiple of 64.
bool int4_subs_fit(int64_t k_in, int64_t group) {
  const int64_t tail = k_in % group;
  return k_in % 32 == 0 && (group == 32 || group % 64 == 0) && (tail == 0 || tail == 32 || tail % 64 == 0);
}

// One 32-input sub-block's codes (first and last 16 inputs, 16-bit lanes) into R rows' sums: per
// row two vpmaddwd against its int16 activations (xq: row 0's sub-block, rows k_in apart), an add,
// a conversion and one FMA by its s * dx (d: row 0's, rows 8 floats apart).
template <int R>
inline void sub_rows(__m256i first, __m256i last, const int16_t* xq, int64_t k_in, const float* d, __m256* acc) {
  for (int r = 0; r < R; ++r) {
    const __m256i* xg = reinterpret_cast<const __m256i*>(xq + r * k_in);
    const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(first, _mm256_loadu_si256(xg)),
                                         _mm256_madd_epi16(last, _mm256_loadu_si256(xg + 1)));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(d + r * 8), acc[r]);
  }
}

// int4 (GGUF's Q4_0/Q4_1, and AWQ/GPTQ/our int4 in groups of 64-128): the activations are rounded
// to int16 per 32 inputs first (Int16Rows), so each 32-input sub-block's codes widen to 16-bit
// lanes once for all rows (G32: groups of 32, one group a sub-block) and each row costs two
// vpmaddwd, an add, one conversion and one FMA per sub-block:
//   sum_k (dx xq_k) (q_k s + o) = s * dx * sum_k q_k xq_k + o * dx * sum_k xq_k
// so a row's result is F.linear(x rounded, W) up to float32 rounding, whatever rows are beside it:
// the integer sums are exact (|q xq| <= 15 * 32767), and the rounding of x to int16 (at most
// dx / 2 = max|x| / 65534 per input, ~250x finer than bfloat16's) is the only difference from the
// float kernel's result beyond summation order. Why: the float kernel's widening (4 int-to-float
// conversions, 2 masks, 2 shifts per group) and 5 FMAs per row held a one-row step on SmolLM2's
// layers to ~15 vector ops per group, 8 here (measured in docs/ARCHITECTURE.md); groups of 128
// took the buffered float kernel, a widening per 8 weights and an FMA per row, no faster than
// oneDNN's float32.
template <int R, bool G32>
void rows_dot_int4(const Int16Rows& x, int64_t row0, int64_t k_in, const Int4Subs& layout, const uint8_t* q,
                   const uint16_t* scales, const uint16_t* offsets, float* out, int64_t n_out, int64_t groups) {
  const int64_t subs = k_in / 32, row_bytes = k_in / 2;
  const int16_t* xq = x.xq.data() + row0 * k_in;
  const float* dx = x.dx.data() + row0 * subs;
  const float* sums = x.sums.data() + row0 * subs;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_out; ++n) {
    const uint8_t* qn = q + n * row_bytes;
    const uint16_t* scale_n = scales + n * groups;
    const uint16_t* offset_n = offsets + n * groups;
    if (n + 2 < n_out)
      for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(qn + 2 * row_bytes + b), _MM_HINT_T0);
    __m256 acc[R], offset_acc[R];
    float offset_tail[R];
    for (int r = 0; r < R; ++r) acc[r] = offset_acc[r] = _mm256_setzero_ps(), offset_tail[r] = 0.0f;
    alignas(32) float d8[R][8];  // s * dx per row and sub-block
    const __m256i low = _mm256_set1_epi16(15);
    for (int64_t t0 = 0; t0 < subs; t0 += 8) {
      const int64_t count = subs - t0 < 8 ? subs - t0 : 8;
      const bool whole = count == 8 && (G32 || layout.per_block);  // eight sub-blocks of whole groups
      if (whole) {
        __m256 scale8, offset8;
        if (G32) {
          scale8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_n + t0)));
          offset8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offset_n + t0)));
        } else {  // each group's scale and offset spread over its sub-blocks
          const int64_t g0 = t0 / layout.subs_per_group;
          const __m256i expand = _mm256_load_si256(reinterpret_cast<const __m256i*>(layout.expand));
          scale8 = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(halves(scale_n + g0, layout.per_block)), expand);
          offset8 = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(halves(offset_n + g0, layout.per_block)), expand);
        }
        for (int r = 0; r < R; ++r) {
          _mm256_store_ps(d8[r], _mm256_mul_ps(scale8, _mm256_loadu_ps(dx + r * subs + t0)));
          offset_acc[r] = _mm256_fmadd_ps(offset8, _mm256_loadu_ps(sums + r * subs + t0), offset_acc[r]);
        }
      } else {
        for (int64_t j = 0; j < count; ++j) {
          const int64_t g = (t0 + j) / layout.subs_per_group;
          for (int r = 0; r < R; ++r) {
            d8[r][j] = f16(scale_n[g]) * dx[r * subs + t0 + j];
            offset_tail[r] += f16(offset_n[g]) * sums[r * subs + t0 + j];
          }
        }
      }
      if (!G32 && whole) {
        // Each 32-byte run's low nibbles are one sub-block and its high nibbles the one half a group
        // on: widened once for both, every row taking the first, then every row the second (each
        // row's sums in the same order whatever rows are beside it).
        const int64_t half = layout.subs_per_group / 2;
        for (int64_t c = 0; c < 4; ++c) {
          const int64_t first_sub = c / half * 2 * half + c % half, second_sub = first_sub + half;
          const uint8_t* bytes = qn + layout.byte[t0 + first_sub];
          const __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
          const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 16)));
          sub_rows<R>(_mm256_and_si256(a, low), _mm256_and_si256(b, low), xq + (t0 + first_sub) * 32, k_in,
                      &d8[0][first_sub], acc);
          sub_rows<R>(_mm256_srli_epi16(a, 4), _mm256_srli_epi16(b, 4), xq + (t0 + second_sub) * 32, k_in,
                      &d8[0][second_sub], acc);
        }
        continue;
      }
      for (int64_t j = 0; j < count; ++j) {
        const int64_t t = t0 + j;
        __m256i first, last;  // the sub-block's codes for its first and last 16 inputs
        const Nibbles nibbles = G32 ? Nibbles::PAIRED : layout.nibbles[t];
        const uint8_t* bytes = qn + (G32 ? t * 16 : layout.byte[t]);
        const __m256i codes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
        if (nibbles == Nibbles::PAIRED) {
          first = _mm256_and_si256(codes, low), last = _mm256_srli_epi16(codes, 4);
        } else {
          const __m256i next = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 16)));
          const bool high = nibbles == Nibbles::HIGH_RUN;
          first = high ? _mm256_srli_epi16(codes, 4) : _mm256_and_si256(codes, low);
          last = high ? _mm256_srli_epi16(next, 4) : _mm256_and_si256(next, low);
        }
        sub_rows<R>(first, last, xq + t * 32, k_in, &d8[0][j], acc);
      }
    }
    for (int r = 0; r < R; ++r) out[r * n_out + n] = hsum(acc[r]) + (hsum(offset_acc[r]) + offset_tail[r]);
  }
}
#endif

constexpr int64_t G32_MAX_ROWS = 64;  // quantization.py's G32_KERNEL_MAX_ROWS: larger calls dequantize
constexpr int64_t G32_TILE = 8;       // rows per pass over the weights: 8 accumulators stay in registers

// kernel(tile_index, m0): rows m0 .. m0 + tile_index of x, for up to G32_TILE rows at a time.
template <typename Kernel>
void by_tiles(int64_t rows, Kernel kernel) {
  for (int64_t m0 = 0; m0 < rows; m0 += G32_TILE) kernel((rows - m0 < G32_TILE ? rows - m0 : G32_TILE) - 1, m0);
}

// Up to G32_MAX_ROWS rows against 32-input groups (AVX2 builds: int4 groups of a multiple of 64 too,
// int4_subs_fit; AVX-512 builds: int4/int8 groups of any multiple of 32), each group unpacked once
// per G32_TILE rows.
template <Weights KIND>
void rows_few(const float* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out,
              int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
#ifndef CODEYARD_G32_AVX2
  using Tile = void (*)(const float*, int64_t, const uint8_t*, const uint16_t*, const uint16_t*, float*, int64_t,
                        int64_t);
  static constexpr Tile tiles[G32_TILE] = {
      rows_dot_float<KIND, 1>, rows_dot_float<KIND, 2>, rows_dot_float<KIND, 3>, rows_dot_float<KIND, 4>,
      rows_dot_float<KIND, 5>, rows_dot_float<KIND, 6>, rows_dot_float<KIND, 7>, rows_dot_float<KIND, 8>};
  by_tiles(rows, [&](int64_t t, int64_t m0) {
    tiles[t](x + m0 * k_in, k_in, q, scales, offsets, out + m0 * n_out, n_out, group);
  });
#else
  if constexpr (KIND == Weights::INT4) {
    using Tile = void (*)(const Int16Rows&, int64_t, int64_t, const Int4Subs&, const uint8_t*, const uint16_t*,
                          const uint16_t*, float*, int64_t, int64_t);
    static constexpr Tile g32[G32_TILE] = {
        rows_dot_int4<1, true>, rows_dot_int4<2, true>, rows_dot_int4<3, true>, rows_dot_int4<4, true>,
        rows_dot_int4<5, true>, rows_dot_int4<6, true>, rows_dot_int4<7, true>, rows_dot_int4<8, true>};
    static constexpr Tile runs[G32_TILE] = {
        rows_dot_int4<1, false>, rows_dot_int4<2, false>, rows_dot_int4<3, false>, rows_dot_int4<4, false>,
        rows_dot_int4<5, false>, rows_dot_int4<6, false>, rows_dot_int4<7, false>, rows_dot_int4<8, false>};
    const Tile* tiles = group == 32 ? g32 : runs;
    const Int4Subs layout = group == 32 ? Int4Subs{} : int4_subs(k_in, group);
    const int64_t groups = (k_in + group - 1) / group;
    const Int16Rows rounded = int16_rows(x, rows, k_in);
    by_tiles(rows, [&](int64_t t, int64_t m0) {
      tiles[t](rounded, m0, k_in, layout, q, scales, offsets, out + m0 * n_out, n_out, groups);
    });
  } else {
    using Tile = void (*)(const float*, int64_t, const uint8_t*, const uint16_t*, float*, int64_t);
    static constexpr Tile tiles[G32_TILE] = {
        rows_dot_int8_g32<1>, rows_dot_int8_g32<2>, rows_dot_int8_g32<3>, rows_dot_int8_g32<4>,
        rows_dot_int8_g32<5>, rows_dot_int8_g32<6>, rows_dot_int8_g32<7>, rows_dot_int8_g32<8>};
    by_tiles(rows, [&](int64_t t, int64_t m0) { tiles[t](x + m0 * k_in, k_in, q, scales, out + m0 * n_out, n_out); });
  }
#endif
}
#endif

#ifdef CODEYARD_FEW_ROWS_AMX
// Few rows (1-16) against 32-input int4 groups on AMX bf16 tiles, for bfloat16 models (opt-in:
// it rounds weights and activations to bf16). Why: with one 512-bit FMA port, the float kernel
// above pays two FMAs per row and group (a verified row costs what a one-token step's arithmetic
// costs); the tile unit multiplies up to 16 rows in the time of one. Per pass 16 output channels:
// their float16 scales/offsets convert once, then slices of FEW_SLICE groups are dequantized into
// an L1 buffer (per group a bf16 table of its 16 levels, and its 32 codes picked out of their 16
// bytes by one vpmultishiftqb and looked up by one vpermw, in FEW_ORDER), and the slice before
// is multiplied while the next one is dequantized: A = 16 channels x 32 weights, B = the group's
// 32 activations of every row (pair-interleaved, rounded to bf16 once per call), C = 16 channels
// x rows float32 sums over all of K. (Measured on SmolLM2's layers, one thread, against the float
// kernel's one row: 4-group slices 1.06-1.09x, 8 1.11x, 16 1.12x; even and odd groups in two C
// tiles, 32 or 64 channels per pass, or a tile product issued between channels' dequantization:
// no better; the multishift and the FMA table instead of a shared two-group table with masked
// indices and two roundings: 1.05-1.08x -> 0.97-0.99x.) Each output element depends only on its channel's weights and its row's
// activations, in an order fixed by the hardware: a row's result is the same whatever rows are
// beside it (tested), so a verified row equals its one-token step.
constexpr int64_t FEW_SLICE = 4;       // groups per dequantized slice (16 channels x 4 groups: 4 KiB)
constexpr int64_t FEW_MAX_ROWS = 16;   // a B tile's columns

// The order of a group's 32 weights in an A row (and of its inputs in the B tiles): word w holds
// element order[w], the nibble `select` picks out of a broadcast of the group's 16 bytes with one
// vpmultishiftqb (its bits 4-7 are the neighbouring nibble's: the table repeats in both halves,
// and vpermw reads only 5 bits).
struct FewRowsOrder {
  alignas(64) uint8_t select[64];
  alignas(64) uint16_t order[32];
  FewRowsOrder() {
    for (int w = 0; w < 32; ++w) {  // qword m of the result takes from the group's qword m % 2
      const int m = w / 4, t = w % 4, nibble = (m / 2) * 4 + t, byte = nibble % 8, high = nibble / 8;
      select[8 * m + 2 * t] = static_cast<uint8_t>(8 * byte + 4 * high);
      select[8 * m + 2 * t + 1] = 0;
      order[w] = static_cast<uint16_t>(8 * (m % 2) + byte + 16 * high);  // byte b: element b, b + 16
    }
  }
};
const FewRowsOrder FEW_ORDER;

void few_rows_dequantize_slice(const uint8_t* q, const float* scales, const float* offsets, int64_t n0, int64_t g0,
                               int64_t count, int64_t groups, int64_t row_bytes, int64_t n_out, uint16_t* buf) {
  const __m512 codes16 = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i select = _mm512_load_si512(FEW_ORDER.select);
  for (int64_t ch = 0; ch < 16; ++ch) {
    const uint8_t* qn = q + (n0 + ch) * row_bytes + g0 * 16;
    if (n0 + ch + 16 < n_out)  // the next pass's codes of this slice start on their way to L1
      for (int64_t b = 0; b < count * 16; b += 64) _mm_prefetch(reinterpret_cast<const char*>(qn + 16 * row_bytes + b), _MM_HINT_T0);
    const float* s = scales + ch * groups + g0;
    const float* o = offsets + ch * groups + g0;
    uint16_t* w = buf + ch * FEW_SLICE * 32;
    for (int64_t j = 0; j < count; ++j) {
      // the group's 16 levels, code * scale + offset in one rounding (an FMA: dequantize rounds
      // twice, which the bf16 rounding after it hides but for rare ties), in both table halves
      const __m512 levels = _mm512_fmadd_ps(codes16, _mm512_set1_ps(s[j]), _mm512_set1_ps(o[j]));
      const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(levels, levels));
      const __m512i bytes = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qn + j * 16)));
      _mm512_store_si512(w + j * 32, _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(select, bytes), table));
    }
  }
}

// x [rows, k_in] float32 (rounded to bf16 here) -> out [rows, n_out]; n_out a multiple of 16.
void few_rows_int4_amx(const float* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out,
                       int64_t rows, int64_t n_out, int64_t k_in) {
  const int64_t groups = k_in / 32, row_bytes = k_in / 2, slices = (groups + FEW_SLICE - 1) / FEW_SLICE;
  // B tiles: per group, 16 input pairs x rows (a pair of bf16 is one 32-bit word), rounded as torch's
  // .to(torch.bfloat16) rounds; kept per thread across calls (a step makes ~120 of them)
  thread_local std::vector<uint32_t> pairs_buffer;
  if (pairs_buffer.size() < static_cast<size_t>(groups * 16 * rows)) pairs_buffer.resize(groups * 16 * rows);
  uint32_t* pairs = pairs_buffer.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < k_in; k += 32) {  // one group: 16 pairs, in the A rows' order (FEW_ORDER)
      alignas(64) uint32_t v[16];
      const __m512i natural = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + r * k_in + k + 16),
                                                                           _mm512_loadu_ps(x + r * k_in + k)));
      _mm512_store_si512(v, _mm512_permutexvar_epi16(_mm512_load_si512(FEW_ORDER.order), natural));
      for (int64_t p = 0; p < 16; ++p) pairs[(k / 32 * 16 + p) * rows + r] = v[p];
    }
  const uint16_t* xb = reinterpret_cast<const uint16_t*>(pairs);
  const int tile_cols = static_cast<int>(rows * 4);
#pragma omp parallel
  {
    codeyard_amx::TileConfig config;  // tile 0: C, 1: A (weights), 2: B (activations)
    for (int t = 0; t < 3; ++t) config.rows[t] = 16, config.colsb[t] = t == 1 ? 64 : tile_cols;
    _tile_loadconfig(&config);
    alignas(64) uint16_t buf[2][16 * FEW_SLICE * 32];
    alignas(64) float c[16 * FEW_MAX_ROWS];
    thread_local std::vector<float> levels;  // the pass's scales, then its offsets, as float32
    if (levels.size() < static_cast<size_t>(2 * 16 * groups)) levels.resize(2 * 16 * groups);
    float* sf = levels.data();
    float* of = sf + 16 * groups;
    // this thread's passes (16 channels each), their slices in one sequence: slice t is dequantized
    // while slice t - 1 (of this pass or the one before) is multiplied
#if defined(_OPENMP)
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
#else
    const int64_t threads = 1, thread = 0;
#endif
    const int64_t passes = n_out / 16;
    const int64_t first = passes * thread / threads, last = passes * (thread + 1) / threads;
    _tile_zero(0);
    for (int64_t t = first * slices; t <= last * slices && first < last; ++t) {
      if (t < last * slices) {
        const int64_t n0 = t / slices * 16, s = t % slices;
        if (s == 0)
          for (int64_t i = 0; i < 16 * groups; i += 16) {  // the pass's float16 scales and offsets, 16 at a time
            _mm512_storeu_ps(sf + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + n0 * groups + i))));
            _mm512_storeu_ps(of + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets + n0 * groups + i))));
          }
        const int64_t g0 = s * FEW_SLICE, count = groups - g0 < FEW_SLICE ? groups - g0 : FEW_SLICE;
        few_rows_dequantize_slice(q, sf, of, n0, g0, count, groups, row_bytes, n_out, buf[t & 1]);
      }
      if (t == first * slices) continue;
      const int64_t n0 = (t - 1) / slices * 16, s = (t - 1) % slices;
      const int64_t g0 = s * FEW_SLICE, count = groups - g0 < FEW_SLICE ? groups - g0 : FEW_SLICE;
      const uint16_t* w = buf[(t - 1) & 1];
      for (int64_t j = 0; j < count; ++j) {
        _tile_loadd(2, xb + (g0 + j) * 32 * rows, tile_cols);
        _tile_loadd(1, w + j * 32, FEW_SLICE * 64);
        _tile_dpbf16ps(0, 1, 2);
      }
      if (s == slices - 1) {  // the pass's sums are complete
        _tile_stored(0, c, tile_cols);
        _tile_zero(0);
        for (int64_t ch = 0; ch < 16; ++ch)
          for (int64_t r = 0; r < rows; ++r) out[r * n_out + n0 + ch] = c[ch * rows + r];
      }
    }
    _tile_release();
  }
}
#endif

// One output channel's weights as floats (w: k_in floats); the last group may be shorter (K not a
// multiple of `group`; for int4 its length is even). offsets: int4's, else unused.
template <Weights KIND>
inline const uint16_t* channel_offsets(const uint16_t* offsets, int64_t n, int64_t groups) {
  return KIND == Weights::INT4 ? offsets + n * groups : nullptr;
}

template <Weights KIND>
void widen_row(const uint8_t* qn, const uint16_t* scales, const uint16_t* offsets, int64_t k_in, int64_t group,
               float* w) {
  const int64_t groups = (k_in + group - 1) / group;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t start = g * group, length = k_in - start < group ? k_in - start : group;
    const float scale = f16(scales[g]);
    if (KIND == Weights::INT4) widen_int4(qn + start / 2, length, scale, f16(offsets[g]), w + start);
    else if (KIND == Weights::FP8) widen_fp8(qn + start, length, scale, w + start);
    else widen_int8(reinterpret_cast<const int8_t*>(qn) + start, length, scale, w + start);
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// Whether rows_few takes this shape.
template <Weights KIND>
bool few_rows_fit(int64_t k_in, int64_t group) {
  if (KIND == Weights::FP8) return false;
#ifdef CODEYARD_G32_AVX2
  if (KIND == Weights::INT4) return int4_subs_fit(k_in, group);
  return group == 32 && k_in % 32 == 0;
#else
  return group % 32 == 0 && k_in % 32 == 0;  // every group (the last too) in whole 32s
#endif
}
#endif

template <Weights KIND>
void gemm(const float* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out,
          int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  const int64_t groups = (k_in + group - 1) / group, row_bytes = KIND == Weights::INT4 ? k_in / 2 : k_in;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (rows <= G32_MAX_ROWS && few_rows_fit<KIND>(k_in, group)) {
    rows_few<KIND>(x, q, scales, offsets, out, rows, n_out, k_in, group);
    return;
  }
#endif
#pragma omp parallel
  {
    float* w = new float[k_in];  // one output channel's weights, dequantized in L1
#pragma omp for schedule(static)
    for (int64_t n = 0; n < n_out; ++n) {
      widen_row<KIND>(q + n * row_bytes, scales + n * groups, channel_offsets<KIND>(offsets, n, groups), k_in, group, w);
      for (int64_t m = 0; m < rows; ++m) out[m * n_out + n] = dot(x + m * k_in, w, k_in);
    }
    delete[] w;
  }
}

// The whole float32 weight [n_out, k_in], for prefill-sized inputs that run on oneDNN's blocked
// matmul: quantization.py's dequantize bit for bit, in one parallel pass instead of a chain of
// torch ops (which took as long as a 300-row matmul with the weight).
template <Weights KIND>
void dequantize(const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out, int64_t n_out,
                int64_t k_in, int64_t group) {
  const int64_t groups = (k_in + group - 1) / group, row_bytes = KIND == Weights::INT4 ? k_in / 2 : k_in;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_out; ++n)
    widen_row<KIND>(q + n * row_bytes, scales + n * groups, channel_offsets<KIND>(offsets, n, groups), k_in, group,
                    out + n * k_in);
}

// ---- activations rounded to int8 ----------------------------------------------------------------

constexpr int64_t SUB = 32;  // inputs per integer dot product

// x [rows, K] -> xq int8 [rows, K], and per 32-input sub-block its scale dx and dx * sum(xq)
// ([rows, K/32] each); one scale per `block` inputs (a multiple of 32 dividing K).
void quantize_rows(const float* x, int64_t rows, int64_t k_in, int64_t block, int8_t* xq, float* dx,
                   float* sx) {
  const int64_t subs = k_in / SUB;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t start = 0; start < k_in; start += block) {
      const float* xb = x + m * k_in + start;
      int8_t* qb = xq + m * k_in + start;
#if defined(__AVX512F__)
      // the loops below, 16 inputs at a time (the same roundings: to nearest even, then wrapped to int8)
      __m512 amax16 = _mm512_setzero_ps();
      for (int64_t k = 0; k < block; k += 16) amax16 = _mm512_max_ps(amax16, _mm512_abs_ps(_mm512_loadu_ps(xb + k)));
      const float amax = _mm512_reduce_max_ps(amax16);
#elif defined(__AVX2__) && defined(__FMA__)
      __m256 amax8 = _mm256_setzero_ps();
      for (int64_t k = 0; k < block; k += 8)
        amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(xb + k)));
      const float amax = max_of_lanes(amax8);
#else
      float amax = 0.0f;
      for (int64_t k = 0; k < block; ++k) amax = std::fmax(amax, std::fabs(xb[k]));
#endif
      const float d = amax / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
      for (int64_t s = 0; s < block / SUB; ++s) {
#if defined(__AVX512F__)
        const __m512 scale = _mm512_set1_ps(inverse);
        const __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + s * SUB), scale));
        const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + s * SUB + 16), scale));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + s * SUB), _mm512_cvtepi32_epi8(lo));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + s * SUB + 16), _mm512_cvtepi32_epi8(hi));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(
            _mm512_cvtepi8_epi32(_mm512_cvtepi32_epi8(lo)), _mm512_cvtepi8_epi32(_mm512_cvtepi32_epi8(hi))));
#elif defined(__AVX2__) && defined(__FMA__)  // hsum_epi32 is defined under these
        // the same roundings, 8 inputs at a time; packs saturate where AVX-512 wraps, which differs only
        // past |v| = 127: a NaN input (either output is meaningless then)
        const __m256 scale = _mm256_set1_ps(inverse);
        __m256i v[4];
        for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + s * SUB + 8 * i), scale));
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + s * SUB),  // packs interleave 128-bit halves
                            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        const int32_t sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])));
#else
        int32_t sum = 0;
        for (int64_t k = s * SUB; k < (s + 1) * SUB; ++k) {
          const int8_t v = static_cast<int8_t>(std::nearbyint(xb[k] * inverse));
          qb[k] = v;
          sum += v;
        }
#endif
        const int64_t index = m * subs + (start / SUB) + s;
        dx[index] = d;
        sx[index] = d * static_cast<float>(sum);
      }
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// The 32 codes of sub-block s of an int4 group of `length` inputs, as unsigned bytes in order.
inline __m256i int4_sub(const uint8_t* group_bytes, int64_t length, int64_t s) {
  const __m256i low = _mm256_set1_epi8(15);
  if (length == SUB) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group_bytes));
    const __m128i m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
  }
  const int64_t chunks = length / 64;  // 32-byte chunks: low nibbles are sub-blocks 0..chunks-1
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group_bytes + (s % chunks) * 32));
  return s < chunks ? _mm256_and_si256(b, low) : _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
}

// Eight int32 partial sums of a 32-input dot product: u8 weights (int4 codes) or s8 weights.
template <bool INT4>
inline __m256 sub_dot(__m256i w, const int8_t* xq) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i u = INT4 ? w : _mm256_sign_epi8(w, w), s = INT4 ? x : _mm256_sign_epi8(x, w);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  // VNNI: one u8 x s8 multiply-add into int32 lanes; the same exact sums as the AVX2 pair below
  // (whose int16 pair sums cannot saturate: |code| <= 128 and |xq| <= 127).
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#else
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
#endif

// Scalar twin of sub_dot for CPUs without AVX2: sum over the 32 inputs of code * xq.
template <bool INT4>
inline int32_t sub_dot_scalar(const uint8_t* group_bytes, int64_t length, int64_t s, const int8_t* xq) {
  int32_t sum = 0;
  for (int64_t k = 0; k < SUB; ++k) {
    const int64_t e = s * SUB + k;  // element of the group
    int32_t w;
    if (INT4) w = e < length / 2 ? group_bytes[e] & 15 : group_bytes[e - length / 2] >> 4;
    else w = reinterpret_cast<const int8_t*>(group_bytes)[e];
    sum += w * xq[k];
  }
  return sum;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// One row against one weight row of 32-input groups (a decode step on GGUF Q4/Q8 blocks or
// w4a8's default): eight groups' scales converted at once, no per-group loops.
template <bool INT4>
float row_dot_g32(const int8_t* xq, const float* dx, const float* sx, const uint8_t* qn, const uint16_t* scales,
                  const uint16_t* offsets, int64_t groups) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), offset_acc = _mm256_setzero_ps();
  alignas(32) float d[8];
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + g)));
    _mm256_store_ps(d, _mm256_mul_ps(scale, _mm256_loadu_ps(dx + g)));
    if (INT4) {
      const __m256 offset = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offsets + g)));
      offset_acc = _mm256_fmadd_ps(offset, _mm256_loadu_ps(sx + g), offset_acc);
    }
    for (int j = 0; j < 8; j += 2) {
      const int64_t a = g + j, b = a + 1;
      const __m256i wa = INT4 ? int4_sub(qn + a * 16, SUB, 0) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qn + a * SUB));
      const __m256i wb = INT4 ? int4_sub(qn + b * 16, SUB, 0) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qn + b * SUB));
      acc0 = _mm256_fmadd_ps(sub_dot<INT4>(wa, xq + a * SUB), _mm256_broadcast_ss(d + j), acc0);
      acc1 = _mm256_fmadd_ps(sub_dot<INT4>(wb, xq + b * SUB), _mm256_broadcast_ss(d + j + 1), acc1);
    }
  }
  float tail = 0.0f;
  for (; g < groups; ++g) {
    const __m256i w = INT4 ? int4_sub(qn + g * 16, SUB, 0) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qn + g * SUB));
    acc0 = _mm256_fmadd_ps(sub_dot<INT4>(w, xq + g * SUB), _mm256_set1_ps(dx[g] * f16(scales[g])), acc0);
    if (INT4) tail += f16(offsets[g]) * sx[g];
  }
  return hsum(_mm256_add_ps(acc0, acc1)) + hsum(offset_acc) + tail;
}
#endif

constexpr int64_t TILE = 4;  // rows of x per pass over a weight row (each sub-block unpacked once)

template <bool INT4>
void gemm_q8(const int8_t* xq, const float* dx, const float* sx, const uint8_t* q, const uint16_t* scales,
             const uint16_t* offsets, float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  const int64_t groups = (k_in + group - 1) / group, row_bytes = INT4 ? k_in / 2 : k_in, subs = k_in / SUB;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_out; ++n) {
    const uint8_t* qn = q + n * row_bytes;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    if (rows == 1 && group == SUB) {
      out[n] = row_dot_g32<INT4>(xq, dx, sx, qn, scales + n * groups, INT4 ? offsets + n * groups : nullptr, groups);
      continue;
    }
#endif
    for (int64_t m0 = 0; m0 < rows; m0 += TILE) {
      const int64_t tile = rows - m0 < TILE ? rows - m0 : TILE;
      float offset_sum[TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__AVX2__) && defined(__FMA__)
      __m256 acc[TILE] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
#else
      float acc[TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
#endif
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t start = g * group, length = k_in - start < group ? k_in - start : group;
        const uint8_t* bytes = qn + (INT4 ? start / 2 : start);
        const float scale = f16(scales[n * groups + g]);
        for (int64_t s = 0; s < length / SUB; ++s) {
          const int64_t sub = start / SUB + s;
#if defined(__AVX2__) && defined(__FMA__)
          const __m256i w = INT4 ? int4_sub(bytes, length, s)
                                 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + s * SUB));
#pragma GCC unroll 4
          for (int64_t r = 0; r < TILE; ++r) {  // a constant trip count keeps acc[] in registers
            if (r < tile) {
              const int64_t m = m0 + r;
              acc[r] = _mm256_fmadd_ps(sub_dot<INT4>(w, xq + m * k_in + sub * SUB),
                                       _mm256_set1_ps(dx[m * subs + sub] * scale), acc[r]);
            }
          }
#else
          for (int64_t r = 0; r < tile; ++r) {
            const int64_t m = m0 + r;
            acc[r] += static_cast<float>(sub_dot_scalar<INT4>(bytes, length, s, xq + m * k_in + sub * SUB))
                      * dx[m * subs + sub] * scale;
          }
#endif
        }
        if (INT4) {
          const float offset = f16(offsets[n * groups + g]);
          for (int64_t r = 0; r < tile; ++r) {
            float sum = 0.0f;
            for (int64_t s = 0; s < length / SUB; ++s) sum += sx[(m0 + r) * subs + start / SUB + s];
            offset_sum[r] += offset * sum;
          }
        }
      }
      for (int64_t r = 0; r < tile; ++r) {
#if defined(__AVX2__) && defined(__FMA__)
        out[(m0 + r) * n_out + n] = hsum(acc[r]) + offset_sum[r];
#else
        out[(m0 + r) * n_out + n] = acc[r] + offset_sum[r];
#endif
      }
    }
  }
}

}  // namespace

extern "C" {

int32_t int4_gemm_q8_columns(const int8_t* xq, const float* dx, const float* sx, const uint8_t* q,
                             const uint16_t* scales, const uint16_t* offsets, float* out, int64_t rows,
                             int64_t n_out, int64_t k_in, int64_t group);  // quant_gemm_q8_columns.cpp

void int8_gemm_f32(const float* x, const int8_t* q, const uint16_t* scales, float* out, int64_t rows,
                   int64_t n_out, int64_t k_in, int64_t group) {
  gemm<Weights::INT8>(x, reinterpret_cast<const uint8_t*>(q), scales, nullptr, out, rows, n_out, k_in, group);
}

void int4_gemm_f32(const float* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out,
                   int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  gemm<Weights::INT4>(x, q, scales, offsets, out, rows, n_out, k_in, group);
}

void fp8_gemm_f32(const float* x, const uint8_t* q, const uint16_t* scales, float* out, int64_t rows, int64_t n_out,
                  int64_t k_in, int64_t group) {
  gemm<Weights::FP8>(x, q, scales, nullptr, out, rows, n_out, k_in, group);
}

// A bfloat16 model's decode rows on an int4 g32 layer through the AMX bf16 few-row kernel (above),
// 16 rows per pass over the weights: 1 when done, 0 when this build/CPU/shape cannot (the caller
// then takes int4_gemm_f32). Opt-in: results are F.linear(x.bfloat16(), dequantize(W).bfloat16())
// in float32 up to summation order, not the float32 kernel's.
int32_t int4_few_rows_bf16_amx(const float* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets,
                               float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
#ifdef CODEYARD_FEW_ROWS_AMX
  if (rows < 1 || group != 32 || k_in % 32 != 0 || n_out % 16 != 0 || !codeyard_amx::tile_state_granted()) return 0;
  for (int64_t m0 = 0; m0 < rows; m0 += FEW_MAX_ROWS)
    few_rows_int4_amx(x + m0 * k_in, q, scales, offsets, out + m0 * n_out,
                      rows - m0 < FEW_MAX_ROWS ? rows - m0 : FEW_MAX_ROWS, n_out, k_in);
  return 1;
#else
  (void)x, (void)q, (void)scales, (void)offsets, (void)out, (void)rows, (void)n_out, (void)k_in, (void)group;
  return 0;
#endif
}

// The activations' precision in int4_gemm_f32's few rows (up to 64) against groups of 32 inputs or
// a multiple of 64: 16 where they are rounded to int16 per 32 inputs (AVX2 builds without AVX-512:
// rows_dot_int4), else 32 (float32).
int32_t int4_activation_bits() {
#ifdef CODEYARD_G32_AVX2
  return 16;
#else
  return 32;
#endif
}

// kind: 0 int8, 1 int4, 2 fp8 (decode_stack.cpp's numbering); offsets: int4's, else null.
void dequantize_f32(int32_t kind, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out,
                    int64_t n_out, int64_t k_in, int64_t group) {
  if (kind == 1) dequantize<Weights::INT4>(q, scales, offsets, out, n_out, k_in, group);
  else if (kind == 2) dequantize<Weights::FP8>(q, scales, nullptr, out, n_out, k_in, group);
  else dequantize<Weights::INT8>(q, scales, nullptr, out, n_out, k_in, group);
}

void quantize_rows_q8(const float* x, int64_t rows, int64_t k_in, int64_t block, int8_t* xq, float* dx,
                      float* sx) {
  quantize_rows(x, rows, k_in, block, xq, dx, sx);
}

void int8_gemm_q8(const int8_t* xq, const float* dx, const float* sx, const int8_t* q, const uint16_t* scales,
                  float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  gemm_q8<false>(xq, dx, sx, reinterpret_cast<const uint8_t*>(q), scales, nullptr, out, rows, n_out, k_in, group);
}

// Rows of 32-input groups take quant_gemm_q8_columns.cpp's kernel where it fits (any number of rows).
void int4_gemm_q8(const int8_t* xq, const float* dx, const float* sx, const uint8_t* q, const uint16_t* scales,
                  const uint16_t* offsets, float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  if (!int4_gemm_q8_columns(xq, dx, sx, q, scales, offsets, out, rows, n_out, k_in, group))
    gemm_q8<true>(xq, dx, sx, q, scales, offsets, out, rows, n_out, k_in, group);
}

}  // extern "C"
