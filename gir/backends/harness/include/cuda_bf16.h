// Harness stand-in for the CUDA header: the shim provides what kernels use.
#pragma once
#include "../gpu_on_cpu.h"
