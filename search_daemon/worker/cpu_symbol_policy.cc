#include "search_daemon/worker/cpu_symbol_policy.h"

#include <elf.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <type_traits>

// Note [Reading what the loader reads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The object comes from our own compiler, but its source can shape the ELF file (top-level asm,
// section and symbol attributes), so the check must not trust one view of the file. The symbol
// table is read from the section headers (SHT_DYNSYM and its linked string table), and then
// checked against the dynamic segment, which is what ld.so actually uses: DT_SYMTAB and DT_STRTAB
// must point at those same bytes, every relocation must name a symbol inside the table we read
// (a table shortened in its section header cannot hide an import), and DT_NEEDED comes from
// PT_DYNAMIC itself. Anything inconsistent is an error, which the builder treats as a refusal.
//
// Weak undefined symbols are checked like any other: ld.so binds a weak reference whenever some
// loaded library defines the name, so `extern "C" int pthread_create(...) __attribute__((weak))`
// would otherwise be a way around the policy. The weak references the toolchain itself emits
// (__cxa_finalize, __gmon_start__, _ITM_*) are in the allowed set, so they never show up.
//
// Every offset and size is checked before use, with overflow-free comparisons, and structs are
// copied out with memcpy (the image may sit at any alignment).

namespace kforge {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the ELF reader copies little-endian fields as they are");

constexpr const char* kMathFunctions[] = {
    "exp",    "exp2",   "expm1",  "log",       "log2",     "log10",   "log1p",  "pow",
    "sqrt",   "cbrt",   "sin",    "cos",       "tan",      "asin",    "acos",   "atan",
    "atan2",  "sinh",   "cosh",   "tanh",      "asinh",    "acosh",   "atanh",  "erf",
    "erfc",   "tgamma", "lgamma", "fma",       "fmin",     "fmax",    "fabs",   "floor",
    "ceil",   "round",  "trunc",  "nearbyint", "rint",     "lrint",   "llrint", "lround",
    "llround", "fmod",  "remainder", "ldexp",  "frexp",    "modf",    "hypot",  "copysign",
    "nextafter", "sincos",
};

constexpr const char* kOtherAllowed[] = {
    "expl",
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "__stack_chk_fail",
    // The toolchain's own weak references (crtstuff, gmon, transactional memory).
    "__cxa_finalize",
    "__gmon_start__",
    "_ITM_deregisterTMCloneTable",
    "_ITM_registerTMCloneTable",
};

constexpr const char* kAllowedNeeded[] = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1"};

const std::set<std::string, std::less<>>& allowed_set() {
  static const std::set<std::string, std::less<>> set = [] {
    std::set<std::string, std::less<>> s;
    for (const char* f : kMathFunctions) {
      s.insert(f);
      s.insert(std::string(f) + "f");
      // Older glibc redirects math calls to these under -ffinite-math-only; the builder refuses
      // that flag, but headers can still select them, and they compute the same functions.
      s.insert("__" + std::string(f) + "_finite");
      s.insert("__" + std::string(f) + "f_finite");
    }
    for (const char* o : kOtherAllowed) s.insert(o);
    return s;
  }();
  return set;
}

bool in_bounds(uint64_t size, uint64_t offset, uint64_t length) {
  return offset <= size && length <= size - offset;
}

class ElfReader {
 public:
  explicit ElfReader(std::string_view image) : image_(image) {}

  uint64_t size() const noexcept { return image_.size(); }

  template <typename T>
  std::optional<T> read(uint64_t offset) const {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!in_bounds(size(), offset, sizeof(T))) return std::nullopt;
    T value;
    std::memcpy(&value, image_.data() + offset, sizeof(T));
    return value;
  }

  // The NUL-terminated string at `offset` inside the string table [table, table + table_size).
  std::optional<std::string_view> string_at(uint64_t table, uint64_t table_size, uint64_t offset) const {
    if (!in_bounds(size(), table, table_size) || offset >= table_size) return std::nullopt;
    std::string_view t = image_.substr(table, table_size);
    size_t end = t.find('\0', offset);
    if (end == std::string_view::npos) return std::nullopt;
    return t.substr(offset, end - offset);
  }

 private:
  std::string_view image_;
};

Status malformed(const std::string& what) { return invalid_argument("not a readable ELF64 shared object: " + what); }

// A virtual address inside some PT_LOAD's file-backed bytes -> its file offset.
std::optional<uint64_t> file_offset_of(const std::vector<Elf64_Phdr>& phdrs, uint64_t vaddr) {
  for (const Elf64_Phdr& p : phdrs) {
    if (p.p_type != PT_LOAD) continue;
    if (vaddr >= p.p_vaddr && vaddr - p.p_vaddr < p.p_filesz) return p.p_offset + (vaddr - p.p_vaddr);
  }
  return std::nullopt;
}

struct DynamicInfo {
  std::vector<uint64_t> needed;   // string table offsets
  std::optional<uint64_t> strtab, strsz, symtab, syment;
  std::optional<uint64_t> rela, relasz, relaent, rel, relsz, relent, jmprel, pltrelsz, pltrel;
};

StatusOr<DynamicInfo> read_dynamic(const ElfReader& elf, const Elf64_Phdr& dyn) {
  if (!in_bounds(elf.size(), dyn.p_offset, dyn.p_filesz)) return malformed("dynamic segment outside the file");
  DynamicInfo info;
  const uint64_t count = dyn.p_filesz / sizeof(Elf64_Dyn);
  for (uint64_t i = 0; i < count; ++i) {
    std::optional<Elf64_Dyn> d = elf.read<Elf64_Dyn>(dyn.p_offset + i * sizeof(Elf64_Dyn));
    if (!d) return malformed("dynamic entry outside the file");
    const uint64_t v = d->d_un.d_val;
    switch (d->d_tag) {
      case DT_NULL: return info;
      case DT_NEEDED: info.needed.push_back(v); break;
      case DT_STRTAB: info.strtab = v; break;
      case DT_STRSZ: info.strsz = v; break;
      case DT_SYMTAB: info.symtab = v; break;
      case DT_SYMENT: info.syment = v; break;
      case DT_RELA: info.rela = v; break;
      case DT_RELASZ: info.relasz = v; break;
      case DT_RELAENT: info.relaent = v; break;
      case DT_REL: info.rel = v; break;
      case DT_RELSZ: info.relsz = v; break;
      case DT_RELENT: info.relent = v; break;
      case DT_JMPREL: info.jmprel = v; break;
      case DT_PLTRELSZ: info.pltrelsz = v; break;
      case DT_PLTREL: info.pltrel = v; break;
      default: break;
    }
  }
  return malformed("dynamic segment without DT_NULL");
}

// Every relocation in [vaddr, vaddr + bytes) must name a symbol below `symbols`.
template <typename Rel>
Status check_relocations(const ElfReader& elf, const std::vector<Elf64_Phdr>& phdrs, uint64_t vaddr,
                         uint64_t bytes, uint64_t symbols, const char* what) {
  if (bytes == 0) return Status();
  std::optional<uint64_t> off = file_offset_of(phdrs, vaddr);
  if (!off || !in_bounds(elf.size(), *off, bytes) || bytes % sizeof(Rel) != 0) {
    return malformed(std::string(what) + " relocations outside the file");
  }
  for (uint64_t i = 0; i < bytes / sizeof(Rel); ++i) {
    std::optional<Rel> r = elf.read<Rel>(*off + i * sizeof(Rel));
    if (!r) return malformed(std::string(what) + " relocation outside the file");
    if (ELF64_R_SYM(r->r_info) >= symbols) {
      return malformed(std::string(what) + " relocation " + std::to_string(i) + " names symbol " +
                       std::to_string(ELF64_R_SYM(r->r_info)) + ", past the " + std::to_string(symbols) +
                       "-entry symbol table");
    }
  }
  return Status();
}

}  // namespace

const std::vector<std::string>& allowed_cpu_imports() {
  static const std::vector<std::string> list(allowed_set().begin(), allowed_set().end());
  return list;
}

StatusOr<std::vector<std::string>> forbidden_imports(std::string_view elf_image) {
  const ElfReader elf(elf_image);
  std::optional<Elf64_Ehdr> eh = elf.read<Elf64_Ehdr>(0);
  if (!eh) return malformed("shorter than an ELF header");
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) return malformed("no ELF magic");
  if (eh->e_ident[EI_CLASS] != ELFCLASS64) return malformed("not ELF64");
  if (eh->e_ident[EI_DATA] != ELFDATA2LSB) return malformed("not little-endian");
  if (eh->e_type != ET_DYN) return malformed("not a shared object (e_type " + std::to_string(eh->e_type) + ")");
  if (eh->e_machine != EM_X86_64 && eh->e_machine != EM_AARCH64) {
    return malformed("machine " + std::to_string(eh->e_machine) + " is neither x86-64 nor aarch64");
  }

  // ---- section headers: the dynamic symbol table and its strings
  if (eh->e_shoff == 0 || eh->e_shentsize != sizeof(Elf64_Shdr)) return malformed("no section headers");
  uint64_t shnum = eh->e_shnum;
  if (shnum == 0) {  // extended numbering: the count is in section 0's sh_size
    std::optional<Elf64_Shdr> s0 = elf.read<Elf64_Shdr>(eh->e_shoff);
    if (!s0) return malformed("section headers outside the file");
    shnum = s0->sh_size;
  }
  if (shnum > elf.size() / sizeof(Elf64_Shdr) || !in_bounds(elf.size(), eh->e_shoff, shnum * sizeof(Elf64_Shdr))) {
    return malformed("section headers outside the file");
  }
  std::vector<Elf64_Shdr> shdrs;
  shdrs.reserve(shnum);
  for (uint64_t i = 0; i < shnum; ++i) shdrs.push_back(*elf.read<Elf64_Shdr>(eh->e_shoff + i * sizeof(Elf64_Shdr)));

  const Elf64_Shdr* dynsym = nullptr;
  for (const Elf64_Shdr& s : shdrs) {
    if (s.sh_type != SHT_DYNSYM) continue;
    if (dynsym != nullptr) return malformed("two dynamic symbol tables");
    dynsym = &s;
  }
  if (dynsym == nullptr) return malformed("no dynamic symbol table");
  if (dynsym->sh_entsize != sizeof(Elf64_Sym) || dynsym->sh_size % sizeof(Elf64_Sym) != 0 ||
      !in_bounds(elf.size(), dynsym->sh_offset, dynsym->sh_size)) {
    return malformed("dynamic symbol table outside the file or of the wrong entry size");
  }
  if (dynsym->sh_link >= shdrs.size() || shdrs[dynsym->sh_link].sh_type != SHT_STRTAB) {
    return malformed("dynamic symbol table without a string table");
  }
  const Elf64_Shdr& dynstr = shdrs[dynsym->sh_link];
  if (!in_bounds(elf.size(), dynstr.sh_offset, dynstr.sh_size)) return malformed("dynamic string table outside the file");
  const uint64_t symbol_count = dynsym->sh_size / sizeof(Elf64_Sym);

  // ---- program headers: the dynamic segment, cross-checked (Note [Reading what the loader reads])
  if (eh->e_phoff == 0 || eh->e_phentsize != sizeof(Elf64_Phdr)) return malformed("no program headers");
  if (!in_bounds(elf.size(), eh->e_phoff, uint64_t{eh->e_phnum} * sizeof(Elf64_Phdr))) {
    return malformed("program headers outside the file");
  }
  std::vector<Elf64_Phdr> phdrs;
  phdrs.reserve(eh->e_phnum);
  for (uint64_t i = 0; i < eh->e_phnum; ++i) phdrs.push_back(*elf.read<Elf64_Phdr>(eh->e_phoff + i * sizeof(Elf64_Phdr)));
  const Elf64_Phdr* dyn_segment = nullptr;
  for (const Elf64_Phdr& p : phdrs) {
    if (p.p_type != PT_DYNAMIC) continue;
    if (dyn_segment != nullptr) return malformed("two dynamic segments");
    dyn_segment = &p;
  }
  if (dyn_segment == nullptr) return malformed("no dynamic segment");
  KFORGE_ASSIGN_OR_RETURN(DynamicInfo dyn, read_dynamic(elf, *dyn_segment));

  if (!dyn.strtab || !dyn.strsz || !dyn.symtab) return malformed("dynamic segment without DT_STRTAB, DT_STRSZ or DT_SYMTAB");
  if (dyn.syment && *dyn.syment != sizeof(Elf64_Sym)) return malformed("DT_SYMENT is not the size of Elf64_Sym");
  std::optional<uint64_t> strtab_off = file_offset_of(phdrs, *dyn.strtab);
  std::optional<uint64_t> symtab_off = file_offset_of(phdrs, *dyn.symtab);
  if (!strtab_off || *strtab_off != dynstr.sh_offset || *dyn.strsz > dynstr.sh_size) {
    return malformed("DT_STRTAB disagrees with the section headers");
  }
  if (!symtab_off || *symtab_off != dynsym->sh_offset) return malformed("DT_SYMTAB disagrees with the section headers");
  if (dyn.relaent && *dyn.relaent != sizeof(Elf64_Rela)) return malformed("DT_RELAENT is not the size of Elf64_Rela");
  if (dyn.relent && *dyn.relent != sizeof(Elf64_Rel)) return malformed("DT_RELENT is not the size of Elf64_Rel");
  if (dyn.rela) {
    KFORGE_RETURN_IF_ERROR(check_relocations<Elf64_Rela>(elf, phdrs, *dyn.rela, dyn.relasz.value_or(0), symbol_count, "DT_RELA"));
  }
  if (dyn.rel) {
    KFORGE_RETURN_IF_ERROR(check_relocations<Elf64_Rel>(elf, phdrs, *dyn.rel, dyn.relsz.value_or(0), symbol_count, "DT_REL"));
  }
  if (dyn.jmprel) {
    if (dyn.pltrel == uint64_t{DT_REL}) {
      KFORGE_RETURN_IF_ERROR(check_relocations<Elf64_Rel>(elf, phdrs, *dyn.jmprel, dyn.pltrelsz.value_or(0), symbol_count, "DT_JMPREL"));
    } else {
      KFORGE_RETURN_IF_ERROR(check_relocations<Elf64_Rela>(elf, phdrs, *dyn.jmprel, dyn.pltrelsz.value_or(0), symbol_count, "DT_JMPREL"));
    }
  }

  // ---- the verdict
  const auto& allowed = allowed_set();
  std::vector<std::string> bad;
  for (uint64_t i = 1; i < symbol_count; ++i) {  // entry 0 is the null symbol
    const Elf64_Sym sym = *elf.read<Elf64_Sym>(dynsym->sh_offset + i * sizeof(Elf64_Sym));
    if (sym.st_shndx != SHN_UNDEF) continue;
    std::optional<std::string_view> name = elf.string_at(dynstr.sh_offset, dynstr.sh_size, sym.st_name);
    if (!name) return malformed("symbol " + std::to_string(i) + " has its name outside the string table");
    if (name->empty()) continue;
    std::string_view bare = name->substr(0, name->find('@'));  // "memcpy@GLIBC_2.14" -> "memcpy"
    if (allowed.find(bare) == allowed.end()) bad.emplace_back(bare);
  }
  for (uint64_t off : dyn.needed) {
    std::optional<std::string_view> soname = elf.string_at(dynstr.sh_offset, *dyn.strsz, off);
    if (!soname) return malformed("DT_NEEDED outside the string table");
    const bool ok = std::any_of(std::begin(kAllowedNeeded), std::end(kAllowedNeeded),
                                [&](const char* n) { return *soname == n; });
    if (!ok) bad.push_back("needs " + std::string(*soname));
  }
  std::sort(bad.begin(), bad.end());
  bad.erase(std::unique(bad.begin(), bad.end()), bad.end());
  return bad;
}

}  // namespace kforge
