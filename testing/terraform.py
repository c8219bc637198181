"""Read infra/terraform with python-hcl2 and evaluate the simple expressions the tests care about.

Terraform itself cannot run here (no provider registry), so the tests evaluate variable
validations, preconditions, locals and jsonencode() calls with a small evaluator for the subset
of HCL the modules use. References to resources and data sources stay symbolic (``Unknown``):
they are only known after apply.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
from hcl2.utils import SerializationOptions

OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False)


@dataclass
class Module:
    """The top-level blocks of one Terraform directory, merged over its .tf files."""

    path: Path
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    data: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    terraform: list[dict[str, Any]] = field(default_factory=list)

    def resource(self, kind: str, name: str) -> dict[str, Any]:
        return self.resources[(kind, name)]

    def defaults(self) -> dict[str, Any]:
        return {name: body["default"] for name, body in self.variables.items() if "default" in body}

    def evaluator(self, **overrides: Any) -> Evaluator:
        values = {**self.defaults(), **overrides}
        return Evaluator(values, self.locals)


def load_module(path: Path) -> Module:
    module = Module(path)
    for tf in sorted(path.glob("*.tf")):
        with tf.open() as f:
            doc = hcl2.load(f, serialization_options=OPTIONS)
        for block in doc.get("variable", []):
            module.variables.update(block)
        for block in doc.get("locals", []):
            module.locals.update({k: v for k, v in block.items() if not k.startswith("__")})
        for kind, target in (("resource", module.resources), ("data", module.data)):
            for block in doc.get(kind, []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        target[(rtype, name)] = body
        for block in doc.get("output", []):
            module.outputs.update(block)
        for block in doc.get("module", []):
            module.modules.update(block)
        module.terraform.extend(doc.get("terraform", []))
    return module


def blocks(body: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    """Nested blocks of one type, static and ``dynamic`` (the latter's ``content``)."""
    found = list(body.get(name, []))
    for dyn in body.get("dynamic", []):
        if name in dyn:
            found.extend(dyn[name]["content"])
    return found


def tf_jsonencode(value: Any) -> str:
    """Terraform's jsonencode: sorted keys, no spaces, and Go's HTML-safe escapes."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escape)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


class Unknown(str):
    """A value only known after apply, kept as the text of its reference."""


class Unsupported(ValueError):
    """An expression outside the subset this evaluator understands."""


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<number>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<op>==|!=|<=|>=|&&|\|\||=>|[-+*/%<>!?:=,.()\[\]{}])
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
    )""",
    re.VERBOSE,
)


def _string_end(text: str, pos: int) -> int:
    """Index just past the string literal opening at ``pos``; interpolations may hold quotes."""
    i, depth = pos + 1, 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if depth == 0 and char == '"':
            return i + 1
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if depth and char == '"':
            i = _string_end(text, i)
            continue
        if depth and char == "{":
            depth += 1
        elif depth and char == "}":
            depth -= 1
        i += 1
    raise Unsupported(f"unterminated string in {text!r}")


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        while text[pos].isspace():
            pos += 1
        if text[pos] == '"':
            end = _string_end(text, pos)
            tokens.append(("string", text[pos + 1 : end - 1]))
            pos = end
            continue
        m = _TOKEN.match(text, pos)
        if not m:
            raise Unsupported(f"cannot tokenize {text[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


def _unescape(literal: str) -> str:
    return json.loads('"' + literal.replace("\n", "\\n") + '"') if "\\" in literal else literal


def _regex(pattern: str, text: str) -> Any:
    m = re.search(pattern, text)
    if not m:
        raise Unsupported(f"regex {pattern!r} does not match {text!r}")
    if m.groupdict():
        return m.groupdict()
    return list(m.groups()) if m.groups() else m.group(0)


def _flatten(items: list[Any]) -> list[Any]:
    return [leaf for item in items for leaf in (_flatten(item) if isinstance(item, list) else [item])]


class Evaluator:
    """Evaluates HCL expressions with variable values and the module's locals."""

    FUNCTIONS: dict[str, Callable[..., Any]] = {
        "jsonencode": tf_jsonencode,
        "merge": lambda *maps: {k: v for m in maps for k, v in m.items()},
        "contains": lambda seq, value: value in seq,
        "length": len,
        "keys": lambda m: sorted(m),
        "setintersection": lambda *sets: sorted(set.intersection(*(set(s) for s in sets))),
        "floor": math.floor,
        "abs": abs,
        "join": lambda sep, items: sep.join(items),
        "lower": str.lower,
        "replace": lambda s, old, new: (
            re.sub(old[1:-1], new, s) if old.startswith("/") and old.endswith("/") else s.replace(old, new)
        ),
        "substr": lambda s, start, length: s[start : start + length],
        "coalesce": lambda *values: next(v for v in values if v is not None),
        "regex": _regex,
        "alltrue": lambda items: all(items),
        "concat": lambda *lists: [item for lst in lists for item in lst],
        "flatten": lambda items: _flatten(items),
        "distinct": lambda items: list(dict.fromkeys(items)),
        "sha256": lambda text: hashlib.sha256(text.encode()).hexdigest(),
    }

    def __init__(self, variables: Mapping[str, Any], locals_: Mapping[str, Any]) -> None:
        self.variables = dict(variables)
        self.local_exprs = dict(locals_)
        self.local_values: dict[str, Any] = {}
        self.scope: dict[str, Any] = {}

    def value(self, serialized: Any) -> Any:
        """A value as python-hcl2 serializes it: '${expr}', a template string, a list, a dict."""
        if isinstance(serialized, str):
            return self._template(serialized)
        if isinstance(serialized, list):
            return [self.value(v) for v in serialized]
        if isinstance(serialized, dict):
            return {k: self.value(v) for k, v in serialized.items()}
        return serialized

    def expr(self, text: str) -> Any:
        self._tokens = _tokenize(text)
        self._pos = 0
        result = self._ternary()
        if self._pos != len(self._tokens):
            raise Unsupported(f"trailing tokens in {text!r}: {self._tokens[self._pos :]}")
        return result

    def local(self, name: str) -> Any:
        if name not in self.local_values:
            sub = Evaluator(self.variables, self.local_exprs)
            sub.local_values, sub.scope = self.local_values, self.scope
            self.local_values[name] = sub.value(self.local_exprs[name])
        return self.local_values[name]

    def _template(self, text: str) -> Any:
        parts, pos = [], 0
        while (start := text.find("${", pos)) >= 0:
            depth, end = 0, start + 2
            for end in range(start + 2, len(text)):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth < 0:
                    break
            inner = Evaluator(self.variables, self.local_exprs)
            inner.local_values, inner.scope = self.local_values, self.scope
            value = inner.expr(text[start + 2 : end])
            if start == 0 and end == len(text) - 1:
                return value
            parts.extend([_unescape(text[pos:start]), "" if value is None else str(value)])
            pos = end + 1
        parts.append(_unescape(text[pos:]))
        joined = "".join(parts)
        return Unknown(joined) if any(isinstance(p, Unknown) for p in parts) else joined

    def _peek(self) -> str:
        """The next operator or name; string literals never read as operators."""
        if self._pos >= len(self._tokens):
            return ""
        kind, text = self._tokens[self._pos]
        return '"' if kind == "string" else text

    def _take(self, expected: str | None = None) -> tuple[str, str]:
        token = self._tokens[self._pos]
        if expected is not None and token[1] != expected:
            raise Unsupported(f"expected {expected!r}, got {token[1]!r}")
        self._pos += 1
        return token

    def _ternary(self) -> Any:
        """``cond ? yes : no``, evaluating only the branch taken, as Terraform does: the other may
        fail (``var.x == null ? null : var.x.attr``)."""
        cond = self._binary(0)
        if self._peek() != "?":
            return cond
        self._take("?")
        yes = self._branch()
        self._take(":")
        no = self._branch()
        return self._sub(yes if cond else no)

    def _branch(self) -> list[tuple[str, str]]:
        """The tokens of one branch of a conditional, not consumed by evaluation: up to the ':',
        ',' or closing bracket that ends it, nested conditionals included."""
        start, depth, pending = self._pos, 0, 0
        while self._pos < len(self._tokens):
            kind, text = self._tokens[self._pos]
            if kind == "op" and depth == 0:
                if text in (")", "]", "}", ",", "=>"):
                    break
                if text == "?":
                    pending += 1
                elif text == ":":
                    if pending == 0:
                        break
                    pending -= 1
            if kind == "name" and depth == 0 and text == "if":
                break
            if kind == "op":
                depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(text, 0)
            self._pos += 1
        if self._pos == start:
            raise Unsupported("empty branch of a conditional")
        return self._tokens[start : self._pos]

    _LEVELS = (("||",), ("&&",), ("==", "!="), ("<", ">", "<=", ">="), ("+", "-"), ("*", "/", "%"))

    def _binary(self, level: int) -> Any:
        if level == len(self._LEVELS):
            return self._unary()
        left = self._binary(level + 1)
        while self._peek() in self._LEVELS[level]:
            op = self._take()[1]
            right = self._binary(level + 1)
            left = {
                "||": lambda a, b: a or b,
                "&&": lambda a, b: a and b,
                "==": lambda a, b: a == b,
                "!=": lambda a, b: a != b,
                "<": lambda a, b: a < b,
                ">": lambda a, b: a > b,
                "<=": lambda a, b: a <= b,
                ">=": lambda a, b: a >= b,
                "+": lambda a, b: a + b,
                "-": lambda a, b: a - b,
                "*": lambda a, b: a * b,
                "/": lambda a, b: a / b,
                "%": lambda a, b: a % b,
            }[op](left, right)
        return left

    def _unary(self) -> Any:
        if self._peek() == "!":
            self._take()
            return not self._unary()
        if self._peek() == "-":
            self._take()
            return -self._unary()
        return self._postfix(self._primary())

    def _postfix(self, value: Any) -> Any:
        while self._peek() in (".", "["):
            if self._take()[1] == ".":
                attr = self._take()[1]
                value = Unknown(f"{value}.{attr}") if isinstance(value, Unknown) else value[attr]
            elif self._peek() == "*":
                self._take("*")
                self._take("]")
                value = self._splat(value)
            else:
                index = self._ternary()
                self._take("]")
                value = Unknown(f"{value}[{index}]") if isinstance(value, Unknown) else value[index]
        return value

    def _splat(self, value: Any) -> Any:
        """``value[*]`` and the attribute traversals after it: null is [], one value [value]."""
        if isinstance(value, Unknown):
            return Unknown(f"{value}[*]")
        items = [] if value is None else value if isinstance(value, list) else [value]
        while self._peek() == ".":
            self._take(".")
            attr = self._take()[1]
            items = [item[attr] for item in items]
        return items

    def _primary(self) -> Any:
        kind, text = self._take()
        if kind == "number":
            return int(text) if text.isdigit() else float(text)
        if kind == "string":
            return self._template(text)
        if text == "(":
            value = self._ternary()
            self._take(")")
            return value
        if text == "[":
            return self._sequence("]")
        if text == "{":
            return self._object()
        if kind != "name":
            raise Unsupported(f"unexpected {text!r}")
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        if self._peek() == "(":
            return self._call(text)
        if text == "var":
            self._take(".")
            return self.variables[self._take()[1]]
        if text == "local":
            self._take(".")
            return self.local(self._take()[1])
        if text in self.scope:
            return self.scope[text]
        return Unknown(text)

    def _sub(self, tokens: list[tuple[str, str]], **scope: Any) -> Any:
        sub = Evaluator(self.variables, self.local_exprs)
        sub.local_values, sub.scope = self.local_values, {**self.scope, **scope}
        sub._tokens, sub._pos = tokens, 0
        value = sub._ternary()
        if sub._pos != len(tokens):
            raise Unsupported(f"trailing tokens {tokens[sub._pos :]}")
        return value

    def _skip(self, stops: tuple[str, ...]) -> list[tuple[str, str]]:
        """The tokens up to the first of ``stops`` at bracket depth 0 (not consumed)."""
        start, depth = self._pos, 0
        while not (depth == 0 and self._peek() in stops):
            kind, text = self._take()
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(text, 0) if kind == "op" else 0
        return self._tokens[start : self._pos]

    def _sequence(self, close: str) -> list[Any]:
        if close == "]" and self._peek() == "for":
            self._take("for")
            name = self._take()[1]
            self._take("in")
            source = self._sub(self._skip((":",)))
            self._take(":")
            body = self._skip(("]", "if"))
            condition = self._skip(("]",))[1:] if self._peek() == "if" else None
            self._take("]")
            return [
                self._sub(body, **{name: item})
                for item in source
                if condition is None or self._sub(condition, **{name: item})
            ]
        items = []
        while self._peek() != close:
            items.append(self._ternary())
            if self._peek() == ",":
                self._take(",")
        self._take(close)
        return items

    def _object(self) -> Any:
        if self._peek() == "for":
            return self._object_for()
        result = {}
        while self._peek() != "}":
            key = self._take()
            name = self._template(key[1]) if key[0] == "string" else key[1]
            self._take("=")
            result[name] = self._ternary()
            if self._peek() == ",":
                self._take(",")
        self._take("}")
        return result

    def _object_for(self) -> dict[Any, Any]:
        """``{ for [k,] v in source : key => value [if cond] }``."""
        self._take("for")
        names = [self._take()[1]]
        if self._peek() == ",":
            self._take(",")
            names.append(self._take()[1])
        self._take("in")
        source = self._sub(self._skip((":",)))
        self._take(":")
        key = self._skip(("=>",))
        self._take("=>")
        value = self._skip(("}", "if"))
        condition = self._skip(("}",))[1:] if self._peek() == "if" else None
        self._take("}")
        result = {}
        for k, v in source.items() if isinstance(source, dict) else enumerate(source):
            scope = {names[0]: v} if len(names) == 1 else {names[0]: k, names[1]: v}
            if condition is None or self._sub(condition, **scope):
                result[self._sub(key, **scope)] = self._sub(value, **scope)
        return result

    def _call(self, name: str) -> Any:
        self._take("(")
        if name in ("can", "try"):
            first = self._skip((")", ","))
            rest = self._sequence(")") if self._take()[1] == "," else []
            try:
                value = self._sub(first)
            except (Unsupported, KeyError, IndexError, TypeError):
                return False if name == "can" else (rest[0] if rest else None)
            return True if name == "can" else value
        args = self._sequence(")")
        if name not in self.FUNCTIONS:
            raise Unsupported(f"function {name}()")
        try:
            return self.FUNCTIONS[name](*args)
        except (TypeError, ValueError, StopIteration) as exc:
            raise Unsupported(f"{name}{tuple(args)}: {exc}") from None


# Values the providers and cloud APIs accept, and values they reject, per module variable: the
# modules' validations must agree. alicloud_fcv3_function in aliyun/terraform-provider-alicloud
# v1.252.0 (gpu_config.gpu_type, memory_size 64-32768, cpu 0.05-16), FC's HTTP trigger authType
# (function or anonymous; the module refuses anonymous), RAM role and policy names (letters,
# digits and '-'; the module name also names FC resources and must start with a letter), and
# Lambda permission statement ids (at most 100 characters, so IAM names of at most 64).
LONG_ROLE = "arn:aws:iam::123456789012:role/" + "platform/" * 30 + "g" * 64
PROVIDER_VALUES: dict[str, dict[str, tuple[list[Any], list[Any]]]] = {
    "aliyun_function": {
        "gpu_type": (
            ["fc.gpu.tesla.1", "fc.gpu.ampere.1", "fc.gpu.ada.1", "g1", None],
            ["fc.gpu.hopper.1", "tesla.1", "fc.gpu.tesla.2", "G1", ""],
        ),
        "memory_size": ([64, 128, 4096, 32768], [0, 32, 100, 32832, 65536]),
        "cpu": ([0.05, 0.35, 1, 8, 16], [0, 0.04, 0.33, 16.05, 32]),
        "http_auth_type": (["function"], ["anonymous", "jwt", "Function"]),
        "name": (
            ["spillway-add-sub", "a", "Fn2", "x" * 48],
            ["spillway_add_sub", "_fn", "1fn", "-fn", "fn.v2", "x" * 49],
        ),
    },
    "aws_function": {
        # aws_lambda_function_url.invoke_mode (hashicorp/aws): BUFFERED or RESPONSE_STREAM.
        "invoke_mode": (["BUFFERED", "RESPONSE_STREAM"], ["buffered", "STREAM", ""]),
        "invoker_principal_arns": (
            [
                ["123456789012"],
                ["arn:aws:iam::123456789012:role/gateway"],
                ["arn:aws-cn:iam::123456789012:user/ops.gateway@team"],
                [LONG_ROLE],
            ],
            [
                ["*"],
                ["arn:aws:iam::123456789012:role/*"],
                ["arn:aws:iam::123456789012:role/a/*/gateway"],
                ["arn:aws:iam::123456789012:role/" + "g" * 65],
            ],
        ),
    },
}


def validations(module: Module, variable: str) -> list[dict[str, Any]]:
    return list(module.variables[variable].get("validation", []))


def accepts(module: Module, variable: str, value: Any) -> bool:
    """Whether every validation of the variable passes for this value."""
    evaluator = module.evaluator(**{variable: value})
    for rule in validations(module, variable):
        try:
            ok = evaluator.value(rule["condition"])
        except Unsupported:
            ok = False
        if not ok:
            return False
    return True


def preconditions(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [p for lc in body.get("lifecycle", []) for p in lc.get("precondition", [])]


def references(expression: str) -> set[str]:
    """Resource/data/var/local references an expression mentions (``type.name`` prefixes)."""
    found = re.findall(r"\b((?:data\.)?[a-z][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_-]*)", expression)
    return {f for f in found if not f.startswith(("count.", "each."))}


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        current += " " + stripped.rstrip("\\").strip() if current else stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            lines.append(current)
            current = ""
    result = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        result.append((instruction.upper(), args.strip()))
    return result


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value
