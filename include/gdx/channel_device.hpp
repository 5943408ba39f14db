// The device handle's former include path, kept so that kernels written against it still build: the device API is
// gdx/device/channel.hpp.
#pragma once

#include "gdx/device/channel.hpp"
