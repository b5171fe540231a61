#include "hyserve/common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "hyserve/common/error.h"
#include "hyserve/common/json.h"

namespace hyserve {

namespace {

namespace json = boost::json;

// Read-only private mapping of a whole file; unmapped on destruction.
class file_mapping {
 public:
  file_mapping() = default;
  file_mapping(const void* addr, size_t size) : addr_(addr), size_(size) {}
  file_mapping(file_mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  file_mapping& operator=(file_mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  file_mapping(const file_mapping&) = delete;
  file_mapping& operator=(const file_mapping&) = delete;
  ~file_mapping() { reset(); }

  const uint8_t* bytes() const { return static_cast<const uint8_t*>(addr_); }
  size_t size() const { return size_; }

 private:
  void reset() {
    // munmap only fails for invalid arguments, which would be a bug here; nothing to report.
    if (addr_) ::munmap(const_cast<void*>(addr_), size_);
    addr_ = nullptr;
    size_ = 0;
  }
  const void* addr_ = nullptr;
  size_t size_ = 0;
};

// Closes a POSIX descriptor on scope exit (the mapping outlives it).
class fd_guard {
 public:
  explicit fd_guard(int fd) : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_;
};

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw format_error(path + ": " + what); }

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& what) {
  throw format_error(path + ": tensor " + name + ": " + what);
}

// Safetensors dtype strings we can hold; every other one (F64, U8, BOOL, F8_*...) is rejected.
std::optional<dtype> parse_safetensors_dtype(std::string_view s) {
  if (s == "F32") return dtype::kF32;
  if (s == "BF16") return dtype::kBF16;
  if (s == "F16") return dtype::kF16;
  if (s == "I32") return dtype::kI32;
  if (s == "I64") return dtype::kI64;
  return std::nullopt;
}

std::string_view safetensors_dtype_name(dtype t) {
  switch (t) {
    case dtype::kF32: return "F32";
    case dtype::kBF16: return "BF16";
    case dtype::kF16: return "F16";
    case dtype::kI32: return "I32";
    case dtype::kI64: return "I64";
  }
  return "?";
}

// A JSON integer ≥ 0 (int64 or uint64 kind).
std::optional<uint64_t> as_unsigned(const json::value& v) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64() && v.get_int64() >= 0) return static_cast<uint64_t>(v.get_int64());
  return std::nullopt;
}

tensor_info parse_entry(const std::string& path, const std::string& name, const json::value& entry,
                        uint64_t data_size) {
  if (!entry.is_object()) fail_tensor(path, name, "header entry is not an object, got " + json_excerpt(entry));
  const json::object& obj = entry.get_object();
  tensor_info info;
  info.name = name;

  const json::value* dt = obj.if_contains("dtype");
  if (!dt) fail_tensor(path, name, "missing \"dtype\"");
  if (!dt->is_string()) fail_tensor(path, name, "\"dtype\" is not a string, got " + json_excerpt(*dt));
  const std::string_view dt_name(dt->get_string());
  const auto parsed = parse_safetensors_dtype(dt_name);
  if (!parsed)
    fail_tensor(path, name, "unsupported dtype '" + std::string(dt_name) + "' (supported: F32, BF16, F16, I32, I64)");
  info.type = *parsed;

  const json::value* sh = obj.if_contains("shape");
  if (!sh) fail_tensor(path, name, "missing \"shape\"");
  if (!sh->is_array()) fail_tensor(path, name, "\"shape\" is not an array, got " + json_excerpt(*sh));
  const json::array& dims = sh->get_array();
  if (dims.size() > static_cast<size_t>(kMaxDims))
    fail_tensor(path, name, "rank " + std::to_string(dims.size()) + " exceeds " + std::to_string(kMaxDims));
  info.shape.ndim = static_cast<int>(dims.size());
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < dims.size(); ++i) {
    const auto d = as_unsigned(dims[i]);
    if (!d || *d > static_cast<uint64_t>(INT64_MAX))
      fail_tensor(path, name, "\"shape\" must hold non-negative integers, got " + json_excerpt(*sh));
    info.shape.dims[i] = static_cast<int64_t>(*d);
    overflow = overflow || __builtin_mul_overflow(numel, *d, &numel);
  }
  uint64_t expected_bytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, dtype_size(info.type), &expected_bytes);
  if (overflow) fail_tensor(path, name, "shape " + info.shape.str() + " is too large");

  const json::value* off = obj.if_contains("data_offsets");
  if (!off) fail_tensor(path, name, "missing \"data_offsets\"");
  if (!off->is_array() || off->get_array().size() != 2)
    fail_tensor(path, name, "\"data_offsets\" must be [begin, end], got " + json_excerpt(*off));
  const auto begin = as_unsigned(off->get_array()[0]);
  const auto end = as_unsigned(off->get_array()[1]);
  if (!begin || !end)
    fail_tensor(path, name, "\"data_offsets\" must hold non-negative integers, got " + json_excerpt(*off));
  if (*begin > *end)
    fail_tensor(path, name,
                "data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) + "] has begin > end");
  if (*end > data_size)
    fail_tensor(path, name,
                "data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) +
                    "] past end of data section (" + std::to_string(data_size) + " bytes)");
  if (*end - *begin != expected_bytes)
    fail_tensor(path, name,
                "byte range of " + std::to_string(*end - *begin) + " bytes does not match shape " + info.shape.str() +
                    " x " + std::string(safetensors_dtype_name(info.type)) + " = " + std::to_string(expected_bytes) +
                    " bytes");
  info.begin = *begin;
  info.end = *end;
  return info;
}

// f32/bf16/f16 element run → f32. Sources may be unaligned inside the mapping (the data section
// starts at 8 + header length), so elements are read with memcpy.
void convert_to_f32(const uint8_t* src, dtype t, size_t n, float* dst) {
  if (n == 0) return;  // empty tensors own no storage (dst is null)
  switch (t) {
    case dtype::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case dtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case dtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    case dtype::kI32:
    case dtype::kI64: break;
  }
  HYSERVE_CHECK(false, "convert_to_f32 called with an integer dtype");
}

bool is_float_type(dtype t) { return t == dtype::kF32 || t == dtype::kBF16 || t == dtype::kF16; }

}  // namespace

struct safetensors_file::impl {
  std::string path;
  file_mapping mapping;
  const uint8_t* data = nullptr;               // start of the data section (mapping + 8 + header length)
  std::map<std::string, tensor_info> tensors;  // sorted by name

  const tensor_info& find(const std::string& name) const {
    const auto it = tensors.find(name);
    if (it == tensors.end()) fail_tensor(path, name, "not found");
    return it->second;
  }

  // Checks the dtype class and the full shape shared by load_f32 and load_f32_slice.
  const tensor_info& find_float(const std::string& name, const shape_t& expected) const {
    const tensor_info& info = find(name);
    if (!is_float_type(info.type))
      fail_tensor(path, name,
                  "dtype " + std::string(safetensors_dtype_name(info.type)) +
                      " cannot be loaded as f32 (expected F32, BF16 or F16)");
    if (!(info.shape == expected))
      fail_tensor(path, name, "expected shape " + expected.str() + ", got " + info.shape.str());
    return info;
  }
};

safetensors_file safetensors_file::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  fd_guard guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    fail(path, "file of " + std::to_string(file_size) + " bytes is too small for the 8-byte header length");

  void* addr = ::mmap(nullptr, static_cast<size_t>(file_size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) fail(path, std::string("cannot mmap: ") + std::strerror(errno));
  auto p = std::make_unique<impl>();
  p->path = path;
  p->mapping = file_mapping(addr, static_cast<size_t>(file_size));
  const uint8_t* bytes = p->mapping.bytes();

  uint64_t header_len = 0;  // u64 little-endian
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > file_size - 8)
    fail(path,
         "header length " + std::to_string(header_len) + " past end of file (size " + std::to_string(file_size) + ")");
  const uint64_t data_size = file_size - 8 - header_len;
  p->data = bytes + 8 + header_len;

  std::string err;
  const auto header = parse_json(std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len), err);
  if (!header) fail(path, "header is not valid JSON: " + err);
  if (!header->is_object()) fail(path, "header is not a JSON object, got " + json_excerpt(*header));

  for (const auto& [key, value] : header->get_object()) {
    const std::string name(key);
    if (name == "__metadata__") {
      if (!value.is_object()) fail(path, "\"__metadata__\" is not an object");
      for (const auto& [mkey, mvalue] : value.get_object())
        if (!mvalue.is_string()) fail(path, "\"__metadata__\" entry '" + std::string(mkey) + "' is not a string");
      continue;
    }
    tensor_info info = parse_entry(path, name, value, data_size);
    if (!p->tensors.emplace(name, std::move(info)).second) fail_tensor(path, name, "listed twice in the header");
  }

  // Overlap check: sort the non-empty ranges by start, each must begin at or after the end of
  // the previous one.
  std::vector<const tensor_info*> by_offset;
  by_offset.reserve(p->tensors.size());
  for (const auto& [name, info] : p->tensors)
    if (info.end > info.begin) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const tensor_info* a, const tensor_info* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const tensor_info& a = *by_offset[i - 1];
    const tensor_info& b = *by_offset[i];
    if (b.begin < a.end)
      fail(path, "tensors '" + a.name + "' [" + std::to_string(a.begin) + ", " + std::to_string(a.end) + ") and '" +
                     b.name + "' [" + std::to_string(b.begin) + ", " + std::to_string(b.end) + ") overlap");
  }
  return safetensors_file(std::move(p));
}

safetensors_file::safetensors_file(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
safetensors_file::safetensors_file(safetensors_file&&) noexcept = default;
safetensors_file& safetensors_file::operator=(safetensors_file&&) noexcept = default;
safetensors_file::~safetensors_file() = default;

const std::string& safetensors_file::path() const { return impl_->path; }

bool safetensors_file::contains(const std::string& name) const { return impl_->tensors.count(name) != 0; }

const tensor_info& safetensors_file::info(const std::string& name) const { return impl_->find(name); }

std::vector<std::string> safetensors_file::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->tensors.size());
  for (const auto& [name, info] : impl_->tensors) out.push_back(name);
  return out;
}

const void* safetensors_file::data(const std::string& name) const { return impl_->data + impl_->find(name).begin; }

host_tensor safetensors_file::load_f32(const std::string& name, const shape_t& expected) const {
  const tensor_info& info = impl_->find_float(name, expected);
  host_tensor out = host_tensor::f32(info.shape);
  convert_to_f32(impl_->data + info.begin, info.type, static_cast<size_t>(out.numel()), out.as<float>());
  return out;
}

host_tensor safetensors_file::load_f32_slice(const std::string& name, const shape_t& expected_full, int dim,
                                             int64_t begin, int64_t end) const {
  const tensor_info& info = impl_->find_float(name, expected_full);
  const shape_t& full = info.shape;
  if (dim < 0 || dim >= full.ndim)
    throw invalid_argument_error(impl_->path + ": tensor " + name + ": slice dimension " + std::to_string(dim) +
                                 " out of range for shape " + full.str());
  if (begin < 0 || begin > end || end > full[dim])
    throw invalid_argument_error(impl_->path + ": tensor " + name + ": slice [" + std::to_string(begin) + ", " +
                                 std::to_string(end) + ") of dimension " + std::to_string(dim) +
                                 " out of range for shape " + full.str());
  // View the tensor as [outer, full[dim], inner] and copy rows [begin, end) of the middle axis
  // for every outer index; only those bytes of the mapping are touched.
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= full[i];
  for (int i = dim + 1; i < full.ndim; ++i) inner *= full[i];
  shape_t out_shape = full;
  out_shape[dim] = end - begin;
  host_tensor out = host_tensor::f32(out_shape);
  const size_t elem = dtype_size(info.type);
  const size_t run = static_cast<size_t>((end - begin) * inner);
  const uint8_t* src = impl_->data + info.begin;
  float* dst = out.as<float>();
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t src_elem = (o * full[dim] + begin) * inner;
    convert_to_f32(src + static_cast<size_t>(src_elem) * elem, info.type, run, dst + static_cast<size_t>(o) * run);
  }
  return out;
}

// ---- checkpoint -------------------------------------------------------------------------------

checkpoint checkpoint::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(dir, "checkpoint directory does not exist or is not a directory");

  // Which files: the index's weight_map when there is one (sharded checkpoints), else the
  // canonical single file model.safetensors, else every *.safetensors in the directory. The
  // single-file rule matches how Hugging Face loads a directory and keeps unrelated files
  // (e.g. test reference tensors) out of the weight set.
  std::vector<std::string> file_names;
  std::map<std::string, std::string> index_map;  // tensor name → file name, from the index
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    std::string err;
    const auto text = read_text_file(index_path.string(), err);
    if (!text) fail(index_path.string(), "cannot read: " + err);
    const auto index = parse_json(*text, err);
    if (!index) fail(index_path.string(), "not valid JSON: " + err);
    const json::value* wm = index->is_object() ? index->get_object().if_contains("weight_map") : nullptr;
    if (!wm || !wm->is_object()) fail(index_path.string(), "missing \"weight_map\" object");
    std::set<std::string> unique;
    for (const auto& [tensor, file] : wm->get_object()) {
      if (!file.is_string())
        fail(index_path.string(), "weight_map entry '" + std::string(tensor) + "' is not a file name string");
      unique.emplace(file.get_string());
      index_map.emplace(std::string(tensor), std::string(file.get_string()));
    }
    file_names.assign(unique.begin(), unique.end());
  } else if (fs::is_regular_file(fs::path(dir) / "model.safetensors", ec)) {
    file_names.push_back("model.safetensors");
  } else {
    for (fs::directory_iterator it(dir, ec), last; !ec && it != last; it.increment(ec)) {
      if (it->path().extension() == ".safetensors" && it->is_regular_file(ec))
        file_names.push_back(it->path().filename().string());
    }
    if (ec) fail(dir, "cannot list checkpoint directory: " + ec.message());
    std::sort(file_names.begin(), file_names.end());
  }
  if (file_names.empty()) fail(dir, "no *.safetensors files in checkpoint directory");

  checkpoint ck;
  std::map<std::string, size_t> owner;  // tensor name → index into files_
  for (const auto& file_name : file_names) {
    ck.files_.push_back(safetensors_file::open((fs::path(dir) / file_name).string()));
    const safetensors_file& f = ck.files_.back();
    for (const auto& name : f.names()) {
      const auto [it, inserted] = owner.emplace(name, ck.files_.size() - 1);
      if (!inserted) fail(dir, "tensor " + name + " is in both " + ck.files_[it->second].path() + " and " + f.path());
    }
  }
  for (const auto& [tensor, file] : index_map) {
    const auto it = owner.find(tensor);
    if (it == owner.end() || ck.files_[it->second].path() != (fs::path(dir) / file).string())
      fail(index_path.string(), "weight_map says tensor " + tensor + " is in " + file + ", but it is not there");
  }
  return ck;
}

bool checkpoint::contains(const std::string& name) const {
  return std::any_of(files_.begin(), files_.end(), [&](const safetensors_file& f) { return f.contains(name); });
}

const safetensors_file& checkpoint::file_of(const std::string& name) const {
  // A handful of files at most; each lookup is a map search.
  for (const auto& f : files_)
    if (f.contains(name)) return f;
  std::string where = files_.empty() ? std::string("empty checkpoint")
                                     : std::filesystem::path(files_.front().path()).parent_path().string();
  throw format_error(where + ": tensor " + name + ": not found in checkpoint");
}

host_tensor checkpoint::load_f32(const std::string& name, const shape_t& expected) const {
  return file_of(name).load_f32(name, expected);
}

host_tensor checkpoint::load_f32_slice(const std::string& name, const shape_t& expected_full, int dim, int64_t begin,
                                       int64_t end) const {
  return file_of(name).load_f32_slice(name, expected_full, dim, begin, end);
}

}  // namespace hyserve
