"""Exceptions that the CLI maps to exit codes (ValueError and missing files are bad input: exit 2)."""


class CudaUnavailableError(RuntimeError):
    """CUDA was asked for but there is no GPU, no driver or no nvcc (exit code 3)."""
