"""What model-written code may use inside the sandbox, checked on its source before anything runs.

This is the interpreter layer's source check: it refuses an import outside ALLOWED_MODULES, `open`, `eval`, and every
way the source can name a `_private`, dunder or frame attribute (attributes, class patterns, format strings, dunder
strings), and gives a reward function a clear verdict. The lists here are the one copy: the sandbox process receives
them and enforces the same rules at run time (guards.py: guarded import and getattr, module views, an audit hook).
The kernel layers (kernel.py) hold beneath it; without one the sandbox refuses to run model code (layers.py).
"""

from __future__ import annotations
import __future__

import ast
import string
import sys

from _string import formatter_field_name_split as _formatter_field_name_split

# pure computation; a module attribute that is itself a module is visible only when that module is listed too
ALLOWED_MODULES = (
    "__future__", "array", "bisect", "cmath", "collections", "collections.abc", "copy", "dataclasses", "datetime",
    "decimal", "enum", "fractions", "functools", "heapq", "itertools", "json", "math", "numbers", "operator", "random",
    "re", "statistics", "string", "textwrap", "time", "typing", "unicodedata",
)  # fmt: skip
# module attributes that evaluate strings as code or reach any attribute by name: hidden from the sandbox
REFUSED_MODULE_ATTRIBUTES = {
    "typing": ("get_type_hints", "ForwardRef", "evaluate_forward_ref"),
    "operator": ("attrgetter", "methodcaller"),
    "string": ("Formatter",),  # Formatter().get_field("0.__class__", ...) is getattr by another name
    # update_wrapper(w, f, assigned=..., updated=...) reads and copies any attribute it is told to
    # singledispatch's register() evaluates a function's annotations (typing.get_type_hints): code in a string
    "functools": ("update_wrapper", "wraps", "WRAPPER_ASSIGNMENTS", "WRAPPER_UPDATES", "singledispatch",
                  "singledispatchmethod"),
}  # fmt: skip
REFUSED_BUILTINS = (
    "open", "exec", "eval", "compile", "globals", "locals", "vars", "input", "breakpoint", "help", "exit", "quit",
)  # fmt: skip
# attributes that lead from a value to frames, code or globals (besides every name starting with "_")
REFUSED_ATTRIBUTES = (
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code", "ag_await",
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "func_globals", "func_code",
)  # fmt: skip
# methods that make a class hook into other objects' checks, pickling or finalisation: refused as definitions
REFUSED_METHODS = (
    "__del__", "__instancecheck__", "__subclasscheck__", "__subclasshook__", "__init_subclass__", "__set_name__",
    "__class_getitem__", "__mro_entries__", "__prepare__", "__reduce__", "__reduce_ex__", "__getstate__",
    "__setstate__", "__getnewargs__", "__getnewargs_ex__", "__copy__", "__deepcopy__", "__match_args__",
)  # fmt: skip
# str.format reads attributes named in its format string: only on a literal whose fields are checked
FORMAT_METHODS = ("format", "format_map")
# class patterns with positional sub-patterns read __match_args__: only these (which match themselves) may
SELF_MATCHING = ("bool", "bytearray", "bytes", "dict", "float", "frozenset", "int", "list", "set", "str", "tuple")
# run time, inside the sandbox process: audit events (PEP 578) refused once the model's code is defined
REFUSED_EVENTS = (
    "open", "import", "code.__new__", "function.__new__", "builtins.input", "builtins.breakpoint", "sys.addaudithook",
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions", "pickle.find_class",
    "setopencodehook",
)  # fmt: skip
REFUSED_EVENT_PREFIXES = (
    "os.", "subprocess.", "socket.", "shutil.", "ctypes.", "gc.", "marshal.", "mmap.", "resource.", "signal.",
    "fcntl.", "pty.", "syslog.", "sqlite3.", "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.",
    "telnetlib.", "nntplib.", "webbrowser.", "glob.", "tempfile.", "_winapi.", "winreg.", "msvcrt.", "sys.monitoring",
)  # fmt: skip
# "object.__getattr__" events (CPython audits reads of these): frames and code, refused at run time
AUDITED_FRAME_ATTRIBUTES = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code", "gi_code", "cr_code", "ag_code")
ANNOTATIONS_FLAG = __future__.annotations.compiler_flag  # annotations stay strings: never evaluated


def _stdlib_names() -> set[str]:
    return {name.lower() for name in (*getattr(sys, "stdlib_module_names", ()), *sys.builtin_module_names)} | {
        "__future__"
    }


class _Scanner(ast.NodeVisitor):
    """Imports, names and attributes of a piece of code, and what of it the sandbox refuses."""

    def __init__(self):
        self.imports: set[str] = set()
        self.relative_imports = 0
        self.refused: list[str] = []
        self.bound: set[str] = set()
        self.loaded: list[tuple[str, int]] = []
        self.self_matching: list[tuple[str, int]] = []

    def _refuse(self, node, what: str) -> None:
        self.refused.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    def _import(self, node, module: str) -> None:
        self.imports.add(module.split(".")[0])
        if module not in ALLOWED_MODULES:
            self._refuse(node, f"import {module} (not among the sandbox's allowed modules)")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._import(node, alias.name)
            self.bound.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.relative_imports += 1
            self._refuse(node, "a relative import")
            return
        self._import(node, node.module or "")
        for alias in node.names:
            if alias.name == "*" or alias.name.startswith("_"):
                self._refuse(node, f"from {node.module} import {alias.name}")
            self.bound.add(alias.asname or alias.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if refused_attribute(node.attr):
            self._refuse(node, f"the attribute .{node.attr}")
        elif node.attr in FORMAT_METHODS:
            self._format(node)
        self.generic_visit(node)

    def _format(self, node: ast.Attribute) -> None:
        receiver = node.value
        if not (isinstance(receiver, ast.Constant) and isinstance(receiver.value, str)):
            self._refuse(node, f".{node.attr} on anything but a string literal (its fields read attributes)")
            return
        for problem in format_string_problems(receiver.value):
            self._refuse(node, f"the format string {receiver.value!r}: {problem}")

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:
            if refused_attribute(name) or name in FORMAT_METHODS:
                self._refuse(node, f"the class pattern's attribute {name}=")
        if node.patterns and not (isinstance(node.cls, ast.Name) and node.cls.id in SELF_MATCHING):
            self._refuse(node, "a class pattern with positional sub-patterns (they read __match_args__); use "
                         "keyword patterns such as Point(x=0)")  # fmt: skip
        elif node.patterns:
            self.self_matching.append((node.cls.id, node.lineno))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and _DUNDER(node.value):
            self._refuse(node, f"the string {node.value!r} (a dunder name)")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("__"):
            self._refuse(node, f"the name {node.id}")
        elif isinstance(node.ctx, ast.Load):
            self.loaded.append((node.id, node.lineno))
        else:
            self.bound.add(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        self.bound.add(node.arg)
        self._annotation(node.annotation)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        for child in (node.target, node.value):
            if child is not None:
                self.visit(child)

    def _annotation(self, node) -> None:
        """An annotation is checked like code, a string one too: something may evaluate it (get_type_hints)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.increment_lineno(ast.parse(node.value.strip(), mode="eval"), node.lineno - 1)
            except SyntaxError:
                return  # not an expression: nothing can evaluate it
        if node is not None:
            self.visit(node)

    def visit_FunctionDef(self, node) -> None:
        if node.name in REFUSED_METHODS:
            self._refuse(node, f"a method named {node.name}")
        self.bound.add(node.name)
        for field, value in ast.iter_fields(node):
            if field == "returns":
                self._annotation(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def finish(self) -> None:
        for name, line in self.loaded:
            if name in REFUSED_BUILTINS and name not in self.bound:
                self.refused.append(f"line {line}: {name}() (not available in the sandbox)")
        for name, line in self.self_matching:
            if name in self.bound:  # a built-in's name given to another class
                self.refused.append(f"line {line}: a class pattern on {name}, which the code rebinds")


def _DUNDER(text: str) -> bool:
    return len(text) > 4 and text.startswith("__") and text.endswith("__") and text[2:-2].isidentifier()


def refused_attribute(name: str) -> bool:
    """A private, dunder or frame attribute (the parser has NFKC-normalised names in the source already)."""
    return name.startswith("_") or name in REFUSED_ATTRIBUTES


def format_string_problems(text: str) -> list[str]:
    """What a `str.format` string reads that the sandbox refuses: attributes named in its fields (nested ones in
    format specs included), or a string that does not parse."""
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        return [f"does not parse ({exc})"]
    problems = []
    for name, spec in fields:
        try:
            first, rest = _formatter_field_name_split(name)
            parts = [(is_attribute, key) for is_attribute, key in rest]
        except ValueError as exc:
            problems.append(f"field {name!r} does not parse ({exc})")
            continue
        problems += [f"field {name!r} reads the attribute .{key}" for is_attribute, key in parts
                     if is_attribute and (refused_attribute(key) or key in FORMAT_METHODS)]  # fmt: skip
        problems += format_string_problems(spec or "")
    return problems


def _scan(tree: ast.AST) -> _Scanner:
    scanner = _Scanner()
    scanner.visit(tree)
    scanner.finish()
    return scanner


def check_python_modules(code: str) -> tuple[bool, dict]:
    """Unsloth's check, kept to what the sandbox runs: `(ok, info)`.

    info: "stdlib" / "non_stdlib" (the modules imported, split like Unsloth's), "relative_imports" (a count),
    "refused" (each thing the sandbox would refuse, with its line: imports outside ALLOWED_MODULES, `open`, `eval`,
    private or frame attributes, dunder names) and, when the code does not parse, "error". ok: nothing refused.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return False, {"error": f"SyntaxError: {exc}", "stdlib": [], "non_stdlib": [], "relative_imports": 0,
                       "refused": []}  # fmt: skip
    scanner = _scan(tree)
    stdlib = _stdlib_names()
    info = {
        "stdlib": sorted(m for m in scanner.imports if m.lower() in stdlib),
        "non_stdlib": sorted(m for m in scanner.imports if m.lower() not in stdlib),
        "relative_imports": scanner.relative_imports,
        "refused": scanner.refused,
    }
    return not scanner.refused, info


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Tuple):
        return all(_is_literal(element) for element in node.elts)
    return isinstance(node, ast.Constant)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def function_name(source: str, enforce_policy: bool = True) -> str:
    """The name of the one function `source` defines; RuntimeError (Unsloth's type) saying what is wrong otherwise
    (with enforce_policy, also what of it the sandbox refuses)."""
    if not isinstance(source, str):
        raise TypeError(f"the function's source must be a string, got {type(source).__name__}")
    try:
        tree = ast.parse(source)
        compile(tree, "<model code>", "exec", flags=ANNOTATIONS_FLAG, dont_inherit=True)  # compiles, runs nothing
    except SyntaxError as exc:
        raise RuntimeError(f"SyntaxError: {exc}") from None
    body = tree.body[1:] if tree.body and _is_docstring(tree.body[0]) else tree.body
    if len(body) != 1 or not isinstance(body[0], ast.FunctionDef):
        raise RuntimeError("The code must define exactly one top-level (non-async) function and nothing else.")
    function = body[0]
    if function.decorator_list:
        raise RuntimeError("Decorators are not allowed (they run code when the function is defined).")
    defaults = [*function.args.defaults, *(d for d in function.args.kw_defaults if d is not None)]
    if not all(_is_literal(default) for default in defaults):
        raise RuntimeError("Only literal default argument values are allowed.")
    refused = _scan(tree).refused if enforce_policy else []
    if refused:
        raise RuntimeError("The sandbox refuses: " + "; ".join(refused))
    return function.name
