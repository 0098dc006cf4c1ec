"""Recipe: the YAML (or dict) that declares a mixture, validated into frozen config objects."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from mixer.config.audio import AudioSettings
from mixer.config.fields import Float, Int, _Frozen, normalize
from mixer.config.images import ImageSettings
from mixer.config.online_mixing import OnlineMixing
from mixer.config.recipe_input import check_plain, read_yaml
from mixer.config.schedule import Schedule
from mixer.core.errors import RecipeError
from mixer.core.registry import FORMATS, PACKERS

# Upper bounds on sizes (docs/recipes.md): larger values are typos that would otherwise fail
# much later, out of memory.
MAX_LANES = 1 << 16
MAX_SEQ_LEN = 1 << 24
MAX_BATCH_SIZE = 1 << 24
MAX_BATCH_TOKENS = 1 << 28  # seq_len × batch_size
MAX_SHUFFLE_WINDOW = 1 << 24
MAX_PACK_WINDOW = 1 << 20
MAX_BYTES_SETTING = 1 << 40  # every *_bytes setting
MAX_EPOCHS = 1 << 32


class SourceConfig(_Frozen):
    """One weighted source of documents."""

    name: str = Field(min_length=1, description="Unique name; seeds derive from it.")
    path: str | list[str] = Field(description="Glob, or list of globs (local or fsspec URL).")
    weight: Float | None = Field(
        default=None,
        gt=0,
        description="Share of training tokens (normalized over sources); "
        "required unless the recipe has a `schedule`.",
    )
    text_field: str = Field(
        default="text",
        min_length=1,
        description="Column/key with the text (webdataset: key in the json member; its "
        "default is the txt member).",
    )
    format: str | None = Field(
        default=None, description="File format; inferred from each file's extension when absent."
    )
    token_dtype: Literal["uint16", "uint32"] | None = Field(
        default=None,
        description="Pre-tokenized sources: the ids' type in a headerless .npy "
        "(OLMo's raw token arrays); a .npy header must agree with it.",
    )
    epochs: Int | None = Field(
        default=None,
        ge=1,
        le=MAX_EPOCHS,
        description="null: repeat forever; an integer caps the epochs.",
    )
    on_error: Literal["raise", "skip"] = Field(
        default="raise", description="raise: stop with an error; skip: skip and count bad input."
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options (credentials, endpoint); never logged."
    )

    @property
    def chosen_text_field(self) -> str | None:
        """`text_field` when the recipe sets it, else None: each format's default applies."""
        return self.text_field if "text_field" in self.model_fields_set else None

    @property
    def globs(self) -> list[str]:
        return [self.path] if isinstance(self.path, str) else list(self.path)

    @field_validator("path", mode="plain")
    @classmethod
    def _glob_or_globs(cls, value: Any) -> str | list[str]:
        # Checked here rather than by pydantic's union, whose errors carry branch tags
        # ("str", "list[str]") in their locations.
        paths = [value] if isinstance(value, str) else value
        if (
            not isinstance(paths, list)
            or not paths
            or any(not isinstance(p, str) or not p for p in paths)
        ):
            raise ValueError("path must be a non-empty glob or a non-empty list of globs")
        return value

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        if value is not None and value not in FORMATS:
            raise ValueError(f"unknown format {value!r}; known: {', '.join(FORMATS)}")
        return value

    def __repr__(self) -> str:  # keep storage_options (credentials) out of reprs
        return f"SourceConfig(name={self.name!r}, path={self.path!r}, weight={self.weight})"

    __str__ = __repr__


class Recipe(_Frozen):
    """A validated mixture recipe. Build with `mixer.load_recipe`."""

    seed: Int = Field(
        default=0,
        ge=-(1 << 63),
        lt=1 << 64,
        description="Root of every random choice (a 64-bit integer).",
    )
    tokenizer: str = Field(min_length=1, description="tokenizer.json file or local HF folder.")
    seq_len: Int = Field(gt=0, le=MAX_SEQ_LEN, description="Tokens per row.")
    batch_size: Int = Field(gt=0, le=MAX_BATCH_SIZE, description="Rows per batch, per rank.")
    lanes: Int = Field(
        default=8, gt=0, le=MAX_LANES, description="Independent pipelines; see docs."
    )
    packing: str = Field(default="concat", description="A packer's name: concat | pad | best_fit.")
    pack_window: Int = Field(
        default=256, ge=1, le=MAX_PACK_WINDOW, description="Documents per best_fit packing window."
    )
    shuffle_window: Int = Field(
        default=1024, ge=1, le=MAX_SHUFFLE_WINDOW, description="Documents per shuffle window."
    )
    shuffle_window_bytes: Int = Field(
        default=64 << 20,
        ge=1,
        le=MAX_BYTES_SETTING,
        description="A window also ends at this many text bytes.",
    )
    shuffle_budget_bytes: Int = Field(
        default=64 << 20,
        ge=1 << 16,
        le=MAX_BYTES_SETTING,
        description="Text bytes of all shuffle windows together (every lane and source): each "
        "(lane, source) window ends at an equal share, so a worker's windows never hold more.",
    )
    split_bytes: Int = Field(
        default=64 << 20,
        ge=1,
        le=MAX_BYTES_SETTING,
        description="Target size of byte-range splits of plain jsonl.",
    )
    max_document_bytes: Int = Field(
        default=64 << 20,
        ge=1,
        le=MAX_BYTES_SETTING,
        description="Longer records are errors (or skipped).",
    )
    read_ahead_bytes: Int = Field(
        default=64 << 20,
        ge=1 << 16,
        le=MAX_BYTES_SETTING,
        description="Read-ahead budget per worker, shared by its open remote streams.",
    )
    manifest: str | None = Field(
        default=None,
        description="Manifest file written by `mixer index`; used at start-up when it exists.",
    )
    mask_document_boundaries: bool = Field(default=False)
    flatten: bool = Field(
        default=False,
        description="Each batch as one row [1, batch_size·seq_len] with cu_seq_lens_q/k and "
        "max_length_q/k (varlen attention); the stream and state are the unflattened recipe's.",
    )
    token_cache: str | None = Field(
        default=None,
        min_length=1,
        description="Folder or URL of the token cache (see docs/recipes.md); absent: none.",
    )
    token_cache_storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options of the token cache's URL."
    )
    eos_token: str | None = Field(default=None, description="Overrides the tokenizer's EOS.")
    tokenizer_backend: Literal["auto", "hf", "fastokens"] = Field(
        default="auto",
        description="What encodes: hf (the `tokenizers` library), fastokens "
        "(required; refused unless it loads the tokenizer and matches hf on a stress text and "
        "the sources' first documents), auto (fastokens where it does, else hf).",
    )
    images: ImageSettings | None = Field(
        default=None, description="Image+text batches (absent: text batches)."
    )
    audio: AudioSettings | None = Field(
        default=None, description="Audio+text batches (absent: text batches)."
    )
    sources: list[SourceConfig] = Field(min_length=1)
    schedule: Schedule | None = Field(
        default=None,
        description="Target weights over global tokens; absent: the sources' `weight`.",
    )
    online_mixing: OnlineMixing | None = Field(
        default=None,
        description="Weights set from the reported training loss (absent: off); the "
        "sources' `weight`s are the start and the prior.",
    )
    base_dir: str = Field(default=".", description="Relative paths resolve against this folder.")

    @field_validator("packing")
    @classmethod
    def _known_packer(cls, value: str) -> str:
        if value not in PACKERS:
            raise ValueError(f"unknown packing {value!r}; known: {', '.join(PACKERS)}")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> Recipe:
        seen: dict[str, int] = {}
        for i, src in enumerate(self.sources):
            if src.name in seen:
                raise ValueError(
                    f"sources[{i}].name: duplicate source name {src.name!r} "
                    f"(also sources[{seen[src.name]}].name)"
                )
            seen[src.name] = i
        return self

    @model_validator(mode="after")
    def _one_media_layout(self) -> Recipe:
        if self.images is not None and self.audio is not None:
            raise ValueError(
                "audio: a recipe has one batch layout; `images:` and `audio:` cannot be "
                "combined (qwen2_audio batches carry no pixels)"
            )
        return self

    @model_validator(mode="after")
    def _bounded_batch(self) -> Recipe:
        tokens = self.seq_len * self.batch_size
        if tokens > MAX_BATCH_TOKENS:
            raise ValueError(
                f"batch_size: seq_len × batch_size = {tokens:,} tokens per batch "
                f"is more than the limit of {MAX_BATCH_TOKENS:,}"
            )
        return self

    @model_validator(mode="after")
    def _schedule_names_sources(self) -> Recipe:
        names = {s.name for s in self.sources}
        if self.schedule is None:
            for i, src in enumerate(self.sources):
                if src.weight is None:
                    raise ValueError(
                        f"sources[{i}].weight: field required (a recipe without "
                        "`schedule` weighs each source)"
                    )
            return self
        points = self.schedule.points
        if points[0].at_tokens != 0:
            raise ValueError(
                f"schedule.points[0].at_tokens: the first point must be at 0 "
                f"tokens, got {points[0].at_tokens:g}"
            )
        for i, point in enumerate(points):
            if i and point.at_tokens <= points[i - 1].at_tokens:
                raise ValueError(
                    f"schedule.points[{i}].at_tokens: {point.at_tokens:g} is not "
                    f"after points[{i - 1}].at_tokens ({points[i - 1].at_tokens:g})"
                    "; points must be strictly increasing"
                )
            for name, weight in point.weights.items():
                if weight < 0:
                    raise ValueError(
                        f"schedule.points[{i}].weights.{name}: weight {weight:g} is negative"
                    )
            if not any(w > 0 for w in point.weights.values()):
                raise ValueError(
                    f"schedule.points[{i}].weights: every weight is 0 (at least "
                    "one source must have a positive weight)"
                )
            for name in point.weights:
                if name not in names:
                    raise ValueError(
                        f"schedule.points[{i}].weights.{name}: unknown source "
                        f"{name!r}; sources: {', '.join(sorted(names))}"
                    )
            shares = normalize([point.weights.get(s.name, 0.0) for s in self.sources])
            for name, share in zip([s.name for s in self.sources], shares):
                if not math.isfinite(share) or (point.weights.get(name, 0) > 0 and share <= 0):
                    raise ValueError(
                        f"schedule.points[{i}].weights.{name}: its share rounds "
                        "to 0 next to the other weights"
                    )
        return self

    @model_validator(mode="after")
    def _online_mixing_alone(self) -> Recipe:
        if self.online_mixing is not None and self.schedule is not None:
            raise ValueError(
                "online_mixing: cannot be combined with `schedule` (the algorithm sets the "
                "weights; give the sources `weight`s to start from)"
            )
        return self

    @model_validator(mode="after")
    def _weights_have_shares(self) -> Recipe:
        if self.schedule is not None:
            return self
        for i, share in enumerate(self.weights):
            if not (math.isfinite(share) and share > 0):
                raise ValueError(
                    f"sources[{i}].weight: {self.sources[i].weight} is too small "
                    "next to the other weights: its share rounds to 0"
                )
        return self

    @property
    def has_media(self) -> bool:
        """Whether documents are built from records with media (an `images:` or `audio:`
        block): no token cache, one batch per DataLoader item, a layout of its own."""
        return self.images is not None or self.audio is not None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    @property
    def weights(self) -> list[float]:
        """Each source's share at the start (token 0), summing to 1."""
        return self.weights_at(0)

    def weights_at(self, tokens: int) -> list[float]:
        """Each source's target share at global position `tokens` (schedule, else weights)."""
        if self.schedule is not None:
            return self.schedule.weights_at(self.names, tokens)
        return normalize([s.weight or 0.0 for s in self.sources])

    @property
    def window_bytes(self) -> int:
        """Text bytes at which a (lane, source) shuffle window ends: `shuffle_window_bytes`,
        or the window's equal share of `shuffle_budget_bytes` when smaller. Depends on recipe
        values only (never on ranks or workers), so the stream stays topology-independent."""
        share = self.shuffle_budget_bytes // (self.lanes * len(self.sources))
        return max(1, min(self.shuffle_window_bytes, share))

    @property
    def finite(self) -> bool:
        """True when every source is capped, so the stream ends."""
        return all(s.epochs is not None for s in self.sources)

    def resolve(self, path: str) -> str:
        """An absolute local path or an untouched URL."""
        if "://" in path or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(self.base_dir, path))


def field_path(loc: tuple[Any, ...]) -> str:
    """`sources[0].weight` from a pydantic error location."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<recipe>"


def _format_error(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        path = field_path(tuple(item["loc"]))
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
        if item["type"] == "value_error" and (path == "<recipe>" or msg.startswith(path + ".")):
            lines.append(msg)  # a model check: the message names its field
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
        check_plain(path_or_dict)
        data = dict(path_or_dict)
        data.setdefault("base_dir", os.getcwd())
    elif isinstance(path_or_dict, (str, os.PathLike)):
        file = Path(path_or_dict)
        data = read_yaml(file)
        if not isinstance(data, dict):
            raise RecipeError(f"recipe {str(file)!r} must be a mapping of keys at the top level")
        check_plain(data)
        if "base_dir" in data:
            raise RecipeError("base_dir: unknown key (set only for dict recipes)")
        data["base_dir"] = str(file.resolve().parent)
    else:
        raise RecipeError(
            f"a recipe is a YAML file path, a dict or a Recipe, not {type(path_or_dict).__name__}"
        )
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_error(exc)) from None
