// Batched rows of the weight-only int4/int8 matmuls (quant_gemm.cpp's layouts) for bfloat16
// activations, on Intel AMX bf16 tiles. Why: on such a CPU oneDNN's bf16 matmul of a float model
// runs on AMX, and the float-activation kernel (which widens every code to float32 for every row)
// stays ~3x slower per batched row than it. Here each pass dequantizes 32 output channels into a
// small bfloat16 buffer (code * scale + offset in float32, dequantize's two roundings, then
// rounded to bfloat16 as `.to(torch.bfloat16)` rounds), and `tdpbf16ps` multiplies it with every
// row block of the activations, accumulating in float32 over all of K: weights stream from memory
// at 4 (or 8) bits and the dequantization is paid once per channel for all rows. The result is
// F.linear(x, dequantize(W).bfloat16()) up to float summation order, and each row's sums are
// the same whatever rows are beside it.
//
// The tile product is out^T: A = 16 channels x 32 bf16 weights (the buffer's rows as they are),
// B = 32 inputs x 16 activation rows in the tile's pair-interleaved layout (built once per call),
// C = 16 channels x 16 rows of float32 sums. Two A and two B tiles feed four C tiles (32 channels
// x 32 rows) per step. int4 codes widen through a per-group 16-entry table of bfloat16 values
// (`vpermw`); int8 codes through float32. Every group (the last one too) must be a multiple of
// 32 inputs; the caller checks (quantization.py).

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__F16C__)
#define CODEYARD_AMX_BF16 1
#include <immintrin.h>

#include <omp.h>

#include "amx.h"
#endif

namespace {

#ifdef CODEYARD_AMX_BF16
constexpr int64_t STEP = 32;          // inputs per tile product (an A row: 64 bytes of bf16)
constexpr int64_t BLOCK = 16;         // channels per A tile, activation rows per B tile
constexpr int64_t CHUNK_BLOCKS = 16;  // row blocks per pass over the weights: a prefill's rows stay in L2

struct Bf16Buffer {  // 64-byte aligned bfloat16 storage (tile loads read whole cache lines)
  uint16_t* data;
  explicit Bf16Buffer(int64_t n) : data(static_cast<uint16_t*>(::operator new(n * 2, std::align_val_t(64)))) {}
  ~Bf16Buffer() { ::operator delete(data, std::align_val_t(64)); }
  Bf16Buffer(const Bf16Buffer&) = delete;
  Bf16Buffer& operator=(const Bf16Buffer&) = delete;
};

void load_tile_config() {  // per thread: tiles 0-3 = C, 4 and 5 = A (weights), 6 and 7 = B (activations)
  codeyard_amx::TileConfig config;
  for (int t = 0; t < 8; ++t) config.rows[t] = BLOCK, config.colsb[t] = 64;
  _tile_loadconfig(&config);
}

inline __m256i bf16_of(__m512 v) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)); }

// One channel's weights as bfloat16 [k_in]. int4: a group's byte j holds element j (low nibble)
// and j + length/2 (high), length the group's (or the shorter last group's) size.
// (scales and offsets: the channel's, one per group, already float32)
void dequantize_int4_row(const uint8_t* qn, const float* scales, const float* offsets, int64_t k_in,
                         int64_t group, uint16_t* w) {
  const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m256i low = _mm256_set1_epi16(15);
  int64_t start = 0, g = 0;
  if (group == 32) {  // two 32-input groups a step: one 32-entry table (group g's 16 values, then g+1's)
    const __m512i low16 = _mm512_set1_epi16(15);
    const __m512i second = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
    for (; start + 64 <= k_in; start += 64, g += 2) {
      const __m512 first_level =
          _mm512_add_ps(_mm512_mul_ps(codes, _mm512_set1_ps(scales[g])), _mm512_set1_ps(offsets[g]));
      const __m512 second_level =
          _mm512_add_ps(_mm512_mul_ps(codes, _mm512_set1_ps(scales[g + 1])), _mm512_set1_ps(offsets[g + 1]));
      const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(second_level, first_level));
      // 16 code bytes of group g, then 16 of g + 1, widened; g + 1's indices moved to the table's upper half
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qn + start / 2)));
      const __m512i lows = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_and_si512(b, low16), second), table);
      const __m512i highs = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_srli_epi16(b, 4), second), table);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + start), _mm512_castsi512_si256(lows));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + start + 16), _mm512_castsi512_si256(highs));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + start + 32), _mm512_extracti64x4_epi64(lows, 1));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + start + 48), _mm512_extracti64x4_epi64(highs, 1));
    }
  }
  for (; start < k_in; start += group, ++g) {
    const int64_t half = (k_in - start < group ? k_in - start : group) / 2;
    // code * scale, then + offset: dequantize's two float32 roundings (-ffp-contract=off), then bf16
    const __m512 level = _mm512_add_ps(_mm512_mul_ps(codes, _mm512_set1_ps(scales[g])), _mm512_set1_ps(offsets[g]));
    const __m256i table = bf16_of(level);
    const uint8_t* bytes = qn + start / 2;
    for (int64_t j = 0; j < half; j += 16) {
      const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + j)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + start + j),
                          _mm256_permutexvar_epi16(_mm256_and_si256(b, low), table));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + start + half + j),
                          _mm256_permutexvar_epi16(_mm256_srli_epi16(b, 4), table));
    }
  }
}

void dequantize_int8_row(const int8_t* qn, const float* scales, int64_t k_in, int64_t group, uint16_t* w) {
  for (int64_t start = 0, g = 0; start < k_in; start += group, ++g) {
    const int64_t end = k_in - start < group ? k_in : start + group;
    const __m512 scale = _mm512_set1_ps(scales[g]);
    for (int64_t k = start; k < end; k += 32) {
      const __m128i* codes = reinterpret_cast<const __m128i*>(qn + k);
      const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes))), scale);
      const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes + 1))), scale);
      _mm512_storeu_si512(w + k, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

void widen_halves(const uint16_t* halves, int64_t n, float* out) {  // float16 -> float32
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(halves[i]);
}

// Channel n's weights as bfloat16 [k_in]. `factors`: room for its scales and offsets as float32
// (2 x groups).
template <bool INT4>
void dequantize_channel(const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, int64_t n, int64_t k_in,
                        int64_t group, uint16_t* row, float* factors) {
  const int64_t groups = (k_in + group - 1) / group, row_bytes = INT4 ? k_in / 2 : k_in;
  widen_halves(scales + n * groups, groups, factors);
  if (INT4) {
    widen_halves(offsets + n * groups, groups, factors + groups);
    dequantize_int4_row(q + n * row_bytes, factors, factors + groups, k_in, group, row);
  } else {
    dequantize_int8_row(reinterpret_cast<const int8_t*>(q) + n * row_bytes, factors, k_in, group, row);
  }
}

// Channel n's packed codes, scales and offsets into L2: the next pass's, asked for while this pass
// runs, so that its dequantization does not wait on memory (the codes are what a step streams).
template <bool INT4>
void prefetch_channel(const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, int64_t n, int64_t k_in,
                      int64_t group) {
  const int64_t groups = (k_in + group - 1) / group, row_bytes = INT4 ? k_in / 2 : k_in;
  const char* codes = reinterpret_cast<const char*>(q + n * row_bytes);
  for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(codes + b, _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(scales + n * groups), _MM_HINT_T1);
  if (INT4) _mm_prefetch(reinterpret_cast<const char*>(offsets + n * groups), _MM_HINT_T1);
}

// Channels n0..n0+31 as bfloat16 rows of w [32][k_in], a few at a time; channels past n_out are
// zeros. Each one's successor 32 channels on (the pass after) is prefetched on the way.
template <bool INT4>
struct PassChannels {
  const uint8_t* q;
  const uint16_t* scales;
  const uint16_t* offsets;
  int64_t n0, n_out, k_in, group;
  uint16_t* w;
  float* factors;
  int64_t done = 0;

  void one() {
    const int64_t c = done++;
    if (n0 + 2 * BLOCK + c < n_out) prefetch_channel<INT4>(q, scales, offsets, n0 + 2 * BLOCK + c, k_in, group);
    if (n0 + c < n_out) dequantize_channel<INT4>(q, scales, offsets, n0 + c, k_in, group, w + c * k_in, factors);
    else std::memset(w + c * k_in, 0, k_in * 2);
  }
  void all() {
    while (done < 2 * BLOCK) one();
  }
};

// The next pass's channels, dequantized between this pass's tile products (`step` after each
// k step, spread evenly over `steps` of them): the AVX-512 dequantization then runs beside the AMX
// products instead of after them. The same bits as dequantizing the pass up front.
template <bool INT4>
struct NextPass {
  PassChannels<INT4> channels;
  int64_t steps_left;

  void step() {
    if (steps_left <= 0) return;
    for (int64_t todo = (2 * BLOCK - channels.done + steps_left - 1) / steps_left; todo > 0; --todo) channels.one();
    --steps_left;
  }
};

// 16 x 16 32-bit elements transposed in registers: on return t[i] holds column ROW_OF[i] of the
// rows t held (the 4 x 4 step swaps columns 1 and 2; callers store each t[i] where it belongs).
constexpr int ROW_OF[BLOCK] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
inline void transpose16(__m512* t) {
  __m512 u[BLOCK];
  for (int i = 0; i < BLOCK; i += 2) {  // 2 x 2 blocks of floats
    u[i] = _mm512_unpacklo_ps(t[i], t[i + 1]);
    u[i + 1] = _mm512_unpackhi_ps(t[i], t[i + 1]);
  }
  for (int i = 0; i < BLOCK; i += 4)
    for (int j = 0; j < 2; ++j) {  // 4 x 4
      t[i + j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i + j]), _mm512_castps_pd(u[i + j + 2])));
      t[i + j + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i + j]), _mm512_castps_pd(u[i + j + 2])));
    }
  for (int i = 0; i < BLOCK; i += 8)
    for (int j = 0; j < 4; ++j) {  // 8 x 8: 128-bit lanes
      u[i + j] = _mm512_shuffle_f32x4(t[i + j], t[i + j + 4], 0x88);
      u[i + j + 4] = _mm512_shuffle_f32x4(t[i + j], t[i + j + 4], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {  // 16 x 16
    t[j] = _mm512_shuffle_f32x4(u[j], u[j + 8], 0x88);
    t[j + 8] = _mm512_shuffle_f32x4(u[j], u[j + 8], 0xDD);
  }
}

// The activations' row blocks as B tiles: [row block][input pair][row][2 inputs], rows past the
// end zeros; 16 rows x 16 input pairs transposed at a time (k_in is a multiple of 32).
void tiled_rows(const uint16_t* x, int64_t rows, int64_t k_in, uint32_t* xt) {
  const int64_t pairs = k_in / 2;
  for (int64_t r0 = 0; r0 < rows; r0 += BLOCK) {
    const int64_t block_rows = rows - r0 < BLOCK ? rows - r0 : BLOCK;
    uint32_t* block = xt + r0 * pairs;
    for (int64_t p = 0; p < pairs; p += BLOCK) {
      __m512 t[BLOCK];
      for (int i = 0; i < BLOCK; ++i)
        t[i] = i < block_rows ? _mm512_castsi512_ps(_mm512_loadu_si512(x + (r0 + i) * k_in + 2 * p)) : _mm512_setzero_ps();
      transpose16(t);
      for (int i = 0; i < BLOCK; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(block + (p + ROW_OF[i]) * BLOCK), t[i]);
    }
  }
}

// The 16 x 16 float sums of C [channel][row] into out's rows r0.. (bf16, channels n0..): C
// transposed in registers (a column of C is a row of out; a gather per row cost ~4x more).
void write_block(const float* c, uint16_t* out, int64_t r0, int64_t block_rows, int64_t n0, int64_t n_out) {
  const int64_t channels = n_out - n0;
  if (channels <= 0) return;
  const __mmask16 mask = channels >= BLOCK ? 0xFFFF : static_cast<__mmask16>((1u << channels) - 1);
  __m512 t[BLOCK];
  for (int i = 0; i < BLOCK; ++i) t[i] = _mm512_load_ps(c + i * BLOCK);
  transpose16(t);  // t[i]: row ROW_OF[i] of out, 16 channels in order
  for (int i = 0; i < BLOCK; ++i) {
    const int r = ROW_OF[i];
    if (r < block_rows) _mm256_mask_storeu_epi16(out + (r0 + r) * n_out + n0, mask, bf16_of(t[i]));
  }
}

// out[row blocks mb (and mb + 1 if TWO), channels n0..n0+31] from the dequantized channels w.
// (GCC's tile intrinsics take the tile numbers as literals, hence the spelled-out tiles.)
template <bool TWO, typename Next>
void multiply_row_blocks(const uint16_t* w, const uint32_t* xt, int64_t mb, int64_t rows, int64_t n0, int64_t n_out,
                int64_t k_in, float* c, uint16_t* out, Next* next) {
  const int64_t pairs = k_in / 2;
  const uint32_t* x0 = xt + mb * pairs * BLOCK;
  const uint32_t* x1 = x0 + pairs * BLOCK;
  _tile_zero(0);
  _tile_zero(1);
  if (TWO) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k = 0; k < k_in; k += STEP) {
    _tile_loadd(4, w + k, k_in * 2);
    _tile_loadd(5, w + BLOCK * k_in + k, k_in * 2);
    _tile_loadd(6, x0 + k / 2 * BLOCK, BLOCK * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if (TWO) {
      _tile_loadd(7, x1 + k / 2 * BLOCK, BLOCK * 4);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    if (next != nullptr) next->step();
  }
  constexpr int64_t TILE = BLOCK * BLOCK;
  _tile_stored(0, c, BLOCK * 4);
  _tile_stored(1, c + TILE, BLOCK * 4);
  if (TWO) {
    _tile_stored(2, c + 2 * TILE, BLOCK * 4);
    _tile_stored(3, c + 3 * TILE, BLOCK * 4);
  }
  for (int64_t b = 0; b < (TWO ? 2 : 1); ++b) {
    const int64_t r0 = (mb + b) * BLOCK, block_rows = rows - r0 < BLOCK ? rows - r0 : BLOCK;
    write_block(c + 2 * b * TILE, out, r0, block_rows, n0, n_out);
    write_block(c + (2 * b + 1) * TILE, out, r0, block_rows, n0 + BLOCK, n_out);
  }
}

template <bool INT4>
void gemm_bf16_amx(const uint16_t* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets,
                   uint16_t* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  const int64_t row_blocks = (rows + BLOCK - 1) / BLOCK, channel_pairs = (n_out + 2 * BLOCK - 1) / (2 * BLOCK);
  Bf16Buffer xt_storage(2 * row_blocks * BLOCK * (k_in / 2));  // 32-bit pairs
  uint32_t* xt = reinterpret_cast<uint32_t*>(xt_storage.data);
  tiled_rows(x, rows, k_in, xt);
#pragma omp parallel
  {
    load_tile_config();
    // this pass's channels and the next's (the second only where passes overlap: two row blocks or more)
    Bf16Buffer w0(2 * BLOCK * k_in), w1(row_blocks > 1 ? 2 * BLOCK * k_in : 32);
    std::vector<float> factors(2 * ((k_in + group - 1) / group));
    alignas(64) float c[4 * BLOCK * BLOCK];
    // this thread's passes, split by hand (not `omp for`) so that a pass knows its successor
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t share = channel_pairs / threads, extra = channel_pairs % threads;
    const int64_t begin = thread * share + (thread < extra ? thread : extra);
    const int64_t end = begin + share + (thread < extra ? 1 : 0);
    for (int64_t first = 0; first < row_blocks && begin < end; first += CHUNK_BLOCKS) {
      const int64_t last = first + CHUNK_BLOCKS < row_blocks ? first + CHUNK_BLOCKS : row_blocks;
      const int64_t steps = (last - first + 1) / 2 * (k_in / STEP);  // k steps of a pass
      // one row block (16 rows or fewer): too few products to hide a pass's dequantization behind
      const bool overlap = last - first >= 2;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t n0 = p * 2 * BLOCK;
        const bool odd = overlap && (p - begin) % 2;
        uint16_t* w = odd ? w1.data : w0.data;
        if (p == begin || !overlap) PassChannels<INT4>{q, scales, offsets, n0, n_out, k_in, group, w, factors.data()}.all();
        NextPass<INT4> next{{q, scales, offsets, n0 + 2 * BLOCK, n_out, k_in, group, odd ? w0.data : w1.data,
                             factors.data()}, steps};
        NextPass<INT4>* pending = overlap && p + 1 < end ? &next : nullptr;
        int64_t mb = first;
        for (; mb + 1 < last; mb += 2) multiply_row_blocks<true>(w, xt, mb, rows, n0, n_out, k_in, c, out, pending);
        if (mb < last) multiply_row_blocks<false>(w, xt, mb, rows, n0, n_out, k_in, c, out, pending);
        if (pending != nullptr) pending->channels.all();
      }
    }
    _tile_release();
  }
}
#endif

}  // namespace

extern "C" {

// 1 where this build has the bf16 AMX kernels and the OS granted the tile state, else 0 (callers
// then keep the float-activation kernel or a dequantized matmul).
int32_t amx_bf16_ready() {
#ifdef CODEYARD_AMX_BF16
  return codeyard_amx::tile_state_granted() ? 1 : 0;
#else
  return 0;
#endif
}

#ifdef CODEYARD_AMX_BF16
// The whole bfloat16 weight [n_out, k_in] of int8 (offsets null) or packed int4 ones, for a
// prefill chunk's oneDNN matmul (whose blocking beats this file's tiles on hundreds of rows).
void weight_only_dequantize_bf16(const uint8_t* q, const uint16_t* scales, const uint16_t* offsets, uint16_t* w,
                                 int64_t n_out, int64_t k_in, int64_t group) {
#pragma omp parallel
  {
    std::vector<float> factors(2 * ((k_in + group - 1) / group));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < n_out; ++n) {
      if (offsets != nullptr) dequantize_channel<true>(q, scales, offsets, n, k_in, group, w + n * k_in, factors.data());
      else dequantize_channel<false>(q, scales, nullptr, n, k_in, group, w + n * k_in, factors.data());
    }
  }
}

// x: bfloat16 [rows, k_in]; out: bfloat16 [rows, n_out]; int8 (offsets null) or packed int4 weights.
void weight_only_gemm_bf16_amx(const uint16_t* x, const uint8_t* q, const uint16_t* scales, const uint16_t* offsets,
                               uint16_t* out, int64_t rows, int64_t n_out, int64_t k_in, int64_t group) {
  if (offsets != nullptr) gemm_bf16_amx<true>(x, q, scales, offsets, out, rows, n_out, k_in, group);
  else gemm_bf16_amx<false>(x, q, scales, nullptr, out, rows, n_out, k_in, group);
}
#endif

}  // extern "C"
