"""What a 3090 owner sees for the seed's pair, against a loopback hub (README's GPU section).

Serves shaped (random-weight, sparse) GGUFs of Qwen3.6-27B Q4_K_M and its DFlash drafter under the hub
names models.toml gives the pair ``qwen36-27b-dflash``, points HF_ENDPOINT at it and runs
``localflash plan --pair qwen36-27b-dflash --vram 24GiB`` and ``localflash models --vram 24GiB``.
Nothing reaches the real hub; the files are not the real ones (same shapes and quant types).

    python scripts/hub_readme_demo.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from localflash.testing.hub import LoopbackHub
from localflash.testing.shaped import write_preset


def main() -> None:
    d = Path(tempfile.mkdtemp())
    target = write_preset(d, "qwen3.6-27b", "Q4_K_M", tokenizer=True)  # a placeholder vocabulary of the real size
    drafter = write_preset(d, "qwen3.6-27b-dflash", "Q4_K_M")
    with LoopbackHub() as hub:
        hub.add("unsloth/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q4_K_M.gguf", target, sha256="0" * 64)
        hub.add("Alittlehammmer/Qwen3.6-27B-DFlash-GGUF-llama.cpp", "Qwen3.6-27B-DFlash-Q4_K_M.gguf", drafter, sha256="1" * 64)
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(d / "hf"), COLUMNS="110")
        for args in (["plan", "--pair", "qwen36-27b-dflash", "--vram", "24GiB"], ["models", "--vram", "24GiB"]):
            print("$ localflash " + " ".join(args), flush=True)
            subprocess.run([sys.executable, "-m", "localflash.cli", *args], env=env, check=False)
        print(f"(loopback hub at {hub.url}: {hub.bytes_served():,} bytes served)")


if __name__ == "__main__":
    main()
