"""CUDA backend: NVRTC compiler and driver-API launcher."""
