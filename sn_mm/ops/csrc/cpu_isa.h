// The instruction set SN's row kernels run with (cpu_isa.cpp).
#pragma once

#include <string>
#include <vector>

#include "row_kernels.h"

namespace sn_mm_cpu {

// The table of the set in use: the best this CPU runs, unless
// $SN_MM_CPU_ISA or set_cpu_isa chose another.
const sn_mm_rows::RowKernels& kernels();
// The sets this build has and this CPU runs, best first.
std::vector<std::string> cpu_isas();
// Run the kernels with set `name` (one of cpu_isas()); a clear error
// otherwise.
void set_cpu_isa(const std::string& name);

}  // namespace sn_mm_cpu
