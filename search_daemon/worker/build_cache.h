// The build cache's key and files: one framed, checksummed file per key under the cache directory,
// holding a build's outcome (Note [Build cache files] in build_cache.cc). CandidateBuilder decides
// what to build and what is worth caching; this file decides how it is named, laid out and checked.
//
//   KFORGE_RETURN_IF_ERROR(build_cache::prepare_cache_dir(dir));      // once, before any entry
//   const std::string key = build_cache::cache_key(spec, identity);
//   StatusOr<std::optional<build_cache::CacheRecord>> hit = build_cache::read_entry(dir, key);
//   if (!hit.ok()) ...                 // the disk failed
//   else if (*hit) serve(**hit);       // a whole, intact record stored under this key
//   else ... build ..., then KFORGE_RETURN_IF_ERROR(build_cache::write_entry(dir, key, record));
//
// Promises:
// - The key is SHA-256 (64 hex digits) over length-prefixed fields: a domain string bumped when
//   the frame or the meaning of a key changes, the backend, the target identity, the CPU ABI
//   version and header, the fixed CPU flags (CPU only), the source, the entry points and the
//   compile options. No two different inputs share their bytes.
// - read_entry never serves a damaged entry: a missing file, a symbolic link, anything but a regular
//   file, an oversized file, or a frame that fails any check (magic, format, length, checksum, the
//   key inside) is a miss (nullopt), never an error; only the disk failing is an error.
// - write_entry installs by write to a private temporary name, fsync and rename, then fsyncs the
//   directory: a reader sees a whole old file or a whole new one, and concurrent writers of one
//   key never write the same file.
// - Directories are ours: created 0700, and one that is a symbolic link or belongs to another uid
//   is refused.
// - Nothing throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/kernel_spec.h"
#include "runtime/status.h"

namespace kforge::build_cache {

// The largest cache file read back, and the largest built object accepted.
inline constexpr uint64_t kMaxArtifactFileBytes = uint64_t{256} << 20;

// A build's outcome as stored: an artifact ("so", "cubin", "ptx") when compiled, else the log
// saying why not. compiled == !artifact_name.empty() in every record read back.
struct CacheRecord {
  bool compiled = false;
  std::string artifact_name;
  std::string log;
  std::string artifact;
};

// Starts libsodium (hashes, random names) and makes `cache_dir` (mkdir -p; the components above it
// may be anything the system provides, `cache_dir` itself must be ours) and its tmp/ directory.
Status prepare_cache_dir(const std::string& cache_dir);

// mkdir that tolerates an existing directory but not a symbolic link (the cache holds code that
// runs in users' processes) nor someone else's directory.
Status ensure_private_dir(const std::string& dir);

// Length-prefixed fields, so no two different inputs concatenate to the same bytes.
std::string cache_key(const KernelSpec& spec, const std::string& identity);

// The frame of Note [Build cache files]. decode_frame: nullopt when `file` is not a valid frame
// for `key`.
std::string encode_frame(const std::string& key, const CacheRecord& r);
std::optional<CacheRecord> decode_frame(std::string_view file, const std::string& key);

// The record stored under `key`, nullopt when there is none or it is damaged (the rebuild's
// write_entry replaces it); an error only when the disk fails.
StatusOr<std::optional<CacheRecord>> read_entry(const std::string& cache_dir, const std::string& key);

// Installs `r` under `key` (tmp + fsync + rename, then the directory fsynced).
Status write_entry(const std::string& cache_dir, const std::string& key, const CacheRecord& r);

}  // namespace kforge::build_cache
