"""Recipe: the YAML (or dict) that declares a mixture, validated into frozen config objects."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mixer.errors import RecipeError

FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "text")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class SourceConfig(_Frozen):
    """One weighted source of documents."""

    name: str = Field(min_length=1, description="Unique name; seeds derive from it.")
    path: str | list[str] = Field(description="Glob, or list of globs (local or fsspec URL).")
    weight: float = Field(gt=0, description="Share of training tokens (normalized over sources).")
    text_field: str = Field(default="text", min_length=1, description="Column/key with the text.")
    format: Literal["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "text"] | None = Field(
        default=None, description="File format; inferred from each file's extension when absent.")
    epochs: int | None = Field(default=None, ge=1,
                               description="null: repeat forever; an integer caps the epochs.")
    on_error: Literal["raise", "skip"] = Field(
        default="raise", description="raise: stop with an error; skip: skip and count bad input.")
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options (credentials, endpoint); never logged.")

    @property
    def globs(self) -> list[str]:
        return [self.path] if isinstance(self.path, str) else list(self.path)

    @field_validator("path")
    @classmethod
    def _path_not_empty(cls, value: str | list[str]) -> str | list[str]:
        paths = [value] if isinstance(value, str) else value
        if not paths or any(not p for p in paths):
            raise ValueError("path must be a non-empty glob or a non-empty list of globs")
        return value

    def __repr__(self) -> str:  # keep storage_options (credentials) out of reprs
        return f"SourceConfig(name={self.name!r}, path={self.path!r}, weight={self.weight})"

    __str__ = __repr__


class Recipe(_Frozen):
    """A validated mixture recipe. Build with `mixer.load_recipe`."""

    seed: int = Field(default=0, description="Root of every random choice.")
    tokenizer: str = Field(min_length=1, description="tokenizer.json file or local HF folder.")
    seq_len: int = Field(gt=0, description="Tokens per row.")
    batch_size: int = Field(gt=0, description="Rows per batch, per rank.")
    lanes: int = Field(default=8, gt=0, description="Independent pipelines; see docs.")
    packing: Literal["concat", "pad", "best_fit"] = Field(default="concat")
    pack_window: int = Field(default=256, ge=1,
                             description="Documents per best_fit packing window.")
    shuffle_window: int = Field(default=1024, ge=1, description="Documents per shuffle window.")
    shuffle_window_bytes: int = Field(default=64 << 20, ge=1,
                                      description="A window also ends at this many text bytes.")
    split_bytes: int = Field(default=64 << 20, ge=1,
                             description="Target size of byte-range splits of plain jsonl.")
    max_document_bytes: int = Field(default=64 << 20, ge=1,
                                    description="Longer records are errors (or skipped).")
    read_ahead_bytes: int = Field(default=64 << 20, ge=1 << 16,
                                  description="Read-ahead budget per worker, shared by its "
                                              "open remote streams.")
    manifest: str | None = Field(default=None, description="Manifest file written by "
                                 "`mixer index`; used at start-up when it exists.")
    mask_document_boundaries: bool = Field(default=False)
    eos_token: str | None = Field(default=None, description="Overrides the tokenizer's EOS.")
    sources: list[SourceConfig] = Field(min_length=1)
    base_dir: str = Field(default=".", description="Relative paths resolve against this folder.")

    @model_validator(mode="after")
    def _unique_names(self) -> Recipe:
        seen: dict[str, int] = {}
        for i, src in enumerate(self.sources):
            if src.name in seen:
                raise ValueError(f"sources[{i}].name: duplicate source name {src.name!r} "
                                 f"(also sources[{seen[src.name]}].name)")
            seen[src.name] = i
        return self

    @property
    def weights(self) -> list[float]:
        total = sum(s.weight for s in self.sources)
        return [s.weight / total for s in self.sources]

    @property
    def finite(self) -> bool:
        """True when every source is capped, so the stream ends."""
        return all(s.epochs is not None for s in self.sources)

    def resolve(self, path: str) -> str:
        """An absolute local path or an untouched URL."""
        if "://" in path or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(self.base_dir, path))


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in FORMATS or part in ("str", "list[str]"):
            continue  # pydantic's union-branch tags, not user-visible fields
        elif str(part).startswith(("literal[", "function-")):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "<recipe>"


def _format_error(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        path = _field_path(tuple(item["loc"]))
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
        if item["type"] == "value_error" and path == "<recipe>":
            lines.append(msg.removeprefix("Value error, "))  # already names its field
            continue
        lines.append(f"{path}: {msg}")
    return "invalid recipe: " + "; ".join(dict.fromkeys(lines))


def load_recipe(path_or_dict: str | os.PathLike[str] | dict[str, Any] | Recipe) -> Recipe:
    """Load and validate a recipe from a YAML file path or a plain dict.

    Relative paths in a file recipe resolve against the file's folder; in a dict recipe,
    against `base_dir` if given, else the current directory. Raises `RecipeError` naming
    the field path of every problem.
    """
    if isinstance(path_or_dict, Recipe):
        return path_or_dict
    if isinstance(path_or_dict, dict):
        data = dict(path_or_dict)
        data.setdefault("base_dir", os.getcwd())
    else:
        file = Path(path_or_dict)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise RecipeError(f"cannot read recipe {str(file)!r}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RecipeError(f"recipe {str(file)!r} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise RecipeError(f"recipe {str(file)!r} must be a mapping of keys at the top level")
        if "base_dir" in data:
            raise RecipeError("base_dir: unknown key (set only for dict recipes)")
        data["base_dir"] = str(file.resolve().parent)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_error(exc)) from None
