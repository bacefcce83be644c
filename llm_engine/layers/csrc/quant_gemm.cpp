// Weight-only quantized matmuls, out[m, n] = sum_k x[m, k] * w[n, k], reading the packed weights
// directly (no dequantized copy of the matrix). Weights are row-major per output channel and
// split into groups of `group` input features, each with a float16 scale (int4 also an offset;
// float16 as in GGUF's blocks, so they are kept as they are):
//   int8: w = q * scale                      q: int8, one byte per weight
//   int4: w = q * scale + offset             q: 0..15, two per byte; in each group byte j holds
//                                            element j (low nibble) and j + group/2 (high nibble),
//                                            the layout of GGUF's Q4_0/Q4_1 blocks.
// Each thread widens one output channel at a time into a K-float buffer that stays in L1 and
// dots every row of x with it: memory traffic is the packed bytes, and the widening is paid once
// per channel however many rows x has. AVX2+FMA where the compiler targets it (plain loops
// elsewhere and for tails); output channels are spread over torch's OpenMP threads.

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
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

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline __m256 widen(__m128i bytes8, bool is_signed) {  // 8 integers in the low bytes -> 8 floats
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes8) : _mm256_cvtepu8_epi32(bytes8));
}
#endif

// One group's weights as floats, q * scale + offset (int8: offset 0; int4: low nibbles then high).
inline void widen_int8(const int8_t* q, int64_t n, float scale, float* out) {
  int64_t k = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 s = _mm256_set1_ps(scale);
  for (; k + 8 <= n; k += 8)
    _mm256_storeu_ps(out + k, _mm256_mul_ps(widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k)), true), s));
#endif
  for (; k < n; ++k) out[k] = static_cast<float>(q[k]) * scale;
}

inline void widen_int4(const uint8_t* q, int64_t n, float scale, float offset, float* out) {
  const int64_t half = n / 2;
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m128i low = _mm_set1_epi8(15);
  const __m256 s = _mm256_set1_ps(scale), o = _mm256_set1_ps(offset);
  for (; j + 8 <= half; j += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
    _mm256_storeu_ps(out + j, _mm256_fmadd_ps(widen(_mm_and_si128(bytes, low), false), s, o));
    _mm256_storeu_ps(out + j + half, _mm256_fmadd_ps(widen(_mm_and_si128(_mm_srli_epi16(bytes, 4), low), false), s, o));
  }
#endif
  for (; j < half; ++j) {
    out[j] = static_cast<float>(q[j] & 15) * scale + offset;
    out[j + half] = static_cast<float>(q[j] >> 4) * scale + offset;
  }
}

inline float dot(const float* x, const float* w, int64_t n) {
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
}

// The last group may be shorter (K not a multiple of `group`; for int4 its length is even).
template <bool INT4>
void gemm(const float* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out,
          int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  const int64_t groups = (k_in + group - 1) / group, row_bytes = INT4 ? k_in / 2 : k_in;
#pragma omp parallel
  {
    float* w = new float[k_in];  // one output channel's weights, dequantized in L1
#pragma omp for schedule(static)
    for (int64_t n = 0; n < n_out; ++n) {
      const uint8_t* qn = q + n * row_bytes;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t start = g * group, length = k_in - start < group ? k_in - start : group;
        const float scale = half_to_float(scales[n * groups + g]);
        if (INT4) widen_int4(qn + start / 2, length, scale, half_to_float(offsets[n * groups + g]), w + start);
        else widen_int8(reinterpret_cast<const int8_t*>(qn) + start, length, scale, w + start);
      }
      for (int64_t m = 0; m < rows; ++m) out[m * n_out + n] = dot(x + m * k_in, w, k_in);
    }
    delete[] w;
  }
}

}  // namespace

extern "C" {

void int8_gemm_f32(const float* x, const int8_t* q, const uint16_t* scales, float* out, int64_t rows,
                   int64_t n_out, int64_t k_in, int64_t group) {
  gemm<false>(x, reinterpret_cast<const uint8_t*>(q), scales, nullptr, out, rows, n_out, k_in, group);
}

void int4_gemm_f32(const float* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, float* out,
                   int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  gemm<true>(x, q, scales, offsets, out, rows, n_out, k_in, group);
}

}  // extern "C"
