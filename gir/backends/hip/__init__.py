"""HIP backend: hiprtc compiler and HIP launcher."""
