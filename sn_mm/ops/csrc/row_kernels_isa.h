// One instruction set's row kernels and their table, row_kernels_<SN_ISA>():
// row_kernels_<isa>.cpp defines SN_ISA, SN_REGISTER_BYTES and, beyond the
// baseline, SN_TARGET (the set in GCC's and clang's target-attribute
// spelling), then includes this. GCC takes a target pragma; clang applies
// the target attribute to every function declared in the region, lambdas
// included. The library headers come first, outside the region.
#include <cstdint>
#include <type_traits>
#include <utility>

#include "row_kernels.h"

#define SN_PRAGMA(text) _Pragma(#text)
#ifdef SN_TARGET
#if defined(__clang__)
#define SN_TARGET_REGION(isa)                                  \
  SN_PRAGMA(clang attribute push(__attribute__((target(isa))), \
                                 apply_to = function))
#else
#define SN_TARGET_REGION(isa) SN_PRAGMA(GCC target(isa))
#endif
SN_TARGET_REGION(SN_TARGET)
#endif

#include "row_kernels_impl.h"

#define SN_TABLE(isa) row_kernels_##isa
#define SN_TABLE_OF(isa) SN_TABLE(isa)
#define SN_NAME(isa) #isa
#define SN_NAME_OF(isa) SN_NAME(isa)
const sn_mm_rows::RowKernels* sn_mm_rows::SN_TABLE_OF(SN_ISA)() {
  static constexpr RowKernels table = kernel_table(SN_NAME_OF(SN_ISA));
  return &table;
}

#if defined(SN_TARGET) && defined(__clang__)
#pragma clang attribute pop
#endif
