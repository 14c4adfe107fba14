// The one file that knows which backends were built (style-lessons §2).
#include <string>

#include "backend/backend.h"
#include "backend/description.h"

#ifdef LAYERSTREAM_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace ls {

Expected<std::unique_ptr<Backend>> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (name.size() > 5) {
      try {
        size_t used = 0;
        index = std::stoi(name.substr(5), &used);
        if (used != name.size() - 5 || index < 0) throw 0;
      } catch (...) {
        return make_error(ErrorCode::invalid_argument, "bad device '" + name + "': expected cuda or cuda:N");
      }
    }
#ifdef LAYERSTREAM_CUDA
    return make_cuda_backend(index);
#else
    (void)index;
    return make_error(ErrorCode::unsupported,
                      "this layerstream was built without CUDA; rebuild with -DLAYERSTREAM_CUDA=ON to use '" + name + "'");
#endif
  }
  return make_error(ErrorCode::invalid_argument, "unknown device '" + name + "': expected cpu, cuda or cuda:N");
}

Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Numerics& n, const Diagnostics& d) {
  LS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, make_backend(name));
  Status s = b->set_numerics(n, d);
  if (!s.ok()) return make_error(s.error().code, name + ": " + s.error().message);
  return b;
}

BackendDescription describe_backend(const Backend& backend) {
  if (backend.device().kind == DeviceKind::cpu) return cpu_description();
#ifdef LAYERSTREAM_CUDA
  return cuda_description(cuda_build());
#else
  LS_CHECK_MSG(false, "a CUDA backend in a build without CUDA");
  return cuda_description();
#endif
}

AttentionEntry resolved_attention(const Backend& backend) {
  const BackendDescription desc = describe_backend(backend);
  const Numerics n = backend.numerics();
  const AttentionEntry* e = desc.attention(n.attention);
  LS_CHECK_MSG(e != nullptr, desc.name + " runs attention " + to_string(n.attention) + " without a description of it");
  return *e;
}

}  // namespace ls
