// SN's CPU row kernels for any CPU the compiler targets by default (SSE2
// on x86-64, NEON on aarch64).
#define SN_ISA baseline
#define SN_REGISTER_BYTES 16  // SSE2 and NEON alike
#include "row_kernels_impl.h"
