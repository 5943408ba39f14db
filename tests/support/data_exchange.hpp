// The multi-process data test that runs over loopback and over network namespaces: every rank puts random
// data of many sizes (1 B .. maxBytes) to every other rank with putWithSignal; every receiver checks every
// byte against what the sender must have sent.
#pragma once

#include <cstddef>

namespace gdx::test {

/// Runs in one rank of a job described by the environment; returns 0 on success (failures are printed).
int exchangeRandomData(size_t maxBytes);

}  // namespace gdx::test
