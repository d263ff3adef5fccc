"""Which `engine:` keys a llama.cpp model takes.

`llama_cpp.Llama(**kwargs)` ends in `**kwargs` and ignores what it does not know, so a typo such as
`n_ctxx: 4096` would load the model with the default context and say nothing. The names are read
from `Llama.__init__`'s source (its named parameters) rather than from the imported class, so the
controller and the gateway can check a spec before anything loads the native library.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from collections.abc import Iterable
from functools import cache
from pathlib import Path

# Our own keys, taken off before `Llama(...)` sees the rest (model.py, batched.py).
RAYGATE_KEYS = frozenset({"prompt_cache", "prompt_cache_ram_mib", "chat_template", "n_seq_max"})
# Set by Raygate from the spec itself (`source:`, `task:`); a second value would clash.
SET_BY_RAYGATE = frozenset({"model_path", "embedding"})


@cache
def llama_parameters() -> frozenset[str]:
    """`Llama.__init__`'s named parameters in the installed llama-cpp-python."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise ValueError("llama-cpp-python is not installed")
    tree = ast.parse((Path(spec.origin).parent / "llama.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Llama":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args
                    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                    return frozenset(names) - {"self"}
    raise ValueError("llama_cpp/llama.py has no Llama.__init__")


def check_llama_options(keys: Iterable[str]) -> None:
    """Raise ValueError naming the first key `Llama` would ignore or that Raygate sets itself."""
    known = llama_parameters() | RAYGATE_KEYS
    for key in sorted(keys):
        if key in SET_BY_RAYGATE:
            raise ValueError(f"engine option `{key}` is set by Raygate from the model's spec; leave it out")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known - SET_BY_RAYGATE), n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise ValueError(f"unknown llama.cpp engine option `{key}`{hint}")
