"""How a config file's YAML is read and how ``--print-config`` writes it, so that one reads back the other.

Reading: the YAML is composed into nodes first, and refused (:class:`ConfigTextError`) when its
aliases expand past :data:`MAX_VALUES` values or refer to themselves, before anything is built
from it. A plain scalar is then typed by the YAML resolvers (``lr: 3e-4`` is a float, as are
``1e3`` and ``5e10``; ``yes`` is true), except under a text setting's key (``TEXT_KEYS``: a ``str``
field, a list of them, or a field of choices): there a plain scalar, and each plain item of a list,
is the text it is written as (``prompt: [yes, 0x10, null]`` is the three strings ``yes``, ``0x10``,
``null``). A setting's own ``null`` (or an empty value) is still null: unset, where the setting
allows it. A flag's value, which the parser reads with the same loader (:func:`load_value`), is
null only when it is ``null``: ``--gguf-file ~`` or ``--gguf-file '#c'`` is that text.

Writing: a string is quoted wherever the reader above, or a YAML 1.1 reader, would read it as
something else (``'1e3'``, ``'yes'``, ``'null'``), so the printed config means the same run to this
reader and to others.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_VALUES = 100_000  # values a config file may expand to, aliases counted each time they are used
STR_TAG = "tag:yaml.org,2002:str"
FLOAT_TAG = "tag:yaml.org,2002:float"
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# YAML 1.1's floats need a dot; these also take 1e3 and 5e-10 (as jsonargparse's loader does)
FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


class ConfigTextError(ValueError):
    """A config text that is refused before it is built: too many values, or an alias within itself."""


def _with_resolvers(cls: type) -> type:
    """``cls`` with jsonargparse's implicit types: no timestamps (a date stays text), exponent floats."""
    cls.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (FLOAT_TAG, TIMESTAMP_TAG)]
        for first, resolvers in cls.yaml_implicit_resolvers.items()
    }
    cls.add_implicit_resolver(FLOAT_TAG, FLOAT, list("-+0123456789."))
    return cls


@_with_resolvers
class ConfigLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The safe YAML loader with the implicit types above."""


@_with_resolvers
class ConfigDumper(yaml.SafeDumper):
    """The safe YAML dumper; it quotes a string that :class:`ConfigLoader` would read as another type."""


def _yaml11_would_retype(text: str) -> bool:
    """Whether a YAML 1.1 reader (PyYAML's safe loader) reads ``text`` unquoted as another type (a date)."""
    return yaml.resolver.Resolver().resolve(ScalarNode, text, (True, False)) != STR_TAG


def _represent_str(dumper: ConfigDumper, text: str) -> Node:
    node = dumper.represent_str(text)
    if not node.style and _yaml11_would_retype(text):
        node.style = "'"
    return node


ConfigDumper.add_representer(str, _represent_str)


def dump_config(data: Any) -> str:
    """``data`` as ``--print-config`` writes it: block style, in its order, strings quoted where needed."""
    return yaml.dump(data, Dumper=ConfigDumper, default_flow_style=False, allow_unicode=True, sort_keys=False)


def expanded_values(node: Node | None, limit: int = MAX_VALUES) -> int:
    """How many values ``node`` stands for with every alias expanded (at most ``limit`` + 1: counting
    stops past it); an alias inside the node it names is a :class:`ConfigTextError`."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(n: Node) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in open_nodes:
            raise ConfigTextError("an alias refers to a value that holds it (a recursive alias)")
        open_nodes.add(id(n))
        total = 1
        if isinstance(n, SequenceNode):
            children = n.value
        elif isinstance(n, MappingNode):
            children = [part for pair in n.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        open_nodes.discard(id(n))
        sizes[id(n)] = min(total, limit + 1)
        return sizes[id(n)]

    return 0 if node is None else size(node)


def _as_text(node: Node) -> Node:
    """A plain scalar as a string node of its own text; a sequence with each plain item so; else ``node``."""
    if isinstance(node, ScalarNode) and not node.style and node.tag != STR_TAG:  # plain: None, or "" (libyaml)
        return ScalarNode(STR_TAG, node.value, node.start_mark, node.end_mark, style=None)
    if isinstance(node, SequenceNode):
        items = [_as_text(item) if isinstance(item, ScalarNode) else item for item in node.value]
        return SequenceNode(node.tag, items, node.start_mark, node.end_mark, flow_style=node.flow_style)
    return node


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _text_under_keys(node: Node | None, text_keys: Collection[str]) -> Node | None:
    """A top-level mapping with the values under ``text_keys`` (dashes or underscores) read as text."""
    if not isinstance(node, MappingNode) or not text_keys:
        return node
    pairs = []
    for key, value in node.value:
        is_text = isinstance(key, ScalarNode) and key.value.replace("-", "_") in text_keys
        pairs.append((key, _as_text(value) if is_text and not _is_null(value) else value))
    return MappingNode(node.tag, pairs, node.start_mark, node.end_mark, flow_style=node.flow_style)


def load_config(text: str, text_keys: Collection[str] = ()) -> Any:
    """A config text's value; the values under ``text_keys`` as written (see the module's docstring).
    Raises ``yaml.YAMLError`` for text that is not YAML, :class:`ConfigTextError` past the bounds."""
    loader = ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if expanded_values(node) > MAX_VALUES:
            raise ConfigTextError(f"its aliases expand to more than {MAX_VALUES:,} values")
        node = _text_under_keys(node, frozenset(text_keys))
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def load_value(text: str, text_keys: Collection[str] = (), path: str | None = None) -> Any:
    """What the parser's loader returns: a config file's value (``path`` given: the parser passes it
    for files) as :func:`load_config` reads it, or a flag's value, which reads as YAML too except
    that only ``null`` is null (an empty value, a comment or ``~`` is the text it is)."""
    value = load_config(text, text_keys)
    if path is None and value is None and text.strip() != "null":
        return text
    return value
