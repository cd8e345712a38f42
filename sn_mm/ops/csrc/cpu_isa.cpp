// Which instruction set SN's row kernels run with: the extension is built
// without -march flags so that it runs on any CPU; the row kernels are
// compiled for AVX-512, AVX2 and the compiler's baseline, and the best set
// the CPU has runs unless SN_MM_CPU_ISA names another (for tests and
// benchmarks: every set can be checked and timed on a machine that has
// more).
#include "cpu_isa.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <atomic>
#include <cstdlib>

namespace {

using sn_mm_rows::RowKernels;

struct Isa {
  const char* name;
  const RowKernels* (*table)();
  bool (*cpu_has)();
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SN_CPU_HAS(feature) \
  (__builtin_cpu_init(), __builtin_cpu_supports(feature))
#else
#define SN_CPU_HAS(feature) false
#endif

bool cpu_has_avx2() { return SN_CPU_HAS("avx2") && SN_CPU_HAS("fma"); }

bool cpu_has_avx512() {
  return cpu_has_avx2() && SN_CPU_HAS("avx512f") && SN_CPU_HAS("avx512vl") &&
         SN_CPU_HAS("avx512bw") && SN_CPU_HAS("avx512dq");
}

bool always() { return true; }

// Best first.
const Isa kIsas[] = {
    {"avx512", sn_mm_rows::row_kernels_avx512, cpu_has_avx512},
    {"avx2", sn_mm_rows::row_kernels_avx2, cpu_has_avx2},
    {"baseline", sn_mm_rows::row_kernels_baseline, always}};

std::atomic<const RowKernels*> active_kernels{nullptr};

}  // namespace

namespace sn_mm_cpu {

std::vector<std::string> cpu_isas() {
  std::vector<std::string> names;
  for (const Isa& isa : kIsas)
    if (isa.table() != nullptr && isa.cpu_has()) names.push_back(isa.name);
  return names;
}

void set_cpu_isa(const std::string& name) {
  for (const Isa& isa : kIsas) {
    if (name != isa.name) continue;
    TORCH_CHECK_VALUE(isa.table() != nullptr,
                      "SN's CPU kernels: this build has no '", name,
                      "' kernels (compiled by GCC for x86-64 only)");
    TORCH_CHECK_VALUE(isa.cpu_has(),
                      "SN's CPU kernels: this CPU cannot run "
                      "the '",
                      name, "' kernels; it runs ",
                      c10::Join(", ", cpu_isas()));
    active_kernels = isa.table();
    return;
  }
  TORCH_CHECK_VALUE(false, "SN's CPU kernels: unknown instruction set '", name,
                    "' (expected avx512, avx2 or baseline)");
}

const RowKernels& kernels() {
  const RowKernels* table = active_kernels.load(std::memory_order_relaxed);
  if (table == nullptr) {  // $SN_MM_CPU_ISA where set, else the best
    const char* wanted = std::getenv("SN_MM_CPU_ISA");
    set_cpu_isa(wanted && *wanted ? std::string(wanted) : cpu_isas().front());
    table = active_kernels.load();
  }
  return *table;
}

}  // namespace sn_mm_cpu
