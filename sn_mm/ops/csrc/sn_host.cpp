// The CPU operator's host side that its forward (sn_forward.cpp) and
// backward (sn_backward.cpp) share: the special paths' switches and
// counts, the ratios a call mixes with, the input's checks and rows.
#include "sn_host.h"

#include <ATen/Dispatch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>


namespace sn_mm_cpu {

const char* const kPathNames[kPathCount] = {"short_rows", "by_sample"};
std::atomic<bool> path_on[kPathCount] = {true, true};
std::atomic<int64_t> path_taken[kPathCount] = {};

bool take(Path p, bool applies) {
  if (!applies || !path_on[p].load(std::memory_order_relaxed)) return false;
  path_taken[p].fetch_add(1, std::memory_order_relaxed);
  return true;
}

Path path_named(const std::string& name) {
  for (int p = 0; p < kPathCount; ++p)
    if (name == kPathNames[p]) return static_cast<Path>(p);
  TORCH_CHECK_VALUE(false, "SN's CPU kernels: unknown path '", name,
                    "' (expected short_rows or by_sample)");
}

std::vector<std::pair<std::string, int64_t>> path_counts() {
  std::vector<std::pair<std::string, int64_t>> counts;
  for (int p = 0; p < kPathCount; ++p)
    counts.emplace_back(kPathNames[p], path_taken[p].load());
  return counts;
}

bool set_path(const std::string& name, bool on) {
  return path_on[path_named(name)].exchange(on);
}

std::vector<double> read_doubles(const at::Tensor& t) {
  auto c = t.is_contiguous() ? t : t.contiguous();
  std::vector<double> out(c.numel());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(),
                                  "read", [&] {
                                    const scalar_t* p = c.data_ptr<scalar_t>();
                                    for (int64_t i = 0; i < c.numel(); ++i)
                                      out[i] = static_cast<double>(p[i]);
                                  });
  return out;
}

std::vector<bool> read_fixed(const c10::optional<at::Tensor>& fixed,
                             int64_t groups) {
  if (!(fixed.has_value() && fixed->defined()))
    return std::vector<bool>(2 * groups, false);
  auto f = fixed->scalar_type() == at::kBool && fixed->is_contiguous()
               ? *fixed
               : fixed->to(at::kBool).contiguous();
  TORCH_CHECK(f.numel() == 2 * groups,
              "switchable_norm: ratio_fixed must "
              "hold 2 x ",
              groups, " flags, got ", f.sizes());
  const bool* p = f.data_ptr<bool>();
  return std::vector<bool>(p, p + 2 * groups);
}

// G: the rows of (G, K) logits (group SN), else 1.
int64_t ratio_groups(const at::Tensor& logits) {
  return logits.dim() == 2 ? logits.size(0) : 1;
}

// Where IN is undefined: the other terms of src (k values) renormalised
// into dst (k - 1), or LN alone if the vector selected IN alone
// (sn_mm/ops/ratios.py's ratio_without_in).
void without_in(const double* src, int64_t k, double* dst) {
  double total = 0;
  for (int64_t i = 1; i < k; ++i) total += src[i];
  for (int64_t i = 1; i < k; ++i)
    dst[i - 1] = total > 0 ? src[i] / std::max(total, 1e-30) : 0.0;
  if (!(total > 0)) dst[0] = 1;
}

Ratios mixing_ratios(const at::Tensor& mean_logits,
                     const at::Tensor& var_logits,
                     std::vector<bool> fixed_flags,
                     const c10::optional<at::Tensor>& fixed_ratios,
                     bool has_in, bool ratios_given) {
  Ratios out;
  out.fixed = std::move(fixed_flags);
  const std::vector<bool>& is_fixed = out.fixed;
  out.has_in = has_in;
  out.k_ln = has_in ? 1 : 0;
  out.groups = ratio_groups(mean_logits);
  const int64_t groups = out.groups, k = mean_logits.numel() / groups;
  const int64_t terms = has_in ? k : k - 1;
  std::vector<double> fixed_values;
  if (std::find(is_fixed.begin(), is_fixed.end(), true) != is_fixed.end())
    fixed_values = read_doubles(*fixed_ratios);
  const at::Tensor* logits[2] = {&mean_logits, &var_logits};
  // In place, group by group: group SN's host work stays a few hundred
  // flops, without an allocation per group.
  for (int row = 0; row < 2; ++row) {
    const std::vector<double> all = read_doubles(*logits[row]);
    std::vector<double>& rows = row == 0 ? out.mean : out.var;
    rows.resize(groups * terms);
    for (int64_t g = 0; g < groups; ++g) {
      double* r = rows.data() + g * terms;
      if (is_fixed[row * groups + g]) {
        const double* src = fixed_values.data() + (row * groups + g) * k;
        if (has_in)
          std::copy_n(src, k, r);
        else
          without_in(src, k, r);
        continue;
      }
      std::copy_n(all.data() + g * k + (has_in ? 0 : 1), terms, r);
      if (!ratios_given) {  // softmax; given ratios come renormalised
        const double top = *std::max_element(r, r + terms);
        double total = 0;
        for (int64_t i = 0; i < terms; ++i)
          total += (r[i] = std::exp(r[i] - top));
        for (int64_t i = 0; i < terms; ++i) r[i] /= total;
      }
    }
  }
  return out;
}

void check_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 2, "switchable_norm: expected (N, C, *), got ",
              x.sizes());
  const auto dtype = x.scalar_type();
  TORCH_CHECK(
      x.device().is_cpu() && (dtype == at::kFloat || dtype == at::kDouble),
      "switchable_norm: float32/float64 CPU tensors only, got ", dtype, " on ",
      x.device());
}

void check_params(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias) {
  const auto dtype = x.scalar_type();
  for (const auto* t : {&weight, &bias})
    TORCH_CHECK(t->scalar_type() == dtype && t->numel() == x.size(1) &&
                    t->device().is_cpu(),
                "switchable_norm: weight and bias must be ", x.size(1),
                " CPU values of the input's dtype");
}

Forward prepared(const at::Tensor& x, const at::Tensor& mean_logits,
                 const at::Tensor& var_logits, const OptTensor& fixed,
                 const OptTensor& fixed_ratios, bool unbiased,
                 bool ratios_given) {
  check_input(x);
  Forward f;
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  f.x3 = x.reshape({x.size(0), x.size(1), spatial});
  if (!f.x3.is_contiguous()) f.x3 = f.x3.contiguous();
  f.correction = (unbiased && spatial > 1) ? 1 : 0;
  const int64_t groups = ratio_groups(mean_logits);
  TORCH_CHECK(groups >= 1 && x.size(1) % groups == 0 &&
                  var_logits.sizes() == mean_logits.sizes(),
              "switchable_norm: ", groups, " ratio groups do not divide ",
              x.size(1), " channels (or the logits' shapes differ)");
  f.ratios = mixing_ratios(mean_logits, var_logits, read_fixed(fixed, groups),
                           fixed_ratios, spatial > 1, ratios_given);
  return f;
}

}  // namespace sn_mm_cpu
