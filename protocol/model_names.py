"""The grammar of a model id: a deployment's name, its aliases, and (like a name) an adapter's.

Its own room because more than the spec reads it: LoRA adapters (lora.py) are named like models,
Xinference launches (xinference.py) and Ollama's names (server/serving/ollama_models.py) must be
ids a spec accepts, and each of them checks against this one copy.
"""

from __future__ import annotations

import re

# A deployment name is a path segment of `/admin/deployments/{name}`, a CLI argument, part of the
# replicas' Ray actor names (`raygate:{name}:...`) and a key of registry.json: letters, digits and
# `._-`, starting with a letter or digit (so never `.`, `..`, a flag or whitespace).
MAX_MODEL_ID_CHARS = 128
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NAME_RE = re.compile(NAME_PATTERN)
# Aliases are only ever model ids (`/v1/models/{id:path}` carries a slash), so they may be
# Hugging Face style, `org/model`: segments like names, joined by single slashes.
ALIAS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$"
ALIAS_RE = re.compile(ALIAS_PATTERN)
