"""Errors of the backend toolchains, shared so callers catch one class whatever the backend."""


class CompileError(RuntimeError):
    """A compiler rejected the source. The first line names the source and the target; the
    compiler log follows, because that log is what the person fixing the emitter needs."""

    def __init__(self, what: str, target: str, log: str):
        self.what, self.target, self.log = what, target, log
        super().__init__(f"{what}: compilation for {target} failed\n{log.rstrip()}")

    def __reduce__(self):  # rebuilt from its fields when it crosses a process boundary (--jobs)
        return CompileError, (self.what, self.target, self.log)


class ToolchainMissingError(RuntimeError):
    """A compiler library is not installed; the one-line message says how to install it."""


class NoDeviceError(RuntimeError):
    """No GPU driver or device here: kernels compile but cannot be launched."""


class LibraryUnavailable(NoDeviceError):
    """The device is there (or may be) but a vendor library or Python extra the GPU runtime
    needs is not: the one-line message names what is missing and how to install it. A kind of
    NoDeviceError: the model cannot run on this machine's GPU, and there is no host fallback."""


class IndexOutOfRange(ValueError):
    """A kernel reported a Gather index outside [-n, n) (it clamped it, so memory stayed
    safe); the runtime turns it into a GatherIndexError naming model and node."""


class ResourceError(RuntimeError):
    """An emitted kernel compiled but would not run well or at all on the target: it spills
    registers (where the caller asks for no spills: the emitter tests) or needs more shared
    memory than a block may have. The message is one line."""


class SpillWarning(UserWarning):
    """A kernel the compiler gave local memory (a stack frame with spill stores): it runs and
    computes the same, slower. Builds warn instead of failing the model: ptxas spills for its
    own reasons too (24 bytes with 32 registers in use, on a fuzzed graph), which no register
    estimate predicts. The message is one line."""
