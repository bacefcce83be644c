// One decode step of a whole Llama-style decoder stack for a single sequence (batch 1), float32,
// in one call: per layer RMSNorm (+ residual), the qkv matmul, rotary, the KV write, paged
// attention, o_proj, RMSNorm (+ residual), gate_up, SiLU * up and down, then the final norm.
// It calls the same kernels the layers call one by one from Python (quant_gemm.cpp,
// elementwise.cpp, paged_attention.cpp) in the same order, so the hidden state it returns is
// the one the per-layer path computes; what it removes is the per-op Python and torch dispatch
// that dominated a single-stream step (about 10 calls per layer, 30 layers).
// Linear layers must hold weight-only quantized weights (int8/int4/fp8, with float or int8
// activations); the Python side (decode_stack.py) checks that before choosing this path.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" {
void int8_gemm_f32(const float*, const int8_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t);
void int4_gemm_f32(const float*, const uint8_t*, const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t,
                   int64_t);
void fp8_gemm_f32(const float*, const uint8_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t);
void quantize_rows_q8(const float*, int64_t, int64_t, int64_t, int8_t*, float*, float*);
void int8_gemm_q8(const int8_t*, const float*, const float*, const int8_t*, const uint16_t*, float*, int64_t, int64_t,
                  int64_t, int64_t);
void int4_gemm_q8(const int8_t*, const float*, const float*, const uint8_t*, const uint16_t*, const uint16_t*, float*,
                  int64_t, int64_t, int64_t, int64_t);
void rms_norm_f32(const float*, float*, const float*, float*, int64_t, int, float);
void rotary_f32(const int64_t*, float*, float*, const float*, const float*, int64_t, int, int, int, int64_t, int64_t);
void silu_and_mul_f32(const float*, float*, int64_t, int);
void write_kv_f32(const float*, const float*, float*, float*, const int64_t*, const int64_t*, int64_t, int, int, int,
                  int64_t, int64_t);
void paged_decode_f32(const float*, const float*, const float*, const int32_t*, const int32_t*, float*, int, int, int,
                      int, int, int, float);
}

namespace {

// A quantized linear layer as quantization.py holds it (kind: 0 int8, 1 int4, 2 fp8).
struct QuantLinear {
  int32_t kind;
  int32_t act_block;  // inputs per int8 activation scale (w8a8/w4a8), 0 for float activations
  int64_t n_out, k_in, group;
  const void* qweight;
  const uint16_t* scales;
  const uint16_t* offsets;  // int4 only
  const float* bias;        // or null
};

struct DecodeLayer {
  const float* input_norm;
  const float* post_norm;
  QuantLinear qkv, o, gate_up, down;
  float* k_cache;  // [num_blocks, kv_heads, block_size, head_dim]
  float* v_cache;
};

struct DecodeModel {
  int64_t hidden, intermediate;
  int32_t heads, kv_heads, head_dim, block_size, num_layers;
  float eps, scale;
  const float* cos;  // [max_position, head_dim / 2]
  const float* sin;
  const float* final_norm;
  const DecodeLayer* layers;
};

// Phases of the time breakdown (seconds added into `seconds[phase]` when it is given).
enum Phase { NORMS, QKV, ROTARY_KV, ATTENTION, O_PROJ, GATE_UP, ACTIVATION, DOWN, PHASES };

struct Scratch {
  std::vector<int8_t> xq;
  std::vector<float> dx, sx;
};

void linear(const QuantLinear& l, const float* x, float* out, Scratch& scratch) {
  if (l.act_block == 0) {
    if (l.kind == 0) int8_gemm_f32(x, static_cast<const int8_t*>(l.qweight), l.scales, out, 1, l.n_out, l.k_in, l.group);
    else if (l.kind == 1)
      int4_gemm_f32(x, static_cast<const uint8_t*>(l.qweight), l.scales, l.offsets, out, 1, l.n_out, l.k_in, l.group);
    else fp8_gemm_f32(x, static_cast<const uint8_t*>(l.qweight), l.scales, out, 1, l.n_out, l.k_in, l.group);
  } else {
    scratch.xq.resize(l.k_in);
    scratch.dx.resize(l.k_in / 32);
    scratch.sx.resize(l.k_in / 32);
    quantize_rows_q8(x, 1, l.k_in, l.act_block, scratch.xq.data(), scratch.dx.data(), scratch.sx.data());
    if (l.kind == 0)
      int8_gemm_q8(scratch.xq.data(), scratch.dx.data(), scratch.sx.data(), static_cast<const int8_t*>(l.qweight),
                   l.scales, out, 1, l.n_out, l.k_in, l.group);
    else
      int4_gemm_q8(scratch.xq.data(), scratch.dx.data(), scratch.sx.data(), static_cast<const uint8_t*>(l.qweight),
                   l.scales, l.offsets, out, 1, l.n_out, l.k_in, l.group);
  }
  if (l.bias != nullptr)
    for (int64_t n = 0; n < l.n_out; ++n) out[n] += l.bias[n];
}

class Clock {
 public:
  explicit Clock(double* seconds) : seconds_(seconds), last_(now()) {}
  void lap(Phase phase) {
    if (seconds_ == nullptr) return;
    const double t = now();
    seconds_[phase] += t - last_;
    last_ = t;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double* seconds_;
  double last_;
};

}  // namespace

extern "C" {

// x: the token's embedding [hidden] in, the final-normed hidden state out (overwritten);
// block_table: the sequence's blocks, holding `position` + 1 tokens once this one is written.
void decode_stack_f32(const DecodeModel* m, float* x, int64_t position, const int32_t* block_table,
                      int32_t num_blocks, double* seconds) {
  const int64_t hidden = m->hidden, q_size = int64_t{m->heads} * m->head_dim,
                kv_size = int64_t{m->kv_heads} * m->head_dim, qkv_size = q_size + 2 * kv_size;
  std::vector<float> residual(x, x + hidden), normed(hidden), qkv(qkv_size), attn(q_size),
      gate_up(2 * m->intermediate), act(m->intermediate);
  Scratch scratch;
  const int64_t slot_block = block_table[position / m->block_size], slot_offset = position % m->block_size;
  const int32_t context = static_cast<int32_t>(position + 1);
  Clock clock(seconds);
  rms_norm_f32(x, nullptr, m->layers[0].input_norm, normed.data(), 1, static_cast<int>(hidden), m->eps);
  for (int32_t i = 0; i < m->num_layers; ++i) {
    const DecodeLayer& layer = m->layers[i];
    if (i > 0) rms_norm_f32(x, residual.data(), layer.input_norm, normed.data(), 1, static_cast<int>(hidden), m->eps);
    clock.lap(NORMS);
    linear(layer.qkv, normed.data(), qkv.data(), scratch);
    clock.lap(QKV);
    float *q = qkv.data(), *k = q + q_size, *v = k + kv_size;
    rotary_f32(&position, q, k, m->cos, m->sin, 1, m->heads, m->kv_heads, m->head_dim, qkv_size, qkv_size);
    write_kv_f32(k, v, layer.k_cache, layer.v_cache, &slot_block, &slot_offset, 1, m->kv_heads, m->block_size,
                 m->head_dim, qkv_size, qkv_size);
    clock.lap(ROTARY_KV);
    paged_decode_f32(q, layer.k_cache, layer.v_cache, block_table, &context, attn.data(), 1, m->heads, m->kv_heads,
                     m->block_size, m->head_dim, num_blocks, m->scale);
    clock.lap(ATTENTION);
    linear(layer.o, attn.data(), x, scratch);
    clock.lap(O_PROJ);
    rms_norm_f32(x, residual.data(), layer.post_norm, normed.data(), 1, static_cast<int>(hidden), m->eps);
    clock.lap(NORMS);
    linear(layer.gate_up, normed.data(), gate_up.data(), scratch);
    clock.lap(GATE_UP);
    silu_and_mul_f32(gate_up.data(), act.data(), 1, static_cast<int>(m->intermediate));
    clock.lap(ACTIVATION);
    linear(layer.down, act.data(), x, scratch);
    clock.lap(DOWN);
  }
  rms_norm_f32(x, residual.data(), m->final_norm, normed.data(), 1, static_cast<int>(hidden), m->eps);
  std::memcpy(x, normed.data(), hidden * sizeof(float));
  clock.lap(NORMS);
}

}  // extern "C"
