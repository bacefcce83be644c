// Decode attention straight from the paged KV pool, for the CPU.
//
// One query token per sequence. Each (sequence, kv head) pair is one unit of work: it walks the
// sequence's block table, reads every key and value row once from the pool (no gathered copy),
// and serves the `group` query heads that share that kv head. Scores, softmax and the weighted
// sum are accumulated in float32 whatever the storage type (float32 or bfloat16).
//
// Layouts (all contiguous): q, out [batch, heads, dim]; k_cache, v_cache
// [num_blocks, kv_heads, block_size, dim]; block_tables [batch, max_blocks]; context_lens [batch].

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float load(float x) { return x; }
inline float load(uint16_t x) {  // bfloat16 -> float32: the bf16 bits are the float's top half
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline void store(float* dst, float x) { *dst = x; }
inline void store(uint16_t* dst, float x) {  // float32 -> bfloat16, round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) {
    *dst = 0x7FC0;
    return;
  }
  bits += 0x7FFF + ((bits >> 16) & 1);
  *dst = static_cast<uint16_t>(bits >> 16);
}

template <typename T>
void decode(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables,
            const int32_t* context_lens, T* out, int batch, int heads, int kv_heads, int block_size,
            int dim, int max_blocks, float scale) {
  const int group = heads / kv_heads;
  const int64_t head_stride = static_cast<int64_t>(block_size) * dim;
  const int64_t block_stride = kv_heads * head_stride;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int b = 0; b < batch; ++b) {
    for (int kvh = 0; kvh < kv_heads; ++kvh) {
      const int len = context_lens[b];
      const int32_t* table = block_tables + static_cast<int64_t>(b) * max_blocks;
      std::vector<float> query(static_cast<size_t>(group) * dim);
      std::vector<float> scores(static_cast<size_t>(group) * len);
      std::vector<float> acc(static_cast<size_t>(group) * dim, 0.0f);
      std::vector<float> row(dim);
      for (int g = 0; g < group; ++g) {
        const T* src = q + (static_cast<int64_t>(b) * heads + kvh * group + g) * dim;
        for (int d = 0; d < dim; ++d) query[g * dim + d] = load(src[d]) * scale;
      }
      for (int t = 0; t < len; ++t) {
        const T* key = k_cache + table[t / block_size] * block_stride + kvh * head_stride +
                       static_cast<int64_t>(t % block_size) * dim;
        for (int d = 0; d < dim; ++d) row[d] = load(key[d]);
        for (int g = 0; g < group; ++g) {
          const float* qg = query.data() + g * dim;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int d = 0; d < dim; ++d) dot += qg[d] * row[d];
          scores[static_cast<size_t>(g) * len + t] = dot;
        }
      }
      std::vector<float> total(group, 0.0f);
      for (int g = 0; g < group; ++g) {
        float* s = scores.data() + static_cast<size_t>(g) * len;
        float peak = -INFINITY;
        for (int t = 0; t < len; ++t) peak = s[t] > peak ? s[t] : peak;
        for (int t = 0; t < len; ++t) {
          s[t] = std::exp(s[t] - peak);
          total[g] += s[t];
        }
      }
      for (int t = 0; t < len; ++t) {
        const T* value = v_cache + table[t / block_size] * block_stride + kvh * head_stride +
                         static_cast<int64_t>(t % block_size) * dim;
        for (int d = 0; d < dim; ++d) row[d] = load(value[d]);
        for (int g = 0; g < group; ++g) {
          const float p = scores[static_cast<size_t>(g) * len + t];
          float* a = acc.data() + g * dim;
#pragma omp simd
          for (int d = 0; d < dim; ++d) a[d] += p * row[d];
        }
      }
      for (int g = 0; g < group; ++g) {
        T* dst = out + (static_cast<int64_t>(b) * heads + kvh * group + g) * dim;
        const float inv = 1.0f / total[g];
        for (int d = 0; d < dim; ++d) store(dst + d, acc[g * dim + d] * inv);
      }
    }
  }
}

}  // namespace

extern "C" {

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
