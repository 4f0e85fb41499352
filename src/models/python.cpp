// The hook through which memgate's Python extension builds Python models (models/python.h).
#include "memgate/models/python.h"

#include "memgate/base/error.h"

#include <mutex>

namespace memgate {
namespace {

std::mutex g_mutex;
PythonModelFactory g_factory;
PythonBuildReuse g_reuse;

}  // namespace

void set_python_model_factory(PythonModelFactory factory) {
  const std::lock_guard lock(g_mutex);
  g_factory = std::move(factory);
}

void set_python_build_reuse(PythonBuildReuse reuse) {
  const std::lock_guard lock(g_mutex);
  g_reuse = std::move(reuse);
}

void reuse_python_builds(bool on) {
  PythonBuildReuse reuse;
  {
    const std::lock_guard lock(g_mutex);
    reuse = g_reuse;
  }
  if (reuse.enable) reuse.enable(on);
}

void drop_reused_python_build() {
  PythonBuildReuse reuse;
  {
    const std::lock_guard lock(g_mutex);
    reuse = g_reuse;
  }
  if (reuse.drop) reuse.drop();
}

bool python_models_available() {
  const std::lock_guard lock(g_mutex);
  return static_cast<bool>(g_factory);
}

std::unique_ptr<Model> make_python_model(const PythonOptions& options, torch::Device device, std::uint64_t seed) {
  PythonModelFactory factory;
  {
    const std::lock_guard lock(g_mutex);
    factory = g_factory;
  }
  if (!factory) {
    throw Error("model.entry " + options.entry + ": a Python model is built in a Python process that imported "
                "memgate's extension (memgate._core); run_probe starts one");
  }
  return factory(options, device, seed);
}

}  // namespace memgate
