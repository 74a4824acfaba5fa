"""Shipped adapters for third-party quantizers, usable as `--backend harness.adapters.<module>:<object>`.

Each adapter calls the framework's own function and converts its outputs to the contract layout
(`reference.QuantizedTensor`, docs/design.md §3); what it cannot run raises `reference.Unsupported`.
`torchao` (optional extra `[torchao]`): `mx` (and `mx_floor`, `mx_ceil`, `mx_even`, `mx_rceil`),
`nvfp4`, `float8`. The golden follows the same frameworks bit for bit under the conventions of
`reference/conventions.py` (docs/numerics.md §10).
"""
