"""Named statements: the ``-- name:`` source format, parsed once, and binding a statement's keyword parameters.

A source holds blocks like::

    -- name: finish_dispatch
    -- pending|claimed -> done|failed; last_error replaced only when set_last_error is 1
    UPDATE job_dispatch_queue SET status = :status, ...
    WHERE id = :dispatch_id AND status IN ('pending', 'claimed')

The comment lines right after the name are the statement's description; the rest, up to the next
``-- name:``, is portable SQL (``scheduler.core.store.base`` says what portable means) with
``:keyword`` parameters. A statement that writes several rows at once marks the part repeated per row
with ``[[ ... ]]`` (joined by a space) or ``[[, ... ]]`` (joined by a comma): inside it a parameter is
the row's (``rows=[{...}, ...]``), outside it the statement's.

A part written ``{{flag: ... }}`` is a section: it is in the text a call runs only when that
call's ``flag`` parameter is true (``set_stdout=1``). A statement that writes a group of columns
only when asked lists them in a section rather than as ``CASE WHEN :flag = 1 THEN ... ELSE
column END``: the SQL a store runs then holds only the columns it changes (the CASE form binds
and evaluates every column on every call, which doubled the cost of finishing a run). The
section's own parameters are still the statement's: a call passes them, set or not, so a call's
keywords never depend on its flags.

The text is rendered to ``?`` placeholders once (per row count for a repeated statement, per
combination of flags for one with sections; cached), so no SQL is ever built from a caller's
keys: a statement's parameters are exactly the names its text uses, and a call with a missing or
an unknown keyword is refused before anything reaches the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import attrs

#: ``-- name: NAME`` opens a statement.
_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z][a-z0-9_]*)\s*$")
#: Inside a statement: quoted text (left as written), a comment (dropped), a parameter, a repeated part's start or
#: end, a section's start or end. Every token starts with one of ``'"-:[]{}``, so the scan skips ahead to those.
_TOKEN = re.compile(
    r"""(?=['"\-:\[\]{}])("""
    r"""'(?:[^']|'')*'"""
    r'|"(?:[^"]|"")*"'
    r"""|--[^\n]*"""
    r"""|(?<![:\w]):[A-Za-z_][A-Za-z0-9_]*"""
    r"""|\[\[,?"""
    r"""|\]\]"""
    r"""|\{\{[a-z_][a-z0-9_]*:"""
    r"""|\}\})"""
)
_SPACE = re.compile(r"\s+")
#: Rendered texts kept for one statement (row counts: the callers chunk; flag combinations: a handful in practice).
_RENDERED_MAX = 512


class StatementError(ValueError):
    """A statement source that cannot be parsed, or a call whose parameters do not match its statement."""


@attrs.frozen
class Repeat:
    """A part of a statement written once per row: its pieces, and what joins the copies."""

    parts: tuple[str | Param, ...]
    separator: str


@attrs.frozen
class Section:
    """A part of a statement in the text only when the call's ``flag`` parameter is true."""

    flag: str
    parts: tuple[str | Param, ...]


@attrs.frozen
class Param:
    """A ``:name`` parameter."""

    name: str


@attrs.frozen
class Rendered:
    """A statement as a store runs it: ``?`` placeholders, and where each placeholder's value comes from.

    ``slots`` names, per placeholder in order, ``(-1, name)`` for a statement parameter and
    ``(i, name)`` for row ``i``'s.
    """

    sql: str
    slots: tuple[tuple[int, str], ...]
    #: The values of a statement without repeated parts, from a call's parameters, in placeholder order.
    values: Callable[[Mapping[str, Any]], list[Any]] = attrs.field(eq=False, repr=False)


class Statement:
    """One named statement: its name, what it does, its source text and the parameters that text uses.

    The text is parsed on first use (``params``, ``render``, ``bind``): a process parses only
    the statements it runs, or all of them once when its store checks them at start-up.
    """

    __slots__ = ("_by_flags", "_by_rows", "_flags", "_outer_names", "_outer_pick", "_params", "_parts", "_pick_flags", "_plans", "_row_all",
                 "_row_names", "_row_params", "_single", "doc", "name", "text")

    def __init__(self, name: str, doc: str, text: str) -> None:
        self.name = name
        self.doc = doc
        self.text = text
        self._parts: tuple[Part, ...] | None = None
        self._params: frozenset[str] = frozenset()
        self._row_params: frozenset[str] = frozenset()
        #: The rendered text of a statement without repeated parts (None for a repeated one: see ``render``).
        self._single: Rendered | None = None
        self._by_rows: dict[int, Rendered] = {}
        #: The flags of the sections, in text order, and the rendered text per combination of them.
        self._flags: tuple[str, ...] = ()
        self._pick_flags: Callable[[Mapping[str, Any]], list[Any]] = _picker(())
        self._by_flags: dict[tuple[bool, ...], Rendered] = {}
        #: A repeated statement's row parameters in the order the text first uses them, read from a row in one call, and
        #: its own parameters' values (a list) in that order; per row count, the text and where each placeholder's value
        #: is in ``[the statement's values..., row 0's..., row 1's...]`` (one C-level pick per call, none when in order).
        self._row_names: tuple[str, ...] = ()
        self._outer_names: tuple[str, ...] = ()
        self._row_all: Callable[[Mapping[str, Any]], tuple[Any, ...]] = _row_picker(())
        self._outer_pick: Callable[[Mapping[str, Any]], list[Any]] = _picker(())
        self._plans: dict[int, tuple[str, Callable[[Sequence[Any]], list[Any]]]] = {}

    def __repr__(self) -> str:
        return f"Statement({self.name!r})"

    def _parse(self) -> tuple[Part, ...]:
        parts = self._parts
        if parts is None:
            parts, self._params, self._row_params = _parse_body(self.name, self.text)
            self._flags = tuple(dict.fromkeys(p.flag for p in parts if isinstance(p, Section)))
            self._pick_flags = _picker(self._flags)
            if not self._flags and not any(isinstance(p, Repeat) for p in parts):
                self._single = _render(parts, 1)
            if any(isinstance(p, Repeat) for p in parts):
                slots = _render(parts, 1).slots
                self._row_names = tuple(dict.fromkeys(name for i, name in slots if i >= 0))
                self._row_all = _row_picker(self._row_names)
                self._outer_names = tuple(dict.fromkeys(name for i, name in slots if i < 0))
                self._outer_pick = _picker(self._outer_names)
            self._parts = parts
        return parts

    @property
    def params(self) -> frozenset[str]:
        """The statement's own parameters (outside any repeated part)."""
        self._parse()
        return self._params

    @property
    def row_params(self) -> frozenset[str]:
        """The parameters of each row (inside the repeated parts); empty for a one-row statement."""
        self._parse()
        return self._row_params

    @property
    def repeated(self) -> bool:
        """Whether the statement writes ``rows`` (a repeated part) rather than one set of values."""
        return any(isinstance(p, Repeat) for p in self._parse())

    @property
    def flags(self) -> tuple[str, ...]:
        """The flags of the statement's sections, in text order (empty for a statement without sections)."""
        self._parse()
        return self._flags

    def render(self, rows: int = 1, flags: Mapping[str, object] | None = None) -> Rendered:
        """The text with ``?`` placeholders for ``rows`` rows (ignored without a repeated part), cached per count.

        For a statement with sections, the text with those whose flag is true in ``flags``
        (``None``: every section, as a store's start-up check compiles it), cached per combination.
        """
        parts = self._parse()
        if self._single is not None:
            return self._single
        if self._flags:
            key = tuple(True for _ in self._flags) if flags is None else tuple(bool(flags[f]) for f in self._flags)
            return self._switched(key)
        if rows < 1:
            raise StatementError(f"statement {self.name!r} needs at least one row")
        done = self._by_rows.get(rows)
        if done is None:
            done = _render(parts, rows)
            if len(self._by_rows) >= _RENDERED_MAX:
                self._by_rows.clear()
            self._by_rows[rows] = done
        return done

    def _switched(self, key: tuple[bool, ...]) -> Rendered:
        done = self._by_flags.get(key)
        if done is None:
            parts = self._parts or ()
            on = frozenset(flag for flag, value in zip(self._flags, key, strict=True) if value)
            done = _render(parts, 1, on)
            if len(self._by_flags) >= _RENDERED_MAX:
                self._by_flags.clear()
            self._by_flags[key] = done
        return done

    def bind(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """``(sql, values)`` for a call with ``params`` (``rows`` among them for a repeated statement).

        Refuses (``StatementError``) a missing or unknown parameter, and a row with either.
        """
        single = self._single
        if single is None and self._parts is None:
            self._parse()
            single = self._single
        if single is not None:
            if len(params) != len(self._params):
                raise self._mismatch(params, self._params)
            try:
                return single.sql, single.values(params)
            except KeyError:
                raise self._mismatch(params, self._params) from None
        if self._flags:
            if len(params) != len(self._params):
                raise self._mismatch(params, self._params)
            try:
                rendered = self._switched(tuple(map(bool, self._pick_flags(params))))
                return rendered.sql, rendered.values(params)
            except KeyError:
                raise self._mismatch(params, self._params) from None
        rows: Sequence[Mapping[str, Any]] | None = params.get("rows")
        if rows is None or isinstance(rows, Mapping):
            raise StatementError(f"statement {self.name!r} writes rows: pass rows=[{{...}}, ...]")
        if len(params) != len(self._params) + 1:
            raise self._mismatch({k: v for k, v in params.items() if k != "rows"}, self._params)
        wanted = self._row_params
        # As many keys as the row's parameters, each of them found (below): exactly those, no unknown key either.
        if not rows:
            raise StatementError(f"statement {self.name!r} needs at least one row")
        if set(map(len, rows)) != {len(wanted)}:
            bad = next(row for row in rows if len(row) != len(wanted))
            raise self._mismatch(bad, wanted, what="a row of ")
        sql, pick = self._plans.get(len(rows)) or self._plan(len(rows))
        try:  # the statement's values, then every row's (each row read once): placed by the plan in one pick
            flat = self._outer_pick(params)
            flat.extend(chain.from_iterable(map(self._row_all, rows)))
        except KeyError:
            outer = {k: v for k, v in params.items() if k != "rows"}
            if not self._params.issubset(outer):
                raise self._mismatch(outer, self._params) from None
            bad = next(row for row in rows if not wanted.issubset(row))
            raise self._mismatch(bad, wanted, what="a row of ") from None
        return sql, pick(flat)

    def _plan(self, rows: int) -> tuple[str, Callable[[Sequence[Any]], list[Any]]]:
        """A repeated statement's text for ``rows`` rows and its placeholders' positions among a call's values (cached)."""
        rendered = self.render(rows)
        of_statement = {name: j for j, name in enumerate(self._outer_names)}
        width, base = len(self._row_names), len(of_statement)
        of_row = {name: base + k for k, name in enumerate(self._row_names)}
        indices = tuple(of_statement[name] if i < 0 else i * width + of_row[name] for i, name in rendered.slots)
        plan = (rendered.sql, _index_picker(indices))
        if len(self._plans) >= _RENDERED_MAX:
            self._plans.clear()
        self._plans[rows] = plan
        return plan

    def prepare(self, params: Mapping[str, Any]) -> Rendered:
        """The rendered text a call with ``params`` runs, checked as ``bind`` checks it, for a caller to keep per shape.

        Only for a statement without repeated parts. The ``Rendered``'s ``values`` reads only
        the names that text uses, so a hot caller that keeps it per shape of its calls (the same
        keywords and flags as ``params``) binds its later calls of that shape with just those
        names, checked once instead of per call (``transitions.finish_run``). ``StatementError``
        for a repeated statement, or a missing or unknown parameter.
        """
        self._parse()
        if any(isinstance(p, Repeat) for p in self._parts or ()):
            raise StatementError(f"statement {self.name!r} writes rows: it has no one-row shape to prepare")
        self.bind(params)  # refuses a missing or unknown parameter
        if self._single is not None:
            return self._single
        return self._switched(tuple(map(bool, self._pick_flags(params))))

    def _mismatch(self, given: Mapping[str, Any], wanted: frozenset[str], what: str = "") -> StatementError:
        missing = sorted(wanted - set(given))
        unknown = sorted(set(given) - wanted)
        return StatementError(f"{what}statement {self.name!r}: missing {missing}, unknown {unknown}")


#: A piece of a parsed statement: text, a parameter, a repeated part or a section.
Part = str | Param | Repeat | Section


def _render(parts: Sequence[Part], rows: int, on: frozenset[str] = frozenset()) -> Rendered:
    """The text of ``parts`` with ``rows`` copies of each repeated part and the sections whose flag is in ``on``."""
    sql: list[str] = []
    slots: list[tuple[int, str]] = []

    def add_text(piece: str) -> None:  # a section left out leaves two spaces where it was: keep one
        if sql and piece[:1] == " " and sql[-1][-1:] == " ":
            piece = piece[1:]
        if piece:
            sql.append(piece)

    for part in parts:
        if isinstance(part, str):
            add_text(part)
        elif isinstance(part, Param):
            sql.append("?")
            slots.append((-1, part.name))
        elif isinstance(part, Section):
            if part.flag in on:
                for piece in part.parts:
                    if isinstance(piece, Param):
                        sql.append("?")
                        slots.append((-1, piece.name))
                    else:
                        add_text(piece)
        else:
            copies = []
            for i in range(rows):
                text = []
                for piece in part.parts:
                    if isinstance(piece, Param):
                        text.append("?")
                        slots.append((i, piece.name))
                    else:
                        text.append(piece)
                copies.append("".join(text).strip())
            sql.append(part.separator.join(copies))
    return Rendered("".join(sql).strip(), tuple(slots), _picker(tuple(name for _i, name in slots)))


def _row_picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """One row's values for ``names``, in order, as a tuple (``KeyError`` for a missing one)."""
    if not names:
        return lambda row: ()
    if len(names) == 1:
        name = names[0]
        return lambda row: (row[name],)
    pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] = itemgetter(*names)
    return pick


def _index_picker(indices: tuple[int, ...]) -> Callable[[Sequence[Any]], list[Any]]:
    """The values at ``indices`` of a list, in order, as a list: one C-level pick per call (the list itself when in order)."""
    if indices == tuple(range(len(indices))):
        return _same
    return _picker(indices)


def _same(values: Sequence[Any]) -> list[Any]:
    """The call's values, already in placeholder order."""
    return list(values) if not isinstance(values, list) else values


def _picker(names: tuple[Any, ...]) -> Callable[[Any], list[Any]]:
    """A call's values for ``names`` (a mapping's keys, or a list's indices), in order (``KeyError`` or ``IndexError``
    for a missing one): one C-level lookup per call."""
    if not names:
        return lambda params: []
    if len(names) == 1:
        name = names[0]
        return lambda params: [params[name]]
    pick = itemgetter(*names)
    return lambda params: list(pick(params))


def _parse_body(name: str, body: str) -> tuple[tuple[Part, ...], frozenset[str], frozenset[str]]:
    """A statement's text as pieces (text, parameters, repeated parts, sections) with its own and its rows' parameter names."""
    outer: list[Part] = []
    inner: list[str | Param] | None = None
    target: list[Any] = outer
    comma = False
    flag: str | None = None  # the open section's
    repeats = sections = False
    own: set[str] = set()
    per_row: set[str] = set()
    names = own
    pieces = _TOKEN.split(body)  # text, token, text, token, ..., text
    for index, piece in enumerate(pieces):
        if not index % 2:  # text between tokens: any run of whitespace is one space
            piece = _SPACE.sub(" ", piece)
        elif piece[0] == ":":
            target.append(Param(piece[1:]))
            names.add(piece[1:])
            continue
        elif piece.startswith("--"):
            continue
        elif piece.startswith("[["):
            if inner is not None:
                raise StatementError(f"statement {name!r}: a repeated part or section inside another")
            inner, comma, repeats = [], piece == "[[,", True
            target, names = inner, per_row
            continue
        elif piece == "]]":
            if inner is None or flag is not None:
                raise StatementError(f"statement {name!r}: ']]' without '[['")
            outer.append(Repeat(tuple(inner), ", " if comma else " "))
            inner, target, names = None, outer, own
            continue
        elif piece.startswith("{{"):
            if inner is not None:
                raise StatementError(f"statement {name!r}: a section inside a repeated part or another section")
            inner, flag, sections = [], piece[2:-1], True
            own.add(flag)
            target = inner
            continue
        elif piece == "}}":
            if inner is None or flag is None:
                raise StatementError(f"statement {name!r}: '}}}}' without '{{{{'")
            outer.append(Section(flag, tuple(inner)))
            inner, flag, target = None, None, outer
            continue
        if piece:  # text, or quoted text kept as written
            if target and isinstance(target[-1], str):
                if piece[0] == " " and target[-1].endswith(" "):  # where a comment was dropped
                    piece = piece[1:]
                target[-1] += piece
            else:
                target.append(piece)
    if inner is not None:
        raise StatementError(f"statement {name!r}: '{{{{' without '}}}}'" if flag else f"statement {name!r}: '[[' without ']]'")
    if repeats and sections:
        raise StatementError(f"statement {name!r}: both repeated parts and sections (one statement does one or the other)")
    if own & per_row:
        raise StatementError(f"statement {name!r}: {sorted(own & per_row)} used both per row and for the statement")
    if "rows" in own:
        raise StatementError(f"statement {name!r}: 'rows' is reserved for the rows of a repeated statement")
    return tuple(outer), frozenset(own), frozenset(per_row)


def parse(source: str) -> dict[str, Statement]:
    """Every statement of a ``-- name:`` source, by name (see the module docstring); ``StatementError`` if malformed."""
    statements: dict[str, Statement] = {}
    current: str | None = None
    doc: list[str] = []
    body: list[str] = []

    def close() -> None:
        if current is None:
            return
        text = "\n".join(body).strip()
        if not text:
            raise StatementError(f"statement {current!r} has no SQL")
        if current in statements:
            raise StatementError(f"statement {current!r} is named twice")
        statements[current] = Statement(current, " ".join(doc), text)

    for line in source.splitlines():
        stripped = line.strip()
        named = _NAME_LINE.match(stripped)
        if named:
            close()
            current, doc, body = named.group(1), [], []
        elif current is None:
            if stripped and not stripped.startswith("--"):
                raise StatementError(f"SQL before the first '-- name:' line: {stripped[:60]!r}")
        elif stripped.startswith("--") and not body:
            doc.append(stripped[2:].strip())
        else:
            body.append(line)
    close()
    return statements
