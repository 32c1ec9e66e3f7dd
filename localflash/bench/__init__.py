"""``localflash bench``: prompt sets, the benchmark run (plain vs speculative, interleaved), verdicts, rig facts."""
