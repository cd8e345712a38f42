// SN's CPU row kernels for AVX-512 (F, VL, BW, DQ) with AVX2 and FMA. The host
// side (cpu_isa.cpp) runs them only where the CPU has these instructions.
// Other compilers and CPUs get no such table (nullptr).
#include "row_kernels.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#define SN_REGISTER_BYTES 64
#include "reduction_kernels_impl.h"
SN_DEFINE_ROW_KERNELS(avx512)
#else
const sn_mm_rows::RowKernels* sn_mm_rows::row_kernels_avx512() {
  return nullptr;
}
#endif
