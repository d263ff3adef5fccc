"""Xinference's model registrations, kept by the controller beside its deployments.

A registration is a model family (protocol/xinference.py `ModelFamily`): a name and the specs of
the files that can serve it. Built-in ones describe what Raygate can load offline (the default
models, from `models/default.yaml`; an embedding model is also a `rerank` one, by cosine), and are
derived in families.py, beside the `Registration` record itself; user ones come from
`POST /v1/model_registrations`, and those registered with `persist: true` are written to
`<state_dir>/registrations.json` (the registry file's atomic writer) and come back with the
controller.

Launching a registration builds an ordinary deployment spec (`launch_spec`): the registry knows
nothing of Xinference beyond the `origin` the spec carries. Every check runs before anything is
stored, so a refused request leaves the registrations and the file as they were.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from raygate.backends.cluster.control.families import Registration, builtin_registrations
from raygate.backends.cluster.stores.state_file import StateFileError, write_json
from raygate.backends.engines.model_files import ModelFileError, resolve_model_file
from raygate.protocol.base import describe_errors
from raygate.protocol.config import LaunchOrigin, ModelConfig
from raygate.protocol.errors import BadRequestError, ModelNotFoundError
from raygate.protocol.model_source import ModelSource
from raygate.protocol.xinference import (
    ENGINE_FORMATS,
    ENGINE_NAMES,
    FORMAT_ENGINE,
    MODEL_TYPE_TASK,
    SUPPORTED,
    TASK_ABILITY,
    LaunchRequest,
    ModelFamily,
    ModelSpec,
    PromptStyle,
    builtin_prompt_styles,
    chat_template,
)

REGISTRATIONS_FILE = "registrations.json"
FORMAT = 1


def _bad(message: str, param: str = "model") -> BadRequestError:
    return BadRequestError(message, param=param)


def check_model_type(model_type: str) -> str:
    if model_type not in MODEL_TYPE_TASK:
        raise _bad(
            f"Model type `{model_type[:40]}` is not served by Raygate; "
            f"it serves: {', '.join(MODEL_TYPE_TASK)}.",
            "model_type",
        )
    return model_type


HUBS = {"huggingface": "hf", "modelscope": "modelscope"}


def spec_source(spec: ModelSpec, quantization: str) -> dict[str, Any]:
    """Where a launch's weights come from: the local file or folder of `model_uri`, or, without
    one, the Hub repository `model_id` on `model_hub` (Xinference's own default), at
    `model_revision`, the GGUF picked by `model_file_name_template`. A Hub source is checked (and
    pinned) by the deploy it starts, like any `source: {hf: ...}`."""
    if spec.model_uri or not spec.model_id:
        return {"path": str(spec_file(spec, quantization))}
    if spec.model_format not in FORMAT_ENGINE:
        raise _bad(f"Model format `{spec.model_format}` cannot be served by Raygate; it runs {SUPPORTED}.")
    hub = HUBS.get(spec.model_hub)
    if hub is None:
        raise _bad(f"`model_hub` must be one of {', '.join(HUBS)} (got `{spec.model_hub[:40]}`).")
    source: dict[str, Any] = {hub: spec.model_id}
    if spec.model_format != "pytorch":
        template = spec.model_file_name_template or f"*{quantization}*.gguf"
        source["file"] = template.replace("{quantization}", quantization)
    if spec.model_revision:
        source["revision"] = spec.model_revision
    try:
        ModelSource.model_validate(source)
    except ValidationError as exc:
        raise _bad(
            f"`model_id` / `model_revision` do not name a Hub repository: {exc.errors()[0]['msg']}"
        ) from None
    return source


def spec_file(spec: ModelSpec, quantization: str) -> Path:
    """The file (GGUF) or folder (Hugging Face) `spec` names for `quantization`; 400 naming it when
    it is not there."""
    if spec.model_format not in FORMAT_ENGINE:
        raise _bad(f"Model format `{spec.model_format}` cannot be served by Raygate; it runs {SUPPORTED}.")
    uri = spec.model_uri
    if not uri:
        raise _bad("`model_uri` or `model_id` is required: where the weights are, locally or on a Hub.")
    root = uri.removeprefix("file://")
    if not Path(root).expanduser().is_absolute():
        raise _bad(f"`model_uri` must be an absolute path or a file:// URI (got `{uri[:200]}`).")
    folder = spec.model_format == "pytorch"
    path = root
    if not folder:
        template = spec.model_file_name_template
        if not template:
            raise _bad("A `ggufv2` spec needs `model_file_name_template` (the GGUF's file name).")
        name = template.replace("{quantization}", quantization)
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise _bad(
                f"`model_file_name_template` must name a file inside `model_uri` (got `{name[:200]}`)."
            )
        path = str(Path(root) / name)
    try:
        return resolve_model_file(ModelSource(path=path), folder=folder)
    except ModelFileError as exc:
        raise _bad(f"The files of this family do not exist: {exc}") from None


def load_registrations(state_dir: Path) -> list[Registration]:
    """The persisted user families (none when there is no file yet); `StateFileError` when the
    file cannot be read back (the gateway checks this before Ray starts, as for registry.json)."""
    path = state_dir / REGISTRATIONS_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, json.JSONDecodeError) as exc:
        raise StateFileError(f"cannot read registrations {path}: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise StateFileError(f"registrations {path} is not a format-{FORMAT} Raygate file")
    try:
        return [
            Registration(check_model_type(r["model_type"]), ModelFamily.model_validate(r["family"]), True)
            for r in raw.get("registrations", [])
        ]
    except (ValidationError, KeyError, TypeError, BadRequestError) as exc:
        raise StateFileError(f"registrations {path} holds an invalid entry: {exc}") from None


class Registrations:
    """The registrations of the module docstring, owned by the controller actor."""

    def __init__(self, state_dir: Path | None, builtins: list[ModelConfig]) -> None:
        self._state_dir = state_dir
        self._entries: dict[tuple[str, str], Registration] = {}
        for spec in builtins:
            for reg in builtin_registrations(spec):
                self._entries[(reg.model_type, reg.family.model_name)] = reg
        for reg in load_registrations(state_dir) if state_dir is not None else []:
            self._entries.setdefault((reg.model_type, reg.family.model_name), reg)

    def _save(self) -> None:
        if self._state_dir is None:
            return
        body = {
            "format": FORMAT,
            "registrations": [
                {"model_type": r.model_type, "family": r.family.model_dump(mode="json")}
                for r in self._entries.values()
                if r.persist
            ],
        }
        write_json(self._state_dir, REGISTRATIONS_FILE, body)

    # ---- read ----------------------------------------------------------------------------------

    def list(self, model_type: str, detailed: bool) -> list[dict[str, Any]]:
        check_model_type(model_type)
        return [r.wire(detailed) for (t, _), r in self._entries.items() if t == model_type]

    def get(self, model_type: str, name: str) -> Registration:
        check_model_type(model_type)
        reg = self._entries.get((model_type, name))
        if reg is None:
            raise ModelNotFoundError(
                f"No {model_type} registration named `{name[:128]}`; "
                f"GET /v1/model_registrations/{model_type} lists them.",
                param="model_name",
            )
        return reg

    def prompt_styles(self) -> dict[str, dict[str, Any]]:
        """Xinference keys styles by model name: the chat families that carry one, then the styles
        Raygate renders, by style name."""
        styles: dict[str, PromptStyle] = {
            r.family.model_name: r.family.prompt_style
            for r in self._entries.values()
            if r.family.prompt_style is not None
        }
        for name, style in builtin_prompt_styles().items():
            styles.setdefault(name, style)
        return {name: style.model_dump(mode="json") for name, style in styles.items()}

    # ---- change --------------------------------------------------------------------------------

    def register(self, model_type: str, raw: dict[str, Any], persist: bool) -> ModelFamily:
        check_model_type(model_type)
        try:
            family = ModelFamily.model_validate(raw)
        except ValidationError as exc:
            raise _bad(f"Invalid model family:\n{describe_errors(exc, limit=3)}") from None
        name = family.model_name
        taken = [t for (t, n) in self._entries if n == name]
        if taken:
            raise BadRequestError(
                f"A {taken[0]} model named `{name}` is already registered; "
                "unregister it first or pick another name.",
                param="model_name",
                code="model_exists",
            )
        if model_type == "LLM" and not {"generate", "chat"} & set(family.model_ability):
            raise _bad("An LLM family needs `generate` or `chat` in `model_ability`.")
        if family.prompt_style is not None and "chat" not in family.model_ability:
            raise _bad("`prompt_style` renders chats: add `chat` to `model_ability`.")
        for spec in family.model_specs:
            for quantization in spec.quantizations:
                spec_source(spec, quantization)
        reg = Registration(model_type, family, persist)
        self._entries[(model_type, name)] = reg
        if persist:
            try:
                self._save()
            except OSError as exc:
                del self._entries[(model_type, name)]
                raise BadRequestError(f"Cannot persist the registration: {exc}") from None
        return family

    def unregister(self, model_type: str, name: str) -> None:
        reg = self.get(model_type, name)
        if reg.builtin:
            raise _bad(
                f"`{name}` is a built-in model; only registered models can be unregistered.", "model_name"
            )
        del self._entries[(model_type, name)]
        if reg.persist:
            try:
                self._save()
            except OSError as exc:
                self._entries[(model_type, name)] = reg
                raise BadRequestError(f"Cannot persist the change: {exc}") from None

    # ---- launch --------------------------------------------------------------------------------

    def launch_spec(self, req: LaunchRequest) -> ModelConfig:
        """The deployment a launch starts: a built-in's default spec, or a spec built from the family's
        files, under the uid, with the launch's replicas, GPUs and engine options."""
        refused = req.refused()
        if refused is not None:
            raise _bad(refused, "model")
        reg = self.get(req.model_type, req.model_name)
        spec, quantization = self._pick(reg, req)
        engine_name = FORMAT_ENGINE[spec.model_format]
        backend = ENGINE_FORMATS[engine_name][1]
        family = reg.family
        origin = LaunchOrigin(
            model_name=family.model_name,
            model_type=reg.model_type,
            model_ability=[*(family.model_ability or TASK_ABILITY[MODEL_TYPE_TASK[reg.model_type]])],
            model_lang=list(family.model_lang),
            model_description=family.model_description,
            model_format=spec.model_format,
            model_engine=engine_name,
            model_size_in_billions=spec.model_size_in_billions,
            quantization=quantization,
            context_length=family.context_length,
            prompt_style=family.prompt_style.style_name if family.prompt_style else None,
        )
        uid = req.model_uid or req.model_name
        if reg.base is not None:
            body: dict[str, Any] = reg.base.model_dump(mode="json", exclude={"aliases", "origin"})
        else:
            body = {
                "backend": backend,
                "task": MODEL_TYPE_TASK[reg.model_type],
                "source": spec_source(spec, quantization),
                "engine": self._engine_defaults(reg, backend),
            }
        # Xinference's launch loads the model now, on `replica` copies: a built-in's autoscaling
        # (models/default.yaml's embedding model loads on demand) does not carry over.
        body.pop("autoscaling", None)
        body.update(name=uid, replicas=req.replica, origin=origin.model_dump(mode="json"))
        body["engine"] = {**body.get("engine", {}), **req.engine_options()}
        if isinstance(req.n_gpu, int):
            body["num_gpus"] = req.n_gpu
        elif req.n_gpu not in (None, "auto"):
            raise _bad(f"`n_gpu` must be a number, `auto` or null (got `{str(req.n_gpu)[:20]}`).", "n_gpu")
        if req.request_limits is not None:
            body["limits"] = {**body.get("limits", {}), "max_running": req.request_limits}
        if req.envs:
            body["env"] = {**body.get("env", {}), **req.envs}
        try:
            return ModelConfig.model_validate(body)
        except ValidationError as exc:
            raise _bad(
                f"Cannot launch `{req.model_name}`:\n{describe_errors(exc, limit=3)}", "model_uid"
            ) from None

    @staticmethod
    def _engine_defaults(reg: Registration, backend: str) -> dict[str, Any]:
        family = reg.family
        engine: dict[str, Any] = {}
        if backend != "llama_cpp":
            if family.context_length:
                engine["max_model_len"] = family.context_length
            return engine
        if reg.model_type != "LLM":
            # llama.cpp embeds (and scores) one input per micro-batch: as long as the longest input.
            n = family.max_tokens or family.context_length or 512
            engine.update(n_ctx=n, n_batch=n, n_ubatch=n)
        elif family.context_length:
            engine["n_ctx"] = min(family.context_length, 32768)
        if family.prompt_style is not None:
            engine["chat_template"] = chat_template(family.prompt_style)
        return engine

    @staticmethod
    def _pick(reg: Registration, req: LaunchRequest) -> tuple[ModelSpec, str]:
        """The first spec matching the launch's engine, format, size and quantization; 400 saying
        what the family offers when none does."""
        fmt = req.model_format
        if req.model_engine is not None:
            engine = ENGINE_NAMES.get(
                req.model_engine.lower().replace("_", ".").replace("llamacpp", "llama.cpp"), ""
            )
            if not engine:
                raise _bad(
                    f"Raygate cannot run engine `{req.model_engine[:32]}`; it runs {SUPPORTED}.",
                    "model_engine",
                )
            wanted = ENGINE_FORMATS[engine][0]
            if fmt is not None and fmt != wanted:
                raise _bad(
                    f"Engine `{req.model_engine}` cannot run format `{fmt}`; Raygate runs {SUPPORTED}.",
                    "model_format",
                )
            fmt = wanted
        size = (
            None if req.model_size_in_billions is None else str(req.model_size_in_billions).replace(".", "_")
        )
        for spec in reg.family.model_specs:
            if spec.model_format not in FORMAT_ENGINE or (fmt is not None and spec.model_format != fmt):
                continue
            if size is not None and str(spec.model_size_in_billions).replace(".", "_") != size:
                continue
            if req.quantization is not None and req.quantization not in spec.quantizations:
                continue
            return spec, req.quantization if req.quantization is not None else spec.quantizations[0]
        offered = "; ".join(
            f"{s.model_format} {s.model_size_in_billions}B [{', '.join(s.quantizations)}]"
            for s in reg.family.model_specs
        )
        raise _bad(
            f"`{req.model_name}` has no spec Raygate can run for engine={req.model_engine}, format={fmt}, "
            f"size={req.model_size_in_billions}, quantization={req.quantization}. It offers: {offered}. "
            f"Raygate runs {SUPPORTED}.",
            "model_format",
        )
