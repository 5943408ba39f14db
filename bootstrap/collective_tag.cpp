#include "bootstrap/collective_tag.hpp"

#include "bootstrap/protocol.hpp"
#include "gdx/error.hpp"

namespace gdx::bootstrap {
namespace {

constexpr size_t kMaxKindBytes = 64;
constexpr size_t kMaxNameBytes = 256;
constexpr uint32_t kSameSize = 1;
static_assert(4 + kMaxKindBytes + 8 + 4 + 4 + kMaxNameBytes <= kMaxTagBytes, "a tag fits its budget");

}  // namespace

std::string encodeTagged(const CollectiveTag& tag, const std::string& blob) {
  if (tag.kind.size() > kMaxKindBytes || tag.name.size() > kMaxNameBytes)
    throw Error(ErrorCode::kInvalidArgument, "collective '" + tag.kind.substr(0, kMaxKindBytes) + "': name of " +
                                                 std::to_string(tag.name.size()) + " bytes is longer than " +
                                                 std::to_string(kMaxNameBytes));
  ByteWriter w;
  w.putString(tag.kind)
      .put(uint64_t{tag.size})
      .put<uint32_t>(tag.sameSize ? kSameSize : 0)
      .putString(tag.name)
      .putBytes(blob);
  return w.take();
}

void decodeTagged(const std::string& payload, int rank, CollectiveTag* tag, std::string* blob) {
  try {
    Reader r(payload, "collective tag");
    tag->kind = r.str();
    tag->size = r.u64();
    tag->sameSize = (r.u32() & kSameSize) != 0;
    tag->name = r.str();
    if (tag->kind.size() > kMaxKindBytes || tag->name.size() > kMaxNameBytes)
      throw Error(ErrorCode::kProtocol, "kind or name too long");
    *blob = r.rest();
  } catch (const Error& e) {
    throw Error(ErrorCode::kProtocol, "the collective tag from rank " + std::to_string(rank) +
                                          " is malformed (a rank of another gdx build?): " + e.what());
  }
}

std::string tagMismatch(const CollectiveTag& a, const CollectiveTag& b) {
  if (a.kind != b.kind) return "different calls";
  if (!a.name.empty() && !b.name.empty() && a.name != b.name) return "different names";
  if ((a.sameSize || b.sameSize) && a.size != b.size) return "different sizes where they must be equal";
  return {};
}

std::string describeTag(const CollectiveTag& tag) {
  std::string out = tag.kind;
  if (tag.size != 0 || tag.sameSize) out += " of " + std::to_string(tag.size) + " bytes";
  if (!tag.name.empty()) out += " named '" + tag.name + "'";
  return out;
}

}  // namespace gdx::bootstrap
