// The quantisation census (see quant_census.h).
#include "model/h3/quant_census.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/arena.h"  // format_bytes

namespace ls::h3 {

namespace {
bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
uint64_t bytes_of(const TensorSpec& s) { return static_cast<uint64_t>(s.numel()) * static_cast<uint64_t>(dtype_size(s.dtype)); }
}  // namespace

QuantCensus quant_census(const H3Config& cfg) {
  QuantCensus c;
  c.mixed_ops = cfg.quant.mixed_ops;
  std::map<std::pair<std::string, int64_t>, QuantCensus::Linears> q;
  std::map<DType, QuantCensus::Bytes> by;
  for (const TensorSpec& s : h3_tensor_specs(cfg)) {
    QuantCensus::Bytes& b = by[s.dtype];
    b.dtype = dtype_name(s.dtype);
    ++b.tensors;
    b.bytes += bytes_of(s);
    c.total_bytes += bytes_of(s);
    std::string_view suffix;
    if (ends_with(s.name, ".weight")) suffix = ".weight";
    else if (ends_with(s.name, ".weight_scale")) suffix = ".weight_scale";
    else continue;
    const std::string m = s.name.substr(0, s.name.size() - suffix.size());
    const LinearQuant* lq = cfg.quant.find(m);
    if (!lq) {
      if (suffix == ".weight" && s.shape.size() == 2) ++c.plain_linears;
      continue;
    }
    QuantCensus::Linears& l = q[{weight_format_name(lq->format), lq->group}];
    l.format = weight_format_name(lq->format);
    l.group = lq->group;
    l.weight_bytes += bytes_of(s);
    if (suffix == ".weight") {
      ++l.count;
      if (lq->has_input_scale) ++l.with_input_scale;
    }
  }
  for (auto& [k, l] : q) c.quantised.push_back(l);
  for (auto& [k, b] : by) c.by_dtype.push_back(b);
  std::stable_sort(c.by_dtype.begin(), c.by_dtype.end(),
                   [](const QuantCensus::Bytes& a, const QuantCensus::Bytes& b) { return a.bytes > b.bytes; });
  return c;
}

std::string checkpoint_format_label(const QuantCensus& c) {
  if (c.quantised.empty()) return "bf16";
  std::string out;
  std::string last_format;
  // Groups of one format joined with '+', largest group first ("int8_convrot g256+g64").
  std::vector<QuantCensus::Linears> q = c.quantised;
  std::stable_sort(q.begin(), q.end(), [](const QuantCensus::Linears& a, const QuantCensus::Linears& b) {
    return a.format != b.format ? a.format < b.format : a.group > b.group;
  });
  for (const auto& l : q) {
    if (l.format != last_format) {
      if (!out.empty()) out += " + ";
      out += l.format;
      if (l.group > 0) out += " g" + std::to_string(l.group);
      last_format = l.format;
    } else if (l.group > 0) {
      out += "+g" + std::to_string(l.group);
    }
  }
  return out;
}

std::string quant_census_text(const QuantCensus& c) {
  std::ostringstream o;
  int64_t nq = 0;
  for (const auto& l : c.quantised) nq += l.count;
  o << "  format: " << checkpoint_format_label(c) << " (" << nq << " quantised linears, " << c.plain_linears
    << " plain";
  if (c.mixed_ops) o << "; ComfyUI mixed ops: f32 linears held as bf16";
  o << ")\n";
  for (const auto& l : c.quantised) {
    o << "  " << l.format;
    if (l.group > 0) o << " g" << l.group;
    o << ": " << l.count << " linears, " << format_bytes(l.weight_bytes);
    if (l.with_input_scale > 0) o << ", " << l.with_input_scale << " with a static input_scale";
    o << "\n";
  }
  o << "  bytes:";
  for (size_t i = 0; i < c.by_dtype.size(); ++i) {
    const auto& b = c.by_dtype[i];
    o << (i ? ", " : " ") << b.dtype << " " << format_bytes(b.bytes) << " (" << b.tensors << " tensors)";
  }
  o << "; total " << format_bytes(c.total_bytes) << "\n";
  return o.str();
}

nlohmann::ordered_json quant_census_json(const QuantCensus& c) {
  nlohmann::ordered_json j;
  j["format"] = checkpoint_format_label(c);
  j["mixed_ops"] = c.mixed_ops;
  j["plain_linears"] = c.plain_linears;
  j["quantised"] = nlohmann::ordered_json::array();
  for (const auto& l : c.quantised)
    j["quantised"].push_back({{"format", l.format},
                              {"group", l.group},
                              {"linears", l.count},
                              {"with_input_scale", l.with_input_scale},
                              {"weight_bytes", l.weight_bytes}});
  j["bytes_by_dtype"] = nlohmann::ordered_json::array();
  for (const auto& b : c.by_dtype) j["bytes_by_dtype"].push_back({{"dtype", b.dtype}, {"tensors", b.tensors}, {"bytes", b.bytes}});
  j["total_bytes"] = c.total_bytes;
  return j;
}

}  // namespace ls::h3
