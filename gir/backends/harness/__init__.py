"""CPU harness that runs unchanged CUDA/HIP kernel source, for tests only."""
