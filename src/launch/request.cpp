// A probe's request as JSON. Each struct's fields are listed once (fields()), and one visitor writes them while
// another reads them back, so that the two ends cannot disagree on a name; the reader names the key it fails on.
#include "memgate/launch/request.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace memgate {

namespace {

using nlohmann::json;

// How many values each enum of the request has: a number out of its range is refused, naming its key.
constexpr int enum_count(Arch) { return static_cast<int>(Arch::kRegistered) + 1; }
constexpr int enum_count(VitOptions::Attention) { return 2; }
constexpr int enum_count(ResNetOptions::Task) { return 2; }
constexpr int enum_count(GptOptions::Mlp) { return 2; }
constexpr int enum_count(GptOptions::Norm) { return 2; }
constexpr int enum_count(GptOptions::Position) { return 2; }
constexpr int enum_count(TorchScriptOptions::Task) { return 3; }
constexpr int enum_count(TorchScriptInput::Fill) { return 4; }
constexpr int enum_count(Precision) { return 3; }
constexpr int enum_count(TrainableSpec::Kind) { return 5; }
constexpr int enum_count(Optimizer) { return 2; }
constexpr int enum_count(OptimizerImpl) { return 4; }
constexpr int enum_count(CpuKernels) { return 2; }
constexpr int enum_count(ActivationOffload) { return 3; }
constexpr int enum_count(DistributedStrategy) { return 3; }
constexpr int enum_count(FsdpOffload) { return 3; }
constexpr int enum_count(EstimateTarget) { return 2; }
constexpr int enum_count(c10::ScalarType) { return static_cast<int>(c10::ScalarType::NumOptions); }

// A field added to one of these structs must be listed in its fields() below, or a probe's process would run without
// it: each size, as this platform lays them out, is checked here so that the build says so.
#if defined(__x86_64__) && defined(__GLIBCXX__)
#define MEMGATE_REQUEST_FIELDS(T, bytes) \
  static_assert(sizeof(T) == (bytes), #T " changed: list its fields in fields() (launch/request.cpp), then its size")
MEMGATE_REQUEST_FIELDS(LoraOptions, 40);
MEMGATE_REQUEST_FIELDS(VitOptions, 120);
MEMGATE_REQUEST_FIELDS(ResNetOptions, 72);
MEMGATE_REQUEST_FIELDS(UNetOptions, 48);
MEMGATE_REQUEST_FIELDS(GptOptions, 104);
MEMGATE_REQUEST_FIELDS(SegNetOptions, 96);
MEMGATE_REQUEST_FIELDS(MultimodalOptions, 264);
MEMGATE_REQUEST_FIELDS(TorchScriptInput, 96);
MEMGATE_REQUEST_FIELDS(TorchScriptOptions, 72);
MEMGATE_REQUEST_FIELDS(PythonCallable, 128);
MEMGATE_REQUEST_FIELDS(PythonOptions, 1056);
MEMGATE_REQUEST_FIELDS(RegisteredOptions, 48);
MEMGATE_REQUEST_FIELDS(TrainableSpec, 40);
MEMGATE_REQUEST_FIELDS(DistributedSpec, 112);
MEMGATE_REQUEST_FIELDS(TrainingSpec, 312);
MEMGATE_REQUEST_FIELDS(Workload, 1448);
MEMGATE_REQUEST_FIELDS(EstimateContext, 48);
MEMGATE_REQUEST_FIELDS(ProbeRequest, 1856);
#undef MEMGATE_REQUEST_FIELDS
#endif

// Each struct's fields, once: `v(key, member)` for each, on the struct or a const one (the writer's).
#define MEMGATE_FIELDS_OF(Struct)                             \
  template <class V, class T>                                 \
    requires std::same_as<std::remove_const_t<T>, Struct>     \
  void fields(V& v, T& o)
MEMGATE_FIELDS_OF(LoraOptions) {
  v("rank", o.rank), v("alpha", o.alpha), v("targets", o.targets);
}
MEMGATE_FIELDS_OF(VitOptions) {
  v("img_size", o.img_size), v("patch_size", o.patch_size), v("in_chans", o.in_chans), v("embed_dim", o.embed_dim);
  v("depth", o.depth), v("num_heads", o.num_heads), v("mlp_ratio", o.mlp_ratio), v("num_classes", o.num_classes);
  v("qkv_bias", o.qkv_bias), v("attention", o.attention), v("proj_drop", o.proj_drop), v("lora", o.lora);
}
MEMGATE_FIELDS_OF(ResNetOptions) {
  v("depth", o.depth), v("img_size", o.img_size), v("in_chans", o.in_chans), v("width", o.width);
  v("num_classes", o.num_classes), v("task", o.task), v("ways", o.ways), v("shots", o.shots);
  v("queries", o.queries);
}
MEMGATE_FIELDS_OF(UNetOptions) {
  v("img_size", o.img_size), v("in_chans", o.in_chans), v("num_classes", o.num_classes);
  v("base_channels", o.base_channels), v("levels", o.levels), v("bilinear", o.bilinear);
}
MEMGATE_FIELDS_OF(GptOptions) {
  v("vocab_size", o.vocab_size), v("seq_len", o.seq_len), v("n_layer", o.n_layer), v("n_embd", o.n_embd);
  v("n_head", o.n_head), v("mlp_hidden", o.mlp_hidden), v("mlp", o.mlp), v("norm", o.norm);
  v("position", o.position), v("bias", o.bias), v("tied_embeddings", o.tied_embeddings), v("lora", o.lora);
}
MEMGATE_FIELDS_OF(SegNetOptions) {
  v("img_size", o.img_size), v("in_chans", o.in_chans), v("num_classes", o.num_classes), v("dims", o.dims);
  v("depths", o.depths), v("decoder_dim", o.decoder_dim), v("deep_supervision", o.deep_supervision);
  v("num_experts", o.num_experts);
}
MEMGATE_FIELDS_OF(MultimodalOptions) {
  v("llm", o.llm), v("vision", o.vision), v("text_len", o.text_len), v("decoder_dim", o.decoder_dim);
  v("decoder_depth", o.decoder_depth), v("decoder_heads", o.decoder_heads), v("frozen_dtype", o.frozen_dtype);
}
MEMGATE_FIELDS_OF(TorchScriptInput) {
  v("shape", o.shape), v("dtype", o.dtype), v("high", o.high), v("fill", o.fill), v("low_value", o.low_value);
  v("high_value", o.high_value), v("kwarg", o.kwarg);
}
MEMGATE_FIELDS_OF(TorchScriptOptions) {
  v("path", o.path), v("inputs", o.inputs), v("task", o.task), v("num_classes", o.num_classes);
}
MEMGATE_FIELDS_OF(PythonCallable) {
  v("text", o.text), v("file", o.file), v("module", o.module), v("callable", o.callable);
}
MEMGATE_FIELDS_OF(PythonOptions) {
  v("entry", o.entry), v("entry_file", o.entry_file), v("entry_module", o.entry_module);
  v("entry_callable", o.entry_callable), v("args", o.args), v("inputs", o.inputs), v("task", o.task);
  v("num_classes", o.num_classes), v("loss", o.loss), v("loss_file", o.loss_file), v("loss_module", o.loss_module);
  v("loss_callable", o.loss_callable), v("batch", o.batch), v("compute_loss", o.compute_loss), v("target", o.target);
  v("optimizer_class", o.optimizer_class), v("optimizer_kwargs", o.optimizer_kwargs), v("optimizer", o.optimizer);
  v("blocks", o.blocks), v("python", o.python), v("python_written", o.python_written), v("python_key", o.python_key);
  v("compile", o.compile), v("checkpoint_save", o.checkpoint_save), v("checkpoint_policy", o.checkpoint_policy);
}
MEMGATE_FIELDS_OF(RegisteredOptions) {
  v("name", o.name), v("options", o.options);
}
MEMGATE_FIELDS_OF(ModelSpec) {
  v("arch", o.arch), v("options", o.options);
}
MEMGATE_FIELDS_OF(TrainableSpec) {
  v("kind", o.kind), v("last_blocks", o.last_blocks), v("patterns", o.patterns);
}
MEMGATE_FIELDS_OF(DistributedSpec) {
  v("strategy", o.strategy), v("world_size", o.world_size), v("bucket_cap_mb", o.bucket_cap_mb);
  v("gradient_as_bucket_view", o.gradient_as_bucket_view), v("units", o.units);
  v("reshard_after_forward", o.reshard_after_forward), v("reshard_after_forward_group", o.reshard_after_forward_group);
  v("backward_prefetch", o.backward_prefetch), v("reduce_dtype", o.reduce_dtype);
  v("offload_policy", o.offload_policy);
}
MEMGATE_FIELDS_OF(TrainingSpec) {
  v("optimizer", o.optimizer), v("optimizer_impl", o.optimizer_impl), v("lr", o.lr), v("weight_decay", o.weight_decay);
  v("momentum", o.momentum), v("trainable", o.trainable), v("precision", o.precision);
  v("gradient_checkpointing", o.gradient_checkpointing), v("checkpoint_blocks", o.checkpoint_blocks);
  v("accumulation_steps", o.accumulation_steps);
  v("deterministic", o.deterministic), v("allocator", o.allocator), v("cpu_kernels", o.cpu_kernels);
  v("distributed", o.distributed), v("compile", o.compile), v("max_grad_norm", o.max_grad_norm);
  v("own_optimizer", o.own_optimizer), v("ema_decay", o.ema_decay), v("activation_offload", o.activation_offload);
}
MEMGATE_FIELDS_OF(Workload) {
  v("name", o.name), v("source", o.source), v("model", o.model), v("training", o.training);
}
MEMGATE_FIELDS_OF(CudaReduceDevice) {
  v("multiprocessors", o.multiprocessors), v("max_threads_per_multiprocessor", o.max_threads_per_multiprocessor);
}
MEMGATE_FIELDS_OF(EstimateContext) {
  v("target", o.target), v("cpu_kernels", o.cpu_kernels), v("gpu", o.gpu), v("cudnn_device_json", o.cudnn_device_json);
}
MEMGATE_FIELDS_OF(ProbeRequest) {
  v("memgate_version", o.memgate_version), v("workload", o.workload), v("batch_sizes", o.batch_sizes);
  v("device", o.device), v("estimate", o.estimate), v("cap_bytes", o.cap_bytes);
  v("cpu_limit_bytes", o.cpu_limit_bytes), v("warmup_steps", o.warmup_steps), v("cpu_threads", o.cpu_threads);
  v("seed", o.seed), v("timeout_s", o.timeout), v("keep_going", o.keep_going), v("rank", o.rank);
  v("world_size", o.world_size), v("store", o.store), v("output", o.output), v("heartbeat", o.heartbeat);
  v("snapshot", o.snapshot), v("search", o.search), v("flops", o.flops);
}

#undef MEMGATE_FIELDS_OF

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};
template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <class T>
struct IsVariant : std::false_type {};
template <class... T>
struct IsVariant<std::variant<T...>> : std::true_type {};

// Writes each field into one JSON object.
struct Writer {
  json& out;
  template <class T>
  void operator()(const char* key, const T& value) const {
    out[key] = encode(value);
  }
  template <class T>
  static json encode(const T& value) {
    if constexpr (std::is_enum_v<T>) {
      return static_cast<int>(value);
    } else if constexpr (std::is_same_v<T, std::chrono::seconds>) {
      return value.count();
    } else if constexpr (IsOptional<T>::value) {
      return value ? encode(*value) : json(nullptr);
    } else if constexpr (IsVector<T>::value) {
      json items = json::array();
      for (const auto& item : value) items.push_back(encode(item));
      return items;
    } else if constexpr (IsVariant<T>::value) {
      // The alternative's index beside its fields: the reader builds that alternative.
      return std::visit([&](const auto& alternative) { return json{{"index", value.index()},
                                                                   {"value", encode(alternative)}}; },
                        value);
    } else if constexpr (requires(Writer& w, const T& t) { fields(w, t); }) {
      json object = json::object();
      Writer writer{object};
      fields(writer, value);
      return object;
    } else {
      return json(value);
    }
  }
};

// What a JSON value is, for messages.
std::string kind_of(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number_integer()) return "an integer";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void refuse(const std::string& where, std::string_view expected, const json& got) {
  auto shown = got.dump(-1, ' ', false, json::error_handler_t::replace);
  if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
  throw Error(fmt::format("{}: expected {}, got {} ({})", where, expected, kind_of(got), shown));
}

// Reads each field from one JSON object; every key is required, and one it does not know is refused.
struct Reader {
  const json& in;
  std::string where;
  template <class T>
  void operator()(const char* key, T& value) const {
    const auto at = where + "." + key;
    const auto it = in.find(key);
    if (it == in.end()) throw Error(fmt::format("{}: missing (a probe's request has every key)", at));
    decode(*it, value, at);
  }
  template <class T>
  static void decode(const json& j, T& value, const std::string& at) {
    if constexpr (std::is_same_v<T, bool>) {
      if (!j.is_boolean()) refuse(at, "a boolean", j);
      value = j.get<bool>();
    } else if constexpr (std::is_enum_v<T>) {
      if (!j.is_number_integer()) refuse(at, "an integer (an enum's value)", j);
      const auto n = j.get<std::int64_t>();
      if (n < 0 || n >= enum_count(T{})) {
        refuse(at, fmt::format("an enum's value from 0 to {}", enum_count(T{}) - 1), j);
      }
      value = static_cast<T>(n);
    } else if constexpr (std::is_integral_v<T>) {
      if (!j.is_number_integer()) refuse(at, "an integer", j);
      if constexpr (std::is_unsigned_v<T>) {
        if (!j.is_number_unsigned() && j.get<std::int64_t>() < 0) refuse(at, "an integer from 0", j);
        value = j.get<T>();
      } else {
        const auto n = j.get<std::int64_t>();
        if (n < std::numeric_limits<T>::min() || n > std::numeric_limits<T>::max()) {
          refuse(at, fmt::format("an integer from {} to {}", std::numeric_limits<T>::min(),
                                 std::numeric_limits<T>::max()), j);
        }
        value = static_cast<T>(n);
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!j.is_number()) refuse(at, "a number", j);
      value = j.get<T>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!j.is_string()) refuse(at, "a string", j);
      value = j.get<std::string>();
    } else if constexpr (std::is_same_v<T, json>) {
      value = j;
    } else if constexpr (std::is_same_v<T, std::chrono::seconds>) {
      std::int64_t seconds = 0;
      decode(j, seconds, at);
      value = std::chrono::seconds(seconds);
    } else if constexpr (IsOptional<T>::value) {
      if (j.is_null()) {
        value.reset();
      } else {
        typename T::value_type inner{};
        decode(j, inner, at);
        value = std::move(inner);
      }
    } else if constexpr (IsVector<T>::value) {
      if (!j.is_array()) refuse(at, "an array", j);
      value.clear();
      for (std::size_t i = 0; i < j.size(); ++i) {
        typename T::value_type item{};
        decode(j[i], item, fmt::format("{}[{}]", at, i));
        value.push_back(std::move(item));
      }
    } else if constexpr (IsVariant<T>::value) {
      if (!j.is_object()) refuse(at, "an object (index, value)", j);
      std::size_t index = 0;
      Reader{j, at}("index", index);
      if (index >= std::variant_size_v<T>) {
        refuse(at + ".index", fmt::format("an alternative's index from 0 to {}", std::variant_size_v<T> - 1),
               j.at("index"));
      }
      decode_alternative(j, value, index, at, std::make_index_sequence<std::variant_size_v<T>>{});
    } else {
      if (!j.is_object()) refuse(at, "an object", j);
      Reader reader{j, at};
      fields(reader, value);
      for (const auto& [key, unused] : j.items()) {
        Known known{key};
        fields(known, value);
        if (!known.found) throw Error(fmt::format("{}.{}: not a key of a probe's request", at, key));
      }
    }
  }
  template <class T, std::size_t... I>
  static void decode_alternative(const json& j, T& value, std::size_t index, const std::string& at,
                                 std::index_sequence<I...>) {
    (void)((index == I ? (decode_as<I>(j, value, at), true) : false) || ...);
  }
  template <std::size_t I, class T>
  static void decode_as(const json& j, T& value, const std::string& at) {
    std::variant_alternative_t<I, T> alternative{};
    Reader{j, at}("value", alternative);
    value = std::move(alternative);
  }
  // Whether a struct has the field `key`.
  struct Known {
    const std::string& key;
    bool found = false;
    template <class T>
    void operator()(const char* name, T&) {
      found = found || key == name;
    }
  };
};

}  // namespace

void to_json(nlohmann::json& j, const ProbeRequest& request) {
  auto written = request;
  written.memgate_version = MEMGATE_VERSION;
  j = Writer::encode(written);
}

void from_json(const nlohmann::json& j, ProbeRequest& request) { Reader::decode(j, request, "request"); }

void write_probe_request(const std::string& path, const ProbeRequest& request) {
  write_file_atomically(path, json(request).dump(-1, ' ', false, json::error_handler_t::replace));
}

ProbeRequest read_probe_request(const std::string& path) {
  const auto text = read_text_file(path, "a probe's request");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("{}: a probe's request is not JSON: {}", path, e.what()));
  }
  // Another memgate's request may hold other keys: the version first, named as such.
  if (const auto it = j.find("memgate_version"); j.is_object() && it != j.end() && *it != MEMGATE_VERSION) {
    throw Error(fmt::format("this program is memgate {}, and the memgate that wrote its request {} is {}: the probe's "
                            "processes must run the same memgate", MEMGATE_VERSION, path,
                            it->dump(-1, ' ', false, json::error_handler_t::replace)));
  }
  try {
    return j.get<ProbeRequest>();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace memgate
