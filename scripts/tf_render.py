"""A provider-free rendering of Terraform modules, for checks Terraform runs offline.

Terraform type-checks expressions (conditionals whose results disagree, wrong function
arguments, undeclared references) and evaluates variable validations, preconditions, locals and
outputs without any provider; only resource and data-source schemas need the registry. The
rendering keeps everything but those schemas:

- variable, locals, output and module blocks as written (``depends_on``/``providers`` dropped);
- each resource and data source as a builtin ``terraform_data`` resource with the same
  ``count``/``for_each``, whose ``input`` holds every argument and nested block (a ``dynamic``
  block becomes a ``for`` expression) and which keeps the preconditions;
- every reference to a resource or data source reads a local of the same shape (a list with
  ``count``, a map with ``for_each``) whose values are unknown until apply, as a real
  resource's attributes are; data sources may be given known values instead;
- provider blocks and ``required_providers`` dropped.

Each rendered line remembers the source line it came from, so Terraform's errors point there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
from lark import Token, Tree

DROPPED_META = {"provider", "depends_on", "providers"}
RESOURCE_META = {"count", "for_each", "lifecycle", "connection", "provisioner"}
KEPT_LIFECYCLE = {"precondition"}


Node = Tree[Token]


class Unsupported(ValueError):
    """A construct this renderer does not translate (it never skips one silently)."""


# -- reading the source tree --


def _name(node: Node | Token) -> str:
    """The text of an identifier, keyword or string-label node."""
    tokens = [node] if isinstance(node, Token) else node.scan_values(lambda v: isinstance(v, Token))
    return "".join(str(t) for t in tokens).strip('"')


def _value(attribute: Node) -> Node:
    """The expression of an attribute node."""
    value = attribute.children[-1]
    if not isinstance(value, Tree):
        raise Unsupported(f"line {attribute.meta.line}: attribute value {value!r}")
    return value


def _tokens(node: Node | Token) -> list[Token]:
    if isinstance(node, Token):
        return [node]
    found = [t for child in node.children for t in _tokens(child)]
    return sorted(found, key=lambda t: t.start_pos or 0)


@dataclass
class Block:
    """One block of a .tf file: type, labels, body items, and where it is."""

    node: Node
    file: Path
    text: str

    @property
    def kind(self) -> str:
        return _name(self.node.children[0])

    @property
    def labels(self) -> list[str]:
        return [_name(c) for c in self.node.children[1:] if isinstance(c, Tree) and c.data != "body"]

    @property
    def line(self) -> int:
        return int(self.node.meta.line)

    def items(self) -> Iterator[tuple[str, Node]]:
        """(name, node) of each attribute and nested block, in order."""
        [body] = [c for c in self.node.children if isinstance(c, Tree) and c.data == "body"]
        for child in body.children:
            if isinstance(child, Tree) and child.data in ("attribute", "block"):
                yield _name(child.children[0]), child

    def child(self, node: Node) -> Block:
        return Block(node, self.file, self.text)


def read_module(directory: Path) -> list[Block]:
    blocks = []
    for tf in sorted(directory.glob("*.tf")):
        text = tf.read_text()
        tree = hcl2.parses_to_tree(text)
        for node in tree.children[0].children:
            if isinstance(node, Tree) and node.data == "block":
                blocks.append(Block(node, tf, text))
    return blocks


# -- writing the rendered module, remembering where each line came from --


@dataclass
class Output:
    """Rendered text, and for each of its lines the source line it came from."""

    lines: list[str] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)

    def add(self, text: str, block: Block, line: int | None = None) -> None:
        """Append text; its lines map to ``line`` onwards (or all to the block's first line)."""
        where = os.path.relpath(block.file) if block.file.is_relative_to(Path.cwd()) else block.file
        for offset, part in enumerate(text.split("\n")):
            self.lines.append(part)
            self.origins.append(f"{where}:{(line + offset) if line is not None else block.line}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def hcl_literal(value: Any) -> str:
    """A Python value as an HCL expression (JSON syntax, template sequences escaped)."""
    return json.dumps(value).replace("${", "$${").replace("%{", "%%{")


@dataclass
class Module:
    """A provider-free rendering of one Terraform directory."""

    source: Path
    data_values: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.blocks = read_module(self.source)
        self.refs: dict[tuple[str, ...], str] = {}
        for block in self.blocks:
            if block.kind in ("resource", "data"):
                prefix = "r" if block.kind == "resource" else "d"
                key = (block.kind, *block.labels) if block.kind == "data" else tuple(block.labels)
                self.refs[key] = f"{prefix}__{block.labels[0]}__{block.labels[1]}"

    # expressions

    def expr(self, block: Block, node: Node, iterators: Sequence[str] = ()) -> str:
        """The source text of ``node`` with resource, data and iterator references rewritten."""
        start, end = node.meta.start_pos, node.meta.end_pos
        text, out, pos = block.text, [], start
        tokens = _tokens(node)
        i = 0
        while i < len(tokens):
            match = self._reference(tokens, i, iterators)
            if match is None:
                i += 1
                continue
            length, replacement = match
            out.append(text[pos : tokens[i].start_pos])
            out.append(replacement)
            pos = tokens[i + length - 1].end_pos or pos
            i += length
        out.append(text[pos:end])
        return "".join(out)

    def _reference(self, tokens: list[Token], i: int, iterators: Sequence[str]) -> tuple[int, str] | None:
        if tokens[i].type != "NAME" or (i and tokens[i - 1].type == "DOT"):
            return None
        names = []
        for j in range(i, min(i + 5, len(tokens)), 2):
            if tokens[j].type != "NAME" or (j > i and tokens[j - 1].type != "DOT"):
                break
            names.append(str(tokens[j]))
        for length in (3, 2):
            if len(names) >= length and tuple(names[:length]) in self.refs:
                return 2 * length - 1, f"local.{self.refs[tuple(names[:length])]}"
        if len(names) >= 2 and names[0] in iterators and names[1] in ("key", "value"):
            return 3, f"{names[0]}__{names[1]}"
        return None

    # blocks

    def render(self) -> Output:
        out = Output()
        for block in self.blocks:
            handler = getattr(self, f"_render_{block.kind}", None)
            if handler is None:
                raise Unsupported(f"{block.file}:{block.line}: top-level block {block.kind!r}")
            handler(block, out)
        locals_lines = [f"  {name} = {value}" for name, value in self._reference_locals()]
        if locals_lines:
            out.lines.extend(["", "locals {", *locals_lines, "}"])
            out.origins.extend(["(generated)"] * (len(locals_lines) + 3))
        return out

    def _render_verbatim(self, block: Block, out: Output) -> None:
        header = block.text[block.node.meta.start_pos : block.text.index("{", block.node.meta.start_pos) + 1]
        out.add(header, block)
        for name, node in block.items():
            if name not in DROPPED_META:
                out.add("  " + self.expr(block, node), block, node.meta.line)
        out.add("}\n", block, block.node.meta.end_line)

    _render_variable = _render_locals = _render_output = _render_module = _render_verbatim

    def _render_provider(self, block: Block, out: Output) -> None:
        """Provider configuration needs the provider: left out."""

    def _render_terraform(self, block: Block, out: Output) -> None:
        for name, node in block.items():
            if name == "required_version":
                out.add(f"terraform {{\n  {self.expr(block, node)}\n}}\n", block, node.meta.line - 1)

    def _render_resource(self, block: Block, out: Output) -> None:
        if block.kind == "data" and ".".join(block.labels) in self.data_values:
            return
        out.add(f'resource "terraform_data" "{self._ref_name(block)}" {{', block)
        items = list(block.items())
        for attr, node in items:
            if attr in ("count", "for_each"):
                out.add(f"  {self.expr(block, node)}", block, node.meta.line)
            elif attr in ("connection", "provisioner"):
                raise Unsupported(f"{block.file}:{node.meta.line}: {attr} blocks")
        out.add("  input = {", block)
        arguments = [(n, v) for n, v in items if n not in RESOURCE_META | DROPPED_META]
        for text, line in self._object_parts(block, arguments, ()):
            out.add(f"    {text}", block, line)
        out.add("  }", block)
        for attr, node in items:
            if attr == "lifecycle":
                self._lifecycle(block.child(node), out)
        out.add("}\n", block)

    _render_data = _render_resource

    def _lifecycle(self, lifecycle: Block, out: Output) -> None:
        if any(n == "postcondition" for n, _ in lifecycle.items()):
            raise Unsupported(f"{lifecycle.file}:{lifecycle.line}: postconditions (self differs here)")
        kept = [node for n, node in lifecycle.items() if n in KEPT_LIFECYCLE]
        if kept:
            out.add("  lifecycle {", lifecycle)
            for node in kept:
                out.add("    " + self.expr(lifecycle, node), lifecycle, node.meta.line)
            out.add("  }", lifecycle)

    def _object_parts(
        self, block: Block, items: list[tuple[str, Node]], iterators: Sequence[str]
    ) -> list[tuple[str, int]]:
        """``name = (expr)`` per argument and ``type = concat(...)`` per nested block type, each
        with its source line."""
        parts: list[tuple[str, int]] = []
        groups: dict[str, tuple[str, int]] = {}
        for name, node in items:
            if node.data == "attribute":
                parts.append((f"{name} = ({self.expr(block, _value(node), iterators)})", node.meta.line))
                continue
            nested = block.child(node)
            kind = nested.labels[0] if name == "dynamic" else name
            text, line = groups.get(kind, ("", node.meta.line))
            groups[kind] = (f"{text}, {self._nested(nested, iterators)}".lstrip(", "), line)
        parts.extend((f"{kind} = concat({text})", line) for kind, (text, line) in groups.items())
        return parts

    def _object(self, block: Block, iterators: Sequence[str]) -> str:
        return (
            "{ "
            + ", ".join(text for text, _ in self._object_parts(block, list(block.items()), iterators))
            + " }"
        )

    def _nested(self, block: Block, iterators: Sequence[str]) -> str:
        """A nested block as a one-element tuple, a dynamic block as a for expression."""
        if block.kind != "dynamic":
            return f"[{self._object(block, iterators)}]"
        items = dict(block.items())
        if "labels" in items:
            raise Unsupported(f"{block.file}:{block.line}: dynamic block labels")
        name = self.expr(block, _value(items["iterator"])).strip() if "iterator" in items else block.labels[0]
        source = self.expr(block, _value(items["for_each"]), iterators)
        body = self._object(block.child(items["content"]), (*iterators, name))
        return f"[for {name}__key, {name}__value in ({source}) : {body}]"

    def _ref_name(self, block: Block) -> str:
        key = tuple(block.labels) if block.kind == "resource" else ("data", *block.labels)
        return self.refs[key]

    def _reference_locals(self) -> Iterator[tuple[str, str]]:
        for block in self.blocks:
            if block.kind not in ("resource", "data"):
                continue
            name = self._ref_name(block)
            if block.kind == "data" and ".".join(block.labels) in self.data_values:
                yield name, hcl_literal(self.data_values[".".join(block.labels)])
                continue
            # A resource's attributes are unknown until apply: jsondecode of the id (unknown
            # until apply too) is an unknown value of any type, whatever attribute is read.
            meta = {n for n, _ in block.items()}
            if "count" in meta:
                yield name, f"[for r in terraform_data.{name} : jsondecode(r.id)]"
            elif "for_each" in meta:
                yield name, f"{{ for k, r in terraform_data.{name} : k => jsondecode(r.id) }}"
            else:
                yield name, f"jsondecode(terraform_data.{name}.id)"


def render_tree(
    source: Path, dest: Path, data_values: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[Path, Output]:
    """Render every directory of ``source`` holding .tf files into the same place under ``dest``.

    ``data_values`` maps a directory (relative to ``source``) to known values of its data
    sources, keyed ``"type.name"``.
    """
    rendered = {}
    for directory in sorted({tf.parent for tf in source.rglob("*.tf")}):
        if ".terraform" in directory.parts:
            continue
        relative = directory.relative_to(source)
        module = Module(directory, (data_values or {}).get(str(relative), {}))
        output = module.render()
        target = dest / relative
        target.mkdir(parents=True, exist_ok=True)
        (target / "main.tf").write_text(output.text())
        rendered[relative] = output
    return rendered


def cases_root(dest: Path, name: str, module: str, cases: Mapping[str, Mapping[str, Any]]) -> Path:
    """A root under ``dest`` that calls the rendered ``module`` once per case, with its inputs,
    and outputs each call's outputs as ``<case>``."""
    root = dest / "_cases" / name
    root.mkdir(parents=True, exist_ok=True)
    source = os.path.relpath(dest / module, root)
    parts = []
    for case, inputs in cases.items():
        args = "".join(f"  {k} = {hcl_literal(v)}\n" for k, v in inputs.items())
        parts.append(f'module "{case}" {{\n  source = "{source}"\n{args}}}\n')
        parts.append(f'output "{case}" {{\n  value = module.{case}\n}}\n')
    (root / "main.tf").write_text("\n".join(parts))
    return root
