"""The sweep harness: cases (cases.py), inputs, backends, comparison, tolerances, reports, CLI.

Source: docs/design.md §4-§6. Data flows one way: cases/*.toml -> Case -> inputs -> golden and candidate
-> compare -> report rows. Import the submodules directly (`from harness import cases`).
"""
