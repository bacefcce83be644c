// Decode attention straight from the paged KV pool, for the CPU, and the write of new keys and
// values into it.
//
// One query token per sequence. Each (sequence, kv head) pair is one unit of work, spread over
// torch's OpenMP threads: it walks the sequence's block table, reads every key and value row
// once from the pool (no gathered copy), and serves the `group` query heads that share that kv
// head. Scores, softmax and the weighted sum are accumulated in float32 whatever the storage type
// (float32 or bfloat16). The inner loops (dot products, exp, value accumulation) use AVX-512
// where the compiler targets it (bf16 dot products with AVX512-BF16: exact products, float32
// sums), float32 dot products and value sums with AVX2+FMA on CPUs without AVX-512; plain loops
// handle the rest and the tails of head sizes that are not multiples of 16 (32 for value sums).
//
// Layouts (all contiguous): q, out [batch, heads, dim]; k_cache, v_cache
// [num_blocks, kv_heads, block_size, dim]; block_tables [batch, max_blocks]; context_lens [batch].

#include <algorithm>
#include <vector>

#include "simd.h"

#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using namespace codeyard;

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

// Dot product of a query row and a key row, float32 accumulation.
template <typename T>
inline float dot(const T* q, const T* k, int dim) {
  int d = 0;
  float sum = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
  if constexpr (sizeof(T) == 2) {  // 32 bf16 pairs per instruction, products exact in float32
    for (; d + 32 <= dim; d += 32) {
      __m512bh qv = (__m512bh)_mm512_loadu_si512(q + d);
      __m512bh kv = (__m512bh)_mm512_loadu_si512(k + d);
      acc = _mm512_dpbf16_ps(acc, qv, kv);
    }
  }
#endif
  for (; d + 16 <= dim; d += 16) acc = _mm512_fmadd_ps(load16(q + d), load16(k + d), acc);
  sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (sizeof(T) == sizeof(float)) {  // float32 on AVX2-only CPUs: 8 lanes, 2 accumulators
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; d + 16 <= dim; d += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), acc1);
    }
    sum = hsum8(_mm256_add_ps(acc0, acc1));
  }
#endif
  for (; d < dim; ++d) sum += load(q[d]) * load(k[d]);
  return sum;
}

// acc[0:dim] += sum over i < n of p[i] * rows[i][0:dim] (rows contiguous); accumulators stay in
// registers across the rows.
template <typename T>
inline void weighted_sum(const float* p, const T* rows, int n, int dim, float* acc) {
  int d = 0;
#if defined(__AVX512F__)
  for (; d + 64 <= dim; d += 64) {
    __m512 a0 = _mm512_loadu_ps(acc + d), a1 = _mm512_loadu_ps(acc + d + 16);
    __m512 a2 = _mm512_loadu_ps(acc + d + 32), a3 = _mm512_loadu_ps(acc + d + 48);
    for (int i = 0; i < n; ++i) {
      const __m512 w = _mm512_set1_ps(p[i]);
      const T* row = rows + static_cast<int64_t>(i) * dim + d;
      a0 = _mm512_fmadd_ps(w, load16(row), a0);
      a1 = _mm512_fmadd_ps(w, load16(row + 16), a1);
      a2 = _mm512_fmadd_ps(w, load16(row + 32), a2);
      a3 = _mm512_fmadd_ps(w, load16(row + 48), a3);
    }
    _mm512_storeu_ps(acc + d, a0);
    _mm512_storeu_ps(acc + d + 16, a1);
    _mm512_storeu_ps(acc + d + 32, a2);
    _mm512_storeu_ps(acc + d + 48, a3);
  }
  for (; d + 16 <= dim; d += 16) {
    __m512 a = _mm512_loadu_ps(acc + d);
    for (int i = 0; i < n; ++i)
      a = _mm512_fmadd_ps(_mm512_set1_ps(p[i]), load16(rows + static_cast<int64_t>(i) * dim + d), a);
    _mm512_storeu_ps(acc + d, a);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (sizeof(T) == sizeof(float)) {
    for (; d + 32 <= dim; d += 32) {
      __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_loadu_ps(acc + d + 8);
      __m256 a2 = _mm256_loadu_ps(acc + d + 16), a3 = _mm256_loadu_ps(acc + d + 24);
      for (int i = 0; i < n; ++i) {
        const __m256 w = _mm256_set1_ps(p[i]);
        const float* row = rows + static_cast<int64_t>(i) * dim + d;
        a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row), a0);
        a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8), a1);
        a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 16), a2);
        a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 24), a3);
      }
      _mm256_storeu_ps(acc + d, a0);
      _mm256_storeu_ps(acc + d + 8, a1);
      _mm256_storeu_ps(acc + d + 16, a2);
      _mm256_storeu_ps(acc + d + 24, a3);
    }
  }
#endif
  for (; d < dim; ++d)
    for (int i = 0; i < n; ++i) acc[d] += p[i] * load(rows[static_cast<int64_t>(i) * dim + d]);
}

// s[i] = exp(s[i] - max(s)); returns the sum.
inline float softmax_numerators(float* s, int n) {
  float peak = -INFINITY;
  int i = 0;
#if defined(__AVX512F__)
  __m512 peaks = _mm512_set1_ps(-INFINITY);
  for (; i + 16 <= n; i += 16) peaks = _mm512_max_ps(peaks, _mm512_loadu_ps(s + i));
  peak = _mm512_reduce_max_ps(peaks);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 peaks = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) peaks = _mm256_max_ps(peaks, _mm256_loadu_ps(s + i));
  peak = reduce_max8(peaks);
#endif
  for (; i < n; ++i) peak = std::max(peak, s[i]);
  float total = 0.0f;
  i = 0;
#if defined(__AVX512F__)
  const __m512 pv = _mm512_set1_ps(peak);
  __m512 sums = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), pv));
    _mm512_storeu_ps(s + i, e);
    sums = _mm512_add_ps(sums, e);
  }
  total = _mm512_reduce_add_ps(sums);
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 pv = _mm256_set1_ps(peak);
  __m256 sums = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), pv));
    _mm256_storeu_ps(s + i, e);
    sums = _mm256_add_ps(sums, e);
  }
  total = reduce_add8(sums);
#endif
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - peak);
    total += s[i];
  }
  return total;
}

// n values as float32: the values themselves, or converted once into `buffer` (a block's value
// rows serve every query head of the group).
inline const float* as_float(const float* values, int64_t, std::vector<float>&) { return values; }
inline const float* as_float(const uint16_t* values, int64_t n, std::vector<float>& buffer) {
  buffer.resize(n);
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(buffer.data() + i, load16(values + i));
#endif
  for (; i < n; ++i) buffer[i] = load(values[i]);
  return buffer.data();
}

// One kv head's rows of the i-th block of a sequence; asks for the next block's rows meanwhile
// (blocks are scattered over the pool, so the hardware prefetcher cannot guess them).
template <typename T>
inline const T* block_rows(const T* cache, const int32_t* table, int i, int num_blocks,
                           int64_t block_stride, int64_t head_offset, int64_t head_stride) {
#if defined(__AVX512F__)
  if (i + 1 < num_blocks) {
    const char* next = reinterpret_cast<const char*>(cache + table[i + 1] * block_stride + head_offset);
    for (int64_t byte = 0; byte < head_stride * static_cast<int64_t>(sizeof(T)); byte += 64)
      _mm_prefetch(next + byte, _MM_HINT_T0);
  }
#endif
  return cache + table[i] * block_stride + head_offset;
}

template <typename T>
void decode(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
            const int32_t* context_lens, T* out, int batch, int heads, int kv_heads, int block_size,
            int dim, int max_blocks, float scale) {
  const int group = heads / kv_heads;
  const int64_t head_stride = static_cast<int64_t>(block_size) * dim;
  const int64_t block_stride = kv_heads * head_stride;
#pragma omp parallel
  {
    std::vector<float> scores, acc, total, converted;  // per thread, reused across items
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < batch; ++b) {
      for (int kvh = 0; kvh < kv_heads; ++kvh) {
        const int len = context_lens[b];
        const int num_blocks = (len + block_size - 1) / block_size;
        const int32_t* table = block_tables + static_cast<int64_t>(b) * max_blocks;
        const int64_t head_offset = kvh * head_stride;
        const T* query = q + (static_cast<int64_t>(b) * heads + kvh * group) * dim;
        scores.resize(static_cast<size_t>(group) * len);
        acc.assign(static_cast<size_t>(group) * dim, 0.0f);
        total.resize(group);
        for (int i = 0; i < num_blocks; ++i) {
          const T* keys = block_rows(k_cache, table, i, num_blocks, block_stride, head_offset, head_stride);
          const int start = i * block_size, rows = std::min(block_size, len - start);
          for (int r = 0; r < rows; ++r)
            for (int g = 0; g < group; ++g)
              scores[static_cast<size_t>(g) * len + start + r] = dot(query + g * dim, keys + r * dim, dim) * scale;
        }
        for (int g = 0; g < group; ++g) total[g] = softmax_numerators(scores.data() + static_cast<size_t>(g) * len, len);
        for (int i = 0; i < num_blocks; ++i) {
          const T* values = block_rows(v_cache, table, i, num_blocks, block_stride, head_offset, head_stride);
          const int start = i * block_size, rows = std::min(block_size, len - start);
          const float* value_rows = as_float(values, static_cast<int64_t>(rows) * dim, converted);
          for (int g = 0; g < group; ++g)
            weighted_sum(scores.data() + static_cast<size_t>(g) * len + start, value_rows, rows, dim, acc.data() + g * dim);
        }
        for (int g = 0; g < group; ++g) {
          T* dst = out + (static_cast<int64_t>(b) * heads + kvh * group + g) * dim;
          const float inv = 1.0f / total[g];
          for (int d = 0; d < dim; ++d) store(dst + d, acc[g * dim + d] * inv);
        }
      }
    }
  }
}

// Each new token's key and value rows (one per kv head) into its slot of the pool.
template <typename T>
void write_kv(const T* k, const T* v, T* k_cache, T* v_cache, const int64_t* slot_blocks,
              const int64_t* slot_offsets, int64_t tokens, int kv_heads, int block_size, int dim,
              int64_t k_stride, int64_t v_stride) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < kv_heads; ++h) {
      const int64_t slot = ((slot_blocks[t] * kv_heads + h) * block_size + slot_offsets[t]) * dim;
      std::memcpy(k_cache + slot, k + t * k_stride + static_cast<int64_t>(h) * dim, dim * sizeof(T));
      std::memcpy(v_cache + slot, v + t * v_stride + static_cast<int64_t>(h) * dim, dim * sizeof(T));
    }
  }
}

}  // namespace

extern "C" {

void write_kv_f32(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* slot_blocks,
                  const int64_t* slot_offsets, int64_t tokens, int kv_heads, int block_size, int dim,
                  int64_t k_stride, int64_t v_stride) {
  write_kv(k, v, k_cache, v_cache, slot_blocks, slot_offsets, tokens, kv_heads, block_size, dim, k_stride, v_stride);
}

void write_kv_bf16(const uint16_t* k, const uint16_t* v, uint16_t* k_cache, uint16_t* v_cache,
                   const int64_t* slot_blocks, const int64_t* slot_offsets, int64_t tokens, int kv_heads,
                   int block_size, int dim, int64_t k_stride, int64_t v_stride) {
  write_kv(k, v, k_cache, v_cache, slot_blocks, slot_offsets, tokens, kv_heads, block_size, dim, k_stride, v_stride);
}

void paged_decode_f32(const float* q, const float* k_cache, const float* v_cache,
                      const int32_t* block_tables, const int32_t* context_lens, float* out,
                      int batch, int heads, int kv_heads, int block_size, int dim, int max_blocks,
                      float scale) {
  decode(q, k_cache, v_cache, block_tables, context_lens, out, batch, heads, kv_heads, block_size,
         dim, max_blocks, scale);
}

void paged_decode_bf16(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                       const int32_t* block_tables, const int32_t* context_lens, uint16_t* out,
                       int batch, int heads, int kv_heads, int block_size, int dim, int max_blocks,
                       float scale) {
  decode(q, k_cache, v_cache, block_tables, context_lens, out, batch, heads, kv_heads, block_size,
         dim, max_blocks, scale);
}
}
