"""Jinja rendering under a budget, for the chat templates that come with model folders: the
accounting (``Budget``); the sandbox that charges it is ``specdec.generation.template_sandbox``.

The environment is Jinja's ``ImmutableSandboxedEnvironment`` (as transformers renders chat
templates) with every render bounded, so that a template can neither hang its thread nor take all
memory, whatever messages it is given:

- **Steps.** Each loop iteration (counted before the loop runs when its sequence has a length),
  call, filter, test, operator and output is a step: at most ``Budget.steps`` per render.
- **Work.** Each value an operation makes or scans (a result, the text of a value written out or
  formatted, the sequence a filter, method, test or comparison goes over) is charged its size in
  characters or entries: at most ``Budget.work`` per render. This bounds loops whose steps each
  handle large values.
- **Size.** No value, and not the rendered text, may be longer than ``Budget.size``. Operations
  whose result can be far larger than their operands (``*``, ``**``, ``%`` and ``format`` widths,
  ``join``, ``replace``, ``indent``, ``wordwrap``, ``tojson``'s indent, ``expandtabs``,
  ``translate``, a width or count given to a filter or string method) are checked before they
  run, the others once their result exists.

The limits grow with the size of the template's variables (``Budget.for_input``) and are far
beyond what real templates reach. A render that would exceed one raises ``TemplateOverrun``.
"""

from __future__ import annotations

import contextvars
import re
import string
from typing import Any

from jinja2.utils import Namespace

from specdec.errors import InvalidInputError

BASE_STEPS = 250_000
STEPS_PER_ENTRY = 16  # per entry of the variables' lists and dicts
BASE_SIZE = 1 << 20  # characters
SIZE_PER_CHAR = 4  # per character of the variables' text
WORK_PER_SIZE = 8

# the budget of the render running in this context (its thread)
BUDGET: contextvars.ContextVar[Budget] = contextvars.ContextVar("specdec_template_budget")
_DIGITS = re.compile(r"\d+")


class TemplateOverrun(InvalidInputError):
    """A render went beyond its budget; the message says which bound, as a phrase."""


def _digits(number: int) -> int:
    return number.bit_length() * 3 // 10 + 2


def shallow_size(value: Any) -> int:
    """Characters of a string, entries of a sequence or mapping, digits of an integer; else 1."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _digits(abs(value))
    if isinstance(value, (str, list, tuple, dict, set, frozenset, range)):
        return len(value)
    return 1


def text_size(value: Any, limit: int) -> tuple[int, int, int]:
    """(about ``len(str(value))`` — quotes and separators counted, escapes not —, the entries
    visited, the nesting depth); stops counting once the size passes ``limit``. A value held
    twice counts twice, as its text holds it twice."""
    size = entries = depth = 0

    def visit(item: Any, ancestors: set, level: int) -> None:
        nonlocal size, entries, depth
        depth = max(depth, level)
        if isinstance(item, str):
            size += len(item) + 2
            return
        if isinstance(item, int) and not isinstance(item, bool):
            size += _digits(abs(item))
            return
        if isinstance(item, Namespace):
            item = item._Namespace__attrs
        if not isinstance(item, (list, tuple, dict, set, frozenset)):
            size += 8  # None, a float, a macro, undefined: a short text
            return
        if id(item) in ancestors:  # a namespace holding itself: written as "..."
            size += 5
            return
        ancestors.add(id(item))
        for entry in item.items() if isinstance(item, dict) else item:
            entries += 1
            size += 2
            visit(entry, ancestors, level + 1)
            if size > limit:
                break
        ancestors.discard(id(item))

    visit(value, set(), 0)
    return size, entries, depth


class Budget:
    """What one render may still spend (module docstring)."""

    def __init__(self, *, steps: int, size: int, work: int):
        self.steps, self.size, self.work = steps, size, work
        self.limits = (steps, size, work)

    @classmethod
    def for_input(cls, variables: Any) -> Budget:
        """The budget of a render of ``variables``, far beyond what real templates need."""
        chars, entries, _ = text_size(variables, 1 << 62)
        size = BASE_SIZE + SIZE_PER_CHAR * chars
        return cls(
            steps=BASE_STEPS + STEPS_PER_ENTRY * entries, size=size, work=WORK_PER_SIZE * size
        )

    def step(self, count: int = 1) -> None:
        self.steps -= count
        if self.steps < 0:
            raise TemplateOverrun(
                f"ran past its budget of {self.limits[0]} steps (loop iterations, calls, "
                "operators and outputs)"
            )

    def spend(self, amount: int) -> None:
        self.work -= amount
        if self.work < 0:
            raise TemplateOverrun(
                f"ran past its budget of {self.limits[2]} characters and entries handled"
            )

    def check(self, size: int) -> None:
        if size > self.size:
            raise TemplateOverrun(
                f"would make a value over its budget of {self.size} characters or entries"
            )

    def made(self, value: Any) -> Any:
        """``value``, charged as made (its size checked)."""
        size = shallow_size(value)
        self.check(size)
        self.spend(size)
        return value

    def shown(self, value: Any) -> Any:
        """``value``, charged as turned into text (the size of its text checked first)."""
        if isinstance(value, str):
            size, entries = len(value), 0
        else:
            size, entries, _ = text_size(value, self.size)
        self.check(size)
        self.spend(size + entries)
        return value

    def arguments(
        self, values, kwargs: dict, *, text: bool, free: bool = False, sizes: bool = False
    ) -> None:
        """Charge the arguments of a filter or method their sizes (unless ``free``), as text when
        ``text``; with ``sizes`` (widths, counts) no integer may be beyond the size."""
        for value in (*values, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool):
                if sizes and abs(value) > self.size:
                    raise TemplateOverrun(
                        f"gave an operation the number {value:.3g}, over its budget of "
                        f"{self.size} characters or entries"
                    )
            elif text:
                self.shown(value)
            elif not free:
                self.spend(shallow_size(value))

    def iterate(self, iterable: Any) -> Any:
        """``iterable``, its items counted as steps: at once when it has a length."""
        try:
            length = len(iterable)
        except TypeError:
            return self._counted(iter(iterable))
        self.step(length)
        return iterable

    def _counted(self, iterator):
        for item in iterator:
            self.step()
            yield item


def current() -> Budget:
    try:
        return BUDGET.get()
    except LookupError:
        raise RuntimeError("a budgeted template rendered without its budget") from None


# -- sizes of the operations that can make far more than they are given --


def _number(digits: str) -> int:
    return int(digits) if len(digits) < 12 else 10**12


def _text(value: Any, budget: Budget) -> int:
    return len(value) if isinstance(value, str) else text_size(value, budget.size)[0]


def percent_size(budget: Budget, template: str, values: Any) -> int:
    """``template % values``: the template, its widths and precisions, the values' text."""
    items = values if isinstance(values, tuple) else (values,)
    if isinstance(values, dict):
        items = tuple(values.values())
    widths = sum(_number(d) for d in _DIGITS.findall(template))
    stars = 0
    if "*" in template:  # widths given as values
        stars = sum(abs(v) for v in items if isinstance(v, int) and not isinstance(v, bool))
    return len(template) + widths + stars + sum(_text(v, budget) for v in items)


def _format_size(budget: Budget, template: str, args: tuple, kwargs: dict) -> int:
    """``template.format(*args, **kwargs)``: widths in its fields (given or nested) and the text."""
    values = (*args, *kwargs.values())
    size = len(template) + sum(_text(v, budget) for v in values)
    for _, _, spec, _ in string.Formatter().parse(template):
        if spec:
            size += sum(_number(d) for d in _DIGITS.findall(spec))
            if "{" in spec:  # a width given as an argument
                size += sum(abs(v) for v in values if isinstance(v, int))
    return size


def _replace_size(text: Any, old: Any, new: Any, count: Any = -1) -> int:
    text, old, new = str(text), str(old), str(new)
    times = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    return len(text) + times * max(0, len(new) - len(old))


def _join_size(budget: Budget, separator: Any, items: list) -> int:
    return len(str(separator)) * len(items) + sum(_text(item, budget) for item in items)


def _indent_size(text: Any, width: Any = 4, *args: Any, **kwargs: Any) -> int:
    text = str(text)
    width = len(width) if isinstance(width, str) else max(int(width), 0)
    return len(text) + (text.count("\n") + 1) * width


def _wordwrap_size(text: Any, width: Any = 79, breaks: Any = True, wrap: Any = None, *_, **kw):
    wrap = kw.get("wrapstring", wrap)
    return len(str(text)) * (1 + (len(str(wrap)) if wrap else 1))


def _tojson_size(budget: Budget, value: Any, indent: Any = None) -> int:
    size, entries, depth = text_size(value, budget.size)
    return size + (entries + 1) * depth * (indent if isinstance(indent, int) else 0)


def filter_size(budget: Budget, name: str, values: list, kwargs: dict) -> int:
    """The size a filter's result may reach, for those that can make more than they are given."""
    if name == "replace":
        return _replace_size(*values, **kwargs)
    if name == "indent":
        return _indent_size(*values, **kwargs)
    if name == "wordwrap":
        return _wordwrap_size(*values, **kwargs)
    if name == "format":
        return percent_size(budget, str(values[0]), tuple(values[1:]) or kwargs)
    if name == "tojson":
        return _tojson_size(budget, *values, **kwargs)
    if name == "join":
        return _join_size(budget, values[1] if len(values) > 1 else kwargs.get("d", ""), values[0])
    return 0


def method_size(budget: Budget, receiver: str, name: str, args: tuple, kwargs: dict) -> int:
    """The size a string method's result may reach, for those that can make more than given."""
    if name in ("format", "format_map"):
        if name == "format_map":
            kwargs = args[0] if args and isinstance(args[0], dict) else {}
        return _format_size(budget, receiver, args, kwargs)
    if name == "replace":
        return _replace_size(receiver, *args, **kwargs)
    if name == "join":
        return _join_size(budget, receiver, args[0])
    if name == "expandtabs":
        width = (args or tuple(kwargs.values()) or (8,))[0]
        return len(receiver) + receiver.count("\t") * max(int(width), 0)
    if name == "translate":
        return len(receiver) * (1 + text_size(args[0] if args else kwargs, budget.size)[0])
    return 0
