#include "exec/weights.h"

#include "model/h3/checkpoint.h"

namespace ls::exec {

bool WeightStore::is_precompute_only(const std::string& n) {
  return n.rfind("time_embedder.", 0) == 0 || n.find("adaln_proj.") != std::string::npos || n == "adaln_t_table";
}

// Host-side only (small tables read on the host) or unused by the dense forward.
static bool is_host_only(const std::string& n) {
  return n == "rope.inv_freq" || n.find("to_gate_compress") != std::string::npos;
}

Expected<std::unique_ptr<WeightStore>> WeightStore::create(const h3::H3TensorSource& src, Backend& be) {
  std::unique_ptr<WeightStore> ws(new WeightStore(src, be));
  if (be.device().kind == DeviceKind::cpu) return ws;
  ws->host_resident_ = false;
  uint64_t total = 0;
  for (const auto& s : src.specs())
    if (!is_precompute_only(s.name) && !is_host_only(s.name))
      total += Arena::aligned_bytes(static_cast<size_t>(s.numel()) * static_cast<size_t>(dtype_size(s.dtype)));
  LS_ASSIGN_OR_RETURN(ws->arena_, Arena::create(be.memory(), total));
  for (const auto& s : src.specs()) {
    if (is_precompute_only(s.name) || is_host_only(s.name)) continue;
    const TensorView h = src.get(s.name);
    LS_ASSIGN_OR_RETURN(void* p, ws->arena_->alloc_bytes(static_cast<size_t>(h.nbytes()), s.name.c_str()));
    TensorView d = h;
    d.data = p;
    d.device = be.device();
    LS_TRY(be.copy(d, h));
    src.release(s.name);  // the device copy is the one in use
    ws->device_[s.name] = d;
  }
  LS_TRY(be.synchronize());
  ws->device_bytes_ = ws->arena_->used();
  return ws;
}

TensorView WeightStore::get(const std::string& name) const {
  if (host_resident_) return src_.get(name);
  auto it = device_.find(name);
  LS_CHECK_MSG(it != device_.end(), "weight '" + name + "' is not resident on the device");
  return it->second;
}

TensorView WeightStore::host(const std::string& name) const { return src_.get(name); }

uint64_t WeightStore::transient_bytes(const std::string& name) const {
  if (host_resident_) return 0;
  const auto* s = src_.spec(name);
  LS_CHECK_MSG(s != nullptr, "unknown weight '" + name + "'");
  return Arena::aligned_bytes(static_cast<size_t>(s->numel()) * static_cast<size_t>(dtype_size(s->dtype)));
}

Expected<TensorView> WeightStore::transient(const std::string& name, Arena& scratch) const {
  const TensorView h = src_.get(name);
  if (host_resident_) return h;
  LS_ASSIGN_OR_RETURN(void* p, scratch.alloc_bytes(static_cast<size_t>(h.nbytes()), name.c_str()));
  TensorView d = h;
  d.data = p;
  d.device = be_.device();
  LS_TRY(be_.copy(d, h));
  return d;
}

}  // namespace ls::exec
