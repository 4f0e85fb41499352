// Loading and validating model fixtures (YAML) into typed specs, with their canonical form and content hash.
#include "memgate/gate/fixture.h"

#include "memgate/models/registry.h"
#include "memgate/report/svg_chart.h"
#include "memgate/spec/yaml_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <set>
#include <string_view>

namespace memgate {
namespace {

using detail::MapReader;

// 64-bit FNV-1a, fed in pieces: the content hash of a fixture's canonical text and of a TorchScript module's file.
struct Fnv1a64 {
  std::uint64_t h = 1469598103934665603ULL;
  void add(std::string_view bytes) {
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 1099511628211ULL;
    }
  }
  [[nodiscard]] std::string text() const {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "fnv1a64:%016llx", static_cast<unsigned long long>(h));
    return buffer;
  }
};

const std::vector<std::string> kLoraTargets{"qkv", "proj", "fc1", "fc2"};

// A LoRA adapter's rank is at most the smaller side of the layer it adapts: embed_dim for every target of a ViT or
// GPT block (qkv, proj, fc1 take embed_dim inputs; fc2 gives embed_dim outputs).
void check_lora_rank(MapReader& parent, const LoraOptions& lora, std::int64_t width, const char* width_key) {
  if (lora.enabled() && lora.rank > width) {
    parent.fail("lora", "a rank of at most " + std::string(width_key) + " (" + std::to_string(width) +
                            "): an adapter's rank is at most the smaller side of the layer it adapts",
                "rank " + std::to_string(lora.rank));
  }
}

LoraOptions read_lora(MapReader& parent) {
  LoraOptions lora;
  if (!parent.has("lora")) return lora;
  auto r = parent.child("lora");
  lora.rank = r.get_int("rank", std::nullopt, 1, 4096);
  lora.alpha = r.get_double("alpha", static_cast<double>(lora.rank), 1e-9, 1e9);
  lora.targets = r.get_string_list("targets", std::vector<std::string>{"qkv"}, kLoraTargets);
  if (lora.targets.empty()) r.fail("targets", "at least one target layer", "an empty list");
  r.finish();
  return lora;
}

VitOptions read_vit(MapReader& r, bool allow_headless) {
  VitOptions s;
  s.img_size = r.get_int("img_size", s.img_size, 1, 1 << 16);
  s.patch_size = r.get_int("patch_size", s.patch_size, 1, s.img_size);
  if (s.img_size % s.patch_size != 0) {
    r.fail("patch_size", "a divisor of img_size (" + std::to_string(s.img_size) + ")",
           std::to_string(s.patch_size));
  }
  s.in_chans = r.get_int("in_chans", s.in_chans, 1, 1024);
  s.embed_dim = r.get_int("embed_dim", std::nullopt, 1, 1 << 16);
  s.depth = r.get_int("depth", std::nullopt, 1, 1024);
  s.num_heads = r.get_int("num_heads", std::nullopt, 1, s.embed_dim);
  if (s.embed_dim % s.num_heads != 0) {
    r.fail("num_heads", "a divisor of embed_dim (" + std::to_string(s.embed_dim) + ")",
           std::to_string(s.num_heads));
  }
  s.mlp_ratio = r.get_double("mlp_ratio", s.mlp_ratio, 0.01, 64.0);
  s.num_classes = r.get_int("num_classes", allow_headless ? 0 : s.num_classes, allow_headless ? 0 : 1, 1 << 24);
  s.qkv_bias = r.get_bool("qkv_bias", s.qkv_bias);
  s.attention = r.get_enum("attention", std::optional(s.attention), kAttentionNames);
  s.proj_drop = r.get_double("proj_drop", s.proj_drop, 0.0, 0.99);
  if (s.proj_drop == 0.0) r.leave_out_of_hash("proj_drop");  // added later: off, fixtures keep their hash
  s.lora = read_lora(r);
  check_lora_rank(r, s.lora, s.embed_dim, "embed_dim");
  return s;
}

ResNetOptions read_resnet(MapReader& r) {
  ResNetOptions s;
  s.depth = r.get_int("depth", std::nullopt, 18, 152);
  if (s.depth != 18 && s.depth != 34 && s.depth != 50 && s.depth != 101 && s.depth != 152) {
    r.fail("depth", "one of 18, 34, 50, 101, 152", std::to_string(s.depth));
  }
  s.img_size = r.get_int("img_size", s.img_size, 16, 1 << 16);
  s.in_chans = r.get_int("in_chans", s.in_chans, 1, 1024);
  s.width = r.get_int("width", s.width, 1, 1 << 14);
  s.task = r.get_enum("task", std::optional(s.task), kResNetTaskNames);
  if (s.task == ResNetOptions::Task::kClassify) {
    s.num_classes = r.get_int("num_classes", s.num_classes, 1, 1 << 24);
  } else {
    s.ways = r.get_int("ways", s.ways, 2, 1 << 16);
    s.shots = r.get_int("shots", s.shots, 1, 1 << 16);
    s.queries = r.get_int("queries", s.queries, 1, 1 << 16);
  }
  return s;
}

UNetOptions read_unet(MapReader& r) {
  UNetOptions s;
  s.img_size = r.get_int("img_size", s.img_size, 1, 1 << 16);
  s.in_chans = r.get_int("in_chans", s.in_chans, 1, 1024);
  s.num_classes = r.get_int("num_classes", s.num_classes, 1, 1 << 16);
  s.base_channels = r.get_int("base_channels", s.base_channels, 1, 1 << 14);
  s.levels = r.get_int("levels", s.levels, 1, 8);
  if (s.img_size % (std::int64_t{1} << s.levels) != 0) {
    r.fail("levels", "at most as many levels as img_size (" + std::to_string(s.img_size) + ") halves evenly",
           std::to_string(s.levels));
  }
  s.bilinear = r.get_bool("bilinear", s.bilinear);
  return s;
}

GptOptions read_gpt(MapReader& r) {
  GptOptions s;
  s.vocab_size = r.get_int("vocab_size", s.vocab_size, 1, 1 << 24);
  s.seq_len = r.get_int("seq_len", s.seq_len, 1, 1 << 20);
  s.n_layer = r.get_int("n_layer", std::nullopt, 1, 1024);
  s.n_embd = r.get_int("n_embd", std::nullopt, 1, 1 << 16);
  s.n_head = r.get_int("n_head", std::nullopt, 1, s.n_embd);
  if (s.n_embd % s.n_head != 0) {
    r.fail("n_head", "a divisor of n_embd (" + std::to_string(s.n_embd) + ")", std::to_string(s.n_head));
  }
  s.mlp_hidden = r.get_int("mlp_hidden", 4 * s.n_embd, 1, 1 << 20);
  s.mlp = r.get_enum("mlp", std::optional(s.mlp), kGptMlpNames);
  s.norm = r.get_enum("norm", std::optional(s.norm), kGptNormNames);
  s.position = r.get_enum("position", std::optional(s.position), kGptPositionNames);
  s.bias = r.get_bool("bias", s.bias);
  s.tied_embeddings = r.get_bool("tied_embeddings", s.tied_embeddings);
  s.lora = read_lora(r);
  check_lora_rank(r, s.lora, s.n_embd, "n_embd");
  return s;
}

SegNetOptions read_segnet(MapReader& r) {
  SegNetOptions s;
  s.img_size = r.get_int("img_size", s.img_size, 32, 1 << 16);
  s.in_chans = r.get_int("in_chans", s.in_chans, 1, 1024);
  s.num_classes = r.get_int("num_classes", s.num_classes, 1, 1 << 16);
  s.dims = r.get_int_list("dims", s.dims, 1, 1 << 14);
  s.depths = r.get_int_list("depths", s.depths, 1, 256);
  if (s.dims.size() != s.depths.size()) {
    r.fail("depths", "as many entries as dims (" + std::to_string(s.dims.size()) + ")",
           std::to_string(s.depths.size()) + " entries");
  }
  if (s.img_size % (std::int64_t{4} << (s.dims.size() - 1)) != 0) {
    r.fail("img_size", "a multiple of " + std::to_string(std::int64_t{4} << (s.dims.size() - 1)) +
                           " (stride of the deepest stage)", std::to_string(s.img_size));
  }
  s.decoder_dim = r.get_int("decoder_dim", s.decoder_dim, 1, 1 << 14);
  s.deep_supervision = r.get_bool("deep_supervision", s.deep_supervision);
  s.num_experts = r.get_int("num_experts", s.num_experts, 0, 64);
  return s;
}

MultimodalOptions read_multimodal(MapReader& r) {
  MultimodalOptions s;
  {
    auto llm = r.child("llm", true);
    s.llm = read_gpt(llm);
    llm.finish();
  }
  {
    auto vision = r.child("vision", true);
    s.vision = read_vit(vision, /*allow_headless=*/true);
    vision.finish();
  }
  s.text_len = r.get_int("text_len", s.text_len, 1, s.llm.seq_len);
  s.decoder_dim = r.get_int("decoder_dim", s.decoder_dim, 1, 1 << 14);
  s.decoder_depth = r.get_int("decoder_depth", s.decoder_depth, 1, 64);
  s.decoder_heads = r.get_int("decoder_heads", s.decoder_heads, 1, s.decoder_dim);
  if (s.decoder_dim % s.decoder_heads != 0) {
    r.fail("decoder_heads", "a divisor of decoder_dim (" + std::to_string(s.decoder_dim) + ")",
           std::to_string(s.decoder_heads));
  }
  s.frozen_dtype = r.get_enum("frozen_dtype", std::optional(s.frozen_dtype), kPrecisionNames);
  return s;
}

// FNV-1a over a file's bytes, streamed (a saved 7B module is many GB).
std::string file_content_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the file");
  Fnv1a64 hash;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hash.add(std::string_view(buffer.data(), static_cast<std::size_t>(in.gcount())));
  }
  return hash.text();
}

// One input (or a Python fixture's target): shape, dtype, high, values; `named` (a Python fixture's inputs) takes
// `kwarg` too.
TorchScriptInput read_torchscript_input(const YAML::Node& node, const std::string& file, const std::string& path,
                                        nlohmann::json& out, bool named = false) {
  if (!node.IsMap()) {
    throw Error(file + ":" + std::to_string(node.Mark().line + 1) + ": " + path +
                ": expected a map {shape: [B, ...], dtype: ...}, got " + detail::describe(node));
  }
  MapReader r(node, file, path, &out);
  TorchScriptInput input;
  nlohmann::json shape = nlohmann::json::array();
  for (const auto& d : r.get_sequence("shape", /*required=*/true)) {
    if (d.IsScalar() && d.Scalar() == "B") {
      input.shape.push_back(-1);
      shape.push_back("B");
      continue;
    }
    std::int64_t v = 0;
    try {
      std::size_t used = 0;
      v = std::stoll(d.IsScalar() ? d.Scalar() : std::string("?"), &used);
      if (used != d.Scalar().size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      r.fail("shape", "B (the batch size) or integers >= 1", detail::describe(d));
    }
    if (v < 1 || v > (std::int64_t{1} << 31)) r.fail("shape", "B (the batch size) or integers >= 1", detail::describe(d));
    input.shape.push_back(v);
    shape.push_back(v);
  }
  if (input.shape.empty()) r.fail("shape", "at least one dimension", "an empty list");
  r.record_value("shape", shape);
  input.dtype = r.get_enum("dtype", std::optional(c10::ScalarType::Float), kInputDtypeNames);
  // `values`: ones | zeros (any dtype), or [low, high) for a floating dtype; drawn as before without it.
  const bool floating = c10::isFloatingType(input.dtype);
  if (r.has("values")) {
    const auto node = r.node()["values"];
    const auto expected = floating ? "ones, zeros or [low, high] (uniform in [low, high), low < high)"
                                   : "ones or zeros (integer inputs are drawn from [0, high): `high: N`)";
    if (node.IsScalar() && (node.Scalar() == "ones" || node.Scalar() == "zeros")) {
      input.fill = node.Scalar() == "ones" ? TorchScriptInput::Fill::kOnes : TorchScriptInput::Fill::kZeros;
      r.record_value("values", node.Scalar());
    } else if (floating && node.IsSequence() && node.size() == 2) {
      try {
        input.low_value = node[0].as<double>();
        input.high_value = node[1].as<double>();
      } catch (const std::exception&) {
        r.fail("values", expected, detail::describe(node));
      }
      if (!std::isfinite(input.low_value) || !std::isfinite(input.high_value) || input.low_value >= input.high_value) {
        r.fail("values", expected, fmt::format("[{}, {}]", input.low_value, input.high_value));
      }
      input.fill = TorchScriptInput::Fill::kUniform;
      r.record_value("values", nlohmann::json::array({input.low_value, input.high_value}));
    } else {
      r.fail("values", expected, detail::describe(node));
    }
  }
  if (c10::isIntegralType(input.dtype, /*includeBool=*/false) && input.fill == TorchScriptInput::Fill::kRandom) {
    input.high = r.get_int("high", input.high, 1, std::numeric_limits<std::int32_t>::max());
  }
  if (named && r.has("kwarg")) {
    input.kwarg = r.get_string("kwarg", std::nullopt);
    const bool identifier = !input.kwarg.empty() && !std::isdigit(static_cast<unsigned char>(input.kwarg[0])) &&
                            std::all_of(input.kwarg.begin(), input.kwarg.end(), [](char ch) {
                              return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
                            });
    if (!identifier) r.fail("kwarg", "a Python keyword (the name of a forward() argument)", "'" + input.kwarg + "'");
  }
  r.finish();
  return input;
}

// `inputs`: one entry per forward() argument, B (the batch size) in at least one shape.
std::vector<TorchScriptInput> read_inputs(MapReader& r, bool named = false) {
  std::vector<TorchScriptInput> out;
  nlohmann::json inputs = nlohmann::json::array();
  const auto nodes = r.get_sequence("inputs", /*required=*/true);
  if (nodes.empty()) r.fail("inputs", "one entry per forward() argument", "an empty list");
  bool batched = false;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nlohmann::json one = nlohmann::json::object();
    out.push_back(read_torchscript_input(nodes[i], r.file(), r.key_path("inputs") + "[" + std::to_string(i) + "]", one,
                                         named));
    inputs.push_back(one);
    for (auto d : out.back().shape) batched = batched || d < 0;
    // Positional arguments come first, as in a call: model(*positional, **keywords).
    if (out.back().kwarg.empty() && out.size() > 1 && !out[out.size() - 2].kwarg.empty()) {
      r.fail("inputs", "the positional inputs before those with a kwarg (forward(*positional, **keywords))",
             "a positional input after one with a kwarg");
    }
    for (std::size_t j = 0; j + 1 < out.size(); ++j) {
      if (!out.back().kwarg.empty() && out[j].kwarg == out.back().kwarg) {
        r.fail("inputs", "each kwarg once", "kwarg '" + out.back().kwarg + "' twice");
      }
    }
  }
  if (!batched) r.fail("inputs", "B (the batch size) in the shape of at least one input", "no B");
  r.record_value("inputs", inputs);
  return out;
}

TorchScriptOptions read_torchscript(MapReader& r) {
  TorchScriptOptions s;
  const auto written = r.get_string("path", std::nullopt);
  const std::filesystem::path fixture_dir = std::filesystem::path(r.file()).parent_path();
  const std::filesystem::path resolved = std::filesystem::path(written).is_absolute() ? std::filesystem::path(written) : fixture_dir / written;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(resolved, ec)) {
    r.fail("path", "a TorchScript file saved with torch.jit.save, relative to the fixture's folder",
           "'" + written + "' (" + resolved.string() + " is " +
               (std::filesystem::exists(resolved, ec) ? "not a regular file)" : "not there)"));
  }
  s.path = resolved.lexically_normal().string();
  // The module's own bytes are part of the model: a re-exported module changes the fixture's hash.
  r.record_value("file_hash", file_content_hash(s.path));
  s.inputs = read_inputs(r);
  s.task = r.get_enum("task", std::optional<TorchScriptOptions::Task>(), kTorchScriptTaskNames);
  if (s.task == TorchScriptOptions::Task::kClassify) s.num_classes = r.get_int("num_classes", std::nullopt, 1, 1 << 24);
  return s;
}

// A YAML value as JSON, for a Python callable's keyword arguments: integers, numbers, booleans and null as YAML 1.2's
// core schema reads them, strings, lists and maps.
nlohmann::json yaml_to_json(const YAML::Node& node) {
  if (node.IsMap()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& item : node) out[item.first.as<std::string>()] = yaml_to_json(item.second);
    return out;
  }
  if (node.IsSequence()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : node) out.push_back(yaml_to_json(item));
    return out;
  }
  if (!node.IsDefined() || node.IsNull()) return nullptr;
  const auto& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted: a string, whatever it spells
  if (text == "true" || text == "True") return true;
  if (text == "false" || text == "False") return false;
  const bool numeric = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' ||
                                         text[0] == '+' || text[0] == '.');
  if (!numeric) return text;
  std::int64_t i = 0;
  if (const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
      ec == std::errc() && end == text.data() + text.size()) {
    return i;
  }
  double d = 0.0;
  if (const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
      ec == std::errc() && end == text.data() + text.size()) {
    return d;
  }
  return text;
}

struct Entry {
  std::string file, module, callable;
};

// `<file.py or dotted.module>:<callable>`: a file relative to the fixture's folder (it must be there), a module
// imported from the Python's own path.
Entry read_entry(MapReader& r, const std::string& key, const std::string& text) {
  const auto colon = text.rfind(':');
  const auto expected = "<file.py or dotted.module>:<callable>, e.g. models.py:build or my_pkg.models:build";
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) r.fail(key, expected, "'" + text + "'");
  Entry e;
  e.callable = text.substr(colon + 1);
  const auto identifier = [](std::string_view s) {
    return !s.empty() && !std::isdigit(static_cast<unsigned char>(s[0])) &&
           std::all_of(s.begin(), s.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; });
  };
  if (!identifier(e.callable)) r.fail(key, expected, "'" + text + "' (the callable is not a Python name)");
  const auto where = text.substr(0, colon);
  if (where.ends_with(".py") || where.find('/') != std::string::npos) {
    const std::filesystem::path written(where);
    const auto resolved = written.is_absolute() ? written : std::filesystem::path(r.file()).parent_path() / written;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(resolved, ec)) {
      r.fail(key, expected, "'" + text + "' (" + resolved.string() + " is " +
                                (std::filesystem::exists(resolved, ec) ? "not a regular file)" : "not there)"));
    }
    e.file = std::filesystem::absolute(resolved).lexically_normal().string();
    // Python imports a file by a str path, which holds no byte that is not UTF-8 (its import then fails deep in the
    // probe's process with a UnicodeDecodeError): said here, naming the file.
    if (valid_utf8(e.file) != e.file) {
      r.fail(key, "a file whose path is valid UTF-8 (Python imports it by that path; rename the folder or the file)",
             "'" + valid_utf8(e.file) + "'");
    }
  } else {
    std::size_t start = 0;
    while (start <= where.size()) {
      const auto dot = std::min(where.find('.', start), where.size());
      if (!identifier(std::string_view(where).substr(start, dot - start))) {
        r.fail(key, expected, "'" + text + "' ('" + where + "' is neither a .py file nor a dotted module name)");
      }
      start = dot + 1;
    }
    e.module = where;
  }
  return e;
}

PythonCallable read_callable(MapReader& r, const std::string& key) {
  PythonCallable c;
  c.text = r.get_string(key, std::nullopt);
  const auto e = read_entry(r, key, c.text);
  c.file = e.file;
  c.module = e.module;
  c.callable = e.callable;
  return c;
}

PythonOptions read_python(MapReader& r) {
  PythonOptions s;
  s.entry = r.get_string("entry", std::nullopt);
  const auto entry = read_entry(r, "entry", s.entry);
  s.entry_file = entry.file;
  s.entry_module = entry.module;
  s.entry_callable = entry.callable;
  if (r.has("args")) {
    auto args = r.child("args");
    s.args = yaml_to_json(args.node());
    r.record_value("args", s.args);
  }
  // The batch: a callable of the user's own, or `inputs` that memgate makes.
  if (r.has("batch")) {
    s.batch = read_callable(r, "batch");
    if (r.has("inputs")) r.fail("inputs", "no inputs with a batch: callable (the callable makes the batch)", "inputs");
  } else {
    s.inputs = read_inputs(r, /*named=*/true);
  }
  if (r.has("compute_loss")) {
    // The loop's forward(s) and loss: it replaces the task and the loss.
    s.compute_loss = read_callable(r, "compute_loss");
    for (const auto* key : {"task", "loss", "num_classes", "target"}) {
      if (r.has(key)) {
        r.fail(key, "no " + std::string(key) + " with a compute_loss: callable (it computes the loss from the model "
                    "and the batch)", "a value");
      }
    }
  } else if (r.has("loss")) {
    s.loss = r.get_string("loss", std::nullopt);
    const auto loss = read_entry(r, "loss", s.loss);
    s.loss_file = loss.file;
    s.loss_module = loss.module;
    s.loss_callable = loss.callable;
    if (r.has("task")) r.fail("task", "no task with a loss: callable (the loss is what trains)", "a task");
    if (!s.batch.empty()) {
      r.fail("loss", "a compute_loss: (model, batch) -> loss callable with a batch: callable (it gets the whole batch)",
             "a loss: callable");
    }
  } else {
    s.task = r.get_enum("task", std::optional<TorchScriptOptions::Task>(), kTorchScriptTaskNames);
    if (!s.batch.empty() && s.task != TorchScriptOptions::Task::kSum) {
      r.fail("task", "sum, or a compute_loss: callable, with a batch: callable (memgate makes no target for your "
                     "batch)", std::string("'") + std::string(name_of(kTorchScriptTaskNames, s.task)) + "'");
    }
    if (s.task == TorchScriptOptions::Task::kClassify) {
      s.num_classes = r.get_int("num_classes", std::nullopt, 1, 1 << 24);
    }
  }
  if (r.has("target")) {
    // The loss callable's batch.target: one tensor made after the inputs, as an input is.
    if (s.loss.empty()) r.fail("target", "a loss: callable beside it (the target goes to it as batch.target)", "a target");
    nlohmann::json one = nlohmann::json::object();
    s.target.push_back(read_torchscript_input(r.node()["target"], r.file(), r.key_path("target"), one));
    r.record_value("target", one);
  }
  s.blocks = r.get_string("blocks", std::string());
  if (s.blocks.empty()) r.leave_out_of_hash("blocks");
  // Which interpreter runs the model is not what the model is.
  s.python = r.get_string("python", std::string());
  r.leave_out_of_hash("python");
  if (!s.python.empty()) {
    s.python_key = r.file() + ":" + std::to_string(r.line_of("python")) + ": " + r.key_path("python");
    s.python_written = s.python;
    // A path (it has a '/') is relative to the fixture's folder, as `entry` is; a bare name is looked up on PATH.
    if (const std::filesystem::path written(s.python); s.python.find('/') != std::string::npos && written.is_relative()) {
      s.python = std::filesystem::absolute(std::filesystem::path(r.file()).parent_path() / written)
                     .lexically_normal()
                     .string();
    }
  }
  return s;
}

RegisteredOptions read_registered(MapReader& r, const Architecture& arch) {
  RegisteredOptions s;
  s.name = arch.name;
  s.options = nlohmann::json::object();
  for (const auto& [key, fallback] : arch.options.items()) {
    nlohmann::json& v = s.options[key];
    if (fallback.is_boolean()) v = r.get_bool(key, fallback.get<bool>());
    else if (fallback.is_number_integer()) {
      v = r.get_int(key, fallback.get<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
    } else if (fallback.is_number()) {
      v = r.get_double(key, fallback.get<double>(), -std::numeric_limits<double>::max(),
                       std::numeric_limits<double>::max());
    } else if (fallback.is_string()) v = r.get_string(key, fallback.get<std::string>());
    else if (fallback.is_array() && std::all_of(fallback.begin(), fallback.end(), [](const auto& e) { return e.is_string(); }) &&
             !fallback.empty()) {
      v = r.get_string_list(key, fallback.get<std::vector<std::string>>());
    } else if (fallback.is_array() &&
               std::all_of(fallback.begin(), fallback.end(), [](const auto& e) { return e.is_number_integer(); })) {
      v = r.get_int_list(key, fallback.get<std::vector<std::int64_t>>(), std::numeric_limits<std::int64_t>::min());
    } else {
      throw Error(r.file() + ": model: the registered architecture '" + arch.name + "' declares option '" + key +
                  "' with a default that is not an integer, number, boolean, string or list of integers or strings");
    }
  }
  if (arch.validate) {
    try {
      arch.validate(s.options);
    } catch (const std::exception& e) {
      throw Error(r.file() + ":" + std::to_string(r.node().Mark().line + 1) + ": model (" + arch.name + "): " + e.what());
    }
  }
  return s;
}

std::string arch_words() {
  std::string words;
  for (const auto& w : enum_words(kArchNames)) words += (words.empty() ? "" : ", ") + w;
  for (const auto& name : registered_architectures()) words += ", " + name;
  return words;
}

ModelSpec read_model(MapReader& r) {
  ModelSpec m;
  const auto word = r.get_string("arch", std::nullopt);
  if (const auto arch = parse_enum(kArchNames, word)) {
    m.arch = *arch;
  } else if (const auto* registered = find_architecture(word)) {
    m.arch = Arch::kRegistered;
    m.options = read_registered(r, *registered);
    r.finish();
    return m;
  } else {
    r.fail("arch", "one of " + arch_words(), "'" + word + "'");
  }
  switch (m.arch) {
    case Arch::kVit: m.options = read_vit(r, false); break;
    case Arch::kResNet: m.options = read_resnet(r); break;
    case Arch::kUNet: m.options = read_unet(r); break;
    case Arch::kGpt: m.options = read_gpt(r); break;
    case Arch::kSegNet: m.options = read_segnet(r); break;
    case Arch::kMultimodal: m.options = read_multimodal(r); break;
    case Arch::kTorchScript: m.options = read_torchscript(r); break;
    case Arch::kPython: m.options = read_python(r); break;
    case Arch::kRegistered: break;  // handled above
  }
  r.finish();
  return m;
}

TrainableSpec parse_trainable(MapReader& r) {
  if (r.has("trainable") && r.node()["trainable"].IsMap()) {
    auto patterns = r.child("trainable");
    TrainableSpec t;
    t.kind = TrainableSpec::Kind::kPatterns;
    t.patterns = patterns.get_string_list("train", std::nullopt);
    if (t.patterns.empty()) patterns.fail("train", "at least one name pattern", "an empty list");
    for (const auto& p : t.patterns) {
      if (p.empty()) patterns.fail("train", "non-empty name patterns such as \"head.*\"", "an empty pattern");
    }
    patterns.finish();
    return t;
  }
  const auto text = r.get_string("trainable", std::string("all"));
  TrainableSpec t;
  if (text == "all") t.kind = TrainableSpec::Kind::kAll;
  else if (text == "lora") t.kind = TrainableSpec::Kind::kLora;
  else if (text == "head") t.kind = TrainableSpec::Kind::kHead;
  else if (text.rfind("last_blocks:", 0) == 0) {
    t.kind = TrainableSpec::Kind::kLastBlocks;
    try {
      std::size_t used = 0;
      const auto digits = text.substr(12);
      t.last_blocks = std::stoll(digits, &used);
      if (used != digits.size() || t.last_blocks < 1) throw std::invalid_argument("bad");
    } catch (const std::exception&) {
      r.fail("trainable", "all, lora, head, last_blocks:N with N >= 1 or {train: [patterns]}", "'" + text + "'");
    }
  } else {
    r.fail("trainable", "all, lora, head, last_blocks:N with N >= 1 or {train: [patterns]}", "'" + text + "'");
  }
  return t;
}

// `training.distributed`: strategy and world size, and the strategy's own keys (docs/design.md; PyTorch's defaults).
DistributedSpec read_distributed(MapReader& r) {
  DistributedSpec d;
  const auto strategy = r.get_string("strategy", std::nullopt, {"ddp", "fsdp"});
  d.strategy = *parse_enum(kDistributedStrategyNames, strategy);
  d.world_size = r.get_int("world_size", std::nullopt, 1, 4096);
  if (d.strategy == DistributedStrategy::kDdp) {
    if (r.optional("bucket_cap_mb")) d.bucket_cap_mb = r.get_double("bucket_cap_mb", std::nullopt, 1e-6, 1e6);
    d.gradient_as_bucket_view = r.get_bool("gradient_as_bucket_view", false);
    for (const auto* key : {"units", "reshard_after_forward", "backward_prefetch", "reduce_dtype", "offload_policy"}) {
      if (r.has(key)) r.fail(key, "no FSDP key with strategy ddp", "a value");
    }
  } else {
    for (const auto* key : {"bucket_cap_mb", "gradient_as_bucket_view"}) {
      if (r.has(key)) r.fail(key, "no DDP key with strategy fsdp", "a value");
    }
    d.units = r.get_string("units", std::string("blocks"), {"blocks", "root"});
    // FSDP2's reshard_after_forward: a bool, or the size of the group of ranks to reshard to after forward (1:
    // none; the world size: the whole group, as true; a divisor between: FSDP2's post-forward mesh).
    const auto reshard = r.optional("reshard_after_forward") ? r.get_string("reshard_after_forward", std::nullopt) : "";
    if (reshard.empty()) {
      // FSDP2's default: the blocks reshard, the root does not.
    } else if (reshard == "true" || reshard == "false") {
      d.reshard_after_forward = reshard == "true";
    } else {
      std::int64_t n = 0;
      const auto [end, ec] = std::from_chars(reshard.data(), reshard.data() + reshard.size(), n);
      if (ec != std::errc() || end != reshard.data() + reshard.size() || n < 1 || d.world_size % n != 0) {
        r.fail("reshard_after_forward",
               fmt::format("true, false or an integer that divides the world size {} (the ranks to reshard to)",
                           d.world_size),
               "'" + reshard + "'");
      }
      d.reshard_after_forward_group = n;
    }
    d.backward_prefetch = r.get_int("backward_prefetch", 1, 1, 64);
    if (r.optional("reduce_dtype")) {
      d.reduce_dtype = r.get_enum("reduce_dtype", std::optional<Precision>(), kPrecisionNames);
    }
    // FSDP2's offload_policy: none (added later: fixtures without it keep their hash), cpu or cpu_pinned.
    d.offload_policy = r.get_enum("offload_policy", std::optional(FsdpOffload::kNone), kFsdpOffloadNames);
    if (d.offload_policy == FsdpOffload::kNone) r.leave_out_of_hash("offload_policy");
  }
  r.finish();
  return d;
}

// `training.optimizer` of a Python model given as its own: `{class: torch.optim.<Name>, ...kwargs}` or
// `file.py:callable` (model) -> optimizer; stepped in Python. Returns false where it names adamw or sgd.
bool read_own_optimizer(MapReader& r, ModelSpec& model) {
  if (!r.has("optimizer")) return false;
  const auto node = r.node()["optimizer"];
  const bool map = node.IsMap();
  if (!map && !(node.IsScalar() && node.Scalar().find(':') != std::string::npos)) return false;
  auto* py = std::get_if<PythonOptions>(&model.options);
  if (py == nullptr) {
    r.fail("optimizer", "adamw or sgd for a model that is not arch: python (a torch.optim class or a callable "
                        "is made and stepped in Python)", map ? "a map" : "'" + node.Scalar() + "'");
  }
  if (!map) {
    py->optimizer = read_callable(r, "optimizer");
    return true;
  }
  auto o = r.child("optimizer");
  py->optimizer_class = o.get_string("class", std::nullopt);
  const auto& cls = py->optimizer_class;
  const auto dot = cls.rfind('.');
  bool dotted = dot != std::string::npos && dot > 0 && dot + 1 < cls.size();
  for (std::size_t start = 0; dotted && start <= cls.size();) {
    const auto end = std::min(cls.find('.', start), cls.size());
    const auto part = std::string_view(cls).substr(start, end - start);
    dotted = !part.empty() && !std::isdigit(static_cast<unsigned char>(part[0])) &&
             std::all_of(part.begin(), part.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; });
    start = end + 1;
  }
  if (!dotted) o.fail("class", "a dotted class name such as torch.optim.RMSprop", "'" + cls + "'");
  for (const auto& item : o.node()) {
    const auto key = item.first.as<std::string>();
    if (key == "class") continue;
    if (key == "params") o.fail(key, "keyword arguments besides the parameters (memgate passes the trainable ones; "
                                     "a callable, file.py:make_optimizer, makes parameter groups)", "params");
    py->optimizer_kwargs[key] = yaml_to_json(item.second);
    o.record_value(key, py->optimizer_kwargs[key]);
  }
  o.finish();
  return true;
}

// The aten ops a selective checkpointing policy saves, looked up where torch.ops.aten looks them up: LibTorch's
// operator registry (torch::jit::getAllSortedOperatorsFor, whose order torch.ops.aten.mm.overloads() lists), so that a
// misspelt op or overload is refused as the fixture is read, before a Python starts. torch.ops.aten knows every op and
// overload of this registry (checked name by name for torch 2.11) and, besides them, only the TorchScript RPC
// builtins that libtorch_python adds (aten.to_here, aten.owner, ...), which the dispatcher never runs and so no policy
// ever sees: those are refused here. Other namespaces are checked in Python only (PythonModel): a fixture's own Python
// may define their ops (torch.library).
void check_aten_ops(const MapReader& ckpt, const std::vector<std::string>& names) {
  const auto where = fmt::format("{}:{}: {}", ckpt.file(), ckpt.line_of("save"), ckpt.key_path("save"));
  for (const auto& name : names) {
    const auto bare = name.starts_with("torch.ops.") ? name.substr(10) : name;
    if (!bare.starts_with("aten.")) continue;
    const auto dot = bare.find('.', 5);
    const auto op = bare.substr(5, dot == std::string::npos ? std::string::npos : dot - 5);
    const auto ops = torch::jit::getAllSortedOperatorsFor(c10::Symbol::fromQualString("aten::" + op));
    if (ops.empty()) {
      std::set<std::string> known;
      for (const auto& o : torch::jit::getAllOperators()) {
        if (o->schema().name().starts_with("aten::")) known.insert(o->schema().name().substr(6));
      }
      const auto near = detail::nearest_key(op, known);
      throw Error(fmt::format("{}: '{}' is not an op of torch.ops.aten (expected an op whose outputs are saved, as "
                              "torch.ops spells it, such as aten.mm, aten.addmm or aten.mm.default){}",
                              where, name, near.empty() ? "" : ": did you mean 'aten." + near + "'?"));
    }
    if (dot == std::string::npos) continue;
    const auto overload = bare.substr(dot + 1);
    std::vector<std::string> overloads;
    for (const auto& o : ops) {
      overloads.push_back(o->schema().overload_name().empty() ? "default" : o->schema().overload_name());
    }
    if (std::find(overloads.begin(), overloads.end(), overload) == overloads.end()) {
      throw Error(fmt::format("{}: '{}': torch.ops.aten.{} has no overload '{}' (its overloads: {})", where, name, op,
                              overload, fmt::join(overloads, ", ")));
    }
  }
}

// `training.gradient_checkpointing: {save: [ops]}` or `{policy: file.py:callable}` (besides an optional `blocks`):
// PyTorch's selective activation checkpointing (torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=
// create_selective_checkpoint_contexts(...))), which runs in Python: an arch: python fixture's only. The op names are
// checked against torch.ops where the model is built (PythonModel); here, their form, where they can apply, and the
// aten ones against LibTorch's operator registry (check_aten_ops).
void read_selective_checkpointing(MapReader& ckpt, const TrainingSpec& t, ModelSpec& model) {
  auto* py = std::get_if<PythonOptions>(&model.options);
  const char* key = ckpt.has("save") ? "save" : "policy";
  if (py == nullptr) {
    ckpt.fail(key, "no selective checkpointing policy for a model that is not arch: python (PyTorch's selective "
                   "checkpointing runs in Python: give the model as an arch: python fixture, as the zoo's Python "
                   "twins under fixtures/models/py_*.yaml are; `blocks` alone recomputes whole blocks)",
              ckpt.has("save") ? "a save list" : "a policy");
  }
  if (ckpt.has("save") && ckpt.has("policy")) {
    ckpt.fail("policy", "either save (the ops whose outputs are kept) or policy (a callable), not both", "both");
  }
  if (ckpt.has("save")) {
    py->checkpoint_save = ckpt.get_string_list("save", std::nullopt);
    if (py->checkpoint_save.empty()) {
      ckpt.fail("save", "at least one op name such as aten.mm (an empty list saves nothing: {blocks: [...]} or true "
                        "recomputes whole blocks)", "an empty list");
    }
    for (const auto& name : py->checkpoint_save) {
      // <namespace>.<op>[.<overload>], as torch.ops spells it (aten.mm, aten.mm.default), "torch.ops." optional.
      const auto bare = name.starts_with("torch.ops.") ? name.substr(10) : name;
      const auto parts = std::count(bare.begin(), bare.end(), '.');
      const bool words = !bare.empty() && bare.front() != '.' && bare.back() != '.' &&
                         bare.find("..") == std::string::npos &&
                         std::all_of(bare.begin(), bare.end(), [](char ch) {
                           return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.';
                         });
      if (!words || parts < 1 || parts > 2) {
        ckpt.fail("save", "op names as torch.ops spells them, <namespace>.<op> or <namespace>.<op>.<overload>, such "
                          "as aten.mm or aten.mm.default", "'" + name + "'");
      }
    }
  } else {
    py->checkpoint_policy = read_callable(ckpt, "policy");
  }
  ckpt.finish();
  const auto refuse = [&](const std::string& other, const std::string& why, const std::string& got) {
    ckpt.fail(key, "no selective checkpointing " + why + " (not measured against PyTorch's run; remove " + other +
                       " or the policy)", got);
  };
  if (t.distributed.enabled()) refuse("training.distributed", "under training.distributed", "a policy with ranks");
  if (t.activation_offload != ActivationOffload::kNone) {
    refuse("training.activation_offload", "with activation_offload", "a policy with save_on_cpu");
  }
  check_aten_ops(ckpt, py->checkpoint_save);
}

TrainingSpec read_training(MapReader& r, ModelSpec& model) {
  TrainingSpec t;
  t.own_optimizer = read_own_optimizer(r, model);
  if (t.own_optimizer) {
    for (const auto* key : {"optimizer_impl", "lr", "weight_decay", "momentum"}) {
      if (r.has(key)) {
        r.fail(key, "no " + std::string(key) + " beside a Python optimizer (give it as the optimizer's own keyword "
                    "argument: optimizer: {class: torch.optim.RMSprop, lr: 1.0e-3})", "a value");
      }
    }
  } else {
    t.optimizer = r.get_enum("optimizer", std::optional(t.optimizer), kOptimizerNames);
    t.optimizer_impl = r.get_enum("optimizer_impl", std::optional(t.optimizer_impl), kOptimizerImplNames);
    if (t.optimizer_impl == OptimizerImpl::kAuto) r.leave_out_of_hash("optimizer_impl");  // added later
    t.lr = r.get_double("lr", t.lr, 0.0, 1e3);
    t.weight_decay = r.get_double("weight_decay", t.optimizer == Optimizer::kAdamW ? 0.01 : 0.0, 0.0, 1e3);
    if (t.optimizer == Optimizer::kSgd) t.momentum = r.get_double("momentum", 0.0, 0.0, 1.0);
  }
  // Added later: absent (or null: not set), fixtures keep their hash.
  if (r.optional("max_grad_norm")) t.max_grad_norm = r.get_double("max_grad_norm", std::nullopt, 1e-12, 1e12);
  if (r.optional("ema")) {
    // timm's ModelEmaV3 with a fixed decay: ema = decay x ema + (1 - decay) x model, after each optimizer step.
    auto ema = r.child("ema");
    t.ema_decay = ema.get_double("decay", std::nullopt, 0.0, 1.0);
    if (t.ema_decay <= 0.0 || t.ema_decay >= 1.0) {
      ema.fail("decay", "a number between 0 and 1, both excluded (timm's default is 0.9998)",
               fmt::format("{}", t.ema_decay));
    }
    ema.finish();
  }
  // torch.autograd.graph.save_on_cpu around the forward. Added later: none (or absent), fixtures keep their hash.
  t.activation_offload =
      r.get_enum("activation_offload", std::optional(ActivationOffload::kNone), kActivationOffloadNames);
  if (t.activation_offload == ActivationOffload::kNone) r.leave_out_of_hash("activation_offload");
  t.trainable = parse_trainable(r);
  t.precision = r.get_enum("precision", std::optional(Precision::kFp32), kPrecisionNames);
  std::optional<MapReader> selective;  // gradient_checkpointing's map where it gives `save` or `policy`
  if (r.has("gradient_checkpointing") && r.node()["gradient_checkpointing"].IsMap()) {
    // {blocks: [...]}: only those blocks, named as the model names them ("blocks.3"); the model checks the names.
    // {save: [...]} or {policy: ...} (with or without blocks): PyTorch's selective checkpointing of those blocks
    // (every block without `blocks`), a Python fixture's only; read below, where the model is known.
    auto ckpt = r.child("gradient_checkpointing");
    const bool policy_given = ckpt.has("save") || ckpt.has("policy");
    if (ckpt.has("blocks") || !policy_given) {
      t.checkpoint_blocks = ckpt.get_string_list("blocks", std::nullopt);
      if (t.checkpoint_blocks.empty()) {
        ckpt.fail("blocks", "at least one block name such as \"blocks.3\" (false checkpoints none)", "an empty list");
      }
    }
    for (const auto& name : t.checkpoint_blocks) {
      if (name.empty() || name.back() == '.') {
        ckpt.fail("blocks", "block names as the model names them, without a final dot, such as \"blocks.3\"",
                  "'" + name + "'");
      }
    }
    if (policy_given) selective.emplace(std::move(ckpt));
    else ckpt.finish();
    t.gradient_checkpointing = true;
  } else {
    t.gradient_checkpointing = r.get_bool("gradient_checkpointing", false);
  }
  t.accumulation_steps = r.get_int("accumulation_steps", 1, 1, 4096);
  t.deterministic = r.get_bool("deterministic", false);
  if (!t.deterministic) r.leave_out_of_hash("deterministic");  // added later: off, fixtures keep their hash
  t.allocator = r.get_string("allocator", std::string());
  t.cpu_kernels = r.get_enum("cpu_kernels", std::optional(t.cpu_kernels), kCpuKernelsNames);
  if (r.optional("distributed")) {
    auto distributed = r.child("distributed");
    t.distributed = read_distributed(distributed);
  }
  // Which kernels measure it, not what the model is: the baseline folder tells them apart.
  r.leave_out_of_hash("cpu_kernels");
  t.compile = r.get_bool("compile", false);
  if (!t.compile) r.leave_out_of_hash("compile");
  if (t.compile && model.arch != Arch::kPython) {
    r.fail("compile", "false for a model that is not arch: python (torch.compile compiles Python modules)", "true");
  }
  if (t.distributed.strategy == DistributedStrategy::kFsdp && t.ema_decay > 0.0) {
    r.fail("ema", "no EMA copy under FSDP (each rank holds a shard of the parameters: an EMA of the whole module is "
                  "not what a rank keeps)", "a map");
  }
  if (t.activation_offload != ActivationOffload::kNone) {
    const auto word = "'" + std::string(name_of(kActivationOffloadNames, t.activation_offload)) + "'";
    if (t.compile) {
      r.fail("activation_offload", "none under compile: true (memgate does not measure save_on_cpu's hooks around "
                                   "a compiled module)", word);
    }
    if (t.distributed.enabled()) {
      r.fail("activation_offload", "none under training.distributed (offload is measured on one device only, for now)",
             word);
    }
  }
  if (t.distributed.strategy == DistributedStrategy::kFsdp && t.max_grad_norm > 0.0) {
    r.fail("max_grad_norm", "no clipping under FSDP (each rank holds a shard of the gradients: their norm is a "
                            "collective's)", std::to_string(t.max_grad_norm));
  }
  if (selective) read_selective_checkpointing(*selective, t, model);
  if (const auto* py = std::get_if<PythonOptions>(&model.options)) {
    using Kind = TrainableSpec::Kind;
    if (t.distributed.strategy == DistributedStrategy::kFsdp) {
      bool named = false;
      for (const auto& i : py->inputs) named = named || !i.kwarg.empty();
      const char* what = !py->batch.empty() ? "a batch: callable"
                         : !py->compute_loss.empty() ? "a compute_loss: callable"
                         : t.own_optimizer ? "a Python optimizer"
                         : named ? "inputs with a kwarg" : nullptr;
      if (what != nullptr) {
        r.fail("distributed", std::string("strategy ddp with ") + what + " (memgate's FSDP casts and shards what "
                              "its own step holds)", "strategy fsdp");
      }
    }
    if (t.trainable.kind == Kind::kLora || t.trainable.kind == Kind::kHead) {
      r.fail("trainable", "all, last_blocks:N or {train: [patterns]} for a Python model (memgate does not know its "
                          "head or adapters; name them, e.g. {train: [\"*lora_*\", \"head.*\"]})",
             "'" + t.trainable.str() + "'");
    }
    const auto needs_blocks = [&](const std::string& key, const std::string& what) {
      if (py->blocks.empty()) r.fail(key, "a model.blocks pattern (the modules " + what + " addresses)", "no blocks");
    };
    if (t.trainable.kind == Kind::kLastBlocks) needs_blocks("trainable", "last_blocks:N");
    if (t.gradient_checkpointing) needs_blocks("gradient_checkpointing", "gradient checkpointing");
    if (t.distributed.strategy == DistributedStrategy::kFsdp && t.distributed.units == "blocks") {
      needs_blocks("distributed", "FSDP's units: blocks");
    }
    if (t.compile && (t.gradient_checkpointing || t.distributed.strategy == DistributedStrategy::kFsdp)) {
      r.fail("compile", "false with gradient_checkpointing or FSDP (memgate runs those blocks itself, outside the "
                        "compiled graph)", "true");
    }
  }
  if (model.arch == Arch::kTorchScript) {
    using Kind = TrainableSpec::Kind;
    if (t.trainable.kind == Kind::kLora || t.trainable.kind == Kind::kHead || t.trainable.kind == Kind::kLastBlocks) {
      r.fail("trainable", "all or {train: [patterns]} for a TorchScript model (memgate does not know its head or "
                          "blocks; name them, e.g. {train: [\"head.*\", \"*.lora_*\"]})",
             "'" + t.trainable.str() + "'");
    }
    if (t.gradient_checkpointing) {
      r.fail("gradient_checkpointing", "false for a TorchScript model (checkpoint inside the module instead)", "true");
    }
    // fully_shard frees each unit's parameters between its forwards and gathers them again around each; a scripted
    // module reads its parameters inside its graph, where memgate cannot put them back.
    if (t.distributed.strategy == DistributedStrategy::kFsdp) {
      r.fail("distributed", "strategy ddp for a TorchScript model (memgate cannot shard a scripted module's "
                            "parameters; a Python fixture, arch: python, can)", "strategy fsdp");
    }
  }
  if (const auto* resnet = std::get_if<ResNetOptions>(&model.options);
      resnet != nullptr && resnet->task == ResNetOptions::Task::kProtonet && t.trainable.kind == TrainableSpec::Kind::kHead) {
    r.fail("trainable", "at least one trainable parameter: a ResNet with task: protonet has no head (no fc), so "
                        "head trains nothing; all, last_blocks:N or {train: [patterns]}",
           "'head'");
  }
  if (t.trainable.kind == TrainableSpec::Kind::kLora && model.arch != Arch::kRegistered) {
    bool has_lora = false;
    if (const auto* v = std::get_if<VitOptions>(&model.options)) has_lora = v->lora.enabled();
    if (const auto* g = std::get_if<GptOptions>(&model.options)) has_lora = g->lora.enabled();
    if (!has_lora) r.fail("trainable", "a model with a `lora:` section for trainable: lora", "'lora'");
  }
  r.finish();
  return t;
}

ToleranceOverride read_tolerance(MapReader& r) {
  ToleranceOverride t;
  // Bounds keep the scaled values (KiB and MiB to bytes) and baseline + allowance far from overflow.
  if (r.optional("relative")) t.relative = r.get_double("relative", std::nullopt, 0.0, 10.0);
  if (r.optional("absolute_kib")) t.absolute = r.get_int("absolute_kib", std::nullopt, 0, std::int64_t{1} << 30) << 10;
  if (r.optional("reserved_relative")) t.reserved_relative = r.get_double("reserved_relative", std::nullopt, 0.0, 10.0);
  if (r.optional("reserved_absolute_mib")) {
    t.reserved_absolute = r.get_int("reserved_absolute_mib", std::nullopt, 0, std::int64_t{1} << 20) << 20;
  }
  r.finish();
  return t;
}

}  // namespace

Tolerance default_tolerance(bool cuda) {
  Tolerance t;
  t.relative = kExactRelative;
  t.reserved_relative = cuda ? 0.0 : kExactRelative;
  t.reserved_absolute = cuda ? kCudaSegmentBytes : 0;
  return t;
}

Tolerance effective_tolerance(const Fixture& fixture, bool cuda) {
  auto t = default_tolerance(cuda);
  const auto& o = fixture.tolerance;
  t.relative = o.relative.value_or(t.relative);
  t.absolute = o.absolute.value_or(t.absolute);
  t.reserved_relative = o.reserved_relative.value_or(t.reserved_relative);
  t.reserved_absolute = o.reserved_absolute.value_or(t.reserved_absolute);
  return t;
}

std::string content_hash(const std::string& text) {
  Fnv1a64 hash;
  hash.add(text);
  return hash.text();
}

Fixture load_fixture(const std::string& path) {
  const YAML::Node root = detail::load_yaml_file(path);
  Fixture f;
  f.source = path;
  nlohmann::json read = nlohmann::json::object();  // what the file says, defaults filled in
  MapReader top(root, path, "", &read);
  f.name = top.get_string("name", std::filesystem::path(path).stem().string());
  if (f.name.empty()) top.fail("name", "a non-empty name (it names baseline files and tests)", "''");
  for (char c : f.name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') {
      top.fail("name", "letters, digits, '_' and '-' only (it names baseline files and tests)", "'" + f.name + "'");
    }
  }
  auto model = top.child("model", /*required=*/true);
  f.model = read_model(model);
  auto training = top.child("training");
  f.training = read_training(training, f.model);
  if (auto* py = std::get_if<PythonOptions>(&f.model.options)) py->compile = f.training.compile;
  f.batch_sizes = top.get_int_list("batch_sizes", std::nullopt, 1, 1 << 20);
  auto gate = top.child("gate");
  f.tolerance = read_tolerance(gate);
  top.finish();
  // The hash covers what the model is and how it trains, not batch sizes, tolerances or formatting.
  const nlohmann::json canonical = {{"model", read["model"]}, {"training", read["training"]}};
  f.canonical = canonical;
  try {
    f.hash = content_hash(canonical.dump());
  } catch (const nlohmann::json::exception&) {  // a string that is not UTF-8 (fuzzing found it)
    throw Error(path + ": a value of the model or training section is not valid UTF-8 text");
  }
  return f;
}

void override_cpu_kernels(Fixture& fixture, std::string_view word, std::string_view where) {
  if (word.empty()) return;
  const auto kernels = parse_enum(kCpuKernelsNames, word);
  if (!kernels) {
    throw Error(fmt::format("{}: expected {}, got '{}'", where, fmt::join(enum_words(kCpuKernelsNames), " or "), word));
  }
  fixture.training.cpu_kernels = *kernels;
}

}  // namespace memgate
