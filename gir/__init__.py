"""GIR: fuse the memory-intensive part of ONNX models into kernels (PowerFusion's Graph IR)."""


def __getattr__(name):
    # `gir.Session` without importing the whole compiler for `import gir`
    if name == "Session":
        from gir.runtime import Session
        return Session
    raise AttributeError(name)
