// Delta Lake deletion vectors (the Delta protocol's "Deletion Vectors" section and its appendix
// "Deletion Vector Format"): the rows of a data file that a DELETE, UPDATE or MERGE marked as
// deleted without rewriting the file. The log's add action names the vector:
//
//   {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1,
//    "sizeInBytes": 40, "cardinality": 6}
//
//   storageType 'u': in <table>/<prefix>/deletion_vector_<uuid>.bin, the uuid being the last 20
//                    characters of pathOrInlineDv, Z85-encoded (16 bytes), the prefix the rest;
//               'p': in the file pathOrInlineDv names (a path or file: URI, as add.path);
//               'i': inline, pathOrInlineDv being the Z85 text of the serialized bitmap.
//   A DV file: one version byte (1), then per vector, big-endian: its size (4 bytes), the
//   serialized bitmap (size bytes) and the CRC-32 of those bytes (4 bytes); `offset` is where
//   the vector's size field starts (absent: 1, the first vector after the version byte - the
//   spec's text says 0, which is the version byte; delta-rs's reader starts at 1 too).
//   The serialized bitmap, little-endian: the magic number 1681511377 (4 bytes), then a 64-bit
//   roaring bitmap in the roaring format's "portable" 64-bit layout: the number of buckets (8
//   bytes), then per bucket in ascending order its key (the values' high 32 bits, 4 bytes) and
//   a 32-bit roaring bitmap of the low 32 bits in the portable format (CRoaring reads these).
//
// A vector's values are row positions in its data file, from 0 across all of its row groups.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::data::detail {

// add.deletionVector (or remove.deletionVector) as the log holds it.
struct DeletionVectorRef {
  std::string storage_type;       // "u", "i" or "p"
  std::string path_or_inline;     // pathOrInlineDv
  std::optional<int64_t> offset;  // absent for 'i' (and allowed to be absent for 'u', 'p')
  int64_t size_in_bytes = 0;      // the serialized bitmap's size (before Z85 when inline)
  int64_t cardinality = 0;        // rows it deletes

  // The protocol's uniqueId: <storageType><pathOrInlineDv>[@<offset>]. With the data file's
  // path, the key of a logical file when the log is replayed.
  std::string unique_id() const;
};

// The rows `dv` deletes from `data_file` (sorted, distinct positions) of the Delta table at
// `root` (version `version`, for messages), a file of `file_rows` rows. Reads the DV file
// ('u', 'p') or decodes the log's text ('i') with decode_deletion_vector. Throws DataError
// naming the table, the data file, the DV file and what to do: never a wrong set of rows.
std::vector<uint64_t> read_deletion_vector(const std::string& root, int64_t version,
                                           const std::string& data_file, int64_t file_rows,
                                           const DeletionVectorRef& dv);

// What read_deletion_vector does once it has the bytes (no file system: the
// deletion_vector fuzz target runs it alone). For 'u' and 'p', `file` holds the DV file's
// `file_size` bytes (named `file_name` in messages); for 'i' it is unused (may be null).
// Checks everything the format allows: the version byte, the size field against sizeInBytes,
// the CRC-32, the magic number, the bitmap (CRoaring's checked reader), the count against
// cardinality - and a cardinality above `file_rows` before anything is allocated for it.
// `of` names the vector in messages ("the deletion vector of F (Delta table R at version V)").
std::vector<uint64_t> decode_deletion_vector(const DeletionVectorRef& dv, std::istream* file,
                                             uint64_t file_size, const std::string& file_name,
                                             int64_t file_rows, const std::string& of);

// Z85 (ZeroMQ RFC 32) text -> bytes; nullopt when it is not Z85 (a length that is not a
// multiple of 5, a character outside the alphabet, a group above 2^32 - 1).
std::optional<std::string> z85_decode(const std::string& text);

// Where a 'u' or 'p' vector is stored (absolute); DataError for a 'u' text that is not a uuid.
std::string deletion_vector_file(const std::string& root, const DeletionVectorRef& dv);

}  // namespace dtrain::data::detail
