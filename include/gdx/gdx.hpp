// The whole host API in one include. Kernels include gdx/device/channel.hpp (the device handle) as well.
#pragma once

#include "gdx/channel.hpp"
#include "gdx/config.hpp"
#include "gdx/context.hpp"
#include "gdx/error.hpp"
#include "gdx/peer_copy.hpp"
#include "gdx/peer_copy_queue.hpp"
#include "gdx/status.hpp"
#include "gdx/types.hpp"
#include "gdx/window.hpp"
