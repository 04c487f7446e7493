"""Reading model XML (MJCF, URDF): a parser that remembers where each element came from, and
MJCF's ``<include file=...>``.

Every element parsed here is recorded with its file and line (:class:`XMLSource.where`), so a
loader can name the place of what it refuses. ``<include>`` is resolved relative to the
including file (then, as MuJoCo does, to the main model's directory), recursively, with cycle
detection. Nothing in a file is executed: document type declarations and entities are refused,
and the size of one file, the depth of nested includes, the number of included files and the
number of elements are bounded.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from xml.parsers import expat

from .model import ModelError

MAX_FILE_BYTES = 64 * 1024 * 1024      # one model file (MuJoCo's largest suite model: ~1 MB)
MAX_INCLUDE_DEPTH = 16
MAX_INCLUDED_FILES = 256
MAX_ELEMENTS = 2_000_000


class XMLSource:
    """A parsed XML document (with its includes expanded) and where each element came from."""

    def __init__(self, source: str):
        self.source = source                     # the main file (or "<string>")
        self.lines: dict[int, tuple[str, int]] = {}
        self.included: list[str] = []            # absolute paths of the included files
        self._count = 0

    def where(self, el: ET.Element) -> str:
        """``file:line`` of an element (the file that holds it: an included one if so)."""
        f, line = self.lines.get(id(el), (self.source, 0))
        return f"{f}:{line}" if line else f

    def line(self, el: ET.Element) -> int:
        return self.lines.get(id(el), (self.source, 0))[1]

    def parse(self, text: str, source: str) -> ET.Element:
        """Parse one document; every element gets its (source, line)."""
        if len(text) > MAX_FILE_BYTES:
            raise ModelError(f"{source}: model file larger than {MAX_FILE_BYTES} bytes")
        builder = ET.TreeBuilder()
        parser = expat.ParserCreate()
        lines = self.lines

        def start(tag, attrs):
            self._count += 1
            if self._count > MAX_ELEMENTS:
                raise ModelError(f"{source}: more than {MAX_ELEMENTS} XML elements")
            el = builder.start(tag, attrs)
            lines[id(el)] = (source, parser.CurrentLineNumber)

        def refuse(*_args):
            raise ModelError(f"{source}:{parser.CurrentLineNumber}: document type declarations "
                             "and entities are not accepted in model files")

        parser.StartElementHandler = start
        parser.EndElementHandler = builder.end
        parser.StartDoctypeDeclHandler = refuse
        parser.EntityDeclHandler = refuse
        try:
            parser.Parse(text, True)
            root = builder.close()
        except expat.ExpatError as exc:
            raise ModelError(f"{source}: not valid XML: {exc}") from None
        except ModelError:
            raise
        except Exception as exc:   # noqa: BLE001 - TreeBuilder errors on malformed input
            raise ModelError(f"{source}: not valid XML: {exc}") from None
        self._roots = getattr(self, "_roots", [])
        self._roots.append(root)                 # keep every tree alive: ids stay unique
        return root

    def expand_includes(self, root: ET.Element, here_dir: str, main_dir: str,
                        stack: tuple[str, ...] = ()) -> None:
        """Replace every ``<include file=...>`` under ``root`` by the children of the included
        file's root element, recursively."""
        for parent in list(root.iter()):
            i = 0
            while i < len(parent):
                child = parent[i]
                if child.tag != "include":
                    i += 1
                    continue
                file = child.get("file")
                where = self.where(child)
                if not file:
                    raise ModelError(f"{where}: <include> without a file attribute")
                cands = [os.path.normpath(os.path.join(here_dir, file))]
                alt = os.path.normpath(os.path.join(main_dir, file))
                if alt not in cands:
                    cands.append(alt)
                path = next((c for c in cands if os.path.isfile(c)), None)
                if path is None:
                    raise ModelError(f"{where}: <include file={file!r}>: file not found (looked "
                                     f"for {' and '.join(map(repr, cands))})")
                real = os.path.realpath(path)
                if real in stack:
                    chain = " -> ".join([*stack, real])
                    raise ModelError(f"{where}: <include file={file!r}>: include cycle ({chain})")
                if len(stack) >= MAX_INCLUDE_DEPTH:
                    raise ModelError(f"{where}: includes nested deeper than {MAX_INCLUDE_DEPTH}")
                if len(self.included) >= MAX_INCLUDED_FILES:
                    raise ModelError(f"{where}: more than {MAX_INCLUDED_FILES} included files")
                if os.path.getsize(path) > MAX_FILE_BYTES:
                    raise ModelError(f"{path}: model file larger than {MAX_FILE_BYTES} bytes")
                self.included.append(real)
                try:
                    with open(path, encoding="utf-8") as fh:
                        text = fh.read()
                except (OSError, UnicodeDecodeError) as exc:
                    raise ModelError(f"{where}: <include file={file!r}>: cannot read {path!r}: "
                                     f"{exc}") from None
                sub = self.parse(text, path)
                if sub.tag != root.tag:
                    raise ModelError(f"{path}: included file's root element is <{sub.tag}>, "
                                     f"expected <{root.tag}>")
                self.expand_includes(sub, os.path.dirname(path), main_dir, (*stack, real))
                parent.remove(child)
                for k, el in enumerate(list(sub)):
                    parent.insert(i + k, el)
                i += len(sub)


def parse_model_xml(text: str, source: str, base_dir: str) -> tuple[ET.Element, XMLSource]:
    """Parse a model document and expand its includes (relative to ``base_dir``, the directory
    of the file the text was read from)."""
    src = XMLSource(source)
    root = src.parse(text, source)
    start = (os.path.realpath(source),) if os.path.isfile(source) else ()
    src.expand_includes(root, base_dir, base_dir, start)
    return root, src
