// Batched rows of the integer-activation matmuls (w8a8/w4a8: quant_gemm.cpp's int*_gemm_q8, the
// same inputs after quantize_rows_q8) on Intel AMX tiles, where the CPU and the compiler have them.
// Why: on such a CPU oneDNN's bf16 matmul runs on AMX, and a kernel that widens int4 codes to
// float (or dots 32 bytes per VNNI instruction) stays several times slower per batched row.
//
// The tile product is out^T: A = 16 output channels x 32 weight codes (the packed row's codes
// unpacked to bytes, once per 16 channels and call), B = 32 inputs x 16 rows of int8 activations
// in the tile's 4-byte-interleaved layout (built once per call), C = 16 x 16 int32 sums of one
// 32-input sub-block: the exact integer sums the VNNI kernel forms. Each C is then scaled in
// float as the other kernel does per sub-block, scale_w * dx * sum(q xq) (+ offset_w * dx * sum(xq)
// for int4), into 16 accumulators of 16 rows; only the float summation order differs.
// int4 codes are unsigned (u8 x s8 `tdpbusd`), int8 weights signed (`tdpbssd`).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__) && defined(__F16C__)
#define CODEYARD_AMX 1
#include <immintrin.h>

#include "amx.h"
#endif

namespace {

#ifdef CODEYARD_AMX
constexpr int64_t SUB = 32;    // inputs per tile product (and per activation scale)
constexpr int64_t BLOCK = 16;  // output channels (A's rows) and activation rows (B's columns) per tile
constexpr int64_t CHUNK_BLOCKS = 16;  // row blocks per pass over the weights

template <typename T>
struct Aligned : std::allocator<T> {  // 64-byte aligned storage: the scaling loads whole cache lines
  template <typename U> struct rebind { using other = Aligned<U>; };
  Aligned() = default;
  template <typename U> Aligned(const Aligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
};

void load_tile_config() {  // per thread: tiles 0 and 3 = C, 1 and 4 = A (weights), 2 and 5 = B (activations)
  codeyard_amx::TileConfig config;
  for (int t : {0, 3}) {
    config.rows[t] = BLOCK, config.colsb[t] = BLOCK * 4;
    config.rows[t + 1] = BLOCK, config.colsb[t + 1] = SUB;
    config.rows[t + 2] = SUB / 4, config.colsb[t + 2] = BLOCK * 4;
  }
  _tile_loadconfig(&config);
}

// Codes of one packed int4 weight row as bytes in input order (group layout as in quant_gemm.cpp:
// a 32-input group's byte j holds element j and j + 16; longer groups run low nibbles then high).
void unpack_int4_row(const uint8_t* qn, int64_t k_in, int64_t group, uint8_t* codes) {
  const __m256i low = _mm256_set1_epi8(15);
  for (int64_t start = 0; start < k_in; start += group) {
    const int64_t length = k_in - start < group ? k_in - start : group;
    const uint8_t* bytes = qn + start / 2;
    if (length == SUB) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
      const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + start), _mm256_and_si256(both, low));
      continue;
    }
    for (int64_t chunk = 0; chunk < length / 64; ++chunk) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + chunk * 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + start + chunk * 32), _mm256_and_si256(b, low));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + start + length / 2 + chunk * 32),
                          _mm256_and_si256(_mm256_srli_epi16(b, 4), low));
    }
  }
}

// The activations of each 16-row block as B tiles, [row block][sub-block][4-input step][row][4
// inputs], and their per-sub-block dx and dx * sum(xq) as [row block][sub-block][row]; rows past
// the end are zeros.
struct TiledRows {
  std::vector<int32_t> xq;
  std::vector<float> dx, sx;

  TiledRows(const int8_t* xq_rows, const float* dx_rows, const float* sx_rows, int64_t rows, int64_t k_in)
      : xq(((rows + BLOCK - 1) / BLOCK) * k_in / 4 * BLOCK, 0),
        dx(((rows + BLOCK - 1) / BLOCK) * (k_in / SUB) * BLOCK, 0.0f),
        sx(dx.size(), 0.0f) {
    const int64_t subs = k_in / SUB;
    for (int64_t m = 0; m < rows; ++m) {
      const int64_t block = m / BLOCK, r = m % BLOCK;
      for (int64_t step = 0; step < k_in / 4; ++step)
        std::memcpy(&xq[(block * (k_in / 4) + step) * BLOCK + r], xq_rows + m * k_in + step * 4, 4);
      for (int64_t s = 0; s < subs; ++s) {
        dx[(block * subs + s) * BLOCK + r] = dx_rows[m * subs + s];
        sx[(block * subs + s) * BLOCK + r] = sx_rows[m * subs + s];
      }
    }
  }
};

// Tile C = tile A (16 channels' codes of sub-block s) x tile B (16 rows' activations of sub-block s).
// A macro: GCC's tile intrinsics take the tile numbers as literals.
#define TILE_PRODUCT(INT4, C, A, B, codes, x_block, k_in, s)                     \
  do {                                                                            \
    _tile_zero(C);                                                                \
    _tile_loadd(A, (codes) + (s) * SUB, k_in);                                    \
    _tile_loadd(B, (x_block) + (s) * (SUB / 4) * BLOCK, BLOCK * 4);               \
    if (INT4) _tile_dpbusd(C, A, B);                                              \
    else _tile_dpbssd(C, A, B);                                                   \
  } while (0)

// acc[c] (16 rows of channel c) += scale_c * dx * sums[c] (+ offset_c * dx * sum(xq)): one sub-block
// (scale and offset of channel c at c * subs).
template <bool INT4>
inline void scale_sums(const int32_t* sums, const float* dx, const float* sx, const float* scale, const float* offset,
                       int64_t subs, __m512* acc) {
  const __m512 d = _mm512_loadu_ps(dx), xs = _mm512_loadu_ps(sx);
#pragma GCC unroll 16
  for (int64_t c = 0; c < BLOCK; ++c) {  // a constant trip count keeps acc[] in registers
    const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + c * BLOCK)), d);
    acc[c] = _mm512_fmadd_ps(dot, _mm512_set1_ps(scale[c * subs]), acc[c]);
    if (INT4) acc[c] = _mm512_fmadd_ps(xs, _mm512_set1_ps(offset[c * subs]), acc[c]);
  }
}

// A channel's float16 scales (or offsets), one per group, as floats, one per 32-input sub-block.
inline void widen_per_sub(const uint16_t* halves, int64_t subs, int64_t group, float* out) {
  if (group == SUB) {  // GGUF's blocks: one per sub-block already
    int64_t s = 0;
    for (; s + 16 <= subs; s += 16)
      _mm512_storeu_ps(out + s, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves + s))));
    for (; s < subs; ++s) out[s] = _cvtsh_ss(halves[s]);
    return;
  }
  for (int64_t s = 0; s < subs; ++s) out[s] = _cvtsh_ss(halves[s * SUB / group]);
}

// Channels n0..n0+15's codes as A's rows, and each one's scale and offset per sub-block
// ([channel][sub-block]); channels past n_out are zeros.
template <bool INT4>
void load_channels(const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, int64_t n0, int64_t n_out,
                   int64_t k_in, int64_t group, uint8_t* codes, float* scale, float* offset) {
  const int64_t subs = k_in / SUB, groups = (k_in + group - 1) / group, row_bytes = INT4 ? k_in / 2 : k_in;
  for (int64_t c = 0; c < BLOCK; ++c) {
    const int64_t n = n0 + c;
    uint8_t* row = codes + c * k_in;
    if (n >= n_out) {
      std::memset(row, 0, k_in);
      std::fill(scale + c * subs, scale + (c + 1) * subs, 0.0f);
      std::fill(offset + c * subs, offset + (c + 1) * subs, 0.0f);
      continue;
    }
    if (INT4) unpack_int4_row(q + n * row_bytes, k_in, group, row);
    else std::memcpy(row, q + n * row_bytes, k_in);
    widen_per_sub(scales + n * groups, subs, group, scale + c * subs);
    if (INT4) widen_per_sub(offsets + n * groups, subs, group, offset + c * subs);
  }
}

// out[rows of block mb, channels n0..] from the loaded channels: every sub-block's integer sums
// first, then their scaling (by then the tile stores are in memory; a store-then-load per
// sub-block stalled on each).
template <bool INT4>
void row_block(const TiledRows& x, int64_t mb, const uint8_t* codes, const float* scale, const float* offset,
               int32_t* sums, float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t n0) {
  const int64_t subs = k_in / SUB;
  const int32_t* x_block = x.xq.data() + mb * (k_in / 4) * BLOCK;
  for (int64_t s = 0; s + 1 < subs; s += 2) {  // two tile sets, so consecutive products overlap
    TILE_PRODUCT(INT4, 0, 1, 2, codes, x_block, k_in, s);
    TILE_PRODUCT(INT4, 3, 4, 5, codes, x_block, k_in, s + 1);
    _tile_stored(0, sums + s * BLOCK * BLOCK, BLOCK * 4);
    _tile_stored(3, sums + (s + 1) * BLOCK * BLOCK, BLOCK * 4);
  }
  if (subs % 2) {
    TILE_PRODUCT(INT4, 0, 1, 2, codes, x_block, k_in, subs - 1);
    _tile_stored(0, sums + (subs - 1) * BLOCK * BLOCK, BLOCK * 4);
  }
  __m512 acc[BLOCK];
  for (int64_t c = 0; c < BLOCK; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t s = 0; s < subs; ++s)
    scale_sums<INT4>(sums + s * BLOCK * BLOCK, x.dx.data() + (mb * subs + s) * BLOCK,
                     x.sx.data() + (mb * subs + s) * BLOCK, scale + s, offset + s, subs, acc);
  alignas(64) float result[BLOCK * BLOCK];  // [channel][row]: transposed on the way out
  for (int64_t c = 0; c < BLOCK; ++c) _mm512_store_ps(result + c * BLOCK, acc[c]);
  const int64_t block_rows = rows - mb * BLOCK < BLOCK ? rows - mb * BLOCK : BLOCK;
  const int64_t channels = n_out - n0 < BLOCK ? n_out - n0 : BLOCK;
  for (int64_t r = 0; r < block_rows; ++r)
    for (int64_t c = 0; c < channels; ++c) out[(mb * BLOCK + r) * n_out + n0 + c] = result[c * BLOCK + r];
}

template <bool INT4>
void gemm_q8_amx(const int8_t* xq, const float* dx, const float* sx, const uint8_t* q, const uint16_t* scales,
                 const uint16_t* offsets, float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  const int64_t subs = k_in / SUB;
  const int64_t row_blocks = (rows + BLOCK - 1) / BLOCK, channel_blocks = (n_out + BLOCK - 1) / BLOCK;
  const TiledRows x(xq, dx, sx, rows, k_in);
#pragma omp parallel
  {
    load_tile_config();
    std::vector<uint8_t> codes(BLOCK * k_in);
    std::vector<float> scale(subs * BLOCK), offset(subs * BLOCK);
    std::vector<int32_t, Aligned<int32_t>> sums(subs * BLOCK * BLOCK);  // C of each sub-block of a row block
    // a prefill's rows in chunks whose activations stay in L2 while every channel block passes over them
    for (int64_t first = 0; first < row_blocks; first += CHUNK_BLOCKS) {
      const int64_t last = first + CHUNK_BLOCKS < row_blocks ? first + CHUNK_BLOCKS : row_blocks;
#pragma omp for schedule(static)
      for (int64_t nb = 0; nb < channel_blocks; ++nb) {
        load_channels<INT4>(q, scales, offsets, nb * BLOCK, n_out, k_in, group, codes.data(), scale.data(),
                            offset.data());
        for (int64_t mb = first; mb < last; ++mb)
          row_block<INT4>(x, mb, codes.data(), scale.data(), offset.data(), sums.data(), out, rows, n_out, k_in,
                          nb * BLOCK);
      }
    }
    _tile_release();
  }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the AMX kernels and the OS granted the tile state, else 0 (callers then
// keep quant_gemm.cpp's int*_gemm_q8, which take the same inputs).
int32_t amx_int8_ready() {
#ifdef CODEYARD_AMX
  return codeyard_amx::tile_state_granted() ? 1 : 0;
#else
  return 0;
#endif
}

#ifdef CODEYARD_AMX
void int8_gemm_q8_amx(const int8_t* xq, const float* dx, const float* sx, const int8_t* q, const uint16_t* scales,
                      float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  gemm_q8_amx<false>(xq, dx, sx, reinterpret_cast<const uint8_t*>(q), scales, nullptr, out, rows, n_out, k_in,
                     group);
}

void int4_gemm_q8_amx(const int8_t* xq, const float* dx, const float* sx, const uint8_t* q, const uint16_t* scales,
                      const uint16_t* offsets, float* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  gemm_q8_amx<true>(xq, dx, sx, q, scales, offsets, out, rows, n_out, k_in, group);
}
#endif

}  // extern "C"
