// What SN's CPU forward and backward share: the kernels' instruction set,
// the special paths' switches and counts, the input's checks and ratios.
#include "sn_host.h"

#include <ATen/Dispatch.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

namespace sn_mm_cpu {

// Built without -march flags, so that it runs on any CPU, with a kernel set
// for each instruction set it may have (the tests run each it has).
namespace {

#ifdef SN_X86
#define SN_CPU_HAS(feature) \
  (__builtin_cpu_init(), __builtin_cpu_supports(feature))
#else
#define SN_CPU_HAS(feature) false
#endif

bool cpu_runs(const std::string& isa) {
  const bool avx2 = SN_CPU_HAS("avx2") && SN_CPU_HAS("fma");
  if (isa == "avx512")
    return avx2 && SN_CPU_HAS("avx512f") && SN_CPU_HAS("avx512vl") &&
           SN_CPU_HAS("avx512bw") && SN_CPU_HAS("avx512dq");
  return isa == "avx2" ? avx2 : true;
}

const std::pair<const char*, const RowKernels* (*)()> kIsas[] = {
#ifdef SN_X86
    {"avx512", row_kernels_avx512},
    {"avx2", row_kernels_avx2},
#endif
    {"baseline", row_kernels_baseline}};

std::atomic<const RowKernels*> active_kernels{nullptr};

}  // namespace

std::vector<std::string> cpu_isas() {
  std::vector<std::string> names;
  for (const auto& [name, table] : kIsas)
    if (cpu_runs(name)) names.push_back(name);
  return names;
}

void set_cpu_isa(std::string name) {
  for (const auto& [isa, table] : kIsas) {
    if (name != isa) continue;
    TORCH_CHECK_VALUE(cpu_runs(name),
                      "SN's CPU kernels: this CPU cannot run the '", name,
                      "' kernels; it runs ", c10::Join(", ", cpu_isas()));
    active_kernels = table();
    return;
  }
  std::vector<std::string> built;
  for (const auto& isa : kIsas) built.push_back(isa.first);
  TORCH_CHECK_VALUE(false, "SN's CPU kernels: unknown instruction set '", name,
                    "' (this build has ", c10::Join(", ", built), ")");
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

const char* const kPathNames[kPathCount] = {"short_rows", "by_sample"};
std::atomic<bool> path_on[kPathCount] = {true, true};
std::atomic<int64_t> path_taken[kPathCount] = {};

bool take(Path p, bool applies) {
  if (!applies || !path_on[p].load(std::memory_order_relaxed)) return false;
  path_taken[p].fetch_add(1, std::memory_order_relaxed);
  return true;
}

PathCounts path_counts() {
  PathCounts counts;
  for (int p = 0; p < kPathCount; ++p) {
    std::get<0>(counts).push_back(kPathNames[p]);
    std::get<1>(counts).push_back(path_taken[p].load());
  }
  return counts;
}

bool set_path(std::string name, bool on) {
  for (int p = 0; p < kPathCount; ++p)
    if (name == kPathNames[p]) return path_on[p].exchange(on);
  TORCH_CHECK_VALUE(false, "SN's CPU kernels: unknown path '", name,
                    "' (expected short_rows or by_sample)");
}

std::vector<double> read_doubles(const at::Tensor& t) {
  const auto c = t.contiguous();
  std::vector<double> out(c.numel());
  AT_DISPATCH_ALL_TYPES_AND3(
      at::kHalf, at::kBFloat16, at::kBool, c.scalar_type(), "read",
      [&] { std::copy_n(c.data_ptr<scalar_t>(), c.numel(), out.begin()); });
  return out;
}

std::vector<bool> read_fixed(const OptTensor& fixed, int64_t groups) {
  if (!defined(fixed)) return std::vector<bool>(2 * groups, false);
  TORCH_CHECK(fixed->numel() == 2 * groups,
              "switchable_norm: ratio_fixed must hold 2 x ", groups,
              " flags, got ", fixed->sizes());
  const auto flags = read_doubles(*fixed);
  return std::vector<bool>(flags.begin(), flags.end());
}

// softmax(logits), or the given or fixed ratios, per group and statistic,
// into the kernels' layout; without IN the IN term left out and the rest
// renormalised, or for fixed ratios that selected IN alone, LN alone
// (sn_mm/ops/ratios.py's rule).
Ratios mixing_ratios(const at::Tensor& mean_logits,
                     const at::Tensor& var_logits, int64_t groups,
                     const OptTensor& fixed, const OptTensor& fixed_ratios,
                     bool has_in, bool ratios_given) {
  Ratios out;
  out.groups = groups;
  const int64_t k = mean_logits.numel() / groups;
  TORCH_CHECK(k == 2 || k == 3,
              "switchable_norm: expected 2 or 3 ratio logits, got ",
              mean_logits.sizes());
  out.logits = k;
  out.has_in = has_in;
  out.fixed = read_fixed(fixed, groups);
  out.six.assign(kRatios * groups, 0.0);
  std::vector<double> fixed_values;
  if (std::find(out.fixed.begin(), out.fixed.end(), true) != out.fixed.end())
    fixed_values = read_doubles(*fixed_ratios);
  const int64_t first = has_in ? 0 : 1;
  for (int row = 0; row < 2; ++row) {  // the mean's, then the variance's
    const auto logits = read_doubles(row == 0 ? mean_logits : var_logits);
    for (int64_t g = 0; g < groups; ++g) {
      const bool is_fixed = out.fixed[row * groups + g];
      const double* given =
          is_fixed ? fixed_values.data() + row * groups * k : logits.data();
      double r[3] = {};
      std::copy_n(given + g * k, k, r);
      double total = 0;
      if (is_fixed && !has_in) {
        for (int64_t i = 1; i < k; ++i) total += r[i];
        for (int64_t i = 1; i < k; ++i)
          r[i] = total > 0 ? r[i] / std::max(total, 1e-30) : double(i == 1);
      } else if (!is_fixed && !ratios_given) {
        const double top = *std::max_element(r + first, r + k);
        for (int64_t i = first; i < k; ++i)
          total += (r[i] = std::exp(r[i] - top));
        for (int64_t i = first; i < k; ++i) r[i] /= total;
      }
      for (int64_t i = first; i < k; ++i)
        out.six[kRatios * g + 2 * i + row] = r[i];
    }
  }
  return out;
}

Forward prepared(const at::Tensor& x, const at::Tensor& mean_logits,
                 const at::Tensor& var_logits, const OptTensor& fixed,
                 const OptTensor& fixed_ratios, bool unbiased,
                 bool ratios_given) {
  TORCH_CHECK(x.dim() >= 2, "switchable_norm: expected (N, C, *), got ",
              x.sizes());
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat ||
                                      x.scalar_type() == at::kDouble),
              "switchable_norm: float32/float64 CPU tensors only, got ",
              x.scalar_type(), " on ", x.device());
  Forward f;
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  f.x3 = x.reshape({x.size(0), x.size(1), spatial}).contiguous();
  f.correction = (unbiased && spatial > 1) ? 1 : 0;
  // G: the rows of (G, K) logits (group SN), else 1.
  const int64_t groups = mean_logits.dim() == 2 ? mean_logits.size(0) : 1;
  TORCH_CHECK(groups >= 1 && x.size(1) % groups == 0 &&
                  var_logits.sizes() == mean_logits.sizes(),
              "switchable_norm: ", groups, " ratio groups do not divide ",
              x.size(1), " channels (or the logits' shapes differ)");
  f.ratios = mixing_ratios(mean_logits, var_logits, groups, fixed,
                           fixed_ratios, spatial > 1, ratios_given);
  return f;
}

}  // namespace sn_mm_cpu
