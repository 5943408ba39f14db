// A two-rank job with one GDX_FAULT on rank 0 (transport/common/fault.hpp), shared by the TCP tests and the verbs tests
// in the Soft-RoCE VM: rank 0 sends ten 4 KiB putWithSignals to rank 1 with GDX_FAULT=`fault` over `transport`;
// rank 1 waits for all ten signals and checks the data. Each rank's exit code is 0 when it saw what `expect` says
// (and, with `senderNamesFault`, rank 0's flush failed naming GDX_FAULT); the other codes are in fault_job.cpp.
#pragma once

#include <string>
#include <vector>

namespace gdx::test {

enum class FaultExpect { kDelivered, kTimeout, kPeerFailed };

std::vector<int> runFaultJob(const std::string& transport, const std::string& fault, FaultExpect expect,
                             bool senderNamesFault = false, long long minMs = 0);

}  // namespace gdx::test
