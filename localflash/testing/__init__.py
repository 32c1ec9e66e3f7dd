"""Test fixtures shipped with the package: random-weight GGUF writers, the live-server harness, the install smoke test.

Production code never imports this package (tests/test_layout.py checks it).
"""
