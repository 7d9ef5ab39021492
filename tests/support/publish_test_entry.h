// kforge-publish-test-entry: publishes one hand-written kernel into a cache, for tests that need a
// real entry for the exact signature a process reports (the hook's swap tests), before the worker
// that will publish verified entries exists. Everything about the kernel comes from the command
// line; nothing here knows any particular kernel.
//
//   kforge-publish-test-entry --cache DIR --signature HEX --backend cuda --source softmax.cu
//       --entry softmax_rows --launch 'entry=softmax_rows;grid=numel0 / size0_1,1,1;block=256,1,1;
//       smem=0;args=input:0,output:0,size:size0_1:i64' --output like:0 --torch-version 2.11.0+cu130
//       --device 0 --compile-option -DKFORGE_TEST_SCALE=1.001
//   # prints the entry key (32 hex digits)
//
// Promises:
// - The entry is exactly what a worker would publish for the backend, so the hook treats it like
//   any other: CUDA source compiled by the runtime's NVRTC for device N's exact architecture and
//   stored as blob "cubin", environment cuda_device_environment(driver, N, torch, nvrtc_version);
//   CPU: the given shared object as blob "so", environment cpu_host_environment(torch) with compiler
//   "c++ (kforge test)". Provenance says "test:hand-written", and the verification report says it
//   was not verified by a worker.
// - Before publishing it checks what the hook would otherwise find out later: the signature
//   decodes and is for this backend (and, for CUDA, this device's arch), the spec validates and
//   resolves for the signature, and every entry point exists in the compiled image.
// - Exit status: 0 published (key on stdout), 1 a check or step failed (message on stderr),
//   2 usage error (message and usage on stderr).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "cache/entry.h"
#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge::test_support {

struct TestEntryRequest {
  std::string cache_dir;
  std::string signature_bytes;             // decoded from --signature's hex
  Backend backend = Backend::kCpu;
  std::string source_path;
  std::vector<std::string> entry_points;
  std::vector<Launch> launches;
  std::vector<OutputSpec> outputs;
  std::vector<ScratchBuffer> scratch;
  std::string torch_version;
  std::string so_path;                     // cpu only (required there)
  std::vector<std::string> compile_options;
  int device = 0;                          // cuda only
  std::string compiler;                    // cpu only: the environment's compiler (another key)
  double speedup = 0;                      // recorded as Timings (0: none)
};

// The text forms of the command line (usage() lists them). Errors name the part that is wrong.
//   launch:  entry=NAME;grid=E[,E[,E]];block=E[,E[,E]];smem=E;args=ARG,ARG,...   (grid/block
//            default 1 per missing dimension, smem 0, args empty; E is a LaunchExpr, commas inside
//            parentheses belong to it)
//   ARG:     input:N  output:N  scratch:N  size:E[:TYPE]  scalar:N:TYPE
//            TYPE: i64 i32 f64 f32 bool (or int64, int32, float64, float32)
//   output:  like:N[:DTYPE]   explicit:DTYPE:E,E,...:E,E,...  (sizes, then strides in elements)
//   scratch: NAME=E  (bytes)
StatusOr<Launch> parse_launch(std::string_view text);
StatusOr<ArgBinding> parse_arg_binding(std::string_view text);
StatusOr<OutputSpec> parse_output(std::string_view text);
StatusOr<ScratchBuffer> parse_scratch(std::string_view text);
// Splits at commas outside parentheses: "ceil_div(numel0, 256),1" -> {"ceil_div(numel0, 256)", "1"}.
std::vector<std::string> split_top_level(std::string_view text, char sep);

// argv without the program name. kInvalidArgument: a usage error.
StatusOr<TestEntryRequest> parse_arguments(const std::vector<std::string>& args);

// Reads the files, compiles (CUDA), checks, and returns the entry that publish would write.
StatusOr<CacheEntry> build_entry(const TestEntryRequest& request);

// The whole tool: parse, build, publish; writes the key to `out`, errors to `err`. Returns the
// exit status.
int run_publish_test_entry(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

std::string usage();

}  // namespace kforge::test_support
