"""The Jinja sandbox chat templates render in: Jinja's ``ImmutableSandboxedEnvironment`` whose
loops, outputs, ``~``, slices, comparisons, calls, operators, filters and tests are charged to the
render's ``specdec.generation.template_budget.Budget`` (that module says what is bounded)."""

from __future__ import annotations

import functools
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.filters import make_attrgetter
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg, pass_context, pass_environment
from jinja2.visitor import NodeTransformer

from specdec.generation.template_budget import (
    BUDGET,
    Budget,
    current,
    filter_size,
    method_size,
    percent_size,
    shallow_size,
)

# filters that do not turn their arguments into text, and those that cost nothing for their length
NOT_TEXT = frozenset(
    {"abs", "attr", "batch", "count", "d", "default", "dictsort", "first", "float", "groupby"}
    | {"int", "items", "last", "length", "list", "map", "max", "min", "random", "reject"}
    | {"rejectattr", "reverse", "round", "select", "selectattr", "slice", "sort", "sum", "unique"}
)
FREE = frozenset({"count", "d", "default", "first", "last", "length"})
SCANNING_TESTS = frozenset({"in", "lower", "upper"})
# names no template can write
_ITERATE, _SHOW, _MADE, _SCANNED = (
    " iterate",
    " show",
    " made",
    " scanned",
)


@pass_environment
def _sum(environment, iterable, attribute=None, start=0):
    """Jinja's ``sum``, with each partial sum of lists or tuples charged as it is made."""
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    if not isinstance(start, (list, tuple)):
        return sum(iterable, start)
    budget, total = current(), start
    for item in iterable:
        budget.check(shallow_size(total) + shallow_size(item))
        total = budget.made(total + item)
    return total


def _raise_exception(message: str):
    """What transformers gives chat templates to refuse messages."""
    raise TemplateError(message)


def _budgeted_filter(name: str, function):
    injected = _PassArg.from_obj(function) is not None
    text, free = name not in NOT_TEXT, name in FREE

    @functools.wraps(function)
    def budgeted(*args, **kwargs):
        budget = current()
        budget.step()
        head, values = (args[:1], list(args[1:])) if injected else ((), list(args))
        if name == "join" and values and not hasattr(values[0], "__len__"):
            values[0] = budget.made(list(values[0]))
        # the filtered value, then the filter's own arguments (widths, counts), but for format's
        budget.arguments(values[:1], {}, text=text, free=free)
        budget.arguments(values[1:], kwargs, text=text, free=free, sizes=name != "format")
        if values:
            budget.check(filter_size(budget, name, values, kwargs))
        return budget.made(function(*head, *values, **kwargs))

    return budgeted


def _budgeted_test(name: str, function):
    @functools.wraps(function)
    def budgeted(*args, **kwargs):
        budget = current()
        budget.step()
        if name in SCANNING_TESTS:
            for value in args:
                budget.spend(shallow_size(value))
        return function(*args, **kwargs)

    return budgeted


@pass_context
def _iterate(context, iterable):
    return current().iterate(iterable)


@pass_context
def _show(context, value):
    budget = current()
    budget.step()
    return budget.shown(value)


@pass_context
def _made(context, value):
    return current().made(value)


@pass_context
def _scanned(context, value):
    current().spend(shallow_size(value))
    return value


def _wrap(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Instrument(NodeTransformer):
    """Routes loops, outputs, ``~``, slices and comparisons through the budget's filters."""

    def visit_For(self, node):
        self.generic_visit(node)
        node.iter = _wrap(node.iter, _ITERATE)
        return node

    def visit_Output(self, node):
        self.generic_visit(node)
        node.nodes = [
            child if isinstance(child, nodes.TemplateData) else _wrap(child, _SHOW)
            for child in node.nodes
        ]
        return node

    def visit_Concat(self, node):
        self.generic_visit(node)
        node.nodes = [_wrap(child, _SHOW) for child in node.nodes]
        return _wrap(node, _MADE)

    def visit_Getitem(self, node):  # a slice is cut in place, not through the sandbox
        self.generic_visit(node)
        return _wrap(node, _MADE) if isinstance(node.arg, nodes.Slice) else node

    def visit_Compare(self, node):
        self.generic_visit(node)
        node.expr = _wrap(node.expr, _SCANNED)
        for operand in node.ops:
            operand.expr = _wrap(operand.expr, _SCANNED)
        return node


class BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox chat templates render in (module docstring); render with ``render``."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.globals.pop("lipsum", None)  # paragraphs by the thousand, for no chat template
        self.globals["raise_exception"] = _raise_exception
        self.filters.pop("urlize", None)
        self.filters["sum"] = _sum
        self.filters = {name: _budgeted_filter(name, f) for name, f in self.filters.items()}
        self.filters.update({_ITERATE: _iterate, _SHOW: _show, _MADE: _made, _SCANNED: _scanned})
        self.tests = {name: _budgeted_test(name, t) for name, t in self.tests.items()}

    def _parse(self, source, name, filename):
        tree = _Instrument().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree

    def render(self, template, budget: Budget, **variables: Any) -> str:
        """``template.render(**variables)`` within ``budget``."""
        token = BUDGET.set(budget)
        try:
            chunks, size = [], 0
            for chunk in template.generate(**variables):
                size += len(chunk)
                budget.check(size)
                chunks.append(chunk)
            return "".join(chunks)
        finally:
            BUDGET.reset(token)

    def call(self, context, obj, /, *args, **kwargs):
        budget = current()
        budget.step()
        if isinstance(obj, LoopContext) and args:  # a recursive loop's next level
            args = (budget.iterate(args[0]), *args[1:])
        receiver = getattr(getattr(obj, "__wrapped__", obj), "__self__", None)
        name = getattr(obj, "__name__", "")
        if (
            isinstance(receiver, str)
            and name == "join"
            and args
            and not hasattr(args[0], "__len__")
        ):
            args = (budget.made(list(args[0])), *args[1:])
        if isinstance(receiver, (str, list, tuple, dict)):  # a method, which may scan them all
            formats = isinstance(receiver, str) and name in ("format", "format_map")
            sizes = isinstance(receiver, str) and not formats
            budget.arguments(args, kwargs, text=formats, sizes=sizes)
            budget.spend(len(receiver))
            if isinstance(receiver, str):
                budget.check(method_size(budget, receiver, name, args, kwargs))
        return budget.made(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        budget = current()
        budget.step()
        if operator == "%" and isinstance(left, str):
            budget.check(percent_size(budget, left, right))
        elif operator == "+":
            budget.check(shallow_size(left) + shallow_size(right))
        elif operator in ("*", "**"):
            number, other = (right, left) if isinstance(right, int) else (left, right)
            if isinstance(number, int) and not isinstance(number, bool):
                if isinstance(other, (str, list, tuple)):
                    budget.check(shallow_size(other) * max(number, 0))
                elif isinstance(other, int) and operator == "*":
                    budget.check(shallow_size(left) + shallow_size(right))
                elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                    budget.check(abs(left).bit_length() * max(right, 0) * 3 // 10 + 2)
        return budget.made(super().call_binop(context, operator, left, right))
