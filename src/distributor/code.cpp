// Finding the function to run in a worker: the driver names it by the loaded object it lives
// in, its offset there and that object's GNU build id; the worker resolves that in its own
// address space (dl_iterate_phdr) and refuses a different build.
#include <elf.h>
#include <link.h>

#include <cxxabi.h>
#include <cstdlib>
#include <cstring>

#include "distributor/internal.h"

namespace dtrain {
namespace distributor {
namespace {

std::string build_id_of(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
          std::memcmp(name, "GNU", 4) == 0) {
        std::string hex;
        static const char* digits = "0123456789abcdef";
        for (unsigned k = 0; k < note->n_descsz; ++k) {
          auto b = static_cast<unsigned char>(desc[k]);
          hex += digits[b >> 4];
          hex += digits[b & 15];
        }
        return hex;
      }
      p = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return "";
}

struct Search {
  std::uintptr_t address = 0;            // locate: the address to find
  const detail::CodeRef* ref = nullptr;  // resolve: the object to find
  int index = 0;
  bool found = false;
  detail::CodeRef result;
  std::uintptr_t base = 0;
  std::string build_id;
};

int locate_callback(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  const int index = s->index++;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (s->address >= lo && s->address < lo + ph.p_memsz) {
      s->found = true;
      s->result.main_program = index == 0;
      s->result.object = info->dlpi_name ? info->dlpi_name : "";
      s->result.offset = s->address - info->dlpi_addr;
      s->result.build_id = build_id_of(info);
      return 1;
    }
  }
  return 0;
}

int resolve_callback(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  const int index = s->index++;
  const bool match = s->ref->main_program
                         ? index == 0
                         : (info->dlpi_name != nullptr && s->ref->object == info->dlpi_name);
  if (!match) return 0;
  s->found = true;
  s->base = info->dlpi_addr;
  s->build_id = build_id_of(info);
  return 1;
}

}  // namespace

json to_json(const detail::CodeRef& r) {
  return {{"main", r.main_program},
          {"object", r.object},
          {"offset", r.offset},
          {"build_id", r.build_id}};
}

detail::CodeRef code_ref_from_json(const json& j) {
  detail::CodeRef r;
  r.main_program = j.at("main").get<bool>();
  r.object = j.at("object").get<std::string>();
  r.offset = j.at("offset").get<std::uintptr_t>();
  r.build_id = j.at("build_id").get<std::string>();
  return r;
}

void* resolve_code(const detail::CodeRef& ref) {
  Search s;
  s.ref = &ref;
  ::dl_iterate_phdr(resolve_callback, &s);
  const std::string what = ref.main_program ? "the program" : "'" + ref.object + "'";
  if (!s.found) {
    throw UsageError("the function to run lives in " + what +
                     ", which this worker has not loaded; the function must be in the "
                     "program or a library it links (not one loaded later with dlopen)");
  }
  if (s.build_id != ref.build_id) {
    throw UsageError("this worker's copy of " + what + " (build id " +
                     (s.build_id.empty() ? "none" : s.build_id) +
                     ") is not the one the driver runs (build id " +
                     (ref.build_id.empty() ? "none" : ref.build_id) +
                     "); was it rebuilt while the driver ran? Restart the driver");
  }
  return reinterpret_cast<void*>(s.base + ref.offset);
}

std::string demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && out) ? out : name;
  std::free(out);
  return s;
}

}  // namespace distributor

namespace detail {

CodeRef locate_code(const void* address) {
  distributor::Search s;
  s.address = reinterpret_cast<std::uintptr_t>(address);
  ::dl_iterate_phdr(distributor::locate_callback, &s);
  DTRAIN_ASSERT(s.found, "no loaded object contains the function's address");
  return s.result;
}

}  // namespace detail
}  // namespace dtrain
