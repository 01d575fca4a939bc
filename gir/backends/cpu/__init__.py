"""CPU port: the GIR target `cpu` emitted as C11 + OpenMP and run through ctypes."""
