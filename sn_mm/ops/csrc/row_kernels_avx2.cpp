// SN's CPU row kernels for AVX2 and FMA, which sn_host.cpp runs only where
// the CPU has them: x86-64 GCC and clang builds (nullptr elsewhere).
#include "row_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SN_ISA avx2
#define SN_TARGET "avx2,fma"
#define SN_REGISTER_BYTES 32
#include "row_kernels_impl.h"
#else
const sn_mm_rows::RowKernels* sn_mm_rows::row_kernels_avx2() {
  return nullptr;
}
#endif
