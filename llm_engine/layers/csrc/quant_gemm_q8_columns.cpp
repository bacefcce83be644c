// Batched w4a8 on AVX2: int4 weights of 32-input groups (GGUF's Q4 blocks) times activations
// rounded to int8 per 32 inputs (quant_gemm.cpp's quantize_rows_q8), for many rows at once.
//
// Why a second int4 x int8 kernel: quant_gemm.cpp's gemm_q8 reduces each row's 32-input dot
// product across the lanes of a vector (vpmaddubsw, vpmaddwd, a conversion and an FMA per row
// and group: ~8 MACs per vector op), so at 64 rows it is no faster than float32's oneDNN matmul.
// Here the lanes hold eight output channels instead. A group's codes for 8 channels are
// transposed once into eight vectors (lane j: 4 consecutive codes of channel j), and each row then
// costs, per group, 8 vpmaddubsw against a broadcast of 4 of its activations, summed in int16
// (exact: |pair| <= 2 * 15 * 127, eight of them <= 30480), one vpmaddwd to widen, a conversion and
// three float ops for the scales: ~20 ops per 256 multiply-adds. The transposition is paid once per
// group and 8 channels whatever the rows.
//   out[m, n] = sum_g s[n, g] dx[m, g] sum_k q[n, k] xq[m, k] + o[n, g] sx[m, g]
// (sx = dx * sum_k xq[m, k]), the sums exact in int32 and then accumulated over the groups in
// float32: gemm_q8's result up to float32 summation order.

#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace {

constexpr int64_t COLUMNS = 8;   // output channels per pass: the 8 float lanes of a vector
constexpr int64_t ROW_TILE = 64; // rows per pass over the weights: their 8-lane sums stay in L1 (2 KiB)

// Group g's 32 codes of 8 channels as 8 vectors: codes[s] lane j = codes 4s..4s+3 of channel j
// (s < 4: the low nibbles of bytes 4s..4s+3; s >= 4: the high nibbles of bytes 4(s-4)..).
inline void transpose_group(const uint8_t* q, int64_t row_bytes, int64_t g, __m256i codes[8]) {
  __m256i pair[4];  // channel j in the low 128 bits, channel j + 4 in the high ones
  for (int j = 0; j < 4; ++j)
    pair[j] = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j * row_bytes + g * 16))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + (j + 4) * row_bytes + g * 16)), 1);
  // a 4x4 transpose of 32-bit words in each 128-bit half: word d of every channel together
  const __m256i t0 = _mm256_unpacklo_epi32(pair[0], pair[1]), t1 = _mm256_unpackhi_epi32(pair[0], pair[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(pair[2], pair[3]), t3 = _mm256_unpackhi_epi32(pair[2], pair[3]);
  const __m256i words[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                            _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
  const __m256i low = _mm256_set1_epi8(15);
  for (int d = 0; d < 4; ++d) {
    codes[d] = _mm256_and_si256(words[d], low);
    codes[d + 4] = _mm256_and_si256(_mm256_srli_epi16(words[d], 4), low);
  }
}

// rows (<= ROW_TILE) rows against channels n0 .. n0 + 7. The lanes come out in channel order
// 0, 1, 2, 3, 4, 5, 6, 7: pair[j]'s halves put channel j in lane j and j + 4 in lane j + 4.
void columns8(const int8_t* xq, const float* dx, const float* sx, const uint8_t* q, const uint16_t* scales,
              const uint16_t* offsets, float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t n0) {
  const int64_t groups = k_in / 32, row_bytes = k_in / 2;
  const uint8_t* qn = q + n0 * row_bytes;
  alignas(32) float acc[ROW_TILE][COLUMNS];
  for (int64_t m = 0; m < rows; ++m) _mm256_store_ps(acc[m], _mm256_setzero_ps());
  alignas(32) uint16_t scale_half[COLUMNS], offset_half[COLUMNS];
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i codes[8];
    transpose_group(qn, row_bytes, g, codes);
    for (int j = 0; j < COLUMNS; ++j) {
      scale_half[j] = scales[(n0 + j) * groups + g];
      offset_half[j] = offsets[(n0 + j) * groups + g];
    }
    const __m256 scale = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scale_half)));
    const __m256 offset = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(offset_half)));
    for (int64_t m = 0; m < rows; ++m) {
      const int8_t* xg = xq + m * k_in + g * 32;
      __m256i p[8];
      for (int s = 0; s < 8; ++s) {
        int32_t four;
        __builtin_memcpy(&four, xg + 4 * s, 4);
        p[s] = _mm256_maddubs_epi16(codes[s], _mm256_set1_epi32(four));
      }
      const __m256i pairs = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                                             _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
      __m256 sum = _mm256_load_ps(acc[m]);
      sum = _mm256_fmadd_ps(_mm256_mul_ps(dot, scale), _mm256_set1_ps(dx[m * groups + g]), sum);
      sum = _mm256_fmadd_ps(offset, _mm256_set1_ps(sx[m * groups + g]), sum);
      _mm256_store_ps(acc[m], sum);
    }
  }
  for (int64_t m = 0; m < rows; ++m) _mm256_storeu_ps(out + m * n_out + n0, _mm256_load_ps(acc[m]));
}

}  // namespace
#endif

extern "C" {

// Whether int4_gemm_q8_columns multiplies this shape (quantization.py then sends it every row count).
int32_t int4_q8_columns_fit(int64_t n_out, int64_t k_in, int64_t group) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  return group == 32 && k_in % 32 == 0 && n_out % COLUMNS == 0;
#else
  (void)n_out, (void)k_in, (void)group;
  return 0;
#endif
}

// int4_gemm_q8's rows of 32-input groups on channels in eights: 1 when done, 0 when this build
// or shape cannot (no AVX2, other groups, channels not a multiple of 8); the caller then takes
// gemm_q8. xq/dx/sx as quantize_rows_q8 gives them with 32-input blocks.
int32_t int4_gemm_q8_columns(const int8_t* xq, const float* dx, const float* sx, const uint8_t* q,
                             const uint16_t* scales, const uint16_t* offsets, float* out, int64_t rows,
                             int64_t n_out, int64_t k_in, int64_t group) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (!int4_q8_columns_fit(n_out, k_in, group)) return 0;
  const int64_t groups = k_in / 32;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t m0 = 0; m0 < rows; m0 += ROW_TILE)
    for (int64_t n0 = 0; n0 < n_out; n0 += COLUMNS) {
      const int64_t tile = rows - m0 < ROW_TILE ? rows - m0 : ROW_TILE;
      columns8(xq + m0 * k_in, dx + m0 * groups, sx + m0 * groups, q, scales, offsets, out + m0 * n_out, tile,
               n_out, k_in, n0);
    }
  return 1;
#else
  (void)xq, (void)dx, (void)sx, (void)q, (void)scales, (void)offsets, (void)out, (void)rows, (void)n_out,
      (void)k_in, (void)group;
  return 0;
#endif
}

}  // extern "C"
