// SN's CPU row kernels for AVX2 and FMA. The host side
// (cpu_isa.cpp) runs them only where the CPU has these instructions.
// Other compilers and CPUs get no such table (nullptr).
#include "row_kernels.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC target("avx2,fma")
#define SN_REGISTER_BYTES 32
#include "reduction_kernels_impl.h"
SN_DEFINE_ROW_KERNELS(avx2)
#else
const sn_mm_rows::RowKernels* sn_mm_rows::row_kernels_avx2() {
  return nullptr;
}
#endif
