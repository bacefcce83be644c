// The decode step of a whole Llama-style decoder stack for one sequence, float32, in one call:
// per layer RMSNorm (+ residual), the qkv matmul, rotary, the KV write, paged attention, o_proj,
// RMSNorm (+ residual), gate_up, SiLU * up and down, then the final norm. It calls the same
// kernels the layers call one by one from Python (quant_gemm.cpp, elementwise.cpp,
// paged_attention.cpp) in the same order, so the hidden state it returns is the one the
// per-layer path computes; what it removes is the per-op Python and torch dispatch that
// dominated a single-stream step (about 10 calls per layer, 30 layers).
// It takes M rows, each a token with its own position and block table: M consecutive tokens of one
// sequence (the next token and a speculative draft to verify), or the next tokens of M sequences
// (a batch's decode step). Each matmul reads the weights once for all M rows, and row t attends to
// its table's cache up to its own position, as a decode step of that token alone would (the M rows
// are M queries of the decode kernel).
// Every kernel treats a row the same whatever rows are beside it, so token t's hidden state is
// bit for bit the one M one-token steps give (for float activations; int8-rounded ones go
// through the integer kernels' multi-row path, equal up to float rounding).
// Linear layers must hold weight-only quantized weights (int8/int4/fp8, with float or int8
// activations); the Python side (decode_stack.py) checks that before choosing this path.
// A bfloat16 model's step runs the same float32 arithmetic (the quantized kernels take float32
// activations either way) on its bfloat16 KV cache: keys, values and queries are rounded to bf16
// as its layers' tensors are, and attention runs the bf16 decode kernel its layers run.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "simd.h"

extern "C" {
void int8_gemm_f32(const float*, const int8_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t);
void int4_gemm_f32(const float*, const uint8_t*, const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t,
                   int64_t);
int32_t int4_few_rows_bf16_amx(const float*, const uint8_t*, const uint16_t*, const uint16_t*, float*, int64_t,
                               int64_t, int64_t, int64_t);
void fp8_gemm_f32(const float*, const uint8_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t);
void quantize_rows_q8(const float*, int64_t, int64_t, int64_t, int8_t*, float*, float*);
void int8_gemm_q8(const int8_t*, const float*, const float*, const int8_t*, const uint16_t*, float*, int64_t, int64_t,
                  int64_t, int64_t);
void int4_gemm_q8(const int8_t*, const float*, const float*, const uint8_t*, const uint16_t*, const uint16_t*, float*,
                  int64_t, int64_t, int64_t, int64_t);
void rms_norm_f32(const float*, float*, const float*, float*, int64_t, int, float);
void rotary_f32(const int64_t*, float*, float*, const float*, const float*, int64_t, int, int, int, int, int64_t,
                int64_t);
void silu_and_mul_f32(const float*, float*, int64_t, int);
void write_kv_f32(const float*, const float*, float*, float*, const int64_t*, const int64_t*, int64_t, int, int, int,
                  int64_t, int64_t);
void paged_decode_f32(const float*, const float*, const float*, const int32_t*, const int32_t*, float*, int, int, int,
                      int, int, int, float);
void write_kv_bf16(const uint16_t*, const uint16_t*, uint16_t*, uint16_t*, const int64_t*, const int64_t*, int64_t, int,
                   int, int, int64_t, int64_t);
void paged_decode_bf16(const uint16_t*, const uint16_t*, const uint16_t*, const int32_t*, const int32_t*, uint16_t*,
                       int, int, int, int, int, int, float);
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
  void* k_cache;  // [num_blocks, kv_heads, block_size, head_dim], float32 or bfloat16 (DecodeModel::kv_bf16)
  void* v_cache;
};

struct DecodeModel {
  int64_t hidden, intermediate;
  int32_t heads, kv_heads, head_dim, block_size, num_layers;
  int32_t kv_bf16;  // the KV cache holds bfloat16 (a bf16 model's), else float32
  float eps, scale;
  const float* cos;  // [max_position, head_dim / 2]
  const float* sin;
  const float* final_norm;
  const DecodeLayer* layers;
};

// Phases of the time breakdown (seconds added into `seconds[phase]` when it is given).
enum Phase { NORMS, QKV, ROTARY_KV, ATTENTION, O_PROJ, GATE_UP, ACTIVATION, DOWN, PHASES };

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

struct Scratch {
  std::vector<int8_t> xq;
  std::vector<float> dx, sx;
  std::vector<uint16_t> k16, v16, q16, out16;  // a bf16 KV cache's operands
};

// dst[t, :n] = src[t * stride, :n] rounded to bfloat16 as torch's .to(torch.bfloat16) rounds
void round_rows_bf16(const float* src, int64_t rows, int64_t n, int64_t stride, std::vector<uint16_t>& dst) {
  dst.resize(rows * n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) codeyard::store(&dst[r * n + i], src[r * stride + i]);
}

// The rotated keys and values into the cache, then attention of the queries (token t: query t,
// context up to its own position) into out [tokens, heads * head_dim].
void attend(const DecodeModel* m, const DecodeLayer& layer, float* qkv, int64_t tokens, const int64_t* slot_blocks,
            const int64_t* slot_offsets, const int32_t* tables, const int32_t* contexts, int32_t num_blocks,
            float* out, Scratch& scratch, Clock& clock) {
  const int64_t q_size = int64_t{m->heads} * m->head_dim, kv_size = int64_t{m->kv_heads} * m->head_dim,
                qkv_size = q_size + 2 * kv_size;
  const int rows = static_cast<int>(tokens);
  float *q = qkv, *k = q + q_size, *v = k + kv_size;
  if (m->kv_bf16 != 0) {
    round_rows_bf16(k, tokens, kv_size, qkv_size, scratch.k16);
    round_rows_bf16(v, tokens, kv_size, qkv_size, scratch.v16);
    write_kv_bf16(scratch.k16.data(), scratch.v16.data(), static_cast<uint16_t*>(layer.k_cache),
                  static_cast<uint16_t*>(layer.v_cache), slot_blocks, slot_offsets, tokens, m->kv_heads,
                  m->block_size, m->head_dim, kv_size, kv_size);
    clock.lap(ROTARY_KV);
    round_rows_bf16(q, tokens, q_size, qkv_size, scratch.q16);
    scratch.out16.resize(tokens * q_size);
    paged_decode_bf16(scratch.q16.data(), static_cast<const uint16_t*>(layer.k_cache),
                      static_cast<const uint16_t*>(layer.v_cache), tables, contexts, scratch.out16.data(), rows,
                      m->heads, m->kv_heads, m->block_size, m->head_dim, num_blocks, m->scale);
    for (int64_t i = 0; i < tokens * q_size; ++i) out[i] = codeyard::load(scratch.out16[i]);
    return;
  }
  write_kv_f32(k, v, static_cast<float*>(layer.k_cache), static_cast<float*>(layer.v_cache), slot_blocks,
               slot_offsets, tokens, m->kv_heads, m->block_size, m->head_dim, qkv_size, qkv_size);
  clock.lap(ROTARY_KV);
  // the decode kernel wants its queries packed [tokens, heads, dim]: q rows sit in qkv's rows
  for (int64_t t = 1; t < tokens; ++t) std::memmove(q + t * q_size, qkv + t * qkv_size, q_size * sizeof(float));
  paged_decode_f32(q, static_cast<const float*>(layer.k_cache), static_cast<const float*>(layer.v_cache), tables,
                   contexts, out, rows, m->heads, m->kv_heads, m->block_size, m->head_dim, num_blocks, m->scale);
}

// A bfloat16 model's int4 g32 layers take the AMX bf16 few-row kernel (quant_gemm.cpp) where the CPU
// has it: a verify row costs ~0.3x of a one-token step there against ~0.6x on the float kernel, for
// a one-token step ~3-6% dearer and bf16 rounding of the weights and activations (the numerics a
// bfloat16 model's prefill and the >8-sequence tiles already have). CODEYARD_FEW_ROWS_AMX=0 keeps
// the float kernel (the A/B benchmarks alternate the two).
bool few_rows_amx_wanted(const DecodeModel* m) {
  const char* flag = std::getenv("CODEYARD_FEW_ROWS_AMX");
  return m->kv_bf16 != 0 && (flag == nullptr || flag[0] != '0');
}

// out [rows, n_out] = x [rows, k_in] @ W^T (+ bias)
void linear(const QuantLinear& l, const float* x, int64_t rows, float* out, Scratch& scratch, bool few_amx = false) {
  if (l.act_block == 0) {
    if (few_amx && l.kind == 1 &&
        int4_few_rows_bf16_amx(x, static_cast<const uint8_t*>(l.qweight), l.scales, l.offsets, out, rows, l.n_out,
                               l.k_in, l.group) != 0) {
    } else if (l.kind == 0)
      int8_gemm_f32(x, static_cast<const int8_t*>(l.qweight), l.scales, out, rows, l.n_out, l.k_in, l.group);
    else if (l.kind == 1)
      int4_gemm_f32(x, static_cast<const uint8_t*>(l.qweight), l.scales, l.offsets, out, rows, l.n_out, l.k_in,
                    l.group);
    else fp8_gemm_f32(x, static_cast<const uint8_t*>(l.qweight), l.scales, out, rows, l.n_out, l.k_in, l.group);
  } else {
    scratch.xq.resize(rows * l.k_in);
    scratch.dx.resize(rows * l.k_in / 32);
    scratch.sx.resize(rows * l.k_in / 32);
    quantize_rows_q8(x, rows, l.k_in, l.act_block, scratch.xq.data(), scratch.dx.data(), scratch.sx.data());
    if (l.kind == 0)
      int8_gemm_q8(scratch.xq.data(), scratch.dx.data(), scratch.sx.data(), static_cast<const int8_t*>(l.qweight),
                   l.scales, out, rows, l.n_out, l.k_in, l.group);
    else
      int4_gemm_q8(scratch.xq.data(), scratch.dx.data(), scratch.sx.data(), static_cast<const uint8_t*>(l.qweight),
                   l.scales, l.offsets, out, rows, l.n_out, l.k_in, l.group);
  }
  if (l.bias != nullptr)
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t n = 0; n < l.n_out; ++n) out[m * l.n_out + n] += l.bias[n];
}

}  // namespace

extern "C" {

// x: the embeddings [tokens, hidden] of the tokens at positions[t] in, their final-normed hidden
// states out (overwritten); tables [tokens, num_blocks]: row t's sequence's blocks, holding
// positions[t] + 1 tokens once this step's are written (padded past that).
void decode_stack_f32(const DecodeModel* m, float* x, int64_t tokens, const int64_t* positions,
                      const int32_t* tables, int32_t num_blocks, double* seconds) {
  const int64_t hidden = m->hidden, q_size = int64_t{m->heads} * m->head_dim,
                kv_size = int64_t{m->kv_heads} * m->head_dim, qkv_size = q_size + 2 * kv_size;
  const int rows = static_cast<int>(tokens), width = static_cast<int>(hidden);
  std::vector<float> residual(x, x + tokens * hidden), normed(tokens * hidden), qkv(tokens * qkv_size),
      attn(tokens * q_size), gate_up(tokens * 2 * m->intermediate), act(tokens * m->intermediate);
  // row t: its KV slot, and (as query t of the decode kernel) a context of positions[t] + 1 tokens
  std::vector<int64_t> slot_blocks(tokens), slot_offsets(tokens);
  std::vector<int32_t> contexts(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    slot_blocks[t] = tables[t * num_blocks + positions[t] / m->block_size];
    slot_offsets[t] = positions[t] % m->block_size;
    contexts[t] = static_cast<int32_t>(positions[t] + 1);
  }
  Scratch scratch;
  const bool few_amx = few_rows_amx_wanted(m);
  Clock clock(seconds);
  rms_norm_f32(x, nullptr, m->layers[0].input_norm, normed.data(), rows, width, m->eps);
  for (int32_t i = 0; i < m->num_layers; ++i) {
    const DecodeLayer& layer = m->layers[i];
    if (i > 0) rms_norm_f32(x, residual.data(), layer.input_norm, normed.data(), rows, width, m->eps);
    clock.lap(NORMS);
    linear(layer.qkv, normed.data(), tokens, qkv.data(), scratch, few_amx);
    clock.lap(QKV);
    float *q = qkv.data(), *k = q + q_size;
    rotary_f32(positions, q, k, m->cos, m->sin, tokens, m->heads, m->kv_heads, m->head_dim, m->head_dim,
               qkv_size, qkv_size);
    attend(m, layer, qkv.data(), tokens, slot_blocks.data(), slot_offsets.data(), tables, contexts.data(),
           num_blocks, attn.data(), scratch, clock);
    clock.lap(ATTENTION);
    linear(layer.o, attn.data(), tokens, x, scratch, few_amx);
    clock.lap(O_PROJ);
    rms_norm_f32(x, residual.data(), layer.post_norm, normed.data(), rows, width, m->eps);
    clock.lap(NORMS);
    linear(layer.gate_up, normed.data(), tokens, gate_up.data(), scratch, few_amx);
    clock.lap(GATE_UP);
    silu_and_mul_f32(gate_up.data(), act.data(), tokens, static_cast<int>(m->intermediate));
    clock.lap(ACTIVATION);
    linear(layer.down, act.data(), tokens, x, scratch, few_amx);
    clock.lap(DOWN);
  }
  rms_norm_f32(x, residual.data(), m->final_norm, normed.data(), rows, width, m->eps);
  std::memcpy(x, normed.data(), tokens * hidden * sizeof(float));
  clock.lap(NORMS);
}

}  // extern "C"
