// The registry of architectures that programs linking memgate add to the zoo.
#include "memgate/models/registry.h"

#include "memgate/base/error.h"
#include "memgate/models/zoo.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace memgate {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, Architecture> by_name;
};

Registry& registry() {
  static Registry r;  // constructed on first use: registrations from other translation units' static init
  return r;
}

}  // namespace

bool register_architecture(Architecture architecture) {
  const auto& name = architecture.name;
  const bool valid_name = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  if (!valid_name) throw Error("register_architecture: '" + name + "' is not a name of letters, digits and '_'");
  if (parse_enum(kArchNames, name)) {
    throw Error("register_architecture: '" + name + "' is an architecture of memgate's zoo; choose another name");
  }
  if (!architecture.options.is_object()) {
    throw Error("register_architecture: " + name + ": options must be a JSON object of keys and defaults");
  }
  if (architecture.options.contains("arch")) {
    throw Error("register_architecture: " + name + ": `arch` is memgate's key, not an option");
  }
  if (!architecture.factory) throw Error("register_architecture: " + name + ": no factory");
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.by_name.contains(name)) throw Error("register_architecture: '" + name + "' is registered twice");
  r.by_name.emplace(name, std::move(architecture));
  return true;
}

const Architecture* find_architecture(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  const auto it = r.by_name.find(name);
  return it == r.by_name.end() ? nullptr : &it->second;
}

std::vector<std::string> registered_architectures() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [name, arch] : r.by_name) out.push_back(name);
  return out;
}

}  // namespace memgate
