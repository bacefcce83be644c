// What the AMX kernels share: the `ldtilecfg` layout and Linux's once-per-process grant of the
// tile state (quant_gemm_amx.cpp's integer tiles, quant_gemm_amx_bf16.cpp's bfloat16 tiles).
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>

namespace codeyard_amx {

struct TileConfig {  // the `ldtilecfg` memory layout (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands a process the 8 KiB tile state only when asked; asked once (an inline function's
// static is one object across the files that include this).
inline bool tile_state_granted() {
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  static const bool granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return granted;
}

}  // namespace codeyard_amx
#endif
