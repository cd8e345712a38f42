// SN's CPU row kernels for AVX2 and FMA. The host side (cpu_isa.cpp) runs
// them only where the CPU has these instructions. Compilers other than GCC
// and clang, and CPUs other than x86-64, get no such table (nullptr).
#include "row_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SN_TARGET "avx2,fma"
#define SN_REGISTER_BYTES 32
#include "row_kernels_target.h"
SN_DEFINE_ROW_KERNELS(avx2)
#include "row_kernels_target_end.h"
#else
const sn_mm_rows::RowKernels* sn_mm_rows::row_kernels_avx2() {
  return nullptr;
}
#endif
