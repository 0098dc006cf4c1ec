"""Recipe input before validation: a bounded YAML reader and checks on the plain data.

A recipe file is read with hard limits (size, nesting, aliases, nodes after alias expansion)
so that a hostile file fails here, at once, rather than later in `build_loader`. The same
plain-data check runs on dict recipes: JSON-like data, string keys, finite numbers, bounded.
Every problem is a `RecipeError`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import Mark
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode
from yaml.resolver import Resolver

from mixer.core.errors import RecipeError

if TYPE_CHECKING:  # the fallback below has the same methods
    from yaml._yaml import CParser as _Parser
else:
    try:  # libyaml's parser when present (about 4x faster); composing stays in Python (below)
        from yaml._yaml import CParser as _Parser
    except ImportError:  # pragma: no cover
        from yaml.parser import Parser as _BaseParser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        class _Parser(Reader, Scanner, _BaseParser):
            def __init__(self, stream: str) -> None:
                Reader.__init__(self, stream)
                Scanner.__init__(self)
                _BaseParser.__init__(self)


MAX_BYTES = 1 << 20  # a recipe file
MAX_DEPTH = 64  # nested mappings/sequences, aliases expanded
MAX_ALIASES = 100  # `*name` references in one file
MAX_NODES = 100_000  # values, keys and collections, aliases expanded

# What PyYAML's safe constructors raise on bad scalars (`!!int abc`, `!!bool maybe`,
# `!!timestamp 2020-99`, too many digits), besides its own YAMLError.
_CONSTRUCT_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError)


def _composed(node: Node | None) -> Node:
    """`Composer.compose_node`'s result: PyYAML's stubs say `Node | None`, while it returns a
    node or raises."""
    return cast(Node, node)


class _Limit(yaml.MarkedYAMLError):
    """A limit of this reader was exceeded at a position of the file."""


class _BoundedLoader(Composer, _Parser, SafeConstructor, Resolver):
    """SafeLoader semantics, composing with running depth, alias and expanded-size counts.

    Aliases share nodes, so the YAML itself stays small while the data it describes can be
    exponential (a "billion laughs"); the expanded size is counted per node as it is composed.
    """

    def __init__(self, text: str) -> None:
        _Parser.__init__(self, text)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, height)

    def _mark(self) -> Mark | None:
        """Where the next event starts (None past the end of the stream)."""
        event = self.peek_event()
        return None if event is None else event.start_mark

    def _fail(self, problem: str) -> None:
        raise _Limit(problem=problem, problem_mark=self._mark())

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            self._fail(f"more than {MAX_NODES:,} values (aliases expanded)")

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                self._fail(f"more than {MAX_ALIASES} aliases")
            mark = self._mark()
            node = _composed(super().compose_node(parent, index))
            size = self._sizes.get(id(node))
            if size is None:  # the alias points into a node still being composed
                raise _Limit(problem="recursive alias", problem_mark=mark)
            if self._depth + size[1] > MAX_DEPTH:
                raise _Limit(
                    problem=f"nested deeper than {MAX_DEPTH} levels (aliases expanded)",
                    problem_mark=mark,
                )
            self._count(size[0])
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            self._fail(f"nested deeper than {MAX_DEPTH} levels")
        self._count(1)
        node = _composed(super().compose_node(parent, index))
        self._depth -= 1
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        sizes = [self._sizes[id(child)] for child in children]
        self._sizes[id(node)] = (
            1 + sum(s[0] for s in sizes),
            1 + max((s[1] for s in sizes), default=0),
        )
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except _CONSTRUCT_ERRORS as exc:  # give a bad value its position
            what = repr(node.value[:40]) if isinstance(node.value, str) else "value"
            raise yaml.constructor.ConstructorError(
                problem=f"cannot read {what} as {node.tag.rsplit(':', 1)[-1]}: {exc}",
                problem_mark=node.start_mark,
            ) from None


def _describe(exc: yaml.YAMLError) -> str:
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc)
    parts = [p for p in (exc.context, exc.problem) if p]
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + ", ".join(parts)


def read_yaml(file: Path) -> Any:
    """The data of a YAML recipe file, read within the limits above."""
    try:
        with open(file, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise RecipeError(f"cannot read recipe {str(file)!r}: {reason}") from None
    if len(raw) > MAX_BYTES:
        raise RecipeError(f"recipe {str(file)!r} is larger than {MAX_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"recipe {str(file)!r} is not UTF-8 text (byte offset {exc.start})"
        ) from None
    loader = None
    try:
        loader = _BoundedLoader(text)
        return loader.get_single_data()
    except _Limit as exc:
        raise RecipeError(f"recipe {str(file)!r} is too large: {_describe(exc)}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {str(file)!r} is not valid YAML: {_describe(exc)}") from None
    except _CONSTRUCT_ERRORS as exc:
        raise RecipeError(f"recipe {str(file)!r} is not valid YAML: {exc}") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept as a last bound
        raise RecipeError(f"recipe {str(file)!r} is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def check_plain(data: Any) -> None:
    """Refuse recipe data that is not bounded, JSON-like plain data with finite numbers.

    Shared structures (the same list referenced twice, as YAML aliases make) count once per
    reference, so the check is also the bound on their expanded size.
    """
    nodes = 0
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        nodes += 1
        where = path or "<recipe>"
        if nodes > MAX_NODES:
            raise RecipeError(f"recipe is too large: more than {MAX_NODES:,} values")
        if depth > MAX_DEPTH:
            raise RecipeError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, float) and not math.isfinite(value):
            raise RecipeError(f"{where}: {value} is not a finite number")
        if isinstance(value, str):
            if "\x00" in value or not _encodable(value):
                raise RecipeError(f"{where}: text with a NUL or unpaired surrogate character")
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise RecipeError(f"{where}: key {key!r} is not a string")
                stack.append((item, _path(path, key), depth + 1))
        elif isinstance(value, (list, tuple, set, frozenset)):
            for i, item in enumerate(value):
                stack.append((item, _path(path, i), depth + 1))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
