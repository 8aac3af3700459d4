// The codec that carries a Distributor's arguments to its workers and their results back.
//
// Supported, and nested freely:
//   - arithmetic types (bool, char, integers, float, double, ...) and enums
//   - std::string, std::vector<T>, std::array<T, N>, std::map<K, V>, std::unordered_map<K, V>,
//     std::set<T>, std::pair<A, B>, std::tuple<T...>, std::optional<T>
//   - torch::Tensor of any dtype, shape and size (CPU bytes; a CUDA tensor comes back on the
//     CPU), undefined tensors, and requires_grad
//   - a model's state dict: torch::OrderedDict<std::string, torch::Tensor> (what
//     dtrain::state_dict(module) returns, see checkpoint.h)
//   - user types that provide both
//         void serialize(dtrain::Encoder& out) const;
//         static T deserialize(dtrain::Decoder& in);
//     (writing and reading their members with out.put(x) / in.get<X>()).
// Anything else fails to compile with a message naming the type ("... is not encodable").
//
// Format: values in order, no type tags (driver and workers are the same binary, so both
// sides agree on the types); sizes as u64; numbers in the machine's byte order.
// A Decoder that runs out of bytes throws CodecError instead of reading past the end.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <array>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/error.h"

namespace dtrain {

// Bytes that do not decode as the type asked for.
class CodecError : public Error {
 public:
  using Error::Error;
};

class Encoder;
class Decoder;

namespace detail {
// Advises transparent huge pages for a large buffer before its first touch (src/core/memory.h).
void advise_huge_pages(const void* data, std::size_t size);
}  // namespace detail

// Codec<T>::encode(Encoder&, const T&) and Codec<T>::decode(Decoder&) -> T.
// Specialise it to support a type you cannot add serialize/deserialize to.
template <class T>
struct Codec;

template <class T>
concept Encodable = requires(Encoder& out, Decoder& in, const T& value) {
  Codec<T>::encode(out, value);
  { Codec<T>::decode(in) } -> std::same_as<T>;
};

class Encoder {
 public:
  void write(const void* data, std::size_t n) {
    if (n > 0) buffer_.append(static_cast<const char*>(data), n);
  }
  void write_size(std::uint64_t n) { write(&n, sizeof n); }
  void reserve(std::size_t n) {
    buffer_.reserve(buffer_.size() + n);
    detail::advise_huge_pages(buffer_.data(), buffer_.capacity());
  }

  template <class T>
  void put(const T& value) {
    static_assert(Encodable<T>,
                  "dtrain: this type is not encodable. Supported: arithmetic types, enums, "
                  "std::string, vector/array/map/unordered_map/set/pair/tuple/optional of "
                  "those, torch::Tensor, torch::OrderedDict<std::string, torch::Tensor>, and "
                  "types with `void serialize(dtrain::Encoder&) const` and `static T "
                  "deserialize(dtrain::Decoder&)` (see dtrain/codec.h)");
    if constexpr (Encodable<T>) Codec<T>::encode(*this, value);
  }

  const std::string& bytes() const { return buffer_; }
  std::string take() { return std::move(buffer_); }

 private:
  std::string buffer_;
};

class Decoder {
 public:
  Decoder(const char* data, std::size_t size) : data_(data), size_(size) {}
  explicit Decoder(const std::string& bytes) : Decoder(bytes.data(), bytes.size()) {}

  // The next n bytes (valid while the underlying buffer lives).
  const char* take(std::size_t n) {
    if (n > size_ - pos_) {
      throw CodecError("dtrain codec: needed " + std::to_string(n) + " more byte(s) at offset " +
                       std::to_string(pos_) + " of " + std::to_string(size_) +
                       "; the data is truncated or was encoded as another type");
    }
    const char* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  void read(void* out, std::size_t n) {
    const char* p = take(n);
    if (n > 0) std::memcpy(out, p, n);
  }
  std::uint64_t read_size() {
    std::uint64_t n;
    read(&n, sizeof n);
    return n;
  }
  // A count of elements, each at least min_bytes long: checked against what is left so a
  // corrupt size cannot make us allocate terabytes.
  std::size_t read_count(std::size_t min_bytes = 1) {
    std::uint64_t n = read_size();
    if (min_bytes > 0 && n > (size_ - pos_) / min_bytes) {
      throw CodecError("dtrain codec: a count of " + std::to_string(n) + " at offset " +
                       std::to_string(pos_) + " exceeds the " + std::to_string(size_ - pos_) +
                       " byte(s) left; the data is corrupt or was encoded as another type");
    }
    return static_cast<std::size_t>(n);
  }

  template <class T>
  T get() {
    static_assert(Encodable<T>, "dtrain: this type is not decodable; see Encoder::put");
    return Codec<T>::decode(*this);
  }

  bool done() const { return pos_ == size_; }
  std::size_t remaining() const { return size_ - pos_; }

 private:
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// ---- codecs -----------------------------------------------------------------

template <class T>
requires(std::is_arithmetic_v<T> || std::is_enum_v<T>) struct Codec<T> {
  static void encode(Encoder& out, const T& v) { out.write(&v, sizeof v); }
  static T decode(Decoder& in) {
    T v;
    in.read(&v, sizeof v);
    return v;
  }
};

template <>
struct Codec<bool> {
  static void encode(Encoder& out, const bool& v) {
    const std::uint8_t b = v ? 1 : 0;
    out.write(&b, 1);
  }
  static bool decode(Decoder& in) {
    std::uint8_t b;
    in.read(&b, 1);
    if (b > 1)
      throw CodecError("dtrain codec: a bool byte is " + std::to_string(b) +
                       ", not 0 or 1; the data was encoded as another type");
    return b == 1;
  }
};

template <>
struct Codec<std::string> {
  static void encode(Encoder& out, const std::string& v) {
    out.write_size(v.size());
    out.write(v.data(), v.size());
  }
  static std::string decode(Decoder& in) {
    std::size_t n = in.read_count(1);
    return std::string(in.take(n), n);
  }
};

template <Encodable T>
struct Codec<std::vector<T>> {
  static void encode(Encoder& out, const std::vector<T>& v) {
    out.write_size(v.size());
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      out.write(v.data(), v.size() * sizeof(T));
    } else {
      for (const auto& x : v) Codec<T>::encode(out, x);
    }
  }
  static std::vector<T> decode(Decoder& in) {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      std::vector<T> v(in.read_count(sizeof(T)));
      in.read(v.data(), v.size() * sizeof(T));
      return v;
    } else {
      std::size_t n = in.read_count(0);
      std::vector<T> v;
      v.reserve(std::min<std::size_t>(n, in.remaining()));
      for (std::size_t i = 0; i < n; ++i) v.push_back(Codec<T>::decode(in));
      return v;
    }
  }
};

template <Encodable T, std::size_t N>
struct Codec<std::array<T, N>> {
  static void encode(Encoder& out, const std::array<T, N>& v) {
    for (const auto& x : v) Codec<T>::encode(out, x);
  }
  static std::array<T, N> decode(Decoder& in) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::array<T, N>{((void)I, Codec<T>::decode(in))...};
    }
    (std::make_index_sequence<N>{});
  }
};

namespace detail {
template <class Map, class K, class V>
struct MapCodec {
  static void encode(Encoder& out, const Map& m) {
    out.write_size(m.size());
    for (const auto& [k, v] : m) {
      Codec<K>::encode(out, k);
      Codec<V>::encode(out, v);
    }
  }
  static Map decode(Decoder& in) {
    std::size_t n = in.read_count(0);
    Map m;
    for (std::size_t i = 0; i < n; ++i) {
      K k = Codec<K>::decode(in);
      m.emplace(std::move(k), Codec<V>::decode(in));
    }
    return m;
  }
};
}  // namespace detail

template <Encodable K, Encodable V>
struct Codec<std::map<K, V>> : detail::MapCodec<std::map<K, V>, K, V> {};
template <Encodable K, Encodable V>
struct Codec<std::unordered_map<K, V>> : detail::MapCodec<std::unordered_map<K, V>, K, V> {};

template <Encodable T>
struct Codec<std::set<T>> {
  static void encode(Encoder& out, const std::set<T>& s) {
    out.write_size(s.size());
    for (const auto& x : s) Codec<T>::encode(out, x);
  }
  static std::set<T> decode(Decoder& in) {
    std::size_t n = in.read_count(0);
    std::set<T> s;
    for (std::size_t i = 0; i < n; ++i) s.insert(Codec<T>::decode(in));
    return s;
  }
};

template <Encodable A, Encodable B>
struct Codec<std::pair<A, B>> {
  static void encode(Encoder& out, const std::pair<A, B>& p) {
    Codec<A>::encode(out, p.first);
    Codec<B>::encode(out, p.second);
  }
  static std::pair<A, B> decode(Decoder& in) {
    A a = Codec<A>::decode(in);
    return {std::move(a), Codec<B>::decode(in)};
  }
};

template <Encodable... T>
struct Codec<std::tuple<T...>> {
  static void encode(Encoder& out, const std::tuple<T...>& t) {
    std::apply([&](const auto&... x) { (Codec<std::decay_t<decltype(x)>>::encode(out, x), ...); },
               t);
  }
  static std::tuple<T...> decode(Decoder& in) {
    // Braced initialisation evaluates left to right.
    return std::tuple<T...>{Codec<T>::decode(in)...};
  }
};

template <Encodable T>
struct Codec<std::optional<T>> {
  static void encode(Encoder& out, const std::optional<T>& v) {
    Codec<bool>::encode(out, v.has_value());
    if (v) Codec<T>::encode(out, *v);
  }
  static std::optional<T> decode(Decoder& in) {
    if (!Codec<bool>::decode(in)) return std::nullopt;
    return Codec<T>::decode(in);
  }
};

// Tensors: dtype, sizes, requires_grad, then the contiguous CPU bytes (src/distributor/codec.cpp).
template <>
struct Codec<at::Tensor> {
  static void encode(Encoder& out, const at::Tensor& t);
  static at::Tensor decode(Decoder& in);
};

template <>
struct Codec<torch::OrderedDict<std::string, at::Tensor>> {
  using Dict = torch::OrderedDict<std::string, at::Tensor>;
  static void encode(Encoder& out, const Dict& d) {
    out.write_size(d.size());
    for (const auto& item : d) {
      Codec<std::string>::encode(out, item.key());
      Codec<at::Tensor>::encode(out, item.value());
    }
  }
  static Dict decode(Decoder& in) {
    std::size_t n = in.read_count(0);
    Dict d;
    d.reserve(std::min<std::size_t>(n, in.remaining()));
    for (std::size_t i = 0; i < n; ++i) {
      std::string k = Codec<std::string>::decode(in);
      if (d.contains(k))  // an encoded OrderedDict never repeats a key
        throw CodecError("dtrain codec: a state dict names '" + k + "' twice; the data is corrupt");
      d.insert(std::move(k), Codec<at::Tensor>::decode(in));
    }
    return d;
  }
};

// User types: serialize/deserialize members.
template <class T>
requires(!std::is_arithmetic_v<T> && !std::is_enum_v<T>) &&
    requires(const T& v, Encoder& out, Decoder& in) {
  v.serialize(out);
  { T::deserialize(in) } -> std::same_as<T>;
}
struct Codec<T> {
  static void encode(Encoder& out, const T& v) { v.serialize(out); }
  static T decode(Decoder& in) { return T::deserialize(in); }
};

// Convenience: one value to bytes and back.
template <Encodable T>
std::string encode(const T& value) {
  Encoder out;
  out.put(value);
  return out.take();
}

template <Encodable T>
T decode(const std::string& bytes) {
  Decoder in(bytes);
  T v = in.get<T>();
  if (!in.done()) {
    throw CodecError("dtrain codec: " + std::to_string(in.remaining()) +
                     " byte(s) left over after decoding; the data was encoded as another type");
  }
  return v;
}

}  // namespace dtrain
