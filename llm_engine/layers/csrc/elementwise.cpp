// The decoder layer's elementwise steps, each one pass over memory instead of torch's several
// (every torch op reads and writes the whole tensor and rounds to its dtype). Each kernel does
// the same float32 operations in the same order as the PyTorch code it replaces, rounding to
// the storage type where that code does, so results match it (up to the order of a sum).
//
// Rows are spread over torch's OpenMP threads. All tensors are row-major; strides are in elements.

#include <algorithm>

#include "simd.h"

namespace {

using namespace codeyard;

// residual += x (rounded), out = weight * rounded(r / rms(r)), r = that new residual;
// without a residual r = x.
template <typename T>
void rms_norm(const T* x, T* residual, const T* weight, T* out, int64_t rows, int hidden, float eps) {
#pragma omp parallel for schedule(static) if (rows > 1)  // one row (a decode step): no thread team to wake
  for (int64_t row = 0; row < rows; ++row) {
    const T* src = x + row * hidden;
    T* dst = out + row * hidden;
    if (residual != nullptr) {
      T* res = residual + row * hidden;
      int d = 0;
#if defined(__AVX512F__)
      for (; d + 16 <= hidden; d += 16) store16(res + d, _mm512_add_ps(load16(src + d), load16(res + d)));
#endif
      for (; d < hidden; ++d) store(res + d, load(src[d]) + load(res[d]));
      src = res;
    }
    float sum = 0.0f;
    int d = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; d + 16 <= hidden; d += 16) {
      const __m512 v = load16(src + d);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; d < hidden; ++d) sum += load(src[d]) * load(src[d]);
    const float inv = 1.0f / std::sqrt(sum / hidden + eps);
    d = 0;
#if defined(__AVX512F__)
    const __m512 scale = _mm512_set1_ps(inv);
    for (; d + 16 <= hidden; d += 16)
      store16(dst + d, _mm512_mul_ps(load16(weight + d), rounded16<T>(_mm512_mul_ps(load16(src + d), scale))));
#endif
    for (; d < hidden; ++d) store(dst + d, load(weight[d]) * rounded<T>(load(src[d]) * inv));
  }
}

// Rotate-half rotary embedding in place on the first 2 * half dims of `count` heads of `head_dim`
// starting at x (partial rotary leaves the rest): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin),
// cos/sin float32 of the token's position.
template <typename T>
inline void rotate_heads(T* x, int count, int head_dim, int half, const float* cos, const float* sin) {
  for (int h = 0; h < count; ++h) {
    T* x1 = x + static_cast<int64_t>(h) * head_dim;
    T* x2 = x1 + half;
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= half; i += 16) {
      const __m512 a = load16(x1 + i), b = load16(x2 + i), c = load16(cos + i), s = load16(sin + i);
      store16(x1 + i, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
      store16(x2 + i, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
    }
#endif
    for (; i < half; ++i) {
      const float a = load(x1[i]), b = load(x2[i]);
      store(x1 + i, a * cos[i] - b * sin[i]);
      store(x2 + i, b * cos[i] + a * sin[i]);
    }
  }
}

template <typename T>
void rotary(const int64_t* positions, T* q, T* k, const float* cos, const float* sin, int64_t tokens,
            int heads, int kv_heads, int head_dim, int rotary_dim, int64_t q_stride, int64_t k_stride) {
  const int half = rotary_dim / 2;
#pragma omp parallel for schedule(static) if (tokens > 1)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + positions[t] * half;
    const float* s = sin + positions[t] * half;
    rotate_heads(q + t * q_stride, heads, head_dim, half, c, s);
    rotate_heads(k + t * k_stride, kv_heads, head_dim, half, c, s);
  }
}

// out = silu(gate) * up over rows of [gate | up], silu's result rounded like torch's F.silu.
template <typename T>
void silu_and_mul(const T* x, T* out, int64_t rows, int width) {
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int64_t row = 0; row < rows; ++row) {
    const T* gate = x + row * 2 * width;
    const T* up = gate + width;
    T* dst = out + row * width;
    int d = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; d + 16 <= width; d += 16) {
      const __m512 g = load16(gate + d);
      const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
      store16(dst + d, _mm512_mul_ps(rounded16<T>(silu), load16(up + d)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if constexpr (sizeof(T) == sizeof(float)) {  // float32 on AVX2: the same arithmetic on 8 lanes
      const __m256 one = _mm256_set1_ps(1.0f);
      for (; d + 8 <= width; d += 8) {
        const __m256 g = _mm256_loadu_ps(gate + d);
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        _mm256_storeu_ps(dst + d, _mm256_mul_ps(silu, _mm256_loadu_ps(up + d)));
      }
    }
#endif
    for (; d < width; ++d) {
      const float g = load(gate[d]);
      store(dst + d, rounded<T>(g / (1.0f + std::exp(-g))) * load(up[d]));
    }
  }
}

}  // namespace

extern "C" {

#define CODEYARD_ELEMENTWISE(suffix, T)                                                             \
  void rms_norm_##suffix(const T* x, T* residual, const T* weight, T* out, int64_t rows, int hidden, \
                         float eps) {                                                               \
    rms_norm(x, residual, weight, out, rows, hidden, eps);                                          \
  }                                                                                                 \
  void rotary_##suffix(const int64_t* positions, T* q, T* k, const float* cos, const float* sin,    \
                       int64_t tokens, int heads, int kv_heads, int head_dim, int rotary_dim,       \
                       int64_t q_stride, int64_t k_stride) {                                        \
    rotary(positions, q, k, cos, sin, tokens, heads, kv_heads, head_dim, rotary_dim, q_stride, k_stride); \
  }                                                                                                 \
  void silu_and_mul_##suffix(const T* x, T* out, int64_t rows, int width) {                          \
    silu_and_mul(x, out, rows, width);                                                              \
  }

CODEYARD_ELEMENTWISE(f32, float)
CODEYARD_ELEMENTWISE(bf16, uint16_t)
}
