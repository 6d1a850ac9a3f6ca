"""A documented subset of PromQL, evaluated on the scrapes an experiment took of ``/metrics``.

Why a subset here: a steady-state probe (Chaos Toolkit's sense) may be written as PromQL over the
service's own metrics ("the breaker is closed", "requests keep being counted"), and most machines
that run mmchaos have no Prometheus server. Where ``promtool`` is installed the same scrapes go
through Prometheus's own engine instead (:mod:`mmchaos.chaos.promql_probe`); this module is the
fallback and the reference for what the fallback understands:

- numbers; instant vector selectors ``name{label="v", l!="v", l=~"re", l!~"re"}`` (also
  ``{__name__="..."}``); range selectors ``sel[30s]`` (units ms, s, m, h, d);
- ``rate``, ``increase``, ``delta``, ``changes``, ``min_over_time``, ``max_over_time``,
  ``avg_over_time``, ``last_over_time`` on a range selector; ``absent`` and ``abs`` on a vector;
- ``sum``, ``min``, ``max``, ``avg``, ``count`` with ``by (...)`` or ``without (...)`` before or
  after the argument;
- ``+ - * / %``, comparisons ``== != > < >= <=`` (filters; ``bool`` gives 0/1), ``and``, ``or``,
  ``unless``, with Prometheus's precedence; vector-vector operands match one-to-one on all labels
  but ``__name__`` (no ``on``/``ignoring``/``group_left``).

Differences from Prometheus, all deliberate: ``rate``/``increase`` take the samples inside the
window (counter resets handled) without extrapolating to the window's edges, so over few scrapes
they read a little lower; an instant selector reads the last scrape at or before the evaluation
time (one target, so a series missing from that scrape is gone, as with staleness markers).
Anything else is refused with :class:`PromQLError`, never guessed at.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Union

__all__ = ["Labels", "PromQLError", "Scrape", "evaluate", "holds", "parse", "parse_scrape"]

Labels = frozenset[tuple[str, str]]
"""A series' labels, ``__name__`` included."""


@dataclass(frozen=True)
class Scrape:
    """One scrape of ``/metrics``: its time (seconds, any origin) and every sample by labels."""

    t: float
    samples: dict[Labels, float]


class PromQLError(ValueError):
    """An expression outside the subset, or malformed."""


def parse_scrape(t: float, text: str) -> Scrape:
    """A scrape from Prometheus text exposition (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[Labels, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[frozenset({("__name__", s.name), *s.labels.items()})] = float(s.value)
    return Scrape(t, samples)


# -- syntax tree ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class Selector:
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)
    range_s: float | None = None


@dataclass(frozen=True)
class Call:
    func: str
    arg: Node


@dataclass(frozen=True)
class Aggregate:
    op: str
    arg: Node
    by: tuple[str, ...] | None = None
    without: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node
    bool_: bool = False


@dataclass(frozen=True)
class Negate:
    arg: Node


Node = Union[Number, Selector, Call, Aggregate, Binary, Negate]  # noqa: UP007 (a runtime alias)

RANGE_FUNCS = frozenset(
    {"rate", "increase", "delta", "changes", "min_over_time", "max_over_time", "avg_over_time", "last_over_time"}
)
VECTOR_FUNCS = frozenset({"absent", "abs"})
AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "count"})
COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
# Prometheus's binary precedence, lowest first.
_LEVELS: tuple[frozenset[str], ...] = (
    frozenset({"or"}),
    frozenset({"and", "unless"}),
    COMPARISONS,
    frozenset({"+", "-"}),
    frozenset({"*", "/", "%"}),
)

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![a-zA-Z_]))
    | (?P<dur>\[\s*\d+(?:ms|s|m|h|d)\s*\])
    | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%<>=(){},])
    )""",
    re.VERBOSE,
)
_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r"}
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise PromQLError(f"cannot read {expr[pos : pos + 20]!r} (at {pos}) in {expr!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.toks = _tokens(expr)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise PromQLError(f"expected {value or 'more'} at token {self.i} of {self.expr!r}, got {tok and tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.binary(0)
        if self.peek() is not None:
            raise PromQLError(f"unexpected {self.peek()[1]!r} in {self.expr!r}")  # type: ignore[index]
        return node

    def binary(self, level: int) -> Node:
        if level == len(_LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while (tok := self.peek()) is not None and tok[1] in _LEVELS[level] and tok[0] in ("op", "ident"):
            self.take()
            bool_ = False
            nxt = self.peek()
            if nxt is not None and nxt[1] == "bool":
                if tok[1] not in COMPARISONS:
                    raise PromQLError(f"bool only goes with a comparison, in {self.expr!r}")
                self.take()
                bool_ = True
            nxt = self.peek()
            if nxt is not None and nxt[1] in ("on", "ignoring", "group_left", "group_right"):
                raise PromQLError(f"{nxt[1]}(...) is outside the subset mmchaos evaluates without promtool")
            right = self.binary(level + 1)
            left = Binary(tok[1], left, right, bool_)
        return left

    def unary(self) -> Node:
        tok = self.peek()
        if tok is not None and tok[1] in ("-", "+"):
            self.take()
            arg = self.unary()
            return Negate(arg) if tok[1] == "-" else arg
        return self.primary()

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names: list[str] = []
        while (tok := self.peek()) is not None and tok[1] != ")":
            names.append(self.take()[1])
            if self.peek() is not None and self.peek()[1] == ",":  # type: ignore[index]
                self.take(",")
        self.take(")")
        return tuple(names)

    def primary(self) -> Node:
        kind, value = self.take()
        if kind == "num":
            return Number(float(value))
        if value == "(":
            node = self.binary(0)
            self.take(")")
            return node
        if kind == "ident" and value in AGGREGATIONS:
            by = without = None
            if self.peek() is not None and self.peek()[1] in ("by", "without"):  # type: ignore[index]
                clause = self.take()[1]
                by, without = (self.labels(), None) if clause == "by" else (None, self.labels())
            self.take("(")
            arg = self.binary(0)
            self.take(")")
            if self.peek() is not None and self.peek()[1] in ("by", "without"):  # type: ignore[index]
                clause = self.take()[1]
                by, without = (self.labels(), None) if clause == "by" else (None, self.labels())
            return Aggregate(value, arg, by, without)
        if kind == "ident" and self.peek() is not None and self.peek()[1] == "(":  # type: ignore[index]
            if value not in RANGE_FUNCS | VECTOR_FUNCS:
                raise PromQLError(f"function {value}() is outside the subset mmchaos evaluates without promtool")
            self.take("(")
            arg = self.binary(0)
            self.take(")")
            is_range = isinstance(arg, Selector) and arg.range_s is not None
            if (value in RANGE_FUNCS) != is_range:
                want = "a range selector (name[30s])" if value in RANGE_FUNCS else "an instant vector"
                raise PromQLError(f"{value}() takes {want}, in {self.expr!r}")
            return Call(value, arg)
        if kind == "ident" or value == "{":
            return self.selector(value if kind == "ident" else None)
        raise PromQLError(f"unexpected {value!r} in {self.expr!r}")

    def unquote(self, raw: str) -> str:
        """A string literal's value: Go's escapes that matter in label values; any other is refused
        (Prometheus refuses ``"\\d"`` too: a regex's backslash is written ``"\\\\d"``)."""

        def one(m: re.Match[str]) -> str:
            c = m.group(1)
            if c not in _ESCAPES:
                raise PromQLError(f"unknown escape \\{c} in {raw} (write \\\\{c} for a backslash)")
            return _ESCAPES[c]

        return re.sub(r"\\(.)", one, raw[1:-1])

    def selector(self, name: str | None) -> Selector:
        matchers: list[tuple[str, str, str]] = [("__name__", "=", name)] if name else []
        if name is None or (self.peek() is not None and self.peek()[1] == "{"):  # type: ignore[index]
            if name is not None:
                self.take("{")
            while (tok := self.peek()) is not None and tok[1] != "}":
                label = self.take()[1]
                op = self.take()[1]
                if op not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"bad label matcher {label}{op} in {self.expr!r}")
                kind, raw = self.take()
                if kind != "str":
                    raise PromQLError(f"label values are quoted strings, in {self.expr!r}")
                matchers.append((label, op, self.unquote(raw)))
                if self.peek() is not None and self.peek()[1] == ",":  # type: ignore[index]
                    self.take(",")
            self.take("}")
        if not any(op in ("=", "=~") and v != "" for _, op, v in matchers):
            raise PromQLError(f"a selector needs a name or a non-empty matcher, in {self.expr!r}")
        range_s = None
        tok = self.peek()
        if tok is not None and tok[0] == "dur":
            self.take()
            m = re.fullmatch(r"\[\s*(\d+)(ms|s|m|h|d)\s*\]", tok[1])
            assert m is not None
            range_s = int(m.group(1)) * _UNITS[m.group(2)]
        return Selector(tuple(matchers), range_s)


def parse(expr: str) -> Node:
    """The syntax tree of ``expr``, or :class:`PromQLError` for anything outside the subset."""
    if not expr.strip():
        raise PromQLError("an empty expression")
    return _Parser(expr).parse()


# -- evaluation -------------------------------------------------------------------------------------

Vector = dict[Labels, float]
Value = Union[float, Vector]  # noqa: UP007


@dataclass
class _Env:
    scrapes: Sequence[Scrape]
    t: float
    regex: dict[str, re.Pattern[str]] = field(default_factory=dict)

    def matches(self, labels: Labels, matchers: tuple[tuple[str, str, str], ...]) -> bool:
        got = dict(labels)
        for label, op, value in matchers:
            have = got.get(label, "")
            if (op == "=" and have != value) or (op == "!=" and have == value):
                return False
            if op in ("=~", "!~"):
                pattern = self.regex.setdefault(value, re.compile(value))
                if (pattern.fullmatch(have) is not None) != (op == "=~"):
                    return False
        return True


def _drop_name(labels: Labels) -> Labels:
    return frozenset(kv for kv in labels if kv[0] != "__name__")


def _select(env: _Env, sel: Selector) -> Vector:
    latest = [s for s in env.scrapes if s.t <= env.t]
    if not latest:
        return {}
    return {k: v for k, v in latest[-1].samples.items() if env.matches(k, sel.matchers)}


def _range(env: _Env, sel: Selector) -> dict[Labels, list[tuple[float, float]]]:
    assert sel.range_s is not None
    out: dict[Labels, list[tuple[float, float]]] = {}
    for s in env.scrapes:
        if env.t - sel.range_s < s.t <= env.t:
            for k, v in s.samples.items():
                if env.matches(k, sel.matchers):
                    out.setdefault(k, []).append((s.t, v))
    return out


def _counter_increase(points: list[tuple[float, float]]) -> float:
    total = 0.0
    for (_, a), (_, b) in pairwise(points):
        total += b - a if b >= a else b  # a reset: the counter restarted from 0
    return total


def _range_func(func: str, points: list[tuple[float, float]]) -> float | None:
    values = [v for _, v in points]
    if func in ("rate", "increase", "delta"):
        if len(points) < 2:
            return None
        if func == "delta":
            return values[-1] - values[0]
        inc = _counter_increase(points)
        return inc / (points[-1][0] - points[0][0]) if func == "rate" else inc
    if func == "changes":
        return float(sum(1 for a, b in pairwise(values) if a != b))
    reducers: dict[str, Callable[[list[float]], float]] = {
        "min_over_time": min,
        "max_over_time": max,
        "avg_over_time": lambda xs: sum(xs) / len(xs),
        "last_over_time": lambda xs: xs[-1],
    }
    return reducers[func](values)


def _aggregate(node: Aggregate, vec: Vector) -> Vector:
    groups: dict[Labels, list[float]] = {}
    for labels, v in vec.items():
        if node.without is None:  # sum(x) is sum by () (x)
            key = frozenset(kv for kv in labels if kv[0] in (node.by or ()))
        else:
            drop = {*node.without, "__name__"}
            key = frozenset(kv for kv in labels if kv[0] not in drop)
        groups.setdefault(key, []).append(v)
    ops: dict[str, Callable[[list[float]], float]] = {
        "sum": sum,
        "min": min,
        "max": max,
        "avg": lambda xs: sum(xs) / len(xs),
        "count": lambda xs: float(len(xs)),
    }
    return {k: ops[node.op](vs) for k, vs in groups.items()}


def _arith(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b if b != 0 else (math.nan if a == 0 else math.copysign(math.inf, a))
    return math.fmod(a, b) if b != 0 else math.nan


def _compare(op: str, a: float, b: float) -> bool:
    return {"==": a == b, "!=": a != b, ">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b}[op]


def _binary(node: Binary, left: Value, right: Value) -> Value:
    op = node.op
    if op in ("and", "or", "unless"):
        if not isinstance(left, dict) or not isinstance(right, dict):
            raise PromQLError(f"{op} takes two vectors")
        keys = {_drop_name(k) for k in right}
        if op == "and":
            return {k: v for k, v in left.items() if _drop_name(k) in keys}
        if op == "unless":
            return {k: v for k, v in left.items() if _drop_name(k) not in keys}
        lkeys = {_drop_name(k) for k in left}
        return {**left, **{k: v for k, v in right.items() if _drop_name(k) not in lkeys}}
    if not isinstance(left, dict) and not isinstance(right, dict):
        if op in COMPARISONS:
            if not node.bool_:
                raise PromQLError("a comparison of two scalars needs bool")
            return float(_compare(op, left, right))
        return _arith(op, left, right)

    def one(labels: Labels, a: float, b: float, keep: float) -> tuple[Labels, float] | None:
        if op in COMPARISONS:
            ok = _compare(op, a, b)
            if node.bool_:
                return _drop_name(labels), float(ok)
            return (labels, keep) if ok else None
        return _drop_name(labels), _arith(op, a, b)

    out: Vector = {}
    if isinstance(left, dict) and isinstance(right, dict):
        by_key = {_drop_name(k): v for k, v in right.items()}
        for k, a in left.items():
            b = by_key.get(_drop_name(k))
            if b is not None and (r := one(k, a, b, a)) is not None:
                out[r[0]] = r[1]
    elif isinstance(left, dict):
        assert not isinstance(right, dict)
        for k, a in left.items():
            if (r := one(k, a, right, a)) is not None:
                out[r[0]] = r[1]
    else:
        assert isinstance(right, dict) and not isinstance(left, dict)
        for k, b in right.items():
            if (r := one(k, left, b, b)) is not None:
                out[r[0]] = r[1]
    return out


def _eval(env: _Env, node: Node) -> Value:
    if isinstance(node, Number):
        return node.value
    if isinstance(node, Selector):
        if node.range_s is not None:
            raise PromQLError("a range selector (name[30s]) goes inside a function such as rate()")
        return _select(env, node)
    if isinstance(node, Negate):
        v = _eval(env, node.arg)
        return -v if not isinstance(v, dict) else {_drop_name(k): -x for k, x in v.items()}
    if isinstance(node, Call):
        if node.func in RANGE_FUNCS:
            assert isinstance(node.arg, Selector)
            out: Vector = {}
            for k, points in _range(env, node.arg).items():
                r = _range_func(node.func, points)
                if r is not None:
                    out[_drop_name(k)] = r
            return out
        v = _eval(env, node.arg)
        if not isinstance(v, dict):
            raise PromQLError(f"{node.func}() takes an instant vector")
        if node.func == "abs":
            return {_drop_name(k): abs(x) for k, x in v.items()}
        return {} if v else {frozenset(): 1.0}  # absent
    if isinstance(node, Aggregate):
        v = _eval(env, node.arg)
        if not isinstance(v, dict):
            raise PromQLError(f"{node.op}() takes an instant vector")
        return _aggregate(node, v)
    return _binary(node, _eval(env, node.left), _eval(env, node.right))


def evaluate(expr: str | Node, scrapes: Sequence[Scrape], t: float | None = None) -> Value:
    """``expr`` at time ``t`` (default: the last scrape's) over ``scrapes`` (in time order)."""
    node = parse(expr) if isinstance(expr, str) else expr
    when = t if t is not None else (scrapes[-1].t if scrapes else 0.0)
    return _eval(_Env(scrapes, when), node)


def holds(value: Value) -> bool:
    """Whether a probe's result holds: a non-empty vector (as an alert rule fires), or a non-zero scalar."""
    return bool(value) if isinstance(value, dict) else value != 0 and not math.isnan(value)
