// oneDNN's matmul through its C API, resolved from libdnnl.so.2 at run time (dlopen): only the
// header's types are compiled in, and without the header (or with another major version's) the
// yardstick is reported missing.
#include "kernels/cpu/onednn_matmul.h"

#include <dlfcn.h>
#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace anvil::cpu {

#if !defined(DNNL_VERSION_MAJOR) || DNNL_VERSION_MAJOR != 2
// Built without oneDNN 2's header (libdnnl-dev; the C API used here is 2.x's): no yardstick.
bool onednn_available(std::string* why) {
  if (why) *why = "anvil was built without oneDNN 2's header (Debian's libdnnl-dev)";
  return false;
}
struct OneDnnMatmul::State {};
OneDnnMatmul::OneDnnMatmul(GemmPrecision, int, int, int, GemmOperand, GemmOperand, float*, bool) {
  ANVIL_FAIL("oneDNN is not available: anvil was built without oneDNN 2's header (Debian's libdnnl-dev)");
}
OneDnnMatmul::~OneDnnMatmul() = default;
void OneDnnMatmul::run() {}
std::string OneDnnMatmul::implementation() const { return {}; }
#else
namespace {

struct OneDnn {
  decltype(&dnnl_engine_create) engine_create;
  decltype(&dnnl_stream_create) stream_create;
  decltype(&dnnl_memory_desc_init_by_strides) memory_desc_init_by_strides;
  decltype(&dnnl_matmul_desc_init) matmul_desc_init;
  decltype(&dnnl_primitive_attr_create) primitive_attr_create;
  decltype(&dnnl_primitive_attr_destroy) primitive_attr_destroy;
  decltype(&dnnl_post_ops_create) post_ops_create;
  decltype(&dnnl_post_ops_destroy) post_ops_destroy;
  decltype(&dnnl_post_ops_append_sum) post_ops_append_sum;
  decltype(&dnnl_primitive_attr_set_post_ops) primitive_attr_set_post_ops;
  decltype(&dnnl_primitive_desc_create) primitive_desc_create;
  decltype(&dnnl_primitive_desc_destroy) primitive_desc_destroy;
  decltype(&dnnl_primitive_desc_query) primitive_desc_query;
  decltype(&dnnl_primitive_create) primitive_create;
  decltype(&dnnl_primitive_destroy) primitive_destroy;
  decltype(&dnnl_memory_create) memory_create;
  decltype(&dnnl_memory_destroy) memory_destroy;
  decltype(&dnnl_primitive_execute) primitive_execute;
  decltype(&dnnl_stream_wait) stream_wait;
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  std::string error;  // why the library is not usable; empty when it is
};

// Loaded once, for the life of the process.
const OneDnn& onednn() {
  static const OneDnn lib = [] {
    OneDnn d{};
    void* handle = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      d.error = fmt::format("libdnnl.so.2 did not load ({})", dlerror());
      return d;
    }
    bool resolved = true;
    auto resolve = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (!fn && resolved) d.error = fmt::format("libdnnl.so.2 has no {}", name), resolved = false;
    };
    resolve(d.engine_create, "dnnl_engine_create");
    resolve(d.stream_create, "dnnl_stream_create");
    resolve(d.memory_desc_init_by_strides, "dnnl_memory_desc_init_by_strides");
    resolve(d.matmul_desc_init, "dnnl_matmul_desc_init");
    resolve(d.primitive_attr_create, "dnnl_primitive_attr_create");
    resolve(d.primitive_attr_destroy, "dnnl_primitive_attr_destroy");
    resolve(d.post_ops_create, "dnnl_post_ops_create");
    resolve(d.post_ops_destroy, "dnnl_post_ops_destroy");
    resolve(d.post_ops_append_sum, "dnnl_post_ops_append_sum");
    resolve(d.primitive_attr_set_post_ops, "dnnl_primitive_attr_set_post_ops");
    resolve(d.primitive_desc_create, "dnnl_primitive_desc_create");
    resolve(d.primitive_desc_destroy, "dnnl_primitive_desc_destroy");
    resolve(d.primitive_desc_query, "dnnl_primitive_desc_query");
    resolve(d.primitive_create, "dnnl_primitive_create");
    resolve(d.primitive_destroy, "dnnl_primitive_destroy");
    resolve(d.memory_create, "dnnl_memory_create");
    resolve(d.memory_destroy, "dnnl_memory_destroy");
    resolve(d.primitive_execute, "dnnl_primitive_execute");
    resolve(d.stream_wait, "dnnl_stream_wait");
    if (!resolved) return d;
    if (d.engine_create(&d.engine, dnnl_cpu, 0) != dnnl_success ||
        d.stream_create(&d.stream, d.engine, dnnl_stream_default_flags) != dnnl_success)
      d.error = "oneDNN could not create its CPU engine";
    return d;
  }();
  return lib;
}

void check(dnnl_status_t status, const char* what) {
  ANVIL_CHECK(status == dnnl_success, "oneDNN: {} failed (status {})", what, static_cast<int>(status));
}

}  // namespace

bool onednn_available(std::string* why) {
  const OneDnn& d = onednn();
  if (why) *why = d.error;
  return d.error.empty();
}

// What a matmul holds, freed on every path out (a constructor that throws included).
struct OneDnnMatmul::State {
  std::vector<uint16_t> a16, b16;  // the bf16 operands
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t primitive = nullptr;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  ~State() {
    const OneDnn& d = onednn();
    for (dnnl_memory_t m : {a, b, c})
      if (m) d.memory_destroy(m);
    if (primitive) d.primitive_destroy(primitive);
    if (pd) d.primitive_desc_destroy(pd);
    if (post_ops) d.post_ops_destroy(post_ops);
    if (attr) d.primitive_attr_destroy(attr);
  }
};

OneDnnMatmul::OneDnnMatmul(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c,
                           bool accumulate)
    : state_(std::make_unique<State>()) {
  const OneDnn& d = onednn();
  ANVIL_CHECK(d.error.empty(), "oneDNN is not available: {}", d.error);
  const bool bf16 = precision == GemmPrecision::bf16;
  const dnnl_data_type_t operand_type = bf16 ? dnnl_bf16 : dnnl_f32;
  // A bf16 copy of everything an operand's strides reach, at the same offsets.
  auto operand = [&](const GemmOperand& m, int rows, int cols, std::vector<uint16_t>& copy) -> void* {
    if (!bf16) return const_cast<float*>(m.data);
    copy.resize(static_cast<size_t>((rows - 1) * m.row_stride + (cols - 1) * m.col_stride + 1));
    for (size_t i = 0; i < copy.size(); i++) copy[i] = float_to_bf16(m.data[i]);
    return copy.data();
  };
  void* a_data = operand(a, M, K, state_->a16);
  void* b_data = operand(b, K, N, state_->b16);
  dnnl_memory_desc_t a_md, b_md, c_md;
  const dnnl_dims_t a_dims = {M, K}, a_strides = {a.row_stride, a.col_stride};
  const dnnl_dims_t b_dims = {K, N}, b_strides = {b.row_stride, b.col_stride};
  const dnnl_dims_t c_dims = {M, N}, c_strides = {N, 1};
  check(d.memory_desc_init_by_strides(&a_md, 2, a_dims, operand_type, a_strides), "the A descriptor");
  check(d.memory_desc_init_by_strides(&b_md, 2, b_dims, operand_type, b_strides), "the B descriptor");
  check(d.memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_strides), "the C descriptor");
  dnnl_matmul_desc_t desc;
  check(d.matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md), "the matmul descriptor");
  check(d.primitive_attr_create(&state_->attr), "the attributes");
  if (accumulate) {  // C += A·B as a sum post-op
    check(d.post_ops_create(&state_->post_ops), "the post-ops");
    check(d.post_ops_append_sum(state_->post_ops, 1.0f), "the sum post-op");
    check(d.primitive_attr_set_post_ops(state_->attr, state_->post_ops), "setting the post-ops");
  }
  check(d.primitive_desc_create(&state_->pd, &desc, state_->attr, d.engine, nullptr),
        "choosing a matmul implementation");
  check(d.primitive_create(&state_->primitive, state_->pd), "creating the matmul");
  check(d.memory_create(&state_->a, &a_md, d.engine, a_data), "wrapping A");
  check(d.memory_create(&state_->b, &b_md, d.engine, b_data), "wrapping B");
  check(d.memory_create(&state_->c, &c_md, d.engine, c), "wrapping C");
}

OneDnnMatmul::~OneDnnMatmul() = default;

void OneDnnMatmul::run() {
  const OneDnn& d = onednn();
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, state_->a}, {DNNL_ARG_WEIGHTS, state_->b}, {DNNL_ARG_DST, state_->c}};
  check(d.primitive_execute(state_->primitive, d.stream, 3, args), "running the matmul");
  check(d.stream_wait(d.stream), "waiting for the matmul");
}

std::string OneDnnMatmul::implementation() const {
  const char* name = nullptr;
  if (onednn().primitive_desc_query(state_->pd, dnnl_query_impl_info_str, 0, &name) != dnnl_success || !name)
    return "unknown";
  return name;
}
#endif

}  // namespace anvil::cpu
