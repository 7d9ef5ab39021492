// Safe file I/O: the one home of what the cache, the build cache, bundles and the worker do with
// files that hold code users' processes will run. Symbolic links are refused where a file is read
// (O_NOFOLLOW), reads are bounded before anything is allocated, writes go all the way or fail
// naming the file, and directories are made durable with their entries.
//
//   StatusOr<std::string> bytes = file_io::read_file(path, 1 << 20);   // not_found when absent
//   KFORGE_RETURN_IF_ERROR(file_io::write_all(fd, bytes, path));
//   KFORGE_RETURN_IF_ERROR(file_io::ensure_dir(dir, /*durable=*/true));
//
// Errors are Status values naming the path and the system's reason; nothing throws. Also here:
// the little-endian integers the on-disk formats (cache frames, build-cache records, bundles) use.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace kforge::file_io {

// "cannot write /x/y: No space left on device" (unavailable).
Status io_error(std::string_view what, const std::string& path, int err);

// A whole regular file of at most max_bytes. not_found when it does not exist; a symbolic link, a
// directory or anything but a regular file, or a file over the limit, is invalid_argument. A file
// that shrinks while it is read comes back shorter (the caller's format check sees the truncation).
StatusOr<std::string> read_file(const std::string& path, uint64_t max_bytes);
// Writes every byte (retrying short writes and EINTR).
Status write_all(int fd, std::string_view bytes, const std::string& path);
// A new file (O_EXCL, 0600, no symlink followed) holding `bytes`; fsynced when `durable`.
Status write_new_file(const std::string& path, std::string_view bytes, bool durable = false);
// fsync of a directory, so the entries renamed or created in it survive a crash.
Status fsync_dir(const std::string& dir);
// mkdir (mode 0700) tolerating an existing directory; a new one's entry made durable when asked.
Status ensure_dir(const std::string& dir, bool durable);
// The names in a directory (no "." or ".."), sorted; a missing directory has none.
StatusOr<std::vector<std::string>> list_names(const std::string& dir);
// Whether anything (a file, a link, a directory) has this name.
bool exists(const std::string& path);
// "/a/b" of "/a/b/c".
std::string parent_of(const std::string& path);

// Lower-case hex of bytes (content hashes in file names and formats).
std::string to_hex(const uint8_t* data, size_t n);

// Little-endian integers.
void put_u32(std::string& out, uint32_t v);
void put_u64(std::string& out, uint64_t v);
// `n` bytes at `offset` of `bytes` as a little-endian integer (the caller checked the bounds).
uint64_t get_le(std::string_view bytes, size_t offset, size_t n);

}  // namespace kforge::file_io
