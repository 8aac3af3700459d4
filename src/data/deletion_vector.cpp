#include "data/deletion_vector.h"

#include <roaring/roaring.h>
#include <zlib.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <memory>

#include "data/delta_log.h"
#include "dtrain/data_table.h"

namespace dtrain::data::detail {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kMagic = 1681511377;  // RoaringBitmapArray, portable serialization
constexpr const char* kZ85 =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

uint32_t big_endian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

uint64_t little_endian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct RoaringDeleter {
  void operator()(roaring_bitmap_t* r) const { roaring_bitmap_free(r); }
};

// The row positions of a serialized RoaringBitmapArray; `why` says what is wrong when not.
// `limit`: the log's cardinality; a bitmap holding more is refused before it is expanded.
std::optional<std::vector<uint64_t>> parse_bitmap(const std::string& bytes, int64_t limit,
                                                  std::string& why) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t left = bytes.size();
  if (left < 12) {
    why = "its " + std::to_string(left) + " bytes are too few for a deletion vector";
    return std::nullopt;
  }
  const auto magic = static_cast<uint32_t>(little_endian(p, 4));
  if (magic != kMagic) {
    why = "its magic number is " + std::to_string(magic) + ", not " + std::to_string(kMagic) +
          " (a Delta deletion vector in the portable roaring format)";
    return std::nullopt;
  }
  const uint64_t buckets = little_endian(p + 4, 8);
  p += 12;
  left -= 12;
  std::vector<uint64_t> rows;
  int64_t last_key = -1;
  for (uint64_t b = 0; b < buckets; ++b) {
    if (left < 4) {
      why = "it ends inside bucket " + std::to_string(b) + " of " + std::to_string(buckets);
      return std::nullopt;
    }
    const auto key = static_cast<uint32_t>(little_endian(p, 4));
    p += 4;
    left -= 4;
    if (key & 0x80000000u || static_cast<int64_t>(key) <= last_key) {
      why = "bucket " + std::to_string(b) + " has the key " + std::to_string(key) +
            " (keys ascend and stay below 2^31)";
      return std::nullopt;
    }
    last_key = key;
    // CRoaring's bounds-checked reader: the size first (0 when the bytes are not a bitmap).
    const size_t size =
        roaring_bitmap_portable_deserialize_size(reinterpret_cast<const char*>(p), left);
    std::unique_ptr<roaring_bitmap_t, RoaringDeleter> bitmap(
        size == 0
            ? nullptr
            : roaring_bitmap_portable_deserialize_safe(reinterpret_cast<const char*>(p), size));
    if (!bitmap) {
      why = "bucket " + std::to_string(b) + " is not a serialized roaring bitmap";
      return std::nullopt;
    }
    // The values one by one, never into an array sized by the bitmap's own count: CRoaring
    // 0.2.66 (Debian 12) takes a bitset container's cardinality from its header unchecked, and
    // roaring_bitmap_to_uint32_array writes every set bit - a header saying 4097 over 65536
    // set bits wrote past the array (tests/fuzz/regressions/deletion_vector). Each value must
    // ascend (containers with unsorted or overlapping values are not a valid bitmap either).
    struct Walk {
      std::vector<uint64_t>* rows;
      uint64_t key, limit;
      int64_t last = -1;
      bool unordered = false, too_many = false;
    } walk{&rows, key, static_cast<uint64_t>(limit)};
    roaring_iterate(
        bitmap.get(),
        [](uint32_t low, void* param) {
          auto& w = *static_cast<Walk*>(param);
          if (static_cast<int64_t>(low) <= w.last) return !(w.unordered = true);
          if (w.rows->size() >= w.limit) return !(w.too_many = true);
          w.last = low;
          w.rows->push_back((w.key << 32) | low);
          return true;
        },
        &walk);
    if (walk.unordered) {
      why = "bucket " + std::to_string(b) + " holds values out of order or twice";
      return std::nullopt;
    }
    if (walk.too_many) {
      why = "it deletes more rows than the log's cardinality " + std::to_string(limit);
      return std::nullopt;
    }
    p += size;
    left -= size;
  }
  if (left != 0) {
    why = std::to_string(left) + " bytes follow its last bucket";
    return std::nullopt;
  }
  return rows;
}

std::string lowercase_uuid(const std::string& bytes) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    const auto c = static_cast<unsigned char>(bytes[i]);
    s.push_back(hex[c >> 4]);
    s.push_back(hex[c & 15]);
  }
  return s;
}

}  // namespace

std::string DeletionVectorRef::unique_id() const {
  std::string id = storage_type + path_or_inline;
  if (offset) id += '@' + std::to_string(*offset);
  return id;
}

std::optional<std::string> z85_decode(const std::string& text) {
  if (text.size() % 5 != 0) return std::nullopt;
  std::array<int, 256> value;
  value.fill(-1);
  for (int i = 0; i < 85; ++i) value[static_cast<unsigned char>(kZ85[i])] = i;
  std::string out;
  out.reserve(text.size() / 5 * 4);
  for (size_t i = 0; i < text.size(); i += 5) {
    uint64_t v = 0;
    for (size_t j = i; j < i + 5; ++j) {
      const int d = value[static_cast<unsigned char>(text[j])];
      if (d < 0) return std::nullopt;
      v = v * 85 + static_cast<uint64_t>(d);
    }
    if (v > 0xffffffffull) return std::nullopt;
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  }
  return out;
}

std::string deletion_vector_file(const std::string& root, const DeletionVectorRef& dv) {
  if (dv.storage_type == "p") return delta_path(root, dv.path_or_inline);
  const std::string& s = dv.path_or_inline;
  const std::optional<std::string> uuid =
      s.size() >= 20 ? z85_decode(s.substr(s.size() - 20)) : std::nullopt;
  if (!uuid) {
    throw DataError("data: the Delta table " + root + " names the deletion vector '" + s +
                    "', which does not end in a Z85-encoded uuid (20 characters): the log is "
                    "damaged or was written by a broken writer");
  }
  fs::path dir(root);
  if (s.size() > 20) dir /= s.substr(0, s.size() - 20);
  return (dir / ("deletion_vector_" + lowercase_uuid(*uuid) + ".bin")).lexically_normal().string();
}

std::vector<uint64_t> read_deletion_vector(const std::string& root, int64_t version,
                                           const std::string& data_file, int64_t file_rows,
                                           const DeletionVectorRef& dv) {
  const std::string of = "the deletion vector of " + data_file + " (Delta table " + root +
                         " at version " + std::to_string(version) + ")";
  if (dv.storage_type != "u" && dv.storage_type != "p")
    return decode_deletion_vector(dv, nullptr, 0, "", file_rows, of);
  const std::string file = deletion_vector_file(root, dv);
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  const auto file_size = in ? fs::file_size(file, ec) : 0;
  if (!in || ec) {
    throw DataError("data: " + of + " is stored in " + file +
                    ", which does not exist or cannot be read: the table was vacuumed past "
                    "this version or copied without its deletion vector files; restore the "
                    "file, or read another version");
  }
  return decode_deletion_vector(dv, &in, file_size, file, file_rows, of);
}

std::vector<uint64_t> decode_deletion_vector(const DeletionVectorRef& dv, std::istream* file,
                                             uint64_t file_size, const std::string& file_name,
                                             int64_t file_rows, const std::string& of) {
  if (dv.size_in_bytes < 0 || dv.cardinality < 0) {
    throw DataError("data: " + of + " has sizeInBytes " + std::to_string(dv.size_in_bytes) +
                    " and cardinality " + std::to_string(dv.cardinality) +
                    ": the log is damaged or was written by a broken writer");
  }
  if (dv.cardinality > file_rows) {
    throw DataError("data: " + of + " deletes " + std::to_string(dv.cardinality) +
                    " rows (its cardinality), but the file has " + std::to_string(file_rows) +
                    ": the vector belongs to another file, or the log is damaged");
  }
  std::string bytes, stored_in;
  if (dv.storage_type == "i") {
    stored_in = "inline in the log";
    auto decoded = z85_decode(dv.path_or_inline);
    if (!decoded || static_cast<int64_t>(decoded->size()) < dv.size_in_bytes) {
      throw DataError("data: " + of + " is stored inline as text that is not Z85 of " +
                      std::to_string(dv.size_in_bytes) +
                      " bytes: the log is damaged or was written by a broken writer");
    }
    bytes = decoded->substr(0, static_cast<size_t>(dv.size_in_bytes));
  } else if (dv.storage_type == "u" || dv.storage_type == "p") {
    DTRAIN_ASSERT(file != nullptr, "decode_deletion_vector: no DV file given for a stored vector");
    stored_in = "stored in " + file_name;
    std::istream& in = *file;
    const int64_t offset = dv.offset.value_or(1);
    std::string head(4, '\0');
    unsigned char version_byte = 0;
    in.read(reinterpret_cast<char*>(&version_byte), 1);
    in.seekg(offset);
    in.read(head.data(), 4);
    if (!in || version_byte != 1) {
      throw DataError("data: " + of + " is stored in " + file_name +
                      (!in ? ", which ends before the vector's offset " + std::to_string(offset)
                           : ", whose format version is " + std::to_string(version_byte) +
                                 " (dtrain::data reads version 1)") +
                      ": the file is truncated or corrupt; restore it, or read another version");
    }
    const uint32_t size = big_endian32(reinterpret_cast<const unsigned char*>(head.data()));
    if (static_cast<int64_t>(size) != dv.size_in_bytes) {
      throw DataError("data: " + of + " is stored in " + file_name + " at offset " +
                      std::to_string(offset) + " with the size " + std::to_string(size) +
                      ", but the log says " + std::to_string(dv.size_in_bytes) +
                      " bytes: the file or the log is damaged; restore it, or read another "
                      "version");
    }
    // Never allocate what the file cannot hold (a corrupt size field).
    std::array<unsigned char, 4> crc{};
    if (static_cast<uint64_t>(offset) + 8 + size <= file_size) {
      bytes.resize(size);
      in.read(bytes.data(), static_cast<std::streamsize>(size));
      in.read(reinterpret_cast<char*>(crc.data()), 4);
    } else {
      in.setstate(std::ios::failbit);
    }
    if (!in) {
      throw DataError("data: " + of + " is stored in " + file_name + ", which ends inside it (" +
                      std::to_string(size) + " bytes and a checksum at offset " +
                      std::to_string(offset + 4) +
                      "): the file is truncated; restore it, or read another version");
    }
    const auto computed = static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), size));
    if (computed != big_endian32(crc.data())) {
      throw DataError("data: " + of + " is stored in " + file_name + " with the CRC-32 " +
                      std::to_string(big_endian32(crc.data())) + ", but its bytes have " +
                      std::to_string(computed) +
                      ": the file is corrupt; restore it, or read another version");
    }
  } else {
    throw DataError("data: " + of + " has the storageType '" + dv.storage_type +
                    "'; the Delta protocol defines u, i and p: the log is damaged or newer "
                    "than dtrain::data");
  }
  std::string why;
  auto rows = parse_bitmap(bytes, dv.cardinality, why);
  const std::string remedy = dv.storage_type == "i" ? "the log is damaged; read another version"
                                                    : "restore the file, or read another version";
  if (!rows) {
    throw DataError("data: " + of + ", " + stored_in + ", is not a valid deletion vector: " + why +
                    "; " + remedy);
  }
  if (static_cast<int64_t>(rows->size()) != dv.cardinality) {
    throw DataError("data: " + of + ", " + stored_in + ", deletes " + std::to_string(rows->size()) +
                    " rows, but the log says " + std::to_string(dv.cardinality) +
                    ": the file or the log is damaged; " + remedy);
  }
  return std::move(*rows);
}

}  // namespace dtrain::data::detail
