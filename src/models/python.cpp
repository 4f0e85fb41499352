// A Python model, built through what memgate's Python extension lends (models/python.h).
#include "memgate/models/python.h"

#include "memgate/base/error.h"

namespace memgate {

std::unique_ptr<Model> make_python_model(const PythonOptions& options, torch::Device device, std::uint64_t seed,
                                         const PythonRuntime* python) {
  if (python == nullptr || !python->build) {
    throw Error("model.entry " + options.entry + ": a Python model is built in a Python process that imported "
                "memgate's extension (memgate._core); run_probe starts one");
  }
  return python->build(options, device, seed);
}

}  // namespace memgate
