// Collective tags: what each rank says it is doing in one allGather round, so that ranks whose calls do not match
// (one registers a window while the other enters a barrier, windows registered in another order) fail at once on
// every rank with both sides named, instead of exchanging the wrong records and putting data in the wrong window.
//
// Layout, in front of the caller's bytes in a kGather blob (protocol.hpp; integers little-endian, str = u32 length +
// bytes): str kind, u64 size, u32 flags (bit 0: sizes must match), str name. At most kMaxTagBytes.
#pragma once

#include <string>

#include "bootstrap/bootstrap.hpp"

namespace gdx::bootstrap {

/// The tag followed by `blob`. Throws kInvalidArgument when the kind or the name is too long.
std::string encodeTagged(const CollectiveTag& tag, const std::string& blob);
/// Splits a blob from rank `rank` into its tag and the caller's bytes; throws kProtocol when it is malformed.
void decodeTagged(const std::string& payload, int rank, CollectiveTag* tag, std::string* blob);
/// Empty when the calls of two ranks match; otherwise what differs.
std::string tagMismatch(const CollectiveTag& a, const CollectiveTag& b);
/// "registerWindow of 4096 bytes named 'x'", for messages.
std::string describeTag(const CollectiveTag& tag);

}  // namespace gdx::bootstrap
