// Umbrella header: the whole host API.
#pragma once

#include "gdx/bootstrap.hpp"
#include "gdx/command.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"
#include "gdx/log.hpp"
#include "gdx/ring_device.hpp"
#include "gdx/status.hpp"
#include "gdx/transport.hpp"
